"""QueueRate: at most ``limit`` job starts of a queue every ``per`` seconds across the whole cluster, checked at fetch.

A GCRA on the server's clock (``lua/policies/queue_rate.lua``): one key per limited queue holds its theoretical
arrival time (``rq:policies:tat:<queue>``); a start is allowed when that time, less the tolerance ``(burst - 1) *
per / limit``, is not in the future, and moves it on by ``per / limit``. Exact, O(1), no per-start entries and no
reaper: the key expires once its time is past, where it allows as much as no key at all.

The check runs in the fetch script together with the pop and any QueueSlot hold (:mod:`rq_policies.engine.fetch`), so a
start the rate does not allow never pops, and a start refused by a cap consumes no rate. A limited queue is skipped
and the worker serves its other queues in rq's order; a worker whose queues are all limited sleeps until the
earliest time one of them allows a start (the script tells it), or until a push, release or setting change wakes it.

The settings live in Redis (``rq:policies:rate``), like QueueSlot's capacity, so every PolicyWorker obeys the same
numbers and an operator changes them without a deploy. The same policy owns BackOff's block
(``rq:policies:backoff``) and what happens to a job that raises :class:`~rq_policies.engine.exceptions.Snooze` or
:class:`~rq_policies.engine.exceptions.BackOff`.

The name is not ``RateLimit``: rq 3 exports ``rq.RateLimit(key, concurrency)``, a concurrency limit at enqueue.
QueueSlot caps how many run, QueueRate how many start per unit of time.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from redis import Redis

from rq_policies.engine import compat, keys
from rq_policies.engine.admin import clear_setting, refusing, warn_unknown_queue
from rq_policies.engine.exceptions import BackOff, Snooze, SnoozeLimitReached, UnknownQueueWarning
from rq_policies.engine.ledger import WAKE_CAPACITY, wake_up
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import server_now as _server_now
from rq_policies.engine.ops import text, time_in
from rq_policies.engine.policy import MAX_CAPACITY, FetchPolicy, positive_int, whole_seconds
from rq_policies.engine.views import (
    Argument,
    BadArgument,
    Cell,
    Digits,
    Metric,
    Option,
    Panel,
    Reply,
    Row,
    Section,
    Setting,
    Shown,
    UsageError,
    Values,
    View,
)
from rq_policies.policies.queue_slot.rules import queue_name

__all__ = ['BACKOFFS_META', 'SNOOZES_META', 'BackOff', 'QueueRate', 'RateStatus', 'Snooze', 'SnoozeLimitReached']

#: The job's meta key counting how often it was snoozed, and how often it backed its queue off.
SNOOZES_META = 'policies_snoozes'
BACKOFFS_META = 'policies_backoffs'


@dataclass(frozen=True)
class RateSetting:
    """A queue's rate as ``info --json`` shows it: ``{'limit', 'per', 'burst'}``."""

    limit: int
    per: int
    burst: int


@dataclass(frozen=True)
class RateState(Section):
    """QueueRate's part of a queue in ``rq-policies info``: its rate (None: none), the starts it allows now and
    the server time of the next one (None without a rate), and a back-off's end and seconds left (None: none);
    ``--json`` shows these fields as they are named."""

    rate: RateSetting | None
    rate_available: int | None
    rate_next_at: float | None
    backoff_until: float | None
    backoff_seconds_left: float | None

    def headline(self) -> str:
        words = []
        if self.rate:
            words.append(f'rate {self.rate.limit}/{self.rate.per}s burst {self.rate.burst}, {self.rate_available} '
                         'available')
        if self.backoff_until:
            words.append(f'backed off for {self.backoff_seconds_left:.0f} s more')
        return ', '.join(words)

    def rows(self, shown: Shown) -> list[Row | str]:
        """The starts available and when the next is allowed, and a back-off's end (local time and how far from
        now, measured on the server clock the state was read at)."""
        from rq_policies.engine.readable import at

        lines: list[Row | str] = []
        if self.rate and self.rate_next_at is not None:
            when = 'now' if self.rate_next_at <= shown.now else at(self.rate_next_at, shown.now)
            lines.append(Row('rate', f'{self.rate_available} start(s) available, next start {when}'))
        if self.backoff_until:
            lines.append(Row('backoff', f'no start until {at(self.backoff_until, shown.now)}'))
        return lines


@dataclass(frozen=True)
class RateStatus:
    """A limited queue's rate right now (server clock).

    Attributes:
        available: starts allowed at once now (0 to ``burst``; 0 also while a back-off blocks the queue).
        next_at: the server time (epoch s) the next start is allowed (now, when one is available).
        backoff_until: the server time a BackOff blocks the queue until, or None.
    """

    available: int
    next_at: float
    backoff_until: float | None = None


class GcraRate:
    """What a GCRA rate (``limit`` starts every ``per`` seconds, up to ``burst`` at once) derives from its numbers;
    shared by :class:`QueueRate` and the per-key ``Rate``."""

    limit: int
    per: int
    burst: int

    @property
    def interval(self) -> float:
        """Seconds between two starts at the sustained rate (the GCRA's emission interval)."""
        return self.per / self.limit


@dataclass(frozen=True)
class QueueRate(FetchPolicy, GcraRate):
    """A queue's start rate: ``limit`` starts every ``per`` seconds, up to ``burst`` at once after a quiet spell.

    Used through classmethods (:meth:`set`, :meth:`get`, :meth:`clear`, :meth:`status`, the shape every run-time
    setting has: :mod:`rq_policies.engine.admin`): the setting lives in Redis, not on a function. An instance is what
    :meth:`set` and :meth:`get` return.
    """

    name: ClassVar[str] = 'queue_rate'
    #: No queue is limited or blocked while these are absent (see :attr:`FetchPolicy.fetch_state`).
    fetch_state: ClassVar[tuple[str, ...] | None] = ('queue_rate.settings', 'queue_rate.backoff')

    limit: int
    per: int = 1
    burst: int = 1

    def __post_init__(self) -> None:
        check(self.limit, self.per, self.burst)

    def __repr__(self) -> str:
        return f'QueueRate(limit={self.limit}, per={self.per}, burst={self.burst})'

    # -- the setting ----------------------------------------------------------------------------------------------

    @classmethod
    def set(cls, queue: Any, limit: int, per: int = 1, burst: int = 1, connection: Redis | None = None) -> QueueRate:
        """Limit ``queue`` to ``limit`` job starts every ``per`` seconds across the cluster, up to ``burst`` at once.

        Stored in Redis: every PolicyWorker's next fetch obeys it. Idle PolicyWorkers are woken, so a raised rate is
        used at once. The starts already owed keep their count and are paid at the new rate, so a change never
        grants a fresh burst by itself.

        Args:
            queue: queue name or Queue.
            limit: starts per ``per`` seconds, a positive integer.
            per: the period, whole seconds >= 1.
            burst: starts allowed at once after a quiet spell, 1 to ``limit``.
            connection: the Redis connection.

        Returns:
            The rate now set.

        Raises:
            InvalidSetting: (a ValueError) naming the argument and the value; nothing is written.

        Warns:
            UnknownQueueWarning: ``queue`` is unknown to rq, to every policy setting and to every live worker (perhaps
                a typo); the rate is set anyway (``rq-policies rate`` refuses it without ``--force``).
        """
        with refusing():
            name = queue_name(queue)
            rate = cls(limit, per, burst)
            conn = _need(connection)
        warn_unknown_queue(conn, name, 'QueueRate.set')
        with conn.pipeline(transaction=False) as pipe:
            pipe.hset(keys.RATE, name, f'{rate.limit} {rate.per} {rate.burst}')
            wake_up(pipe, keys.wake(name), WAKE_CAPACITY)
            pipe.execute()
        return rate

    @classmethod
    def get(cls, queue: Any, connection: Redis | None = None) -> QueueRate | None:
        """The rate of ``queue``, or None when it is unlimited."""
        with refusing():
            name = queue_name(queue)
            conn = _need(connection)
        return parse(conn.hget(keys.RATE, name))

    @classmethod
    def clear(cls, queue: Any, connection: Redis | None = None) -> bool:
        """Remove the rate of ``queue`` (its arrival time expires by itself). Returns True when it had one."""
        with refusing():
            name = queue_name(queue)
            conn = _need(connection)
        return clear_setting(conn, keys.RATE, name, keys.wake(name), WAKE_CAPACITY, also=(keys.rate_tat(name),))

    @classmethod
    def status(cls, queue: Any, connection: Redis | None = None) -> RateStatus | None:
        """How many starts ``queue`` allows now and when the next one is allowed; None when it has no rate and no
        back-off. The state reading of the admin API (:mod:`rq_policies.engine.admin`)."""
        with refusing():
            name = queue_name(queue)
            conn = _need(connection)
        with conn.pipeline(transaction=False) as pipe:
            time_in(pipe)
            pipe.hget(keys.RATE, name)
            pipe.get(keys.rate_tat(name))
            pipe.zscore(keys.BACKOFF, name)
            (seconds, micros), raw, tat, blocked = pipe.execute()
        return _status(parse(raw), tat, blocked, seconds + micros / 1e6)

    @classmethod
    def backoff(cls, queue: Any, seconds: float, connection: Redis | None = None) -> float:
        """Block ``queue`` for ``seconds`` (server clock), as a job raising :class:`BackOff` does; a block that
        already ends later is kept. Returns the server time the block ends."""
        name = queue_name(queue)
        delay = BackOff(seconds).seconds
        conn = _need(connection)
        with conn.pipeline(transaction=False) as pipe:
            _backoff_in(pipe, name, delay, _server_now(conn))
            pipe.execute()
        return float(conn.zscore(keys.BACKOFF, name) or 0.0)

    # -- the fetch (lua/policies/queue_rate.lua) ------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key('queue_rate.settings', keys.RATE)
        call.key('queue_rate.backoff', keys.BACKOFF)
        call.key_list('queue_rate.tat', [keys.rate_tat(name) for name in queue_names])

    # -- a job raised Snooze or BackOff ---------------------------------------------------------------------------

    @classmethod
    def on_job_exception(cls, job: Any, queue: Any, exc: BaseException, pipeline: Any) -> bool:
        if isinstance(exc, Snooze):
            count = int(job.meta.get(SNOOZES_META, 0)) + 1
            if count > exc.max_snoozes:
                raise SnoozeLimitReached(
                    f'job {job.id} raised Snooze({exc.seconds:g}) after {count - 1} snoozes: max_snoozes='
                    f'{exc.max_snoozes} reached, so it fails'
                ) from exc
            job.meta[SNOOZES_META] = count
            # the server's clock, as the fetch that promotes the job reads it: no host clock decides when it is due.
            # rq's scheduled registry keeps whole seconds (it truncates), so round up: never due before `seconds`.
            due = math.ceil(_server_now(queue.connection) + exc.seconds)
            when = datetime.fromtimestamp(due, timezone.utc)
            queue.schedule_job(job, when, pipeline=pipeline)  # saves the job, meta included
            return True
        if isinstance(exc, BackOff) and not exc.key:  # BackOff(key=True) is the per-key policies'
            job.meta[BACKOFFS_META] = int(job.meta.get(BACKOFFS_META, 0)) + 1
            _backoff_in(pipeline, queue.name, exc.seconds, _server_now(queue.connection))
            compat.enqueue_now(queue, job, pipeline=pipeline, at_front=True)  # saves the job, meta included
            return True
        return False

    # -- the contract suite's settings ----------------------------------------------------------------------------

    @classmethod
    def configure(cls, connection: Any, queue: str, **settings: Any) -> None:
        cls.set(queue, connection=connection, **settings)

    @classmethod
    def unconfigure(cls, connection: Any, queue: str) -> None:
        cls.clear(queue, connection=connection)

    @classmethod
    def setting_examples(cls) -> tuple[dict[str, Any], ...]:
        return ({'limit': 1, 'per': 60}, {'limit': 10, 'per': 3600, 'burst': 1})

    # -- state, metrics, the CLI -----------------------------------------------------------------------------------

    @classmethod
    def configured_queues(cls, connection: Any) -> set[str]:
        return {text(name) for name in connection.hkeys(keys.RATE)}

    @classmethod
    def queue_info(cls, connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, Section]:
        return dict(cls.rate_states(connection, names, now))

    @classmethod
    def rate_states(cls, connection: Redis, names: list[str], now: float) -> dict[str, RateState]:
        """Per queue name, its rate, the starts it allows now and a back-off: what ``info``, the dashboard and the
        metrics show."""
        rates = {text(k): parse(v) for k, v in connection.hgetall(keys.RATE).items()}
        blocks = {text(k): float(v) for k, v in connection.zrangebyscore(keys.BACKOFF, f'({now:.6f}', '+inf',
                                                                          withscores=True)}
        with connection.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.get(keys.rate_tat(name))
            tats = pipe.execute()
        out: dict[str, RateState] = {}
        for name, tat in zip(names, tats):
            rate = rates.get(name)
            status = _status(rate, tat, blocks.get(name), now)
            out[name] = RateState(
                rate=None if rate is None else RateSetting(rate.limit, rate.per, rate.burst),
                rate_available=status.available if status and rate else None,
                rate_next_at=status.next_at if status and rate else None,
                backoff_until=blocks.get(name),
                backoff_seconds_left=round(blocks[name] - now, 3) if name in blocks else None,
            )
        return out

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """The dashboard's rates panel: per queue with a rate or a back-off, the rate, the starts allowed now, when
        the next start is allowed and when a back-off ends (local time and how far from now)."""
        names = sorted(cls.configured_queues(connection)
                       | {text(m) for m in connection.zrangebyscore(keys.BACKOFF, f'({now:.6f}', '+inf')})
        names = [name for name in names if not search or search in name]
        rows = []
        for name, entry in cls.rate_states(connection, names[:limit], now).items():
            rate = entry.rate
            left = entry.backoff_seconds_left
            rows.append([
                name,
                f'{rate.limit}/{rate.per}s burst {rate.burst}' if rate else None,
                entry.rate_available,
                ('now' if entry.rate_next_at is not None and entry.rate_next_at <= now
                 else Cell(at=(entry.rate_next_at or now) - now)) if rate else None,
                Cell(note='until', at=left, warn=True) if left else None,
            ])
        if not rows:
            return []
        return [Panel('Queue rates (QueueRate)', ['queue', 'rate', 'starts available', 'next start', 'backed off'],
                      rows, f'{len(rows)} of {len(names)} queues listed' if len(names) > len(rows) else '')]

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[Metric]:
        limit = Metric('rq_policies_queue_rate_per_second', 'QueueRate of a queue: job starts allowed per second.',
                       ('queue',))
        available = Metric('rq_policies_queue_rate_available', 'QueueRate starts a queue allows at once now.',
                           ('queue',))
        backoff = Metric('rq_policies_queue_backoff_seconds', 'Seconds left of a BackOff blocking a queue.',
                         ('queue',))
        names = sorted(cls.configured_queues(connection)
                       | {text(m) for m in connection.zrangebyscore(keys.BACKOFF, f'({now:.6f}', '+inf')})
        for name, entry in cls.rate_states(connection, names, now).items():
            if entry.rate:
                limit.add([name], entry.rate.limit / entry.rate.per)
                available.add([name], entry.rate_available or 0)
            if entry.backoff_seconds_left:
                backoff.add([name], entry.backoff_seconds_left)
        return [limit, available, backoff]

    @classmethod
    def commands(cls) -> tuple[View, ...]:
        """``rq-policies rate``."""
        return (Setting(
            'rate', 'Limit QUEUE to LIMIT job starts every PER across the cluster (100/60s, 5/1m, 10/1h, 3/1), '
                    'remove\nthe limit with --clear, or show it (no LIMIT/PER).',
            targets=(Argument('queue'),),
            value=Argument('rate', metavar='LIMIT/PER'),
            options=(Option('--burst', 'burst', 'Starts allowed at once after a quiet spell (1 to LIMIT; 1).'),),
            clear_help='Remove the rate.',
            force_help='Limit a queue rq does not know yet.',
            json_help='Print the rate and the starts available as JSON.',
            prepare=_rate_prepare, status=_rate_status, set=_rate_set, clear=_rate_clear,
        ),)


def _rate_prepare(values: Values, mode: str) -> Values:
    """The rate given (``new``), read before the command connects."""
    if values['rate'] is None and values['burst'] is not None:
        raise UsageError('--burst goes with LIMIT/PER')
    if mode != 'set':
        return values
    limit, per = parse_rate(str(values['rate']))
    burst = values['burst']
    size = Digits(f'a positive integer up to {MAX_CAPACITY}', 1, MAX_CAPACITY).parse(burst, '--burst') \
        if burst is not None else 1
    try:
        new = QueueRate(limit, per, size)
    except ValueError as exc:
        raise BadArgument(str(exc), '--burst' if 'burst' in str(exc) else 'LIMIT/PER') from None
    return {**values, 'new': new}


def _rate_set(conn: Redis, values: Values) -> Reply:
    queue, new = str(values['queue']), values['new']
    assert isinstance(new, QueueRate)
    was = _was(conn, queue)
    with warnings.catch_warnings():  # refused unless --force: the operator meant it
        warnings.simplefilter('ignore', UnknownQueueWarning)
        QueueRate.set(queue, new.limit, new.per, new.burst, connection=conn)
    return _rate_changed(conn, values, f'Queue {queue!r} is limited to {new.limit} starts every {new.per}s, burst '
                                       f'{new.burst} ({was}).')


def _rate_clear(conn: Redis, values: Values) -> Reply:
    queue = str(values['queue'])
    was = _was(conn, queue)
    QueueRate.clear(queue, connection=conn)
    return _rate_changed(conn, values, f'Queue {queue!r} has no rate ({was}).')


def _was(conn: Redis, queue: str) -> str:
    before = QueueRate.get(queue, connection=conn)
    return f'was {before.limit}/{before.per}s burst {before.burst}' if before else 'was unlimited'


def _rate_changed(conn: Redis, values: Values, message: str) -> Reply:
    return _rate_status(conn, values) if values['as_json'] else Reply((message,))


def _rate_status(conn: Redis, values: Values) -> Reply:
    """``rq-policies rate QUEUE``: the rate, the starts available now and the next one (local time), a back-off."""
    from rq_policies.engine.readable import at

    queue = str(values['queue'])
    rate, status, now = QueueRate.get(queue, connection=conn), QueueRate.status(queue, connection=conn), \
        _server_now(conn)
    if values['as_json']:
        return Reply(data={
            'queue': queue, 'rate': None if rate is None else {'limit': rate.limit, 'per': rate.per,
                                                                 'burst': rate.burst},
            'available': None if status is None else status.available,
            'next_at': None if status is None else status.next_at,
            'backoff_until': None if status is None else status.backoff_until, 'server_time': now,
        })
    lines = []
    if rate is None:
        lines.append(f'Queue {queue!r} has no rate.')
    else:
        assert status is not None
        when = 'now' if status.next_at <= now else at(status.next_at, now)
        lines.append(f'Queue {queue!r} is limited to {rate.limit} starts every {rate.per}s, burst {rate.burst}: '
                     f'{status.available} available, next start {when}.')
    if status is not None and status.backoff_until is not None:
        lines.append(f'Backed off: no start until {at(status.backoff_until, now)}.')
    return Reply(tuple(lines))


_UNITS = {'': 1, 's': 1, 'm': 60, 'h': 3600, 'd': 86400}


def parse_rate(raw: str) -> tuple[int, int]:
    """``'100/60s'`` as ``(100, 60)``: LIMIT/PER with PER in whole seconds, minutes, hours or days (``s`` by default).

    Raises:
        rq_policies.engine.views.BadArgument naming LIMIT/PER and the value (a ValueError).
    """
    head, sep, tail = raw.partition('/')
    unit = tail[-1:] if tail[-1:] in _UNITS else ''
    number = tail[: len(tail) - len(unit)]
    if not sep or not head.isascii() or not head.isdigit() or not number.isascii() or not number.isdigit():
        raise BadArgument(f'expected LIMIT/PER such as 100/60s, 5/1m or 3/1, got {raw!r}', 'LIMIT/PER')
    limit, per = int(head), int(number) * _UNITS[unit]
    try:
        check(limit, per, 1)
    except ValueError as exc:
        raise BadArgument(f'{exc} (in {raw!r})', 'LIMIT/PER') from None
    return limit, per


def check(limit: Any, per: Any, burst: Any) -> None:
    """Refuse a bad rate with a ValueError naming the argument and the value."""
    positive_int('limit', limit, MAX_CAPACITY)
    whole_seconds('per', per)
    positive_int('burst', burst, MAX_CAPACITY)
    if burst > limit:
        raise ValueError(f'burst must be at most limit ({limit}), got {burst!r}')


def parse(raw: Any) -> QueueRate | None:
    """A stored setting (``'<limit> <per> <burst>'``) as a QueueRate, or None."""
    if raw is None:
        return None
    limit, per, burst = (int(part) for part in text(raw).split())
    return QueueRate(limit, per, burst)


def _status(rate: QueueRate | None, raw_tat: Any, blocked: Any, now: float) -> RateStatus | None:
    until = float(blocked) if blocked is not None and float(blocked) > now else None
    if rate is None:
        return None if until is None else RateStatus(0, until, until)
    tat = read_tat(raw_tat, rate.interval, now)
    tolerance = (rate.burst - 1) * rate.interval
    next_at = max(now, tat - tolerance)
    available = min(rate.burst, max(0, math.floor((now + tolerance - tat) / rate.interval + 1e-9) + 1))
    if until is not None:
        return RateStatus(0, max(next_at, until), until)
    return RateStatus(available, next_at, None)


def read_tat(raw: Any, interval: float, now: float) -> float:
    """A stored arrival time (``'<tat> <interval>'``) under ``interval``, as ``lua/policies/queue_rate.lua`` reads it:
    the starts still owed keep their count at a changed rate."""
    if raw is None:
        return now
    parts = text(raw).split()
    tat = float(parts[0])
    if tat <= now:
        return now
    was = float(parts[1]) if len(parts) > 1 else interval
    return now + (tat - now) / was * interval if was > 0 and was != interval else tat


def _backoff_in(pipe: Any, name: str, seconds: float, now: float) -> None:
    """Queue onto ``pipe`` a block of queue ``name`` until ``now + seconds``, kept when one ends later (ZADD GT)."""
    pipe.zadd(keys.BACKOFF, {name: round(now + seconds, 6)}, gt=True)
    pipe.zremrangebyscore(keys.BACKOFF, '-inf', f'({now:.6f}')


