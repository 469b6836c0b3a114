"""One shape for every run-time setting: what the admin calls of the fetch policies share (docs/admin.md).

Every setting an operator changes at run time (it lives in Redis; every PolicyWorker obeys it from its next fetch) is
reached through four classmethods with the same argument order (*what* the setting is for, then the values, then
``connection=``): ``set`` (returns the setting now stored, a frozen dataclass, and wakes idle workers), ``get`` (that
dataclass, or None when nothing is set: a per-key policy's declared limit is not a setting), ``clear`` (True when there
was one) and ``status`` (a frozen dataclass of the state *now*, named ``status`` everywhere):

===========  ==========  ========================================  ================================
policy       what        setting (``set``/``get``)                 state (``status``)
===========  ==========  ========================================  ================================
QueueSlot    queue       :class:`Cap` ``(capacity)``               :class:`SlotStatus`
QueueRate    queue       ``QueueRate(limit, per, burst)``          :class:`RateStatus`
Concurrency  scope, key  :class:`KeyLimit` ``(limit)``             :class:`KeyStatus`
Rate         scope, key  :class:`KeyRate` ``(limit, per, burst)``  :class:`RateStatus`
Fair         scope, key  :class:`FairWeight` ``(weight)``          :class:`FairStatus` (and a queue)
===========  ==========  ========================================  ================================

QueueRate's and Rate's ``set`` also take ``windows=[(limit, per), (limit, per, burst), ...]`` instead of ``limit, per,
burst``: a rate of several windows (:class:`RateWindow`), every one of which must allow a start; its setting then lists
them (``windows``) and its ``status`` names the window holding the next start (``held_by``).

Every ``set`` and ``clear`` is safe to send twice, and a replay after a lost reply answers what the first run did (a
``clear``, like Fair's ``pause``/``resume``, a ``reset``'s count and ``QueueSlot.release``, keeps its answer a minute
under the call's request id: lua/lib/answer.lua); bad input raises :class:`InvalidSetting` (an InvalidArgument: a
ValueError and a TypeError) naming the argument and the value before anything is written; a cap or a rate on a queue
nothing has seen warns (:class:`UnknownQueueWarning`) and is stored all the same, and a per-key setting or a Fair
pause of a scope no policy is known to use is refused unless ``force=True``. Back-offs are events, not settings:
they keep their verb (``backoff``) and show in ``status``. The 0.2 names still work with a DeprecationWarning, until
0.4.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from . import keys
from .exceptions import InvalidArgument, InvalidSetting, UnknownQueueWarning
from .ledger import WAKE_CAPACITY, wake_up
from .ops import Call, need_connection, text
from .policy import MAX_CAPACITY, positive_int, whole_seconds
from .reading import declared_queue, known_queue

__all__ = ['Cap', 'FairPause', 'FairStatus', 'FairWeight', 'GcraRate', 'KeyLimit', 'KeyRate', 'KeyStatus', 'RateStatus',
           'RateWindow', 'SlotStatus', 'check_rate', 'check_windows', 'clear_setting', 'rate_setting', 'read_rate',
           'settle_rate', 'windows_of',
           'deprecated', 'queue_name', 'queue_target', 'rate_status', 'refusing', 'warn_unknown_queue',
           'write_queue_setting']

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
        source: what gave the key ``limit``: ``'set'`` (a run-time setting), ``"rule tier '<prefix>'"`` or
            ``'rule default'`` (its scope's rule, :meth:`Concurrency.set_rule`), ``'declared'`` (the limit its jobs
            declare), or None (no limit known).
    """

    limit: int | None
    overridden: bool
    in_use: int
    parked: tuple[str, ...] = ()
    backoff_until: float | None = None
    source: str | None = None


@dataclass(frozen=True)
class FairWeight:
    """A key's weight set at run time (``Fair.set``)."""

    weight: int


@dataclass(frozen=True)
class FairStatus:
    """One key's Fair state on one queue (``Fair.status``).

    Attributes:
        waiting: jobs of the key waiting in its line on the queue.
        active: is the key taking turns on the queue now (it has waiting jobs and is not paused)?
        paused: is the key paused (on every queue)?
        weight: the weight in force: the run-time weight (``Fair.set``), else the one the key's next waiting job on
            the queue declares (1 unless its Fair says otherwise); None when neither is known (no weight set and no
            job waiting).
        active_keys: how many keys take turns on the queue.
        set_at_run_time: is ``weight`` the run-time weight (``Fair.set``)?
    """

    waiting: int
    active: bool
    paused: bool
    weight: int | None
    active_keys: int
    set_at_run_time: bool = False


@dataclass(frozen=True)
class FairPause:
    """One key's pause and backlog (``Fair.pause_status``): what a pause or a resume would change.

    Attributes:
        paused: is the key paused (on every queue)?
        waiting: the key's waiting jobs per queue (only queues where it has some).
    """

    paused: bool
    waiting: dict[str, int]


def queue_name(value: Any) -> str:
    """Accept a queue name or an rq Queue; refuse anything else."""
    name = getattr(value, 'name', value)
    if not isinstance(name, str) or not name:
        raise InvalidArgument('queue', message=f'queue must be a non-empty queue name or an rq Queue, got {value!r}')
    return name


def queue_target(queue: Any, connection: Any) -> tuple[str, Any]:
    """``queue`` (a name or a Queue) as its name, and ``connection``, checked as every queue setting's call takes
    them: :class:`InvalidSetting` naming a bad one."""
    with refusing():
        return queue_name(queue), need_connection(connection)


def write_queue_setting(connection: Any, settings: str, queue: str, value: str | int | None,
                        also: tuple[str, ...] = ()) -> bool:
    """Store ``value`` as ``queue``'s setting in the hash ``settings`` (None: remove it, and the keys ``also``), and
    wake the queue's idle PolicyWorkers, in one round trip. True when a setting was there to remove."""
    if value is None:
        return clear_setting(connection, settings, queue, keys.wake(queue), WAKE_CAPACITY, also)
    with connection.pipeline(transaction=False) as pipe:
        pipe.hset(settings, queue, value)
        wake_up(pipe, keys.wake(queue), WAKE_CAPACITY)
        return bool(pipe.execute()[0])


class GcraRate:
    """What a GCRA rate (``limit`` starts every ``per`` seconds, up to ``burst`` at once) derives from its numbers;
    shared by QueueRate, the per-key Rate, :class:`KeyRate` and :class:`RateWindow`.

    A rate of several windows (``windows``, each a :class:`RateWindow`) allows a start only when every window allows
    one; its ``limit``, ``per`` and ``burst`` are its first window's, the one of the shortest period."""

    limit: int
    per: int
    burst: int

    @property
    def interval(self) -> float:
        """Seconds between two starts at the sustained rate (the GCRA's emission interval)."""
        return self.per / self.limit

    def rate_repr(self) -> str:
        """``Name(limit=.., per=.., burst=..)``, or ``Name(windows=[...])`` for a rate of several windows (the
        ``__repr__`` of KeyRate and QueueRate)."""
        windows = getattr(self, 'windows', None) or (self,)
        if len(windows) == 1:
            return f'{type(self).__name__}(limit={self.limit}, per={self.per}, burst={self.burst})'
        return f'{type(self).__name__}(windows={window_tuples(windows)})'

    def rate_words(self) -> str:
        """The rate as ``info`` and ``explain`` print it: ``5/1s burst 2``, or its windows joined by `` + ``."""
        return ' + '.join(f'{w.limit}/{w.per}s burst {w.burst}' for w in getattr(self, 'windows', None) or (self,))


def rate_now_words(available: int | None, next_at: float | None, held_by: Any, now: float) -> str:
    """What a rate allows now, as ``explain`` says it: ``N start(s) available now``, or when the next start is
    allowed and, for a rate of several windows, the window that holds it (its ``limit``, ``per`` and ``burst``);
    QueueRate's and the per-key Rate's."""
    if available:
        return f'{available} start(s) available now'
    words = f'next start allowed in {max((next_at or now) - now, 0.0):.1f} s'
    if held_by is not None:
        words += f' (held by its {held_by.per} s window, {held_by.limit}/{held_by.per}s burst {held_by.burst})'
    return words


@dataclass(frozen=True)
class RateWindow(GcraRate):
    """One window of a rate: ``limit`` starts every ``per`` seconds, up to ``burst`` at once (a GCRA on the server's
    clock). A rate of several windows (``Rate(windows=...)``, ``QueueRate.set(queue, windows=...)``) lets a job start
    only when every window allows a start, and the start counts in each."""

    limit: int
    per: int = 1
    burst: int = 1

    def __post_init__(self) -> None:
        check_rate(self.limit, self.per, self.burst)

    @property
    def windows(self) -> tuple[RateWindow, ...]:
        """Itself, as the one window of a rate."""
        return (self,)


def settle_rate(rate: Any, windows: Any) -> None:
    """Fill a frozen rate dataclass (:class:`KeyRate`, ``QueueRate``) from ``limit, per, burst`` or ``windows``
    (:func:`windows_of`): its ``windows`` all of them, its ``limit``, ``per`` and ``burst`` the first's."""
    found = windows_of(rate.limit, rate.per, rate.burst, windows)
    first = found[0]
    object.__setattr__(rate, 'windows', found)
    object.__setattr__(rate, 'limit', first.limit)
    object.__setattr__(rate, 'per', first.per)
    object.__setattr__(rate, 'burst', first.burst)


@dataclass(frozen=True)
class WindowedRate(GcraRate):
    """A rate given as ``limit, per, burst`` or as several ``windows`` (:func:`windows_of`): its ``windows`` are all
    of them, shortest period first, and its ``limit``, ``per`` and ``burst`` the first's. The shape of
    :class:`KeyRate` and ``QueueRate``."""

    limit: int = None  # type: ignore[assignment]  # None only with windows; set from them
    per: int = 1
    burst: int = 1
    windows: tuple[RateWindow, ...] = None  # type: ignore[assignment]  # set: every window, shortest period first

    def __post_init__(self) -> None:
        settle_rate(self, self.windows)

    def __repr__(self) -> str:
        return self.rate_repr()


class KeyRate(WindowedRate):
    """One key's Rate set at run time: ``limit`` starts every ``per`` seconds, up to ``burst`` at once, or several
    ``windows`` (:class:`RateWindow`; then ``limit``, ``per`` and ``burst`` are the first's); it wins over the rate
    its jobs declare."""


@dataclass(frozen=True)
class RateStatus:
    """A limited queue's (or key's) rate right now (server clock).

    Attributes:
        available: starts allowed at once now (0 to ``burst``; 0 also while a back-off blocks the queue); with
            several windows, the fewest any window allows.
        next_at: the server time (epoch s) the next start is allowed (now, when one is available); with several
            windows, the latest of theirs.
        backoff_until: the server time a BackOff blocks the queue until, or None.
        held_by: for a rate of several windows whose next start is not now, the window that holds it (the one
            allowing it last); None otherwise.
    """

    available: int
    next_at: float
    backoff_until: float | None = None
    held_by: RateWindow | None = None


def check_rate(limit: Any, per: Any, burst: Any) -> None:
    """Refuse a bad rate with a ValueError naming the argument and the value."""
    positive_int('limit', limit, MAX_CAPACITY)
    whole_seconds('per', per)
    positive_int('burst', burst, MAX_CAPACITY)
    if burst > limit:
        raise InvalidArgument('burst', message=f'burst must be at most limit ({limit}), got {burst!r}')


#: The most windows one rate may have: the fetch script reads and writes each on every start.
MAX_WINDOWS = 8


def window_tuples(windows: tuple[RateWindow, ...]) -> list[tuple[int, int, int]]:
    """``[(limit, per, burst), ...]``: windows as ``windows=`` takes them (and their repr shows them)."""
    return [(w.limit, w.per, w.burst) for w in windows]


def check_windows(windows: Any) -> tuple[RateWindow, ...]:
    """``windows`` (a non-empty list of ``(limit, per)``, ``(limit, per, burst)`` or :class:`RateWindow`, at most
    :data:`MAX_WINDOWS`, no two with one period) as RateWindows, shortest period first; else an
    :class:`InvalidArgument` naming ``windows``, the window at fault and the value."""

    def refuse(problem: str) -> InvalidArgument:
        return InvalidArgument('windows', message=(
            f'windows must be a non-empty list of (limit, per) or (limit, per, burst), one per period, at most '
            f'{MAX_WINDOWS}: {problem}; got windows={windows!r}'))

    if not isinstance(windows, (list, tuple)):
        raise refuse(f'a {type(windows).__name__} is not a list')
    if not windows:
        raise refuse('it is empty')
    if len(windows) > MAX_WINDOWS:
        raise refuse(f'{len(windows)} windows')
    out: list[RateWindow] = []
    for i, item in enumerate(windows):
        if isinstance(item, RateWindow):
            out.append(item)
            continue
        if not isinstance(item, (list, tuple)) or len(item) not in (2, 3):
            raise refuse(f'windows[{i}] = {item!r} is not (limit, per) or (limit, per, burst)')
        try:
            out.append(RateWindow(*item))
        except InvalidArgument as exc:
            raise refuse(f'windows[{i}] = {item!r}: {exc}') from None
    periods = [w.per for w in out]
    twice = next((per for per in periods if periods.count(per) > 1), None)
    if twice is not None:
        raise refuse(f'per={twice} is given twice (one window per period)')
    return tuple(sorted(out, key=lambda w: w.per))


def windows_of(limit: Any, per: Any, burst: Any, windows: Any = None) -> tuple[RateWindow, ...]:
    """The windows of a rate given as ``limit, per, burst`` (one) or as ``windows`` (:func:`check_windows`), checked:
    an :class:`InvalidArgument` naming the argument and the value. ``limit, per, burst`` beside ``windows`` must be
    unset (None, 1, 1) or its first window's."""
    if windows is None:
        check_rate(limit, per, burst)
        return (RateWindow(limit, per, burst),)
    found = check_windows(windows)
    if limit is not None and (limit, per, burst) != window_tuples(found)[0]:
        raise InvalidArgument('windows', message=(
            f'windows replaces limit, per and burst: give one or the other, got limit={limit!r}, per={per!r}, '
            f'burst={burst!r} and windows={windows!r}'))
    return found


def rate_setting(windows: tuple[RateWindow, ...]) -> str:
    """A rate as the fetch script reads it, on a job hash and in the settings hashes: ``'<limits> <pers> <bursts>'``,
    each a comma-separated list, one entry per window (``'5 1 2'``, one window, as before windows existed)."""
    return ' '.join(','.join(str(getattr(w, name)) for w in windows) for name in ('limit', 'per', 'burst'))


def read_rate(raw: Any) -> tuple[RateWindow, ...] | None:
    """A rate as :func:`rate_setting` stores it (bytes or str), or None when ``raw`` is None or not one."""
    if raw is None:
        return None
    words = text(raw).split(' ')
    if len(words) != 3:
        return None
    columns = [word.split(',') for word in words]
    if len({len(c) for c in columns}) != 1 or not all(n.isascii() and n.isdigit() for c in columns for n in c):
        return None
    try:
        return tuple(RateWindow(int(limit), int(per), int(burst)) for limit, per, burst in zip(*columns))
    except InvalidArgument:
        return None


def read_tat(raw: Any, interval: float, now: float) -> float:
    """A stored arrival time (``'<tat> <interval>'``) under ``interval``, as ``lua/lib/rate_tat.lua`` reads it: the
    starts still owed keep their count at a changed rate."""
    if raw is None:
        return now
    parts = text(raw).split()
    tat = float(parts[0])
    if tat <= now:
        return now
    was = float(parts[1]) if len(parts) > 1 else interval
    return now + (tat - now) / was * interval if was > 0 and was != interval else tat


def read_tats(raw: Any, windows: tuple[RateWindow, ...], now: float) -> list[float]:
    """Each window's arrival time under its interval, as ``lua/lib/rate_windows.lua`` reads them from one stored
    string: ``'<tat> <interval>'`` (one window's layout: it counts for every window) or ``'<tat> <interval> <per>'``
    per window (a window reads the entry of its period; none: nothing owed)."""
    words = [] if raw is None else text(raw).split()
    if len(words) <= 2:
        return [read_tat(raw, w.interval, now) for w in windows]
    stored = {words[n + 2]: f'{words[n]} {words[n + 1]}' for n in range(0, len(words) - 2, 3)}
    return [read_tat(stored.get(str(w.per)), w.interval, now) for w in windows]


def rate_status(rate: GcraRate | None, raw_tat: Any, blocked: Any, now: float) -> RateStatus | None:
    """The :class:`RateStatus` of a rate whose stored arrival times are ``raw_tat`` and back-off end ``blocked``
    (None: none), at server time ``now``; None without a rate and a back-off. A rate of several windows: the fewest
    starts any window allows, the latest next start and the window holding it."""
    until = float(blocked) if blocked is not None and float(blocked) > now else None
    if rate is None:
        return None if until is None else RateStatus(0, until, until)
    windows = getattr(rate, 'windows', None) or (rate,)
    available, next_at, held_by = None, now, None
    for window, tat in zip(windows, read_tats(raw_tat, windows, now)):
        tolerance = (window.burst - 1) * window.interval
        its_next = max(now, tat - tolerance)
        its_available = min(window.burst, max(0, math.floor((now + tolerance - tat) / window.interval + 1e-9) + 1))
        available = its_available if available is None else min(available, its_available)
        if its_next > next_at:
            next_at, held_by = its_next, window
    assert available is not None
    held_by = held_by if len(windows) > 1 else None
    if until is not None:
        return RateStatus(0, max(next_at, until), until, held_by)
    return RateStatus(available, next_at, None, held_by)


def unknown_scope(policy: str, scope: str, hint: str) -> str:
    """The refusal of an admin call naming a scope no ``policy`` (``'Fair'``) is known to use, with ``hint``
    (``'pass force=True to pause it anyway'``)."""
    return (f'scope {scope!r} is unknown: no {policy} policy declares it in this process, it is not the import path '
            f'of a function declaring one, and Redis holds no state of it. A typo? ({hint})')


@contextmanager
def refusing() -> Iterator[None]:
    """Turn an :class:`InvalidArgument` (or a ValueError or TypeError) of argument checking into :class:`InvalidSetting`
    (same argument, same message)."""
    try:
        yield
    except InvalidSetting:
        raise
    except InvalidArgument as exc:
        raise InvalidSetting(exc.argument, message=str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise InvalidSetting(str(exc).split(' ', 1)[0], message=str(exc)) from None


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
    call = Call('clear_setting', field=field, wake=wake, message=message)
    call.key('settings', settings)
    call.key_list('also', list(also))
    return call.answered().run(connection) == 1


def warn_unknown_queue(connection: Any, name: str, what: str) -> None:
    """Warn (:class:`UnknownQueueWarning`) when ``name`` is a queue nothing has seen: not in rq's queue set, not
    configured by any policy, listened to by no live worker, and not declared in this process's code (no PolicyQueue
    of that name built here). ``what`` is the call (``QueueSlot.set``). Never on fakeredis: a unit test's server
    starts empty, so every queue is new there."""
    if type(connection).__module__.startswith('fakeredis') or declared_queue(name):
        return
    if not known_queue(connection, name):
        warnings.warn(f'{what}: queue {name!r} is unknown (rq has no such queue, no policy setting names it and no '
                      'worker listens to it); the setting is stored anyway. A typo?', UnknownQueueWarning,
                      stacklevel=3)
