"""Rate: at most ``limit`` job starts of one *key* every ``per`` seconds across the cluster (per shop, per partner).

QueueRate's GCRA on the server's clock (the same ``lua/lib/rate_tat.lua``), one arrival time per key
(``rq:policies:keytat:<scope>:<key>``), declared on the job's function like :class:`~rq_policies.Concurrency` and
sharing its machinery (:mod:`rq_policies.concurrency`): the key is computed at enqueue and stored on the job hash
(``policies_key_rate = '<limit> <per> <burst> <scope>:<key>'``), checked at fetch after the pop, and a job its key's
rate does not allow now is parked (``rq:policies:keyparked:key_rate:<scope>:<key>``, status ``deferred``) while the
jobs of other keys behind it run.

A key with parked jobs sits in the due index at the time its rate next allows a start; the fetch that finds it due
gives back as many parked jobs as the rate allows then, each with its start already paid for (the arrival time moves
on for it, and the job hash is marked ``policies_key_rate_paid``), to the front of its queue: FIFO per key, and a
given-back job never loses its start to a later one. A rate takes no hold: a start is never refunded, whatever
becomes of the job.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rq.job import Job

from . import keys
from .concurrency import KeyedPolicy, KeyFunction, check_scope, key_text
from .ops import need_connection as _need
from .ops import server_now as _server_now
from .ops import text
from .policy import MAX_CAPACITY, MAX_SECONDS
from .queue_rate import GcraRate, RateStatus, _status, check

__all__ = ['Rate']


class Rate(KeyedPolicy, GcraRate):
    """At most ``limit`` job starts of one key every ``per`` seconds, up to ``burst`` at once after a quiet spell.

    Example::

        @policy(Rate(10, per=1, burst=10, key=lambda args, kwargs: kwargs['shop']))
        def call_shop_api(shop, path): ...   # <= 10 starts a second per shop

    Args:
        limit: starts per ``per`` seconds, a positive integer.
        per: the period, whole seconds >= 1.
        burst: starts allowed at once after a quiet spell, 1 to ``limit``.
        key: ``(args, kwargs) -> str | int``; None keys on the job's identity digest.
        scope: the namespace keys are counted in (no colon); default: the function's import path.
    """

    name: ClassVar[str] = 'key_rate'
    field: ClassVar[str] = 'policies_key_rate'
    setting_words: ClassVar[int] = 3

    def __init__(self, limit: int, per: int = 1, burst: int = 1, key: KeyFunction | None = None,
                 scope: str | None = None) -> None:
        check(limit, per, burst)
        self.limit, self.per, self.burst = limit, per, burst
        super().__init__(key, scope)

    def __repr__(self) -> str:
        words = [str(self.limit), f'per={self.per}', f'burst={self.burst}']
        if self.key is not None:
            words.append(f'key={getattr(self.key, "__name__", self.key)}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        return f'Rate({", ".join(words)})'

    def setting(self) -> str:
        return f'{self.limit} {self.per} {self.burst}'

    @classmethod
    def examples(cls) -> tuple[Rate, ...]:
        from .concurrency import _first_argument

        return (cls(1, per=1), cls(2, per=1, burst=1, key=_first_argument, scope='contract'))

    invalid: ClassVar[tuple[tuple[dict[str, Any], str], ...]] = (
        ({'limit': 0}, 'limit'),
        ({'limit': True}, 'limit'),
        ({'limit': 1.5}, 'limit'),
        ({'limit': MAX_CAPACITY + 1}, 'limit'),
        ({'limit': 5, 'per': 0}, 'per'),
        ({'limit': 5, 'per': 0.5}, 'per'),
        ({'limit': 5, 'per': MAX_SECONDS + 1}, 'per'),
        ({'limit': 5, 'burst': 0}, 'burst'),
        ({'limit': 5, 'burst': 6}, 'burst'),
        ({'limit': 5, 'key': 'shop'}, 'key'),
        ({'limit': 5, 'scope': 'a:b'}, 'scope'),
    )

    # -- gauges -----------------------------------------------------------------------------------------------------

    @classmethod
    def status(cls, scope: str, key: Any, limit: int, per: int = 1, burst: int = 1,
               connection: Any = None) -> RateStatus:
        """How many starts one key allows now under this rate, and when the next is allowed (server clock); a
        BackOff(key=True) of the key shows as ``backoff_until``."""
        check(limit, per, burst)
        conn = _need(connection)
        channel = keys.key_channel(check_scope(scope), key_text(key))
        with conn.pipeline(transaction=False) as pipe:
            pipe.get(keys.KEY_TAT_PREFIX + channel)
            pipe.get(keys.KEY_BLOCK_PREFIX + channel)
            tat, blocked = pipe.execute()
        found = _status(cls(limit, per, burst), tat, blocked, _server_now(conn))
        assert found is not None  # a rate is given
        return found

    @classmethod
    def parked(cls, scope: str, key: Any, connection: Any = None) -> list[str]:
        """The ids of one key's jobs parked by their rate, oldest first (the order they go back in)."""
        channel = keys.key_channel(check_scope(scope), key_text(key))
        return [text(j) for j in _need(connection).lrange(f'{keys.KEY_PARKED_PREFIX}{cls.name}:{channel}', 0, -1)]

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[dict[str, Any]]:
        raw = job.get(cls.field)
        if not raw:
            return []
        limit, per, burst, channel = raw.split(' ', 3)
        scope, _, key = channel.partition(':')
        rate = cls(int(limit), int(per), int(burst))
        with connection.pipeline(transaction=False) as pipe:
            pipe.get(keys.KEY_TAT_PREFIX + channel)
            pipe.get(keys.KEY_BLOCK_PREFIX + channel)
            pipe.lpos(f'{keys.KEY_PARKED_PREFIX}{cls.name}:{channel}', job['id'])
            tat, blocked, position = pipe.execute()
        status = _status(rate, tat, blocked, now)
        assert status is not None
        entry: dict[str, Any] = {'policy': cls.name, 'scope': scope, 'key': key, 'limit': rate.limit,
                                 'per': rate.per, 'burst': rate.burst, 'available': status.available,
                                 'next_at': status.next_at, 'change': ''}
        words = f'key {key!r} (scope {scope}) rate {rate.limit}/{rate.per}s burst {rate.burst}: '
        if status.available:
            words += f'{status.available} start(s) available now'
        else:
            words += f'next start allowed in {max(status.next_at - now, 0.0):.1f} s'
        if position is not None:
            entry['parked_position'] = int(position)
            words += f' (parked, position {int(position) + 1})'
            entry['change'] = 'it goes back to the front of its queue when its key\'s rate allows a start'
        if status.backoff_until is not None:
            entry['backoff_until'] = status.backoff_until
            words += f', backed off for {status.backoff_until - now:.1f} s more'
        entry['verdict'] = words
        return [entry]

    @classmethod
    def key_rows(cls, connection: Any, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` with jobs parked by their rate, most parked first, at most ``limit`` (0: all): each
        ``{'key', 'parked', 'next_due' (server time, or None), 'rate' ((limit, per, burst) its oldest parked job
        declares, or None)}``. Found by SCAN (MATCH, COUNT), never KEYS, unless ``names`` gives the keys to read."""
        from .concurrency import _glob

        conn = _need(connection)
        scope = check_scope(scope)
        prefix = f'{keys.KEY_PARKED_PREFIX}{cls.name}:{scope}:'
        if names is None:
            names = sorted({text(raw)[len(prefix):] for raw in conn.scan_iter(match=_glob(prefix) + '*', count=1000)})
            names = [k for k in names if search is None or search in k]
        with conn.pipeline(transaction=False) as pipe:
            for key in names:
                pipe.llen(prefix + key)
                pipe.zscore(keys.KEY_DUE, f'{cls.name}:{scope}:{key}')
                pipe.lindex(prefix + key, 0)
            replies = pipe.execute()
        heads = {i: text(replies[3 * i + 2]) for i in range(len(names)) if replies[3 * i + 2] is not None}
        with conn.pipeline(transaction=False) as pipe:
            for job_id in heads.values():
                pipe.hget(Job.redis_job_namespace_prefix + job_id, cls.field)
            fields = dict(zip(heads, pipe.execute()))
        rows = [{'key': key, 'parked': int(replies[3 * i]),
                 'next_due': float(replies[3 * i + 1]) if replies[3 * i + 1] is not None else None,
                 'rate': _declared_rate(fields.get(i), f'{scope}:{key}')}
                for i, key in enumerate(names)]
        rows.sort(key=lambda r: (-r['parked'], r['key']))
        return rows[:limit] if limit else rows

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        out = []
        for row in rows:
            due = '' if row['next_due'] is None else f', next start in {max(row["next_due"] - now, 0):.1f} s'
            out.append(f'key {row["key"]}  rate: {row["parked"]} parked{due}')
        return out

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[dict[str, Any]]:
        from .concurrency import panel_names, sample_keys

        found, complete = sample_keys(connection, cls.name, holds=cls.holds)
        out = []
        for scope in sorted(found):
            names, note = panel_names(found[scope], search, complete)
            rows = cls.key_rows(connection, scope, limit, search, now, names=names)
            if rows:
                out.append({
                    'note': note,
                    'title': f'Rate per key: {scope}',
                    'columns': ['key', 'parked', 'next start (s)', 'rate'],
                    'rows': [[row['key'], row['parked'],
                              None if row['next_due'] is None else round(max(row['next_due'] - now, 0.0), 3),
                              None if row['rate'] is None else '{}/{}s burst {}'.format(*row['rate'])]
                             for row in rows],
                })
        return out


def _declared_rate(raw: Any, channel: str) -> tuple[int, int, int] | None:
    """``(limit, per, burst)`` of a job's ``'<limit> <per> <burst> <scope>:<key>'`` field, when it names ``channel``."""
    if raw is None:
        return None
    words = text(raw).split(' ', 3)
    if len(words) != 4 or words[3] != channel or not all(w.isdigit() for w in words[:3]):
        return None
    return int(words[0]), int(words[1]), int(words[2])
