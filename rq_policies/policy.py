"""Policy value objects and the ``@policy`` declaration.

A policy says what an enqueue is admitted under; it holds no state (state lives in Redis, keyed by the job's
identity, see :mod:`rq_policies.identity`). Policies are validated when they are built, so a bad argument fails at
import time, where the decorator runs, and never after something was written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .exceptions import PolicyConfigurationError
from .identity import UniqueContext

F = TypeVar('F', bound=Callable[..., Any])

#: Attribute ``@policy`` sets on the decorated function.
ATTRIBUTE = '__rq_policies__'

#: The longest duration any policy accepts (slot, wait, hold ttl): ten years. Beyond it Redis's expiry arithmetic
#: overflows, and a Lua script that fails half-way keeps the writes it already made, so it is refused up front.
MAX_SECONDS = 10 * 366 * 24 * 3600

#: The largest cap QueueSlot accepts (Lua numbers are doubles; far below where they stop being exact).
MAX_CAPACITY = 2**31 - 1


def positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    """``value`` as an int >= 1 (and <= ``maximum``), or a ValueError naming ``name`` and the value.

    bool is refused although it is an int: ``Throttle(True)`` is a bug, not a one-second slot.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    if maximum is not None and value > maximum:
        raise ValueError(f'{name} must be at most {maximum}, got {value!r}')
    return value


def whole_seconds(name: str, value: Any) -> int:
    """``value`` as a whole number of seconds from 1 to :data:`MAX_SECONDS`, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a whole number of seconds >= 1 (an int), got {value!r}')
    return positive_int(name, value, MAX_SECONDS)


class Policy:
    """Base class of every policy. Subclasses are small immutable value objects."""

    #: Short name used in logs, drop counters and metrics labels.
    name: ClassVar[str] = 'policy'

    def __repr__(self) -> str:
        return f'{type(self).__name__}()'

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))


class Loner(Policy):
    """One job per identity per queue while it waits (resque-loner's unique jobs).

    The identity is held from the enqueue until a PolicyWorker takes the job (or it is deleted, cancelled or removed
    from its queue); an identical enqueue in that time returns ``None``. Once the job runs, the same payload can be
    enqueued again: the policy prevents duplicate *waiting* work, not concurrent runs.
    """

    name: ClassVar[str] = 'loner'


@dataclass(frozen=True)
class PolicySet:
    """The policies one enqueue is admitted under, with the identity hook they share."""

    policies: tuple[Policy, ...]
    unique_context: UniqueContext | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        seen: set[type] = set()
        for item in self.policies:
            if not isinstance(item, Policy):
                raise TypeError(f'policy: expected Loner, Throttle, Debounce or another Policy, got {item!r}')
            if type(item) in seen:
                raise PolicyConfigurationError(f'policy: {type(item).__name__} is given twice in {self.policies!r}')
            seen.add(type(item))
        check_combination(self.policies)
        if self.unique_context is not None and not callable(self.unique_context):
            raise TypeError(f'unique_context: expected a callable (args, kwargs) -> value, got {self.unique_context!r}')

    def get(self, kind: type[P]) -> P | None:
        """The policy of this kind, or None."""
        for item in self.policies:
            if isinstance(item, kind):
                return item
        return None

    def __bool__(self) -> bool:
        return bool(self.policies)


P = TypeVar('P', bound=Policy)

#: Combination rules, extended by policy modules as they are added: each is ``policies -> error message or None``.
COMBINATION_RULES: list[Callable[[tuple[Policy, ...]], str | None]] = []


def check_combination(policies: tuple[Policy, ...]) -> None:
    """Refuse combinations that mean nothing, with the reason."""
    for rule in COMBINATION_RULES:
        message = rule(policies)
        if message:
            raise PolicyConfigurationError(f'policy: {message}')


def make_set(value: Policy | Iterable[Policy] | PolicySet | None, unique_context: UniqueContext | None = None):
    """Normalize what a caller passed as ``policy=`` into a PolicySet (or None for "no policy")."""
    if value is None:
        return None
    if isinstance(value, PolicySet):
        return value
    if isinstance(value, Policy):
        return PolicySet((value,), unique_context)
    if isinstance(value, (list, tuple)):
        return PolicySet(tuple(value), unique_context) if value else None
    raise TypeError(f'policy: expected a Policy, a list of policies or None, got {value!r}')


def policy(*policies: Policy, unique_context: UniqueContext | None = None) -> Callable[[F], F]:
    """Declare the policies a job function is enqueued under.

    Example::

        @policy(Loner())
        def sweep_cache(article_id): ...

        @policy(Loner(), unique_context=lambda args, kwargs: args[0])
        def sync_account(account_id, reason): ...   # one waiting job per account, whatever the reason

    Args:
        *policies: one or more Policy objects.
        unique_context: optional ``(args, kwargs) -> value`` narrowing the identity every policy keys on.

    Returns:
        A decorator that returns the function itself (rq stores jobs by import path, so no wrapper is involved).
    """
    if not policies:
        raise TypeError('policy: give at least one policy, for example @policy(Loner())')
    spec = PolicySet(tuple(policies), unique_context)

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(f'policy: can only decorate a callable, got {func!r}')
        setattr(func, ATTRIBUTE, spec)
        return func

    return decorate


def declared(func: Any) -> PolicySet | None:
    """The PolicySet declared on a function with ``@policy``, or None."""
    spec = getattr(func, ATTRIBUTE, None)
    return spec if isinstance(spec, PolicySet) else None
