"""Concurrency: at most N jobs of one *key* running at once across the cluster (per customer, per shop, per payload).

A per-job fetch policy (:class:`rq_policies.engine.keyed.KeyedPolicy`): the key, computed at enqueue, travels on the
job hash (``policies_concurrency = '<limit> <scope>:<key>'``); the fetch checks it after the pop
(``lua/policies/concurrency.lua``), and a job whose key is at its limit is parked on the key, out of the way of the
jobs behind it, until a hold of its key is released or expires. Holds are a ledger per key
(``rq:policies:keyholds:<scope>:<key>``), as QueueSlot's per queue. The design (why the key travels on the job, no
head-of-line blocking, unparking, the due index) is docs/architecture.md's "Per-job fetch policies"; how to use it,
docs/per-key.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rq.job import Job

from rq_policies.engine import keyed, keys, ledger, reading
from rq_policies.engine.admin import KeyLimit, KeyStatus, deprecated, refusing
from rq_policies.engine.keyed import KeyedPolicy, KeyFunction, check_scope, key_text, keyed_args, rule_source
from rq_policies.engine.ops import Call, text
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import server_now as _server_now
from rq_policies.engine.policy import MAX_CAPACITY, positive_int

__all__ = ['Concurrency', 'KeyFunction', 'KeyedPolicy']


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
    payload_fields: ClassVar[tuple[str, ...]] = (field,)
    holds: ClassVar[bool] = True
    key_settings: ClassVar[str] = keys.KEY_LIMITS

    def __init__(self, limit: int, key: KeyFunction | None = None, scope: str | None = None,
                 cost: int | KeyFunction = 1) -> None:
        self.limit = positive_int('limit', limit, MAX_CAPACITY)
        if not callable(cost):
            keyed.cost(cost, self.limit)
        self.cost = cost
        super().__init__(key, scope)

    def setting(self) -> str:
        return str(self.limit)

    @classmethod
    def rule_setting(cls, value: Any, where: str) -> str:
        return str(positive_int(where, value, MAX_CAPACITY))

    @classmethod
    def rule_value(cls, stored: str) -> int:
        return int(stored)

    # -- the hold -------------------------------------------------------------------------------------------------

    @classmethod
    def release_hold(cls, connection: Any, hold: Any, wake: str) -> bool:
        call = release_call(hold)
        removed = call.run(connection)
        ledger.PROCESS.discard(hold.token)
        return True if hasattr(connection, 'command_stack') else removed == 1

    # -- run-time settings and gauges -----------------------------------------------------------------------------

    @classmethod
    def set(cls, scope: str, key: Any, limit: int, connection: Any = None, force: bool = False) -> KeyLimit:
        """Set the limit of one key of ``scope`` (a str or an int: ``12`` and ``'12'`` are one key) to ``limit`` at
        run time; it wins over the limit its jobs declare, from every worker's next fetch, and a raised limit gives
        the key's parked jobs back at once. The admin API's shape and errors (:mod:`rq_policies.engine.admin`).

        A scope no Concurrency is known to use (declared in this process, the import path of a function declaring
        one, or with state in Redis) is refused as a typo (:class:`~rq_policies.engine.exceptions.InvalidSetting`
        naming it); ``force=True`` sets it anyway."""
        with refusing():
            positive_int('limit', limit, MAX_CAPACITY)
        cls.write_setting(scope, key, str(limit), connection, force)
        return KeyLimit(limit)

    @classmethod
    def get(cls, scope: str, key: Any, connection: Any = None) -> KeyLimit | None:
        """The limit set at run time for one key of ``scope``, or None (its jobs' declared limit applies; see
        :meth:`status` for the limit in force)."""
        raw = cls.read_setting(scope, key, connection)
        return KeyLimit(int(raw)) if raw is not None else None

    @classmethod
    def status(cls, scope: str, key: Any, connection: Any = None) -> KeyStatus:
        """One key's state now (server clock): the limit in force (the run-time one, else the one a parked or
        running job of the key declares), the holds in use, the parked jobs and a back-off."""
        with refusing():
            scope, name = check_scope(scope), key_text(key)
            conn = _need(connection)
        now = _server_now(conn)
        row = _key_rows(conn, cls.name, scope, [name], now)[0]
        parked = tuple(text(j) for j in conn.lrange(keys.KEY_PARKED_PREFIX(cls.name, keys.key_id(scope, name)), 0, -1))
        blocked = cls.blocked_until(scope, name, conn)
        return KeyStatus(row['limit'], row['overridden'], row['in_use'], parked,
                         blocked if blocked is not None and blocked > now else None, row['source'])

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
        return int(conn.zcount(keys.KEY_HOLDS_PREFIX(key_id), f'({_server_now(conn):.6f}', '+inf'))


def release_call(hold: Any) -> Call:
    """The ``lua/key_release.lua`` call giving back a per-key hold (and its unit to the key's oldest parked job)."""
    key_id = hold.ledger[len(keys.KEY_HOLDS_PREFIX):]
    call = Call('key_release', token=hold.token, key_id=key_id, ttl=hold.ttl, keyed=keyed_args())
    call.key('ledger', hold.ledger).key('parked', keys.KEY_PARKED_PREFIX(Concurrency.name, key_id))
    return call.key('keydue', keys.KEY_DUE)



def key_limit(key: Any, override: Any, rule: Any, declared: Any) -> tuple[int | None, str | None]:
    """A key's limit and what gave it (:attr:`KeyStatus.source`): its run-time setting (``override``, as stored),
    else its scope's rule (a :class:`~rq_policies.Tiers`), else what ``declared()`` says its jobs declare."""
    if override is not None:
        return int(override), 'set'
    if rule is not None:
        limit, tier = rule.resolve(key)
        return limit, rule_source(tier)
    limit = declared()
    return limit, None if limit is None else 'declared'

def _key_rows(conn: Any, policy: str, scope: str, names: list[str], now: float) -> list[dict[str, Any]]:
    """Each key's row. Its limit: the override, else its scope's rule (:meth:`Concurrency.set_rule`), else the
    declared limit on the job hash of its oldest parked job, else of a job holding one of its units (a unit reserved
    for a given-back job names it; a running job is found through rq's worker registry, as QueueSlot's holds panel
    finds its holders' jobs, and counts only when its own field names this key). A key none of these name has no limit
    shown. ``source`` says which gave it (:attr:`KeyStatus.source`)."""
    width = 7
    rule = Concurrency.decode_rule(conn.hget(keys.KEY_RULES, Concurrency.rule_field(scope)))
    with conn.pipeline(transaction=False) as pipe:
        for key in names:
            key_id = keys.key_id(scope, key)
            pipe.zcount(keys.KEY_HOLDS_PREFIX(key_id), f'({now:.6f}', '+inf')
            pipe.hget(keys.KEY_LIMITS, key_id)
            pipe.llen(keys.KEY_PARKED_PREFIX(policy, key_id))
            pipe.lindex(keys.KEY_PARKED_PREFIX(policy, key_id), 0)
            pipe.zscore(keys.KEY_DUE, f'{policy}:{key_id}')
            pipe.zrangebyscore(keys.KEY_HOLDS_PREFIX(key_id), f'({now:.6f}', '+inf', start=0, num=1)
            pipe.get(keys.KEY_BLOCK_PREFIX(key_id))
        replies = pipe.execute()
    sources: dict[int, str] = {}  # row -> the job whose declared limit it shows
    holders: dict[int, str] = {}  # row -> the token of a live hold, when no parked job or reservation names a job
    for i in range(len(names)):
        override, head, held = replies[i * width + 1], replies[i * width + 3], replies[i * width + 5]
        if override is not None or rule is not None:
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
        running = reading.running_jobs(conn, list(holders.values()))
        sources.update({i: running[where] for i, token in holders.items()
                        if (where := token.rsplit(':', 2)[0]) in running})
    with conn.pipeline(transaction=False) as pipe:
        for job_id in sources.values():
            pipe.hget(Job.redis_job_namespace_prefix + job_id, 'policies_' + policy)
        fields = dict(zip(sources, pipe.execute()))
    rows = []
    for i, key in enumerate(names):
        in_use, override, parked, _, due, _, blocked = replies[i * width:i * width + width]
        limit, source = key_limit(key, override, rule,
                                  lambda: _declared_limit(fields.get(i), keys.key_id(scope, key)))  # noqa: B023
        until = float(blocked) if blocked is not None and float(blocked) > now else None
        row = {'key': key, 'in_use': int(in_use), 'limit': limit, 'overridden': override is not None, 'source': source,
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


def _declared_limit(raw: Any, key_id: str) -> int | None:
    """The limit in a job's ``'<limit> <scope>:<key>'`` field, when that field names ``key_id``."""
    if raw is None:
        return None
    head, _, named = text(raw).partition(' ')
    head = head.partition('*')[0]  # a costed job's '<limit>*<cost>'
    return int(head) if head.isdigit() and named == key_id else None
