"""Concurrency: at most N jobs of one *key* running at once across the cluster (per customer, per shop, per payload).

A per-job fetch policy: declared on the job's function (``@policy(Concurrency(2, key=...))``) rather than configured
per queue like QueueSlot. The design, and why:

* **The key travels on the job.** At enqueue the key function runs on ``(args, kwargs)`` (it must return a str or an
  int, else TypeError and nothing is written); the key, the scope (the function's import path unless given, so
  functions sharing a ``scope`` share one budget) and the limit are stored on the job hash
  (``policies_concurrency = '<limit> <scope>:<key>'``). A worker needs no import of the function to enforce it.
  ``Concurrency(1)`` with no key keys on the job's identity digest (the one every policy keys on, queue and
  ``unique_context`` included): two runs of one payload never overlap.
* **Checked at fetch, after the pop** (``lua/fetch.lua``, this policy's part ``lua/policies/concurrency.lua``): the
  popped job's fields are read with one HMGET (a job without per-key policies pays only that); every per-job part
  checks before any takes, so a refusal by one consumes nothing of another.
* **No head-of-line blocking: a refused job is parked.** Its id moves off the intermediate list to the key's parked
  list (``rq:policies:keyparked:concurrency:<scope>:<key>``), its status becomes ``deferred`` and it joins rq's
  deferred registry of its queue (rq 2.12's and 3.x's maintenance leaves that registry alone; ``rq info``,
  rq-dashboard and ``Job.fetch`` read the job sanely), and the pop goes on to the jobs behind it. Each refused job is
  parked once per refusal and never rescanned; one fetch parks at most 100 jobs, then reports "look again now".
* **Holds are QueueSlot's ledger**, one per key (``rq:policies:keyholds:<scope>:<key>``): claim tokens with expiry,
  refreshed on the heartbeat, released on every exit path, so a SIGKILLed worker's hold ages out within
  ``hold_ttl`` with no reaper.
* **Unparking.** Releasing a hold (``lua/key_release.lua``, riding the worker's pipeline) gives the freed unit to the
  key's oldest parked job: it goes back to the *front* of its queue (FIFO per key), status queued, with the unit
  reserved for it (a ledger member ``unpark:<job id>`` living ``hold_ttl``, which the take turns into the claim's
  hold), and the queue's idle workers are woken. A job that was not given back waits behind the key's parked jobs.
  An expiry emits no event, so keys with parked jobs are also in a due index (``rq:policies:keydue``, member ->
  earliest time the key could free: its oldest hold's expiry, its back-off's end); every fetch reads the index's
  head (one ZRANGEBYSCORE LIMIT, O(log n)) and gives back what due keys allow, and an idle worker wakes for the
  head's time. Nothing a fetch does grows with the number of keys or parked jobs.
* **Run-time limits** (``Concurrency.set``/``get``/``clear``, :mod:`rq_policies.engine.admin`) live in
  ``rq:policies:keylimits`` and win over the declared limit.

What is not covered: jobs enqueued through a stock ``rq.Queue`` carry no key (nothing limits them), and stock rq
workers do not check keys; a parked job counts in rq's deferred registry, not in its queue's length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rq.job import Job
from rq.queue import Queue
from rq.registry import DeferredJobRegistry

from rq_policies.engine import compat, keys, ledger
from rq_policies.engine.admin import KeyLimit, KeyStatus, deprecated, refusing
from rq_policies.engine.exceptions import BackOff, InvalidArgument
from rq_policies.engine.ops import Call, text
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import server_now as _server_now
from rq_policies.engine.policy import MAX_CAPACITY, FetchPolicy, positive_int
from rq_policies.engine.views import (
    Argument,
    BadArgument,
    Cell,
    CellValue,
    Command,
    Digits,
    Explanation,
    Heading,
    Metric,
    Option,
    Panel,
    Reply,
    Row,
    Section,
    Setting,
    Shown,
    Values,
    View,
    text_only,
)

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['Concurrency', 'KeyFunction', 'KeyedPolicy']

#: A key function: ``(args, kwargs) -> str | int``, as ``unique_context`` gets them.
KeyFunction = Callable[[tuple, dict], Any]

#: The longest key value accepted (characters): it is part of Redis key names.
MAX_KEY_LENGTH = 1000


def keyed_args(job_prefix: str = Job.redis_job_namespace_prefix) -> dict[str, str]:
    """The key prefixes the per-key Lua parts build their keys from (``ctx.kp``), the key id (``<scope>:<key>``)
    appended."""
    return {
        'job': job_prefix, 'queue': Queue.redis_queue_namespace_prefix,
        'deferred': DeferredJobRegistry.key_template.format(''), 'wake': keys.wake(''),
        'holds': keys.KEY_HOLDS_PREFIX, 'parked': keys.KEY_PARKED_PREFIX, 'limits': keys.KEY_LIMITS,
        'rates': keys.KEY_RATES,
        'block': keys.KEY_BLOCK_PREFIX, 'tat': keys.KEY_TAT_PREFIX, 'due': keys.KEY_DUE,
        'units': keys.KEY_UNITS_PREFIX,
    }


def _source(value: Any, args: tuple, kwargs: dict) -> str:
    """``', args[0]'``: the argument a key function returned as is (the usual ``lambda a, k: a[0]``), if any."""
    for i, arg in enumerate(args):
        if arg is value:
            return f', args[{i}]'
    for name, arg in kwargs.items():
        if arg is value:
            return f', kwargs[{name!r}]'
    return ''


def check_scope(scope: Any) -> str:
    """``scope`` as given, or a ValueError naming it: a non-empty str without a colon (it ends at the first one)."""
    if not isinstance(scope, str) or not scope or ':' in scope or len(scope) > MAX_KEY_LENGTH:
        raise ValueError(f'scope must be a non-empty str without ":" (at most {MAX_KEY_LENGTH} characters), '
                         f'got {scope!r}')
    if not scope.isascii():
        try:
            scope.encode('utf-8')
        except UnicodeEncodeError:
            raise InvalidArgument('scope', f'{scope!r} contains a lone surrogate, which UTF-8 cannot encode, and '
                                  'Redis stores keys as UTF-8') from None
    return scope


def key_text(value: Any, where: str = 'key', function: str | None = None) -> str:
    """A key value as the text it is stored as: a str, or an int (``12`` and ``'12'`` are one key); else TypeError
    naming the value (``where``, and the job's ``function`` when there is one). Text Redis cannot store (a lone
    surrogate) raises :class:`~rq_policies.engine.exceptions.InvalidArgument`, a too long key ValueError."""
    named = f'{where} in a call of {function}' if function else where
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f'{named} must be a str or an int, got {value!r} ({type(value).__name__})')
    if isinstance(value, int) and value.bit_length() > 4 * MAX_KEY_LENGTH:  # str() would refuse past its digit limit
        raise ValueError(f'{named} must be at most {MAX_KEY_LENGTH} characters, got an int of {value.bit_length()} '
                         'bits')
    out = str(value)
    if len(out) > MAX_KEY_LENGTH:
        raise ValueError(f'{named} must be at most {MAX_KEY_LENGTH} characters, got one of {len(out)}')
    if not out.isascii():  # O(1): CPython flags ASCII strings
        try:
            out.encode('utf-8')
        except UnicodeEncodeError as exc:
            raise InvalidArgument(where, f'{out!r} contains a lone surrogate ({out[exc.start]!r} at index '
                                  f'{exc.start}), which UTF-8 cannot encode, and Redis stores keys as UTF-8',
                                  function) from None
    return out


class KeyedPolicy(FetchPolicy):
    """The shared part of the per-key policies (Concurrency, Rate): declared on the function, the key computed at
    enqueue and stored on the job hash, checked at fetch, a refused job parked on its key.

    The enqueue path calls the admission-side hooks of every declared policy; a per-key one writes nothing then but
    its job field (:meth:`call_fields`).
    """

    per_job: ClassVar[bool] = True
    #: A per-key policy has no gate: its fetch work is the job's own field (read with the popped job) and the keys
    #: with parked jobs, which are all in the due index (see :attr:`FetchPolicy.fetch_state`).
    fetch_state: ClassVar[tuple[str, ...] | None] = ('keydue',)
    #: The job hash field carrying the policy's setting and key: ``'<setting> <scope>:<key>'``.
    field: ClassVar[str] = ''
    #: How many space-separated words the setting has (before ``<scope>:<key>``).
    setting_words: ClassVar[int] = 1
    #: Does the policy take a hold per running job (a key's ledger, ``rq:policies:keyholds:<scope>:<key>``)?
    holds: ClassVar[bool] = False
    #: A per-key policy never drops an enqueue, so it never stands in the way of an admission policy's probe (the
    #: fast path for an expected duplicate: Loner's and Throttle's checks alone decide it).
    probes: ClassVar[bool] = True
    #: ... nor schedule one.
    schedules: ClassVar[bool] = False

    def __init__(self, key: KeyFunction | None, scope: str | None) -> None:
        if key is not None and not callable(key):
            raise TypeError(f'key must be a callable (args, kwargs) -> str | int, got {key!r}')
        self.key = key
        self.scope = None if scope is None else check_scope(scope)

    # -- the enqueue (rq_policies.engine.queue.PolicyQueue.job_write)
    # ---------------------------------------------------

    def key_of(self, job: Any, digest: str) -> tuple[str, str]:
        """``(scope, key)`` of one job: its key function's value (the identity digest without one)."""
        from rq_policies.engine.identity import func_path

        scope = self.scope or func_path(job)
        if ':' in scope:  # a function path never has one; refuse rather than build an ambiguous key
            raise ValueError(f'scope must not contain ":", got {scope!r}')
        if self.key is None:
            return scope, digest
        args, kwargs = tuple(job.args), dict(job.kwargs)
        try:
            value = self.key(args, kwargs)
        except Exception as exc:
            raise TypeError(f'{self!r}: the key function failed on this call: {exc!r}') from exc
        where = f'{self!r} key (the value the key function returned{_source(value, args, kwargs)})'
        return scope, key_text(value, where, func_path(job))

    def setting(self) -> str:
        """The policy's own part of the job field, before ``<scope>:<key>``."""
        raise NotImplementedError

    def call_field_names(self) -> tuple[str, ...]:
        return (self.field,)

    def job_cost(self, job: Any) -> int:
        """How many units of its key's limit ``job`` uses: the policy's ``cost`` (an int, or ``(args, kwargs) ->
        int`` called on the job's arguments), checked against ``limit`` as :func:`_cost` does."""
        cost = getattr(self, 'cost', 1)
        if not callable(cost):
            return cost
        try:
            cost = cost(tuple(job.args), dict(job.kwargs))
        except Exception as exc:
            raise TypeError(f'{self!r}: the cost function failed on this call: {exc!r}') from exc
        return _cost(cost, self.limit, f'{self!r} cost (the value the cost function returned)')

    def call_fields(self, job: Any, queue: str, digest: str) -> list[Any]:
        scope, key = self.key_of(job, digest)
        return [self.field, f'{self.setting()} {keys.key_id(scope, key)}']

    def job_fields(self, queue: str, digest: str) -> list[str]:
        return []

    def leased_keys(self, queue: str, digest: str) -> list[str]:
        return []

    def validate(self, job: Any, mode: str, force: bool) -> None:
        return None

    def hint_seconds(self, verdict: Any) -> float:
        return 0.0

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        return None

    # -- the fetch ------------------------------------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key('keydue', keys.KEY_DUE)
        call.arg('keyed', keyed_args(call.args.get('job_prefix', Job.redis_job_namespace_prefix)))

    # -- a job raised BackOff(key=True) ---------------------------------------------------------------------------

    @classmethod
    def on_job_exception(cls, job: Any, queue: Any, exc: BaseException, pipeline: Any) -> bool:
        if not isinstance(exc, BackOff) or not getattr(exc, 'key', False):
            return False
        classes = _keyed_classes()
        key_ids = job_key_ids(classes, job.connection.hmget(job.key, [p.field for p in classes]))
        if not key_ids:
            from rq_policies.engine.exceptions import PolicyError

            raise PolicyError(f'job {job.id} raised BackOff(key=True) but has no per-key policy: declare '
                              'Concurrency or Rate with a key, or raise BackOff() to block its queue') from exc
        job.meta['policies_backoffs'] = int(job.meta.get('policies_backoffs', 0)) + 1
        call = Call('key_backoff', seconds=exc.seconds)
        call.key_list('blocks', [keys.KEY_BLOCK_PREFIX + key_id for key_id in key_ids])
        call.run(pipeline)
        compat.enqueue_now(queue, job, pipeline=pipeline, at_front=True)  # saves the job, meta included
        return True

    @classmethod
    def key_rows(cls, connection: Any, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` this policy has state for (``rq-policies keys``, the dashboard)."""
        raise NotImplementedError

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        """``rq-policies keys``'s lines for :meth:`key_rows`."""
        raise NotImplementedError

    @classmethod
    def backoff(cls, scope: str, key: Any, seconds: float, connection: Any = None) -> float:
        """Block one key of ``scope`` for ``seconds`` (server clock), as a job raising ``BackOff(seconds, key=True)``
        does; a block that already ends later is kept. Returns the server time the block ends."""
        delay = BackOff(seconds, key=True).seconds
        call = Call('key_backoff', seconds=delay)
        call.key_list('blocks', [keys.KEY_BLOCK_PREFIX + keys.key_id(check_scope(scope), key_text(key))])
        call.run(_need(connection))
        return float(cls.blocked_until(scope, key, connection) or 0.0)

    @classmethod
    def cluster_info(cls, connection: Redis, now: float, limit: int | None) -> Section | None:
        """Per scope with state: how many keys, in use, parked, and the busiest keys (at most ``limit``)."""
        out = {}
        for scope in sorted(_scopes(connection, cls.name, holds=cls.holds)):
            rows = cls.key_rows(connection, scope, 0, None, now)
            if rows:
                out[scope] = KeyScope(len(rows), sum(r.get('in_use', 0) for r in rows), sum(r['parked'] for r in rows),
                                      rows[:limit] if limit else rows)
        return KeyedState(out, now, cls) if out else None

    @classmethod
    def blocked_until(cls, scope: str, key: Any, connection: Any) -> float | None:
        """The server time until which ``key`` of ``scope`` is backed off, or None."""
        raw = _need(connection).get(keys.KEY_BLOCK_PREFIX + keys.key_id(check_scope(scope), key_text(key)))
        return float(raw) if raw is not None else None


@dataclass(frozen=True)
class KeyScope:
    """One scope of a per-key policy in ``rq-policies info``: its keys with state, the jobs of them in use and
    parked, and the busiest keys (:meth:`KeyedPolicy.key_rows`'s rows, at most ``--limit``)."""

    keys: int
    in_use: int
    parked: int
    busiest: list[dict[str, Any]]


@dataclass(frozen=True)
class KeyedState(Section):
    """A per-key policy's part of ``rq-policies info`` (``policies.<name>`` in ``--json``: ``scopes`` and ``now``,
    the server time its rows were read at): a heading per scope, then its busiest keys' lines
    (:meth:`KeyedPolicy.key_lines`)."""

    scopes: dict[str, KeyScope]
    now: float
    policy: type[KeyedPolicy] = text_only()

    def rows(self, shown: Shown) -> list[Row | str]:
        lines: list[Row | str] = []
        for scope, entry in self.scopes.items():
            lines.append(Heading(f'{self.policy.__name__} per key, scope {scope}',
                                 f'  ({entry.keys} key(s), {entry.in_use} in use, {entry.parked} parked)'))
            lines += ['  ' + line for line in self.policy.key_lines(entry.busiest, self.now)]
            if entry.keys > len(entry.busiest):
                lines.append(f'  ... and {entry.keys - len(entry.busiest)} more (rq-policies keys {scope})')
        return lines


def _keyed_classes() -> list[type[KeyedPolicy]]:
    from rq_policies.engine.policy import FETCH, registered

    return [cls for cls in registered(FETCH) if issubclass(cls, KeyedPolicy)]


def job_key_ids(classes: list[type[KeyedPolicy]], values: list[Any]) -> list[str]:
    """The distinct key ids (``<scope>:<key>``) of a job's per-key fields (``values``: each class's field as read,
    or None)."""
    out: list[str] = []
    for cls, raw in zip(classes, values):
        if raw is None:
            continue
        key_id = text(raw).split(' ', cls.setting_words)[-1]
        if key_id not in out:
            out.append(key_id)
    return out


class Concurrency(KeyedPolicy):
    """At most ``limit`` jobs of one key running at once across the cluster, whatever their queue.

    Example::

        @policy(Concurrency(2, key=lambda args, kwargs: kwargs['customer_id']))
        def sync_customer(customer_id, full=False): ...   # <= 2 running per customer

        @policy(Concurrency(1))          # no key: the job's identity; two runs of one payload never overlap
        def rebuild_report(report_id): ...

        @policy(Concurrency(3, key=lambda a, k: k['customer_id'], scope='billing'))
        def charge(customer_id): ...     # every function with scope='billing' shares one budget per customer

    Args:
        limit: jobs of one key running at once, a positive integer (``Concurrency.set(scope, key, n)`` changes it
            per key at run time).
        key: ``(args, kwargs) -> str | int``; None keys on the job's identity digest.
        scope: the namespace keys are counted in (no colon); default: the function's import path.
        cost: the units of the key's limit one job takes while it runs, an int from 1 to ``limit`` or
            ``(args, kwargs) -> int`` (Sidekiq Enterprise's points, Oban's weights, Hatchet's units): the running
            jobs' costs per key never add up to more than the limit. A cost above ``limit`` is refused at enqueue
            (ValueError naming ``cost``), before anything is written. The costs of a key's holds above 1 live in
            ``rq:policies:keyunits:<scope>:<key>`` (gone with the key's last such hold).

    A job whose key is at its limit is parked (status ``deferred``, in rq's deferred registry) and the jobs behind it
    run; it goes back to the front of its queue when a hold of its key is released or expires.
    """

    name: ClassVar[str] = 'concurrency'
    field: ClassVar[str] = 'policies_concurrency'
    holds: ClassVar[bool] = True
    #: The run-time setting is one limit per key (:meth:`set`): the dashboard's override form offers it.
    key_limit_setting: ClassVar[bool] = True

    def __init__(self, limit: int, key: KeyFunction | None = None, scope: str | None = None,
                 cost: int | KeyFunction = 1) -> None:
        self.limit = positive_int('limit', limit, MAX_CAPACITY)
        if not callable(cost):
            _cost(cost, self.limit)
        self.cost = cost
        super().__init__(key, scope)

    def call_fields(self, job: Any, queue: str, digest: str) -> list[Any]:
        field, value = super().call_fields(job, queue, digest)
        cost = self.job_cost(job)
        if cost == 1:
            return [field, value]
        limit, key_id = value.split(' ', 1)  # a costed job: '<limit>*<cost> <scope>:<key>'
        return [field, f'{limit}*{cost} {key_id}']

    def __repr__(self) -> str:
        words = [str(self.limit)]
        if self.key is not None:
            words.append(f'key={getattr(self.key, "__name__", self.key)}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        if self.cost != 1:
            words.append(f'cost={getattr(self.cost, "__name__", self.cost)}')
        return f'Concurrency({", ".join(words)})'

    def setting(self) -> str:
        return str(self.limit)

    # -- the hold -------------------------------------------------------------------------------------------------

    @classmethod
    def release_hold(cls, connection: Any, hold: Any, wake: str) -> bool:
        call = release_call(hold)
        removed = call.run(connection)
        ledger.PROCESS.discard(hold.token)
        return True if hasattr(connection, 'command_stack') else removed == 1

    # -- run-time settings and gauges -----------------------------------------------------------------------------

    @classmethod
    def set(cls, scope: str, key: Any, limit: int, connection: Any = None) -> KeyLimit:
        """Set the limit of one key of ``scope`` to ``limit`` at run time; it wins over the limit its jobs declare.

        Every worker obeys it from its next fetch; a raised limit gives the key's parked jobs back at once. The
        admin API's shape (:mod:`rq_policies.engine.admin`).

        Args:
            scope: the key's scope (the function's import path unless the policy names one).
            key: the key value, a str or an int (``12`` and ``'12'`` are one key).
            limit: jobs of the key running at once, a positive integer.
            connection: the Redis connection.

        Returns:
            The limit now set.

        Raises:
            InvalidSetting: (a ValueError) naming the argument and the value; nothing is written.
        """
        with refusing():
            call = _setting_call(cls.name, keys.KEY_LIMITS, scope, key,
                                 str(positive_int('limit', limit, MAX_CAPACITY)))
            conn = _need(connection)
        call.run(conn)
        return KeyLimit(limit)

    @classmethod
    def get(cls, scope: str, key: Any, connection: Any = None) -> KeyLimit | None:
        """The limit set at run time for one key of ``scope``, or None (its jobs' declared limit applies; see
        :meth:`status` for the limit in force)."""
        with refusing():
            key_id = keys.key_id(check_scope(scope), key_text(key))
            conn = _need(connection)
        raw = conn.hget(keys.KEY_LIMITS, key_id)
        return KeyLimit(int(raw)) if raw is not None else None

    @classmethod
    def clear(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Remove the run-time limit of one key: its jobs' declared limit applies again. Returns True when it had
        one."""
        with refusing():
            call = _setting_call(cls.name, keys.KEY_LIMITS, scope, key, '')
            conn = _need(connection)
        return call.answered().run(conn) == 1

    @classmethod
    def status(cls, scope: str, key: Any, connection: Any = None) -> KeyStatus:
        """One key's state now (server clock): the limit in force (the run-time one, else the one a parked or
        running job of the key declares), the holds in use, the parked jobs and a back-off."""
        with refusing():
            scope, name = check_scope(scope), key_text(key)
            conn = _need(connection)
        now = _server_now(conn)
        row = _key_rows(conn, cls.name, scope, [name], now)[0]
        parked = tuple(text(j) for j in conn.lrange(f'{keys.KEY_PARKED_PREFIX}{cls.name}:'
                                                    f'{keys.key_id(scope, name)}', 0, -1))
        blocked = cls.blocked_until(scope, name, conn)
        return KeyStatus(row['limit'], row['overridden'], row['in_use'], parked,
                         blocked if blocked is not None and blocked > now else None)

    # -- the 0.2 names (deprecated, removed in 0.4) ----------------------------------------------------------------

    @classmethod
    @deprecated('Concurrency.set(scope, key, limit, connection=), which returns a KeyLimit')
    def override(cls, scope: str, key: Any, limit: int, connection: Any = None) -> bool:
        """Deprecated: :meth:`set`. Returns True when the key had an override."""
        had = cls.get(scope, key, connection=connection) is not None
        cls.set(scope, key, limit, connection=connection)
        return had

    @classmethod
    @deprecated('Concurrency.get(scope, key, connection=), which returns a KeyLimit or None')
    def overridden(cls, scope: str, key: Any, connection: Any = None) -> int | None:
        """Deprecated: :meth:`get`."""
        found = cls.get(scope, key, connection=connection)
        return found.limit if found is not None else None

    @classmethod
    @deprecated('Concurrency.status(scope, key, connection=).in_use')
    def in_use(cls, scope: str, key: Any, connection: Any = None) -> int:
        """Deprecated: :meth:`status` ``.in_use``."""
        with refusing():
            conn = _need(connection)
            key_id = keys.key_id(check_scope(scope), key_text(key))
        return int(conn.zcount(keys.KEY_HOLDS_PREFIX + key_id, f'({_server_now(conn):.6f}', '+inf'))

    @classmethod
    def parked(cls, scope: str, key: Any, connection: Any = None) -> list[str]:
        """The ids of one key's parked jobs, oldest first (the order they go back in)."""
        key_id = keys.key_id(check_scope(scope), key_text(key))
        return [text(j) for j in _need(connection).lrange(f'{keys.KEY_PARKED_PREFIX}{cls.name}:{key_id}', 0, -1)]

    @classmethod
    def key_rows(cls, connection: Any, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` with live holds or parked jobs, busiest first, at most ``limit`` (0: all): each
        ``{'key', 'in_use', 'limit' (override, else the declared limit of a parked or running job's, or None),
        'overridden', 'parked', 'next_due' (server time, or None: the key's oldest hold's crash expiry or its
        back-off's end), 'backoff_until', 'waiting_for' ('release', 'backoff', 'fetch' or None: what the parked jobs
        wait for)}``. Found by SCAN (MATCH, COUNT), never KEYS, unless ``names`` gives the keys to read."""
        conn = _need(connection)
        scope = check_scope(scope)
        now = _server_now(conn) if now is None else now
        if names is None:
            found: set[str] = set()
            pattern = _glob(scope) + ':*'
            for prefix in (keys.KEY_HOLDS_PREFIX, f'{keys.KEY_PARKED_PREFIX}{cls.name}:'):
                for raw in keys.scanner(conn).scan_iter(match=prefix + pattern, count=1000):
                    found.add(text(raw)[len(prefix) + len(scope) + 1:])
            names = sorted(k for k in found if search is None or search in k)
        rows = _key_rows(conn, cls.name, scope, names, now)
        rows.sort(key=lambda r: (-(r['in_use'] + r['parked']), r['key']))
        return rows[:limit] if limit else rows

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[Metric]:
        """Two gauges of the due index, O(log n) whatever the number of keys (no SCAN in a scrape): how many keys
        (of Concurrency and Rate) have parked jobs, and how late the most overdue one is being served (seconds past
        its due time; it stays near 0 while PolicyWorkers fetch)."""
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.KEY_DUE)
            pipe.zrange(keys.KEY_DUE, 0, 0, withscores=True)
            count, head = pipe.execute()
        parked = Metric('rq_policies_keys_with_parked_jobs',
                        'Keys of the per-key policies (Concurrency, Rate) with parked jobs.')
        parked.add([], int(count))
        late = Metric('rq_policies_keys_due_overdue_seconds',
                      'Seconds the most overdue key with parked jobs is past its due time (0: none).')
        late.add([], round(max(now - head[0][1], 0.0), 3) if head else 0.0)
        return [parked, late]

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        """``rq-policies keys``'s lines for :meth:`key_rows`."""
        out = []
        for row in rows:
            limit_text = '?' if row['limit'] is None else str(row['limit'])
            waiting = waiting_words(row, now)
            mark = ' (override)' if row['overridden'] else ''
            out.append(f'key {row["key"]}  {row["in_use"]}/{limit_text}{mark} in use, {row["parked"]} parked'
                       + (f'; {waiting}' if waiting else ''))
        return out

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """The busiest keys of each scope, from one bounded SCAN walk (:func:`sample_keys`): at most
        ``PANEL_BUDGET`` keys examined and ``PANEL_KEYS`` keys read per scope, with a note when the walk stopped
        early (``rq-policies keys SCOPE --limit 0`` reads them all)."""
        found, complete = sample_keys(connection, cls.name, holds=True)
        out = []
        for scope in sorted(found):
            names, note = panel_names(found[scope], search, complete)
            rows = cls.key_rows(connection, scope, limit, search, now, names=names)
            if not rows:
                continue
            out.append(Panel(
                f'Concurrency per key: {scope}', ['key', 'in use', 'limit', 'parked', 'waiting for'],
                [[
                    row['key'],
                    Cell(str(row['in_use']), warn=True)
                    if row['limit'] is not None and row['in_use'] > row['limit'] else row['in_use'],
                    row['limit'], row['parked'],
                    _waiting_cell(row, now),
                ] for row in rows],
                note,
            ))
        return out

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[Explanation]:
        raw = job.get(cls.field)
        if not raw:
            return []
        declared, _, key_id = raw.partition(' ')
        declared = declared.partition('*')[0]  # a costed job's '<limit>*<cost>'
        scope, _, key = key_id.partition(':')
        ledger_key = keys.KEY_HOLDS_PREFIX + key_id
        parked_key = f'{keys.KEY_PARKED_PREFIX}{cls.name}:{key_id}'
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcount(ledger_key, f'({now:.6f}', '+inf')
            pipe.hget(keys.KEY_LIMITS, key_id)
            pipe.lpos(parked_key, job['id'])
            pipe.get(keys.KEY_BLOCK_PREFIX + key_id)
            in_use, override, position, blocked = pipe.execute()
        limit = int(override) if override is not None else int(declared)
        entry: dict[str, Any] = {'scope': scope, 'key': key, 'limit': limit,
                                 'in_use': int(in_use), 'overridden': override is not None}
        words = f'key {key!r} (scope {scope}) at {int(in_use)}/{limit}'
        if position is not None:
            entry['parked_position'] = int(position)
            words += f' (parked, position {int(position) + 1})'
            change = ('it goes back to the front of its queue when a hold of its key is released or expires '
                      '(or raise the key\'s limit: rq-policies override)')
        else:
            change = ''
        if blocked is not None and float(blocked) > now:
            entry['backoff_until'] = float(blocked)
            words += f', backed off for {float(blocked) - now:.1f} s more'
        verdict = words
        return [Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def commands(cls) -> tuple[View, ...]:
        """``rq-policies keys`` (every per-key policy's keys of a scope) and ``rq-policies override``."""
        return (
            Command(
                'keys', 'The keys of SCOPE with running or parked jobs (Concurrency, Rate): in use / limit, parked, '
                        'and what\nthe parked jobs wait for (a release, a back-off, a rate), with local times.',
                arguments=(Argument('scope'),),
                options=(Option('--limit', 'limit', 'List at most this many keys (0: all; 20).', default='20'),
                         Option('--search', 'search', 'Only keys containing this text.'),
                         Option('--json', 'as_json', 'Print the keys as JSON (server-clock times).', is_flag=True)),
                prepare=_keys_prepare, run=_keys_run,
            ),
            Setting(
                'override', 'Set the Concurrency limit of KEY in SCOPE to N at run time, remove that override with '
                            '--clear, or\nshow the key\'s limit and state (no N).',
                targets=(Argument('scope'), Argument('key')),
                value=Argument('n', kind=Digits(f'a positive integer up to {MAX_CAPACITY}', 1, MAX_CAPACITY)),
                clear_help='Remove the override: the declared limit applies again.',
                json_help='Print the key\'s state as JSON.',
                prepare=_override_prepare, status=_override_status, set=_override_set, clear=_override_clear,
            ),
        )


def _keys_prepare(values: Values) -> Values:
    count = Digits('a positive integer up to 1000000000', 0, 10**9).parse(values['limit'], '--limit')
    try:
        check_scope(values['scope'])
    except ValueError as exc:
        raise BadArgument(str(exc), 'SCOPE') from None
    return {**values, 'limit': count}


def _keys_run(conn: Redis, values: Values) -> Reply:
    scope, count, search = str(values['scope']), int(values['limit']), values['search']  # type: ignore[call-overload]
    now = _server_now(conn)
    if values['as_json']:
        return Reply(data={'scope': scope, 'server_time': now,
                           'policies': {policy.name: policy.key_rows(conn, scope, count, search, now)
                                        for policy in _keyed_classes()}})
    lines = []
    for policy in _keyed_classes():
        lines += policy.key_lines(policy.key_rows(conn, scope, count, search, now), now)
    return Reply(tuple(lines or [f'No key of scope {scope!r} has running or parked jobs.']))


def _override_prepare(values: Values, mode: str) -> Values:
    try:
        check_scope(values['scope'])
        key_text(values['key'])
    except (TypeError, ValueError) as exc:
        raise BadArgument(str(exc), 'SCOPE' if 'scope' in str(exc) else 'KEY') from None
    return values


def _override_status(conn: Redis, values: Values) -> Reply:
    scope, key = str(values['scope']), str(values['key'])
    status = Concurrency.status(scope, key, connection=conn)
    if values['as_json']:
        return Reply(data={'scope': scope, 'key': key, 'limit': status.limit, 'overridden': status.overridden,
                           'in_use': status.in_use, 'parked': list(status.parked),
                           'backoff_until': status.backoff_until})
    limit = 'no known limit' if status.limit is None else (
        f'limit {status.limit} ({"override" if status.overridden else "declared"})')
    return Reply((f'Key {key!r} of scope {scope!r}: {limit}, {status.in_use} in use, {len(status.parked)} parked.',))


def _override_set(conn: Redis, values: Values) -> Reply:
    scope, key, n = str(values['scope']), str(values['key']), values['n']
    before = Concurrency.get(scope, key, connection=conn)
    Concurrency.set(scope, key, n, connection=conn)  # type: ignore[arg-type]
    return _override_changed(conn, values, before, f'Key {key!r} of scope {scope!r} is limited to {n} running at once')


def _override_clear(conn: Redis, values: Values) -> Reply:
    scope, key = str(values['scope']), str(values['key'])
    before = Concurrency.get(scope, key, connection=conn)
    Concurrency.clear(scope, key, connection=conn)
    return _override_changed(conn, values, before, f'Key {key!r} of scope {scope!r} has its declared limit again')


def _override_changed(conn: Redis, values: Values, before: KeyLimit | None, words: str) -> Reply:
    if values['as_json']:
        found = Concurrency.get(str(values['scope']), str(values['key']), connection=conn)
        return Reply(data={'scope': values['scope'], 'key': values['key'], 'override': found.limit if found else None,
                           'was': before.limit if before else None})
    was = f'was {before.limit}' if before is not None else 'had no override'
    return Reply((f'{words} ({was}).',))


def release_call(hold: Any) -> Call:
    """The ``lua/key_release.lua`` call giving back a per-key hold (and its unit to the key's oldest parked job)."""
    key_id = hold.ledger[len(keys.KEY_HOLDS_PREFIX):]
    call = Call('key_release', token=hold.token, key_id=key_id, ttl=hold.ttl, keyed=keyed_args())
    call.key('ledger', hold.ledger).key('parked', f'{keys.KEY_PARKED_PREFIX}{Concurrency.name}:{key_id}')
    return call.key('keydue', keys.KEY_DUE)


def _setting_call(policy: str, hash_key: str, scope: str, key: Any, value: str) -> Call:
    """The ``lua/key_setting.lua`` call storing ``value`` as one key's run-time setting in ``hash_key`` ('' clears
    it); checks the scope and the key first (ValueError or TypeError naming them)."""
    key_id = keys.key_id(check_scope(scope), key_text(key))
    call = Call('key_setting', key_id=key_id, policy=policy, value=value,
                job_prefix=Job.redis_job_namespace_prefix, wake=keys.wake(''))
    call.key('limits', hash_key)
    call.key('parked', f'{keys.KEY_PARKED_PREFIX}{policy}:{key_id}')
    return call.key('keydue', keys.KEY_DUE)


def _key_rows(conn: Any, policy: str, scope: str, names: list[str], now: float) -> list[dict[str, Any]]:
    """Each key's row. Its limit: the override, else the declared limit on the job hash of its oldest parked job, else
    of a job holding one of its units (a unit reserved for a given-back job names it; a running job is found through
    rq's worker registry, as QueueSlot's holds panel finds its holders' jobs, and counts only when its own field names
    this key). A key none of these name has no limit shown."""
    from rq_policies.policies.queue_slot.rules import _running_jobs

    width = 7
    with conn.pipeline(transaction=False) as pipe:
        for key in names:
            key_id = keys.key_id(scope, key)
            pipe.zcount(keys.KEY_HOLDS_PREFIX + key_id, f'({now:.6f}', '+inf')
            pipe.hget(keys.KEY_LIMITS, key_id)
            pipe.llen(f'{keys.KEY_PARKED_PREFIX}{policy}:{key_id}')
            pipe.lindex(f'{keys.KEY_PARKED_PREFIX}{policy}:{key_id}', 0)
            pipe.zscore(keys.KEY_DUE, f'{policy}:{key_id}')
            pipe.zrangebyscore(keys.KEY_HOLDS_PREFIX + key_id, f'({now:.6f}', '+inf', start=0, num=1)
            pipe.get(keys.KEY_BLOCK_PREFIX + key_id)
        replies = pipe.execute()
    sources: dict[int, str] = {}  # row -> the job whose declared limit it shows
    holders: dict[int, str] = {}  # row -> the token of a live hold, when no parked job or reservation names a job
    for i in range(len(names)):
        override, head, held = replies[i * width + 1], replies[i * width + 3], replies[i * width + 5]
        if override is not None:
            continue
        if head is not None:
            sources[i] = text(head)
        elif held:
            member = text(held[0])
            if member.startswith('unpark:'):
                sources[i] = member[len('unpark:'):]
            else:
                holders[i] = member
    if holders:
        running = _running_jobs(conn, list(holders.values()))
        sources.update({i: running[where] for i, token in holders.items()
                        if (where := token.rsplit(':', 2)[0]) in running})
    with conn.pipeline(transaction=False) as pipe:
        for job_id in sources.values():
            pipe.hget(Job.redis_job_namespace_prefix + job_id, 'policies_' + policy)
        fields = dict(zip(sources, pipe.execute()))
    rows = []
    for i, key in enumerate(names):
        in_use, override, parked, _, due, _, blocked = replies[i * width:i * width + width]
        limit = int(override) if override is not None else _declared_limit(fields.get(i), keys.key_id(scope, key))
        until = float(blocked) if blocked is not None and float(blocked) > now else None
        row = {'key': key, 'in_use': int(in_use), 'limit': limit, 'overridden': override is not None,
               'parked': int(parked), 'next_due': float(due) if due is not None else None, 'backoff_until': until}
        row['waiting_for'] = _waiting_for(row)
        rows.append(row)
    return rows


def _waiting_for(row: dict[str, Any]) -> str | None:
    """What a key with parked jobs waits for: ``'backoff'`` (a BackOff(key=True) ends at ``backoff_until``),
    ``'release'`` (a running job of the key ends; ``next_due`` is only the latest that can come, its hold's expiry
    should its worker die) or ``'fetch'`` (a unit is free: the next fetch gives a parked job back); None when
    nothing is parked."""
    if not row['parked']:
        return None
    if row['backoff_until'] is not None:
        return 'backoff'
    if row['limit'] is None or row['in_use'] >= row['limit']:
        return 'release'
    return 'fetch'


def waiting_words(row: dict[str, Any], now: float) -> str:
    """:func:`_waiting_for` in words, with the moments it names (local time and how far from now)."""
    from rq_policies.engine.readable import at, relative

    kind = row.get('waiting_for')
    if kind == 'backoff':
        return f'waiting for its back-off to end {at(row["backoff_until"], now)}'
    if kind == 'release':
        words = 'waiting for a release (a running job of the key ends)'
        if row.get('next_due') is not None:
            words += f'; a dead worker\'s hold expires {relative(row["next_due"] - now)}'
        return words
    if kind == 'fetch':
        return 'a unit is free: the next fetch gives a parked job back'
    return ''



def _declared_limit(raw: Any, key_id: str) -> int | None:
    """The limit in a job's ``'<limit> <scope>:<key>'`` field, when that field names ``key_id``."""
    if raw is None:
        return None
    head, _, named = text(raw).partition(' ')
    head = head.partition('*')[0]  # a costed job's '<limit>*<cost>'
    return int(head) if head.isdigit() and named == key_id else None


def _cost(value: Any, limit: int, where: str = 'cost', never: str = 'could never start') -> int:
    """A job's cost: an int from 1 to the policy's ``limit``, else a ValueError naming ``where`` and the value
    (``never`` says what a larger cost would mean)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{where} must be a positive integer, got {value!r}')
    if value > limit:
        raise ValueError(f'{where} must be at most the limit ({limit}), got {value!r}: such a job {never}')
    return value


def _scopes(conn: Any, policy: str, holds: bool = True) -> set[str]:
    """The scopes with parked jobs of ``policy`` (and, with ``holds``, live holds): SCAN with COUNT, never KEYS."""
    found: set[str] = set()
    prefixes = [f'{keys.KEY_PARKED_PREFIX}{policy}:'] + ([keys.KEY_HOLDS_PREFIX] if holds else [])
    for prefix in prefixes:
        for raw in keys.scanner(conn).scan_iter(match=prefix + '*', count=1000):
            found.add(text(raw)[len(prefix):].split(':', 1)[0])
    return found


#: What one dashboard read of a per-key policy may cost: SCAN examines at most PANEL_BUDGET keys (as
#: state.SAMPLE_BUDGET for the identity families), and at most PANEL_KEYS keys of a scope are read.
PANEL_BUDGET = 5_000
PANEL_KEYS = 200


def sample_keys(conn: Any, policy: str, holds: bool, budget: int = PANEL_BUDGET) -> tuple[dict[str, set[str]], bool]:
    """scope -> the keys with parked jobs of ``policy`` (and, with ``holds``, a hold ledger), from one SCAN walk
    (COUNT 1000) of the per-key keys that stops once ``budget`` keys were examined; and whether it reached the end."""
    prefixes = [f'{keys.KEY_PARKED_PREFIX}{policy}:'] + ([keys.KEY_HOLDS_PREFIX] if holds else [])
    found: dict[str, set[str]] = {}
    cursor, examined = 0, 0
    while True:
        cursor, batch = keys.scanner(conn).scan(cursor=cursor, match=_glob(keys.PREFIX) + 'key*', count=1000)
        examined += 1000
        for raw in batch:
            name = text(raw)
            for prefix in prefixes:
                if name.startswith(prefix):
                    scope, _, key = name[len(prefix):].partition(':')
                    found.setdefault(scope, set()).add(key)
        if cursor == 0 or examined >= budget:
            return found, cursor == 0


def panel_names(found: set[str], search: str | None, complete: bool) -> tuple[list[str], str | None]:
    """The keys of one scope a panel reads (matching ``search``, at most PANEL_KEYS) and the note it shows when that
    is not every key of the scope."""
    names = sorted(k for k in found if search is None or search in k)
    note = None
    if len(names) > PANEL_KEYS or not complete:
        note = (f'from {min(len(names), PANEL_KEYS)} of {"at least " if not complete else ""}{len(names)} keys '
                '(the page stopped looking); rq-policies keys SCOPE --limit 0 lists them all')
    return names[:PANEL_KEYS], note


def _glob(value: str) -> str:
    """``value`` with the glob characters of SCAN MATCH escaped."""
    return ''.join('\\' + ch if ch in '*?[]\\' else ch for ch in value)





def _waiting_cell(row: dict[str, Any], now: float) -> CellValue:
    """The page's "waiting for" cell of a key: what its parked jobs wait for, with the moment as a live time."""
    kind = row.get('waiting_for')
    if kind == 'backoff':
        return Cell('its back-off to end', at=row['backoff_until'] - now)
    if kind == 'release':
        if row.get('next_due') is not None:
            return Cell('a release (a running job ends)', note='a dead worker\'s hold expires',
                        at=row['next_due'] - now)
        return Cell('a release (a running job ends)')
    if kind == 'fetch':
        return 'the next fetch (a unit is free)'
    return None
