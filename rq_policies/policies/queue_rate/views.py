"""QueueRate: what it shows (its rates and back-offs in ``info``, on the dashboard and in the metrics; ``rq-policies
rate``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from redis import Redis

from rq_policies.engine import keys, views
from rq_policies.engine.admin import RateWindow, check_rate, rate_now_words, rate_status
from rq_policies.engine.exceptions import UnknownQueueWarning
from rq_policies.engine.ops import server_now, text
from rq_policies.engine.policy import MAX_CAPACITY
from rq_policies.engine.readable import at

from .rules import QueueRate, parse


@dataclass(frozen=True)
class RateSetting:
    """A queue's rate (or one window of it) as ``info --json`` shows it: ``{'limit', 'per', 'burst'}``."""

    limit: int
    per: int
    burst: int

    @classmethod
    def of(cls, window: RateWindow | None) -> RateSetting | None:
        return None if window is None else cls(window.limit, window.per, window.burst)


@dataclass(frozen=True)
class RateState(views.Section):
    """QueueRate's part of a queue in ``rq-policies info``: its rate (None: none; with several windows, the first),
    the starts it allows now and the server time of the next one (None without a rate), a back-off's end and
    seconds left (None: none), and with several windows all of them and the one holding the next start (None: a
    rate of one window, or a start is available); ``--json`` shows these fields as they are named."""

    rate: RateSetting | None
    rate_available: int | None
    rate_next_at: float | None
    backoff_until: float | None
    backoff_seconds_left: float | None
    rate_windows: tuple[RateSetting, ...] | None = None
    rate_held_by: RateSetting | None = None

    def rate_words(self) -> str:
        """``5/1s burst 2``, or every window's joined by `` + ``."""
        return ' + '.join(f'{w.limit}/{w.per}s burst {w.burst}' for w in self.rate_windows or (self.rate,) if w)

    def headline(self) -> str:
        words = []
        if self.rate:
            words.append(f'rate {self.rate_words()}, {self.rate_available} available')
        if self.backoff_until:
            words.append(f'backed off for {self.backoff_seconds_left:.0f} s more')
        return ', '.join(words)

    def rows(self, shown: views.Shown) -> list[views.Row | str]:
        """The starts available and when the next is allowed, and a back-off's end (local time and how far from
        now, measured on the server clock the state was read at)."""
        lines: list[views.Row | str] = []
        if self.rate and self.rate_next_at is not None:
            when = 'now' if self.rate_next_at <= shown.now else at(self.rate_next_at, shown.now)
            held = '' if self.rate_held_by is None else f' (held by its {self.rate_held_by.per} s window)'
            lines.append(views.Row('rate', f'{self.rate_available} start(s) available, next start {when}{held}'))
        if self.backoff_until:
            lines.append(views.Row('backoff', f'no start until {at(self.backoff_until, shown.now)}'))
        return lines


class QueueRateViews(views.PolicyViews):
    policy = QueueRate
    queue_settings = ('limit', 'per', 'burst')

    @classmethod
    def check_setting(cls, settings: dict[str, int]) -> None:
        if 'limit' not in settings:
            raise ValueError('limit is required for a rate')
        QueueRate(settings['limit'], settings.get('per', 1), settings.get('burst', 1))

    @classmethod
    def explain(cls, connection: Redis, job: dict[str, str], now: float) -> list[views.Explanation]:
        """A queued job's queue rate (or back-off): the starts it allows now, or when it allows the next and, with
        several windows, the window holding it."""
        queue = job.get('origin')
        if job.get('status') != 'queued' or not queue:
            return []
        state = cls.rate_states(connection, [queue], now)[queue]
        if state.rate is None and state.backoff_until is None:
            return []
        entry: dict[str, object] = {'queue': queue, 'available': state.rate_available,
                                    'next_at': state.rate_next_at, 'backoff_until': state.backoff_until}
        if state.rate is not None:
            entry.update(limit=state.rate.limit, per=state.rate.per, burst=state.rate.burst)
        if state.rate_windows:
            entry['windows'] = [views.plain(w) for w in state.rate_windows]
            entry['held_by'] = None if state.rate_held_by is None else views.plain(state.rate_held_by)
        if state.rate is None:
            words = f'queue {queue!r} has no rate'
        else:
            words = f'queue {queue!r} rate {state.rate_words()}: ' + rate_now_words(
                state.rate_available, state.rate_next_at, state.rate_held_by, now)
        change = ''
        if state.backoff_until is not None:
            words += f', backed off for {state.backoff_seconds_left:.1f} s more'
            change = 'the back-off ends on its own (a job raising BackOff, or QueueRate.backoff, set it)'
        elif state.rate is not None and not state.rate_available:
            change = 'a PolicyWorker takes it when the queue\'s rate allows a start (QueueRate.set changes the rate)'
        return [views.Explanation(cls.name, words, change, entry)]

    @classmethod
    def queue_info(cls, connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, views.Section]:
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
            status = rate_status(rate, tat, blocks.get(name), now)
            several = rate is not None and len(rate.windows) > 1
            out[name] = RateState(
                rate=None if rate is None else RateSetting(rate.limit, rate.per, rate.burst),
                rate_available=status.available if status and rate else None,
                rate_next_at=status.next_at if status and rate else None,
                backoff_until=blocks.get(name),
                backoff_seconds_left=round(blocks[name] - now, 3) if name in blocks else None,
                rate_windows=tuple(RateSetting.of(w) for w in rate.windows) if several else None,  # type: ignore
                rate_held_by=RateSetting.of(status.held_by) if several and status else None,
            )
        return out

    @classmethod
    def panels(cls, connection: Redis, now: float, limit: int, search: str | None = None) -> list[views.Panel]:
        """The dashboard's rates panel: per queue with a rate or a back-off, the rate, the starts allowed now, when
        the next start is allowed and when a back-off ends (local time and how far from now)."""
        names = [name for name in _limited(connection, now) if not search or search in name]
        rows = []
        for name, entry in cls.rate_states(connection, names[:limit], now).items():
            rate = entry.rate
            left = entry.backoff_seconds_left
            rows.append([
                name,
                entry.rate_words() if rate else None,
                entry.rate_available,
                ('now' if entry.rate_next_at is not None and entry.rate_next_at <= now
                 else views.Cell(at=(entry.rate_next_at or now) - now)) if rate else None,
                views.Cell(note='until', at=left, warn=True) if left else None,
            ])
        if not rows:
            return []
        return [views.Panel('Queue rates (QueueRate)',
                            ['queue', 'rate', 'starts available', 'next start', 'backed off'], rows,
                            f'{len(rows)} of {len(names)} queues listed' if len(names) > len(rows) else '')]

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[views.Metric]:
        limit, available, backoff = (views.Metric(name, words, ('queue',)) for name, words in (
            ('rq_policies_queue_rate_per_second', 'QueueRate of a queue: job starts allowed per second.'),
            ('rq_policies_queue_rate_available', 'QueueRate starts a queue allows at once now.'),
            ('rq_policies_queue_backoff_seconds', 'Seconds left of a BackOff blocking a queue.')))
        for name, entry in cls.rate_states(connection, _limited(connection, now), now).items():
            if entry.rate:  # the sustained rate: the slowest window's
                limit.add([name], min(w.limit / w.per for w in entry.rate_windows or (entry.rate,)))
                available.add([name], entry.rate_available or 0)
            if entry.backoff_seconds_left:
                backoff.add([name], entry.backoff_seconds_left)
        return [limit, available, backoff]

    @classmethod
    def commands(cls) -> tuple[views.View, ...]:
        """``rq-policies rate``."""
        return (views.Setting(
            'rate', 'Limit QUEUE to LIMIT job starts every PER across the cluster (100/60s, 5/1m, 10/1h, 3/1; '
                    'several\nwindows, all kept: 100/1s,1000/1h), remove the limit with --clear, or show it (no '
                    'LIMIT/PER).',
            targets=(views.Argument('queue'),),
            value=views.Argument('rate', metavar='LIMIT/PER'),
            options=(views.Option('--burst', 'burst', 'Starts allowed at once after a quiet spell (1 to LIMIT; 1); '
                                                      'with several windows, one per window (100,500).'),),
            clear_help='Remove the rate.',
            force_help='Limit a queue rq does not know yet.',
            json_help='Print the rate and the starts available as JSON.',
            prepare=_rate_prepare, status=_rate_status, set=_rate_set, clear=_rate_clear,
        ),)


def _limited(connection: Redis, now: float) -> list[str]:
    """The queues with a rate or a live back-off, sorted."""
    return sorted({text(name) for name in connection.hkeys(keys.RATE)}
                  | {text(m) for m in connection.zrangebyscore(keys.BACKOFF, f'({now:.6f}', '+inf')})


def _rate_prepare(values: views.Values, mode: str) -> views.Values:
    """The rate given (``new``), read before the command connects."""
    if values['rate'] is None and values['burst'] is not None:
        raise views.UsageError('--burst goes with LIMIT/PER')
    if mode != 'set':
        return values
    rates = [parse_rate(part) for part in str(values['rate']).split(',')]
    burst = values['burst']
    digits = views.Digits(f'a positive integer up to {MAX_CAPACITY}', 1, MAX_CAPACITY)
    sizes = [1] * len(rates) if burst is None else [digits.parse(b, '--burst') for b in str(burst).split(',')]
    if len(sizes) != len(rates):
        raise views.BadArgument(f'--burst must give one burst per window: {len(rates)} windows, got {burst!r}',
                                '--burst')
    try:
        if len(rates) == 1:
            new = QueueRate(rates[0][0], rates[0][1], sizes[0])
        else:
            new = QueueRate(windows=[(limit, per, size) for (limit, per), size in zip(rates, sizes)])
    except ValueError as exc:
        raise views.BadArgument(str(exc), '--burst' if 'burst' in str(exc) else 'LIMIT/PER') from None
    return {**values, 'new': new}


def _rate_set(conn: Redis, values: views.Values) -> views.Reply:
    queue, new = str(values['queue']), values['new']
    assert isinstance(new, QueueRate)
    was = _was(conn, queue)
    with warnings.catch_warnings():  # refused unless --force: the operator meant it
        warnings.simplefilter('ignore', UnknownQueueWarning)
        QueueRate.set(queue, windows=new.windows, connection=conn)
    return _rate_changed(conn, values, f'Queue {queue!r} is limited to {_limited_to(new)} ({was}).')


def _limited_to(rate: QueueRate) -> str:
    """``100 starts every 60s, burst 10``, each window's joined by `` and ``."""
    return ' and '.join(f'{w.limit} starts every {w.per}s, burst {w.burst}' for w in rate.windows)


def _rate_clear(conn: Redis, values: views.Values) -> views.Reply:
    queue = str(values['queue'])
    was = _was(conn, queue)
    QueueRate.clear(queue, connection=conn)
    return _rate_changed(conn, values, f'Queue {queue!r} has no rate ({was}).')


def _was(conn: Redis, queue: str) -> str:
    before = QueueRate.get(queue, connection=conn)
    return f'was {before.rate_words()}' if before else 'was unlimited'


def _rate_changed(conn: Redis, values: views.Values, message: str) -> views.Reply:
    return _rate_status(conn, values) if values['as_json'] else views.Reply((message,))


def _rate_status(conn: Redis, values: views.Values) -> views.Reply:
    """``rq-policies rate QUEUE``: the rate, the starts available now and the next one (local time), a back-off."""
    queue = str(values['queue'])
    rate, status, now = QueueRate.get(queue, connection=conn), QueueRate.status(queue, connection=conn), \
        server_now(conn)
    if values['as_json']:
        return views.Reply(data={
            'queue': queue, 'rate': None if rate is None else {'limit': rate.limit, 'per': rate.per,
                                                                 'burst': rate.burst},
            'windows': None if rate is None or len(rate.windows) == 1 else [
                {'limit': w.limit, 'per': w.per, 'burst': w.burst} for w in rate.windows],
            'held_by': None if status is None or status.held_by is None else {
                'limit': status.held_by.limit, 'per': status.held_by.per, 'burst': status.held_by.burst},
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
        held = '' if status.held_by is None else f' (held by its {status.held_by.per} s window)'
        lines.append(f'Queue {queue!r} is limited to {_limited_to(rate)}: {status.available} available, next start '
                     f'{when}{held}.')
    if status is not None and status.backoff_until is not None:
        lines.append(f'Backed off: no start until {at(status.backoff_until, now)}.')
    return views.Reply(tuple(lines))


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
        raise views.BadArgument(f'expected LIMIT/PER such as 100/60s, 5/1m or 3/1, got {raw!r}', 'LIMIT/PER')
    limit, per = int(head), int(number) * _UNITS[unit]
    try:
        check_rate(limit, per, 1)
    except ValueError as exc:
        raise views.BadArgument(f'{exc} (in {raw!r})', 'LIMIT/PER') from None
    return limit, per
