"""Rate: at most ``limit`` job starts of one *key* every ``per`` seconds across the cluster (per shop, per partner).

QueueRate's GCRA on the server's clock (the same ``lua/lib/rate_tat.lua``), one arrival time per key
(``rq:policies:keytat:<scope>:<key>``), declared on the job's function like :class:`~rq_policies.Concurrency` and
sharing its machinery (:mod:`rq_policies.engine.keyed`): the key is computed at enqueue and stored on the
job hash (``policies_key_rate = '<limit> <per> <burst> <scope>:<key>'``), checked at fetch after the pop, and a job its
key's rate does not allow now is parked (``rq:policies:keyparked:key_rate:<scope>:<key>``, status ``deferred``) while
the jobs of other keys behind it run.

A rate of several windows (``Rate(windows=[(100, 1, 100), (1000, 3600, 1000)], key=...)``) is one GCRA per window,
checked and taken together in the same script: each of the three words of the field is then a comma-separated list,
one entry per window (``'100,1000 1,3600 100,1000 <scope>:<key>'``), and the key's one arrival-time string holds one
arrival time per window (``lua/lib/rate_windows.lua``).

A key with parked jobs sits in the due index at the time its rate next allows a start; the fetch that finds it due
gives back as many parked jobs as the rate allows then, each with its start already paid for (the arrival time moves
on for it, and the job hash is marked ``policies_key_rate_paid``), to the front of its queue: FIFO per key, and a
given-back job never loses its start to a later one. A rate takes no hold: a start is never refunded, whatever
becomes of the job.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rq.job import Job

from rq_policies.engine import keyed, keys
from rq_policies.engine.admin import (
    GcraRate,
    KeyRate,
    RateStatus,
    RateWindow,
    rate_setting,
    rate_status,
    read_rate,
    refusing,
    window_tuples,
    windows_of,
)
from rq_policies.engine.exceptions import InvalidArgument
from rq_policies.engine.keyed import KeyedPolicy, KeyFunction, Tiers, check_scope, key_text, rule_source
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import text, time_in

__all__ = ['Rate']


class Rate(KeyedPolicy, GcraRate):
    """At most ``limit`` job starts of one key every ``per`` seconds, up to ``burst`` at once after a quiet spell; or
    several such ``windows`` at once.

    Example::

        @policy(Rate(10, per=1, burst=10, key=lambda args, kwargs: kwargs['shop']))
        def call_shop_api(shop, path): ...   # <= 10 starts a second per shop

        @policy(Rate(windows=[(100, 1, 100), (1000, 3600, 1000)], key=lambda args, kwargs: kwargs['shop']))
        def sync_shop(shop): ...   # 100 a second and 1,000 an hour per shop, each window a GCRA with its burst

    Args:
        limit: starts per ``per`` seconds, a positive integer.
        per: the period, whole seconds >= 1.
        burst: starts allowed at once after a quiet spell, 1 to ``limit``.
        windows: instead of ``limit``, ``per`` and ``burst``: several rates a key's starts must all keep, a list of
            ``(limit, per)`` or ``(limit, per, burst)`` (burst 1 unless given; at most 8, one per period). A job
            starts when every window allows a start, and its start counts in each (a window's refusal consumes
            nothing of another). ``limit``, ``per`` and ``burst`` are then the first window's (the shortest period).
            A bad one raises InvalidArgument naming ``windows``, the window and the value.
        key: ``(args, kwargs) -> str | int``; None keys on the job's identity digest.
        scope: the namespace keys are counted in (no colon); default: the function's import path.
        cost: how many starts of the key's rate one job uses, an int from 1 to ``limit`` or ``(args, kwargs) ->
            int`` (Sidekiq Enterprise's points, Oban's weights): a job starts when the key's rate allows one start,
            and its start moves the key's arrival time on by ``cost`` intervals (in every window), so a key's costs
            add up to ``limit`` per ``per`` seconds over time. A cost above ``limit`` (the smallest window's) is
            refused at enqueue (ValueError naming ``cost``), before anything is written.
    """

    name: ClassVar[str] = 'key_rate'
    field: ClassVar[str] = 'policies_key_rate'
    payload_fields: ClassVar[tuple[str, ...]] = (field,)
    key_settings: ClassVar[str] = keys.KEY_RATES
    repr_settings: ClassVar[tuple[str, ...]] = ('per', 'burst')
    setting_words: ClassVar[int] = 3

    def __init__(self, limit: int | None = None, per: int = 1, burst: int = 1, key: KeyFunction | None = None,
                 scope: str | None = None, cost: int | KeyFunction = 1, *, windows: Any = None) -> None:
        self.windows: tuple[RateWindow, ...] = windows_of(limit, per, burst, windows)
        self.limit, self.per, self.burst = window_tuples(self.windows)[0]
        if not callable(cost):
            _cost(cost, self.cost_limit)
        self.cost = cost
        super().__init__(key, scope)

    @property
    def cost_limit(self) -> int:
        return min(w.limit for w in self.windows)

    def setting(self) -> str:
        return rate_setting(self.windows)

    def repr_words(self) -> list[str]:
        if len(self.windows) == 1:
            return super().repr_words()
        return [f'windows={window_tuples(self.windows)}']

    @classmethod
    def rule_setting(cls, value: Any, where: str) -> str:
        """A rule's rate: a :class:`~rq_policies.KeyRate`, ``(limit, per)``, ``(limit, per, burst)`` or a list of such
        windows; an InvalidArgument naming ``where`` and the value otherwise."""
        if isinstance(value, KeyRate):
            return rate_setting(value.windows)
        try:
            if isinstance(value, tuple) and 2 <= len(value) <= 3 and all(isinstance(v, int) for v in value):
                return rate_setting(windows_of(*value, *((1,) if len(value) == 2 else ())))
            if isinstance(value, list):
                return rate_setting(windows_of(None, 1, 1, value))
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(where, message=f'{where}: {exc}') from None
        raise InvalidArgument(where, message=f'{where} must be a KeyRate, (limit, per), (limit, per, burst) or a list '
                                             f'of such windows, got {value!r}')

    @classmethod
    def rule_value(cls, stored: str) -> KeyRate:
        found = _stored_rate(stored)
        if found is None:
            raise ValueError(f'not a stored rate: {stored!r}')
        return found

    # -- run-time settings and gauges (the admin API: rq_policies.engine.admin)
    # -----------------------------------------

    @classmethod
    def set(cls, scope: str, key: Any, limit: int | None = None, per: int = 1, burst: int = 1, connection: Any = None,
            force: bool = False, *, windows: Any = None) -> KeyRate:
        """Set the rate of one key of ``scope`` at run time: ``limit`` starts every ``per`` seconds, up to ``burst``
        at once, or several ``windows`` (``[(limit, per), (limit, per, burst), ...]``, as :class:`Rate` takes them).
        It wins over the rate the key's jobs declare, from every worker's next fetch; the key's parked jobs
        are looked at again at once. The starts already owed keep their count and are paid at the new rate (a window
        of a new period starts with nothing owed). The
        admin API's shape and errors (:mod:`rq_policies.engine.admin`). A scope no Rate is known to use is refused
        as a typo, as :meth:`Concurrency.set <rq_policies.Concurrency.set>` says; ``force=True`` sets it anyway."""
        with refusing():
            rate = KeyRate(limit, per, burst, windows)
        cls.write_setting(scope, key, rate_setting(rate.windows), connection, force)
        return rate

    @classmethod
    def get(cls, scope: str, key: Any, connection: Any = None) -> KeyRate | None:
        """The rate set at run time for one key of ``scope``, or None (its jobs' declared rate applies)."""
        return _stored_rate(cls.read_setting(scope, key, connection))

    @classmethod
    def status(cls, scope: str, key: Any, *deprecated_rate: int, connection: Any = None,
               **deprecated_kwargs: Any) -> RateStatus | None:
        """How many starts one key allows now, and when the next is allowed (server clock); a BackOff(key=True) of
        the key shows as ``backoff_until``.

        The rate is the one in force: the run-time rate (:meth:`set`), else its scope's rule (:meth:`set_rule`), else
        the one the key's oldest parked job declares; None when neither is known (and the key is not backed off).

        ``Rate.status(scope, key, limit, per, burst)``, 0.2's form that gave the rate, is deprecated (removed in
        0.4): it warns and answers under the rate given.
        """
        given = _deprecated_rate(deprecated_rate, deprecated_kwargs)
        with refusing():
            rate: KeyRate | None = None if given is None else KeyRate(*given)
            scope, name = check_scope(scope), key_text(key)
            conn = _need(connection)
        key_id = keys.key_id(scope, name)
        with conn.pipeline(transaction=False) as pipe:
            time_in(pipe)
            pipe.get(keys.KEY_TAT_PREFIX(key_id))
            pipe.get(keys.KEY_BLOCK_PREFIX(key_id))
            pipe.hget(keys.KEY_RATES, key_id)
            pipe.lindex(keys.KEY_PARKED_PREFIX(cls.name, key_id), 0)
            pipe.hget(keys.KEY_RULES, cls.rule_field(scope))
            (seconds, micros), tat, blocked, stored, head, rule = pipe.execute()
        now = seconds + micros / 1e6
        rate = rate or _stored_rate(stored) or ruled_rate(cls.decode_rule(rule), name)[0]
        if rate is None and head is not None:
            rate = _declared_rate(conn.hget(Job.redis_job_namespace_prefix + text(head), cls.field), key_id)
        return rate_status(rate, tat, blocked, now)


def ruled_rate(rule: Tiers | None, key: str) -> tuple[KeyRate | None, str | None]:
    """The rate a scope's rule (:meth:`Rate.set_rule`) gives ``key``, and the words naming the part that gave it
    (:func:`~rq_policies.engine.keyed.rule_source`); ``(None, None)`` without a rule."""
    if rule is None:
        return None, None
    rate, tier = rule.resolve(key)
    return rate, rule_source(tier)


def _declared_rate(raw: Any, key_id: str | None) -> KeyRate | None:
    """The rate of a job's ``'<limit> <per> <burst> <scope>:<key>'`` field (each of the three a comma-separated list
    with several windows), when it names ``key_id`` (None: any key)."""
    if raw is None:
        return None
    words = text(raw).split(' ', 3)
    if len(words) != 4 or (key_id is not None and words[3] != key_id):
        return None
    words[2] = words[2].partition('*')[0]  # a costed job's '<burst>*<cost>'
    return _stored_rate(' '.join(words[:3]))


def _stored_rate(raw: Any) -> KeyRate | None:
    """A run-time rate as stored in ``rq:policies:keyrates`` (``'<limit> <per> <burst>'``, comma-separated lists with
    several windows), or None (none, or not one)."""
    windows = read_rate(raw)
    return None if windows is None else KeyRate(windows=windows)


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


def _cost(value: Any, limit: int, where: str = 'cost') -> int:
    """A job's cost: an int from 1 to the rate's ``limit`` (:func:`rq_policies.engine.keyed.cost`)."""
    return keyed.cost(value, limit, where, 'could never start within its period')
