"""One shape for every run-time setting: what the admin calls of the fetch policies share.

Every setting an operator changes at run time (no deploy: it lives in Redis and every PolicyWorker obeys it from its
next fetch) is reached through the same four classmethods, with the same argument order (*what* the setting is for,
then the values, then ``connection=``), the same return types and the same errors:

=======================  ===========================================  ============================
call                     returns                                      what
=======================  ===========================================  ============================
``X.set(what, values)``  the setting now stored, a frozen dataclass   write (wakes idle workers)
``X.get(what)``          that dataclass, or None when nothing is set  read the setting
``X.clear(what)``        True when there was a setting to remove      remove it
``X.status(what)``       a frozen dataclass of the state *now*        read the live state (gauges)
=======================  ===========================================  ============================

===========  ==========  ========================================  ================================
policy       what        setting (``set``/``get``)                 state (``status``)
===========  ==========  ========================================  ================================
QueueSlot    queue       :class:`Cap` ``(capacity)``               :class:`SlotStatus`
QueueRate    queue       ``QueueRate(limit, per, burst)``          :class:`~rq_policies.RateStatus`
Concurrency  scope, key  :class:`KeyLimit` ``(limit)``             :class:`KeyStatus`
Rate         scope, key  :class:`KeyRate` ``(limit, per, burst)``  :class:`~rq_policies.RateStatus`
===========  ==========  ========================================  ================================

``get`` answers only what was *set*: a per-key policy's declared limit (on the function) is not a run-time setting
and is not returned by ``get``; ``status`` shows the limit in force, whichever it is. A state reading is named
``status`` everywhere: a setting and its live count are different things, read by different calls.

Back-offs (``QueueRate.backoff``, ``Concurrency.backoff``/``Rate.backoff``) are not settings: a back-off is an event
with an end time, not a value that stays, so it keeps its verb and shows in ``status`` (``backoff_until``).

Every ``set`` and ``clear`` is safe to send twice (redis-py resends a call whose reply was lost): the state left is
what one call leaves, and the answer is the first run's. A ``clear`` (and every other admin call whose answer depends
on what it changed: Fair's ``pause``/``resume``, a ``reset``'s count, ``QueueSlot.release``) is one script that keeps
its answer under the call's request id for a minute (``rq:policies:answer:<id>``, lua/lib/answer.lua): the resent
call finds it, answers the same (True, not the False a second removal would say) and writes nothing.

Bad input raises :class:`~rq_policies.engine.exceptions.InvalidSetting` (a ValueError) naming the argument and the
value, before anything is written. Setting a cap or a rate on a queue nothing has seen yet warns
(:class:`~rq_policies.engine.exceptions.UnknownQueueWarning`) and stores it all the same.

The 0.2 names (``QueueSlot.set_capacity``/``clear_capacity``/``capacity``/``in_use``, ``Concurrency.override``/
``overridden``/``in_use``, ``Rate.status(scope, key, limit, per, burst)``) still work and raise a DeprecationWarning;
they are removed in 0.4.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from .exceptions import InvalidSetting, UnknownQueueWarning

__all__ = ['Cap', 'KeyLimit', 'KeyRate', 'KeyStatus', 'SlotStatus', 'deprecated', 'refusing', 'warn_unknown_queue']

#: The release the deprecated 0.2 names are removed in.
REMOVED_IN = '0.4'


@dataclass(frozen=True)
class Cap:
    """A queue's cluster-wide cap (QueueSlot): at most ``capacity`` jobs of it running at once."""

    capacity: int


@dataclass(frozen=True)
class SlotStatus:
    """A queue's QueueSlot state now (server clock).

    Attributes:
        capacity: the cap, or None when the queue is uncapped.
        in_use: live holds (jobs of the queue running under PolicyWorkers).
        holders: ``(claim token, seconds to expiry)`` of each live hold, soonest to expire first.
    """

    capacity: int | None
    in_use: int
    holders: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class KeyLimit:
    """One key's Concurrency limit set at run time: it wins over the limit its jobs declare."""

    limit: int


@dataclass(frozen=True)
class KeyStatus:
    """One key's Concurrency state now (server clock).

    Attributes:
        limit: the limit in force: the run-time setting, else the limit a parked or running job of the key declares,
            else None (nothing of the key is known).
        overridden: True when ``limit`` is a run-time setting (:meth:`Concurrency.set`).
        in_use: live holds (running jobs, and units reserved for parked jobs given back to their queue).
        parked: ids of the key's parked jobs, oldest first (the order they go back in).
        backoff_until: the server time a ``BackOff(key=True)`` blocks the key until, or None.
    """

    limit: int | None
    overridden: bool
    in_use: int
    parked: tuple[str, ...] = ()
    backoff_until: float | None = None


@dataclass(frozen=True)
class KeyRate:
    """One key's Rate set at run time: ``limit`` starts every ``per`` seconds, up to ``burst`` at once; it wins over
    the rate its jobs declare."""

    limit: int
    per: int = 1
    burst: int = 1

    @property
    def interval(self) -> float:
        """Seconds between two starts at the sustained rate."""
        return self.per / self.limit


@contextmanager
def refusing() -> Iterator[None]:
    """Turn a ValueError or TypeError of argument checking into :class:`InvalidSetting` (same message)."""
    try:
        yield
    except InvalidSetting:
        raise
    except (ValueError, TypeError) as exc:
        raise InvalidSetting(str(exc)) from None


F = TypeVar('F', bound=Callable[..., Any])


def deprecated(new: str) -> Callable[[F], F]:
    """Mark a 0.2 admin name: a DeprecationWarning naming ``new`` (removed in :data:`REMOVED_IN`)."""

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            old = func.__qualname__
            warnings.warn(f'{old} is deprecated and is removed in rq-policies {REMOVED_IN}: use {new}',
                          DeprecationWarning, stacklevel=2)
            return func(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


def clear_setting(connection: Any, settings: str, field: str, wake: str | None = None, message: str = '',
                  also: tuple[str, ...] = ()) -> bool:
    """Remove ``field`` of the settings hash ``settings`` (and the keys ``also``) in one script,
    ``lua/clear_setting.lua``, publishing ``message`` on the queue's wake-up channel ``wake`` when given; True when
    the setting was there. A replay after a lost reply answers what the first run did (lua/lib/answer.lua)."""
    from .ops import Call

    call = Call('clear_setting', field=field, wake=wake, message=message)
    call.key('settings', settings)
    call.key_list('also', list(also))
    return call.answered().run(connection) == 1


def warn_unknown_queue(connection: Any, name: str, what: str) -> None:
    """Warn (:class:`UnknownQueueWarning`) when ``name`` is a queue nothing has seen: not in rq's queue set, not
    configured by any policy, listened to by no live worker. ``what`` is the call (``QueueSlot.set``)."""
    from rq_policies.surfaces.state import known_queue

    if not known_queue(connection, name):
        warnings.warn(f'{what}: queue {name!r} is unknown (rq has no such queue, no policy setting names it and no '
                      'worker listens to it); the setting is stored anyway. A typo?', UnknownQueueWarning,
                      stacklevel=3)
