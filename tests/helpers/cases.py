"""Each registered policy's contract cases, found by the policy's registered name (tests/contract/test_every_policy.py,
tests/engine/test_architecture.py).

A policy's test folder holds ``examples.py`` with two dicts keyed by the policy's registered name (a folder may serve
more than one policy: tests/concurrency holds Concurrency's and Rate's):

* ``EXAMPLES``: instances covering the policy's distinct behaviours, for an admission policy and a per-job fetch
  policy (the contract suite runs each one);
* ``SETTINGS``: for a fetch policy configured per queue, the settings its ``set(queue, ..., connection=)`` takes (the
  admin API's shape), under each of which one start is allowed now and the next is refused (:func:`configure` sets
  one, :func:`unconfigure` clears it with ``clear(queue, connection=)``);
* ``INVALID``: constructor arguments (a per-queue fetch policy: settings) the policy refuses, each with the argument
  its error must name;
* ``NO_LIMIT`` (optional): a per-job fetch policy that parks every job rather than the jobs over a key's limit
  (Batch), with why: the per-job suite's start-then-park cases are a limit's, and skip it (its folder tests it).

A new policy gets the contract suite by registering (defining its class) and writing its folder's ``examples.py``; a
registered policy the suite asks about and no ``examples.py`` names is an error naming the policy and the file to
write, and a name no registered policy has is one too (a typo would otherwise test nothing).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from rq_policies.engine.policy import Policy, by_name
from tests.helpers import TESTS


def _first_argument(args: tuple, kwargs: dict) -> Any:
    """The contract suite's key function: the call's first argument. (Its name shows in the test ids, as
    ``key=_first_argument``: it was the policy modules' own before the cases moved here.)"""
    return args[0]


#: ``NO_LIMIT`` of every test folder's ``examples.py`` (:func:`no_limit`), filled by :func:`_tables`.
_NO_LIMIT: dict[str, str] = {}


@functools.cache
def _tables() -> tuple[dict[str, tuple], dict[str, tuple], dict[str, tuple], dict[str, str]]:
    examples: dict[str, tuple] = {}
    invalid: dict[str, tuple] = {}
    settings: dict[str, tuple] = {}
    where: dict[str, str] = {}
    for path in sorted(TESTS.glob('*/examples.py')):
        module_name = f'tests.{path.parent.name}.examples'
        module = importlib.import_module(module_name)
        for table, found in ((examples, getattr(module, 'EXAMPLES', {})), (invalid, getattr(module, 'INVALID', {})),
                             (settings, getattr(module, 'SETTINGS', {}))):
            for name, cases in found.items():
                by_name(name)  # KeyError naming the registered policies: a typo tests nothing
                if name in table:
                    raise LookupError(f'policy {name!r} has cases in both {where[name]} and {module_name}')
                table[name] = tuple(cases)
                where[name] = module_name
        for name, why in getattr(module, 'NO_LIMIT', {}).items():
            by_name(name)
            _NO_LIMIT[name] = why
    return examples, invalid, settings, where


def _lookup(table: dict[str, tuple], cls: type[Policy], what: str) -> tuple:
    try:
        return table[cls.name]
    except KeyError:
        raise LookupError(
            f'policy {cls.name!r} ({cls.__module__}.{cls.__qualname__}) is registered but gives no {what}: add '
            f'{what}[{cls.name!r}] to its test folder\'s examples.py (tests/<folder>/examples.py, see '
            f'tests/helpers/cases.py)'
        ) from None


def examples(cls: type[Policy]) -> tuple[Policy, ...]:
    """The instances the contract suite runs for ``cls`` (an admission or a per-job fetch policy); LookupError when
    no test folder's ``examples.py`` gives them."""
    return _lookup(_tables()[0], cls, 'EXAMPLES')


def invalid(cls: type[Policy]) -> tuple[tuple[dict[str, Any], str], ...]:
    """The arguments ``cls`` refuses, each with the argument its error must name; LookupError when no test folder's
    ``examples.py`` gives them."""
    return _lookup(_tables()[1], cls, 'INVALID')


def settings(cls: type[Policy]) -> tuple[dict[str, Any], ...]:
    """The settings the contract suite gives ``cls`` (a fetch policy configured per queue), each through
    :func:`configure`; LookupError when no test folder's ``examples.py`` gives them."""
    return _lookup(_tables()[2], cls, 'SETTINGS')


def no_limit(cls: type[Policy]) -> str | None:
    """Why ``cls``, a per-job fetch policy, parks every job rather than the ones over a key's limit (its
    ``examples.py``'s ``NO_LIMIT``), or None: the per-job suite's start-then-park cases are for a limit."""
    _tables()
    return _NO_LIMIT.get(cls.name)


def configure(cls: Any, connection: Any, queue: str, **values: Any) -> None:
    """Give ``queue`` the setting ``values`` of ``cls`` (QueueSlot: ``capacity=``): its admin API's ``set``, which
    refuses bad settings naming the argument and writes nothing."""
    cls.set(queue, connection=connection, **values)


def unconfigure(cls: Any, connection: Any, queue: str) -> None:
    """Remove the setting :func:`configure` gave ``queue``: its admin API's ``clear``."""
    cls.clear(queue, connection=connection)
