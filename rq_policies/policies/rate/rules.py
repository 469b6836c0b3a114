"""Rate: at most ``limit`` job starts of one *key* every ``per`` seconds across the cluster (per shop, per partner).

QueueRate's GCRA on the server's clock (the same ``lua/lib/rate_tat.lua``), one arrival time per key
(``rq:policies:keytat:<scope>:<key>``), declared on the job's function like :class:`~rq_policies.Concurrency` and
sharing its machinery (:mod:`rq_policies.policies.concurrency.rules`): the key is computed at enqueue and stored on the
job hash (``policies_key_rate = '<limit> <per> <burst> <scope>:<key>'``), checked at fetch after the pop, and a job its
key's rate does not allow now is parked (``rq:policies:keyparked:key_rate:<scope>:<key>``, status ``deferred``) while
the jobs of other keys behind it run.

A key with parked jobs sits in the due index at the time its rate next allows a start; the fetch that finds it due
gives back as many parked jobs as the rate allows then, each with its start already paid for (the arrival time moves
on for it, and the job hash is marked ``policies_key_rate_paid``), to the front of its queue: FIFO per key, and a
given-back job never loses its start to a later one. A rate takes no hold: a start is never refunded, whatever
becomes of the job.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rq.job import Job

from rq_policies.engine import keys
from rq_policies.engine.admin import KeyRate, refusing
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import text, time_in
from rq_policies.engine.views import Cell, Explanation, Panel
from rq_policies.policies.concurrency.rules import KeyedPolicy, KeyFunction, _setting_call, check_scope, key_text
from rq_policies.policies.concurrency.rules import _cost as _keyed_cost
from rq_policies.policies.queue_rate.rules import GcraRate, RateStatus, _status, check

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
        cost: how many starts of the key's rate one job uses, an int from 1 to ``limit`` or ``(args, kwargs) ->
            int`` (Sidekiq Enterprise's points, Oban's weights): a job starts when the key's rate allows one start,
            and its start moves the key's arrival time on by ``cost`` intervals, so a key's costs add up to
            ``limit`` per ``per`` seconds over time. A cost above ``limit`` is refused at enqueue (ValueError naming
            ``cost``), before anything is written.
    """

    name: ClassVar[str] = 'key_rate'
    field: ClassVar[str] = 'policies_key_rate'
    setting_words: ClassVar[int] = 3

    def __init__(self, limit: int, per: int = 1, burst: int = 1, key: KeyFunction | None = None,
                 scope: str | None = None, cost: int | KeyFunction = 1) -> None:
        check(limit, per, burst)
        self.limit, self.per, self.burst = limit, per, burst
        if not callable(cost):
            _cost(cost, limit)
        self.cost = cost
        super().__init__(key, scope)

    def call_fields(self, job: Any, queue: str, digest: str) -> list[Any]:
        field, value = super().call_fields(job, queue, digest)
        cost = self.job_cost(job)
        if cost == 1:
            return [field, value]
        limit, per, burst, key_id = value.split(' ', 3)  # a costed job: '<limit> <per> <burst>*<cost> <scope>:<key>'
        return [field, f'{limit} {per} {burst}*{cost} {key_id}']

    def __repr__(self) -> str:
        words = [str(self.limit), f'per={self.per}', f'burst={self.burst}']
        if self.key is not None:
            words.append(f'key={getattr(self.key, "__name__", self.key)}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        if self.cost != 1:
            words.append(f'cost={getattr(self.cost, "__name__", self.cost)}')
        return f'Rate({", ".join(words)})'

    def setting(self) -> str:
        return f'{self.limit} {self.per} {self.burst}'

    # -- run-time settings and gauges (the admin API: rq_policies.engine.admin)
    # -----------------------------------------

    @classmethod
    def set(cls, scope: str, key: Any, limit: int, per: int = 1, burst: int = 1, connection: Any = None) -> KeyRate:
        """Set the rate of one key of ``scope`` at run time: ``limit`` starts every ``per`` seconds, up to ``burst``
        at once. It wins over the rate the key's jobs declare, from every worker's next fetch; the key's parked jobs
        are looked at again at once. The starts already owed keep their count and are paid at the new rate.

        Args:
            scope: the key's scope (the function's import path unless the policy names one).
            key: the key value, a str or an int.
            limit: starts per ``per`` seconds, a positive integer.
            per: the period, whole seconds >= 1.
            burst: starts allowed at once after a quiet spell, 1 to ``limit``.
            connection: the Redis connection.

        Returns:
            The rate now set.

        Raises:
            InvalidSetting: (a ValueError) naming the argument and the value; nothing is written.
        """
        with refusing():
            check(limit, per, burst)
            call = _setting_call(cls.name, keys.KEY_RATES, scope, key, f'{limit} {per} {burst}')
            conn = _need(connection)
        call.run(conn)
        return KeyRate(limit, per, burst)

    @classmethod
    def get(cls, scope: str, key: Any, connection: Any = None) -> KeyRate | None:
        """The rate set at run time for one key of ``scope``, or None (its jobs' declared rate applies)."""
        with refusing():
            key_id = keys.key_id(check_scope(scope), key_text(key))
            conn = _need(connection)
        return _stored_rate(conn.hget(keys.KEY_RATES, key_id))

    @classmethod
    def clear(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Remove the run-time rate of one key: its jobs' declared rate applies again. Returns True when it had
        one."""
        with refusing():
            call = _setting_call(cls.name, keys.KEY_RATES, scope, key, '')
            conn = _need(connection)
        return call.answered().run(conn) == 1

    @classmethod
    def status(cls, scope: str, key: Any, *deprecated_rate: int, connection: Any = None,
               **deprecated_kwargs: Any) -> RateStatus | None:
        """How many starts one key allows now, and when the next is allowed (server clock); a BackOff(key=True) of
        the key shows as ``backoff_until``.

        The rate is the one in force: the run-time rate (:meth:`set`), else the one the key's oldest parked job
        declares; None when neither is known (and the key is not backed off).

        ``Rate.status(scope, key, limit, per, burst)``, 0.2's form that gave the rate, is deprecated (removed in
        0.4): it warns and answers under the rate given.
        """
        given = _deprecated_rate(deprecated_rate, deprecated_kwargs)
        with refusing():
            if given is not None:
                check(*given)
            scope, name = check_scope(scope), key_text(key)
            conn = _need(connection)
        key_id = keys.key_id(scope, name)
        with conn.pipeline(transaction=False) as pipe:
            time_in(pipe)
            pipe.get(keys.KEY_TAT_PREFIX + key_id)
            pipe.get(keys.KEY_BLOCK_PREFIX + key_id)
            pipe.hget(keys.KEY_RATES, key_id)
            pipe.lindex(f'{keys.KEY_PARKED_PREFIX}{cls.name}:{key_id}', 0)
            (seconds, micros), tat, blocked, stored, head = pipe.execute()
        now = seconds + micros / 1e6
        rate = given or _stored_rate(stored)
        if rate is None and head is not None:
            rate = _declared_rate(conn.hget(Job.redis_job_namespace_prefix + text(head), cls.field), key_id)
        if rate is None:
            return _status(None, tat, blocked, now)
        limit, per, burst = (rate.limit, rate.per, rate.burst) if isinstance(rate, KeyRate) else rate
        return _status(_Gcra(limit, per, burst), tat, blocked, now)

    @classmethod
    def parked(cls, scope: str, key: Any, connection: Any = None) -> list[str]:
        """The ids of one key's jobs parked by their rate, oldest first (the order they go back in)."""
        key_id = keys.key_id(check_scope(scope), key_text(key))
        return [text(j) for j in _need(connection).lrange(f'{keys.KEY_PARKED_PREFIX}{cls.name}:{key_id}', 0, -1)]

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[Explanation]:
        raw = job.get(cls.field)
        if not raw:
            return []
        limit, per, burst, key_id = raw.split(' ', 3)
        burst = burst.partition('*')[0]  # a costed job's '<burst>*<cost>'
        scope, _, key = key_id.partition(':')
        with connection.pipeline(transaction=False) as pipe:
            pipe.get(keys.KEY_TAT_PREFIX + key_id)
            pipe.get(keys.KEY_BLOCK_PREFIX + key_id)
            pipe.lpos(f'{keys.KEY_PARKED_PREFIX}{cls.name}:{key_id}', job['id'])
            pipe.hget(keys.KEY_RATES, key_id)
            tat, blocked, position, stored = pipe.execute()
        stored_rate = _stored_rate(stored)
        if stored_rate is None:
            rate = cls(int(limit), int(per), int(burst))
        else:
            rate = cls(stored_rate.limit, stored_rate.per, stored_rate.burst)
        status = _status(rate, tat, blocked, now)
        assert status is not None
        entry: dict[str, Any] = {'scope': scope, 'key': key, 'limit': rate.limit,
                                 'per': rate.per, 'burst': rate.burst, 'available': status.available,
                                 'next_at': status.next_at}
        change = ''
        entry['set_at_run_time'] = stored_rate is not None
        mark = ' (set at run time)' if stored_rate is not None else ''
        words = f'key {key!r} (scope {scope}) rate {rate.limit}/{rate.per}s burst {rate.burst}{mark}: '
        if status.available:
            words += f'{status.available} start(s) available now'
        else:
            words += f'next start allowed in {max(status.next_at - now, 0.0):.1f} s'
        if position is not None:
            entry['parked_position'] = int(position)
            words += f' (parked, position {int(position) + 1})'
            change = 'it goes back to the front of its queue when its key\'s rate allows a start'
        if status.backoff_until is not None:
            entry['backoff_until'] = status.backoff_until
            words += f', backed off for {status.backoff_until - now:.1f} s more'
        verdict = words
        return [Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def key_rows(cls, connection: Any, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` with jobs parked by their rate, most parked first, at most ``limit`` (0: all): each
        ``{'key', 'parked', 'next_due' (server time, or None), 'rate' ((limit, per, burst): the run-time rate, else
        the one its oldest parked job declares, or None), 'set_at_run_time'}``. Found by SCAN (MATCH, COUNT), never
        KEYS, unless ``names`` gives the keys to read."""
        from rq_policies.policies.concurrency.rules import _glob

        conn = _need(connection)
        scope = check_scope(scope)
        prefix = f'{keys.KEY_PARKED_PREFIX}{cls.name}:{scope}:'
        if names is None:
            found = keys.scanner(conn).scan_iter(match=_glob(prefix) + '*', count=1000)
            names = sorted({text(raw)[len(prefix):] for raw in found})
            names = [k for k in names if search is None or search in k]
        with conn.pipeline(transaction=False) as pipe:
            for key in names:
                pipe.llen(prefix + key)
                pipe.zscore(keys.KEY_DUE, f'{cls.name}:{scope}:{key}')
                pipe.lindex(prefix + key, 0)
            pipe.hmget(keys.KEY_RATES, [keys.key_id(scope, key) for key in names] or ['-'])
            *replies, stored = pipe.execute()
        heads = {i: text(replies[3 * i + 2]) for i in range(len(names)) if replies[3 * i + 2] is not None}
        with conn.pipeline(transaction=False) as pipe:
            for job_id in heads.values():
                pipe.hget(Job.redis_job_namespace_prefix + job_id, cls.field)
            fields = dict(zip(heads, pipe.execute()))
        rows = [{'key': key, 'parked': int(replies[3 * i]),
                 'next_due': float(replies[3 * i + 1]) if replies[3 * i + 1] is not None else None,
                 'rate': _rate_words(stored[i]) or _declared_rate(fields.get(i), f'{scope}:{key}'),
                 'set_at_run_time': stored[i] is not None}
                for i, key in enumerate(names)]
        rows.sort(key=lambda r: (-r['parked'], r['key']))
        return rows[:limit] if limit else rows

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        from rq_policies.engine.readable import at

        out = []
        for row in rows:
            due = '' if row['next_due'] is None else f'; waiting for its rate: next start {at(row["next_due"], now)}'
            rate = '' if row['rate'] is None else ' {}/{}s burst {}'.format(*row['rate'])
            mark = ' (set at run time)' if row.get('set_at_run_time') else ''
            out.append(f'key {row["key"]}  rate{rate}{mark}: {row["parked"]} parked{due}')
        return out

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[Panel]:
        from rq_policies.policies.concurrency.rules import panel_names, sample_keys

        found, complete = sample_keys(connection, cls.name, holds=cls.holds)
        out = []
        for scope in sorted(found):
            names, note = panel_names(found[scope], search, complete)
            rows = cls.key_rows(connection, scope, limit, search, now, names=names)
            if rows:
                out.append(Panel(
                    f'Rate per key: {scope}', ['key', 'parked', 'waiting for', 'rate'],
                    [[row['key'], row['parked'],
                      None if row['next_due'] is None else
                      Cell('its rate', note='next start', at=max(row['next_due'] - now, 0.0)),
                      None if row['rate'] is None else '{}/{}s burst {}'.format(*row['rate'])
                      + (' (set at run time)' if row.get('set_at_run_time') else '')]
                     for row in rows],
                    note,
                ))
        return out


def _declared_rate(raw: Any, key_id: str) -> tuple[int, int, int] | None:
    """``(limit, per, burst)`` of a job's ``'<limit> <per> <burst> <scope>:<key>'`` field, when it names ``key_id``."""
    if raw is None:
        return None
    words = text(raw).split(' ', 3)
    if len(words) == 4:
        words[2] = words[2].partition('*')[0]  # a costed job's '<burst>*<cost>'
    if len(words) != 4 or words[3] != key_id or not all(w.isdigit() for w in words[:3]):
        return None
    return int(words[0]), int(words[1]), int(words[2])


class _Gcra(GcraRate):
    """A bare rate for :func:`~rq_policies.policies.queue_rate.rules._status` (which reads limit, per, burst and
    interval)."""

    def __init__(self, limit: int, per: int, burst: int) -> None:
        self.limit, self.per, self.burst = limit, per, burst


def _stored_rate(raw: Any) -> KeyRate | None:
    """A run-time rate as stored in ``rq:policies:keyrates`` (``'<limit> <per> <burst>'``), or None."""
    if raw is None:
        return None
    limit, per, burst = (int(word) for word in text(raw).split())
    return KeyRate(limit, per, burst)


def _deprecated_rate(args: tuple, kwargs: dict) -> tuple[int, int, int] | None:
    """The rate 0.2's ``Rate.status(scope, key, limit, per=1, burst=1)`` was given, with its DeprecationWarning."""
    import warnings

    from rq_policies.engine.admin import REMOVED_IN

    unknown = set(kwargs) - {'limit', 'per', 'burst'}
    if unknown:
        raise TypeError(f'Rate.status() got an unexpected keyword argument {sorted(unknown)[0]!r}')
    if not args and not kwargs:
        return None
    if len(args) > 3:
        raise TypeError(f'Rate.status() takes scope, key and connection=, got {len(args) + 2} positional arguments')
    names = ('limit', 'per', 'burst')
    given = dict(zip(names, args))
    for name, value in kwargs.items():
        if name in given:
            raise TypeError(f'Rate.status() got multiple values for argument {name!r}')
        given[name] = value
    if 'limit' not in given:
        raise TypeError("Rate.status() with per= or burst= needs limit= too (0.2's form); or give none of them")
    warnings.warn(f'Rate.status(scope, key, limit, per, burst) is deprecated and is removed in rq-policies '
                  f'{REMOVED_IN}: use Rate.status(scope, key, connection=), which reads the rate in force',
                  DeprecationWarning, stacklevel=3)
    return given['limit'], given.get('per', 1), given.get('burst', 1)


def _rate_words(raw: Any) -> tuple[int, int, int] | None:
    rate = _stored_rate(raw)
    return None if rate is None else (rate.limit, rate.per, rate.burst)


def _cost(value: Any, limit: int, where: str = 'cost') -> int:
    """A job's cost: an int from 1 to the rate's ``limit`` (:func:`rq_policies.policies.concurrency.rules._cost`)."""
    return _keyed_cost(value, limit, where, 'could never start within its period')
