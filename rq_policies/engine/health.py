"""Checks of the server's settings the policies depend on: today, that Redis never evicts their keys.

Under memory pressure a server with a ``maxmemory-policy`` other than ``noeviction`` deletes keys to make room, and
the policies' state is ordinary keys: an evicted capacity hash uncaps every queue, an evicted ledger forgets the jobs
running under a cap, an evicted loner marker or throttle slot admits a duplicate. Nothing reports it; the policies
just stop holding. BullMQ requires ``noeviction`` and warns at start; so does a PolicyWorker (at WARNING), and
``rq-policies info`` and the metrics (``rq_policies_eviction_unsafe``) say it too.

A server where ``CONFIG`` is disabled, renamed or denied by an ACL (the ACL in docs/acl.md denies ``@dangerous``, which
holds CONFIG) answers nothing: the policy is then ``'unknown'``.

The setting says what *may* happen; the server's ``evicted_keys`` counter (``INFO stats``) says what *did*: keys
evicted since the server started or its statistics were last reset (``CONFIG RESETSTAT``). Any eviction on a server
holding the policies' state may have lost some of it, whatever the policy is now, so ``rq-policies info``, the
dashboard page and the metrics (``rq_policies_redis_evicted_keys_total``) report the count, and a PolicyWorker logs
a warning once when the count rises while it runs (:class:`EvictionWatch`, read on the worker's own heartbeat: no
command of its own, nothing per job). Like Sidekiq's and BullMQ's eviction warnings, it reports and does not repair:
what was evicted is gone; ``rq-policies info`` shows what is left.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from . import keys
from .ops import on_next_execute

#: The one setting under which no key of the policies is ever evicted.
SAFE_POLICY = 'noeviction'

#: What the policy reads as when the server does not tell.
UNKNOWN = 'unknown'

#: Under ``volatile-*`` only keys with a TTL go: every policy key that expires by itself.
_VOLATILE_LOSES = (
    f'keys with a TTL can be evicted: QueueSlot ledgers ({keys.holds("")}*) and LimitedCapacityWorker ledgers, so '
    'jobs running under a cap are forgotten and the cap is exceeded; throttle slots, pending trailing and debounce '
    'state, and the loner markers of jobs with a ttl, so duplicates are admitted'
)

#: Under ``allkeys-*`` any key goes, the configuration too.
_ALLKEYS_LOSES = (
    f'any key can be evicted: the capacity hash ({keys.CAPACITY}), so every cap silently disappears; QueueSlot '
    'and LimitedCapacityWorker ledgers, so caps are exceeded; loner markers and throttle slots, so duplicates are '
    "admitted; and rq's own queues and jobs"
)


@dataclass(frozen=True)
class EvictionCheck:
    """What the server's ``maxmemory-policy`` means for the policies.

    Attributes:
        maxmemory_policy: the setting as the server reports it, or ``'unknown'`` when it cannot be read.
        unsafe: True when it may evict policy keys, False under ``noeviction``, None when unknown.
        warning: what it breaks (or that it could not be read), then the keys actually evicted, if any; None when
            the setting is safe and nothing was evicted.
        evicted_keys: the server's ``evicted_keys`` (``INFO stats``): keys evicted since it started or its last
            ``CONFIG RESETSTAT``; None when INFO is denied (or not read).
    """

    maxmemory_policy: str
    unsafe: bool | None
    warning: str | None
    evicted_keys: int | None = None


def maxmemory_policy(connection: Any) -> str:
    """The server's ``maxmemory-policy``, or ``'unknown'`` when CONFIG is disabled, renamed or denied."""
    try:
        found = connection.config_get('maxmemory-policy')
    except ResponseError:  # unknown command (disabled, renamed), NOPERM (an ACL), or a proxy refusing it
        return UNKNOWN
    value = found.get('maxmemory-policy') if isinstance(found, dict) else None
    if value is None:
        value = found.get(b'maxmemory-policy') if isinstance(found, dict) else None
    if value is None:
        return UNKNOWN
    return value.decode() if isinstance(value, bytes) else str(value)


def evicted_keys(connection: Any) -> int | None:
    """The server's ``evicted_keys`` (``INFO stats``), or None when INFO is disabled, renamed or denied (it is in
    ``@dangerous``)."""
    try:
        stats = connection.info('stats')
    except ResponseError:
        return None
    return _evicted_in(stats)


def _evicted_in(stats: Any) -> int | None:
    value = stats.get('evicted_keys') if isinstance(stats, dict) else None
    if isinstance(value, bool):
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def evicted_warning(count: int) -> str:
    """The line every surface shows when the server has evicted ``count`` (> 0) keys."""
    return (
        f'Redis has evicted {count} key{"s" if count != 1 else ""} (INFO stats evicted_keys, counted since the '
        'server started or its last CONFIG RESETSTAT): policy state may have been among them (caps, ledgers, loner '
        'markers, throttle slots), so caps may have been exceeded and duplicates admitted. Give Redis more memory, '
        f'keep maxmemory-policy {SAFE_POLICY}, and run CONFIG RESETSTAT once checked'
    )


def eviction_check(connection: Any) -> EvictionCheck:
    """Read ``maxmemory-policy`` and ``evicted_keys`` and say what they break (see :class:`EvictionCheck`)."""
    policy = maxmemory_policy(connection)
    evicted = evicted_keys(connection)
    if policy == SAFE_POLICY:
        unsafe: bool | None = False
        warning = None
    elif policy == UNKNOWN:
        unsafe, warning = None, (
            'rq-policies could not read maxmemory-policy (CONFIG is disabled, renamed or denied); make sure it is '
            f'{SAFE_POLICY}, or evicted keys silently break caps, loner markers and throttles'
        )
    else:
        loses = _ALLKEYS_LOSES if policy.startswith('allkeys-') else _VOLATILE_LOSES
        unsafe, warning = True, (
            f'Redis maxmemory-policy is {policy}, not {SAFE_POLICY}: under memory pressure {loses}. '
            f'Set maxmemory-policy {SAFE_POLICY}'
        )
    if evicted:
        warning = f'{warning}. {evicted_warning(evicted)}' if warning else evicted_warning(evicted)
    return EvictionCheck(policy, unsafe, warning, evicted)


def warn_if_evicting(connection: Any, log: logging.Logger) -> EvictionCheck | None:
    """Log :func:`eviction_check`'s warning on ``log``: at WARNING for an evicting policy or keys already evicted,
    at INFO when the policy is unknown; on fakeredis, which has none, once per process at DEBUG.

    Never raises: a check that cannot run (Redis unreachable at this moment) must not keep a worker from starting.
    """
    try:
        check = eviction_check(connection)
    except Exception as exc:  # the worker's own first command reports an unreachable Redis
        log.debug('rq-policies: could not check maxmemory-policy: %s', exc)
        return None
    if check.unsafe or check.evicted_keys:
        log.warning('rq-policies: %s', check.warning)
    elif check.warning and type(connection).__module__.startswith('fakeredis'):
        # fakeredis (users' unit tests) has no CONFIG and evicts nothing: said once per process, at DEBUG
        global _FAKE_NOTED
        if not _FAKE_NOTED:
            _FAKE_NOTED = True
            log.debug('rq-policies: fakeredis has no maxmemory-policy to check (it never evicts)')
    elif check.warning:
        log.info('rq-policies: %s', check.warning)
    return check


#: Has this process said that fakeredis has no maxmemory-policy (:func:`warn_if_evicting`)?
_FAKE_NOTED = False


#: Seconds between two reads of ``evicted_keys`` by a worker (each rides a heartbeat the worker sends anyway).
EVICTION_WATCH_SECONDS = 60.0


class EvictionWatch:
    """A worker's watch on the server's ``evicted_keys``: logs one WARNING when the count rises while it runs.

    The count is read at start (:meth:`start`, beside the ``maxmemory-policy`` check) and then by an ``INFO stats``
    appended to a heartbeat pipeline the worker sends anyway (:meth:`ride`), at most once per ``interval`` seconds:
    no round trip of its own and nothing per job. On a cluster, whose pipelines take no keyless command, the
    reading is a command of its own to the primary serving the prefix's slot, at most once per ``interval``. A busy
    worker heartbeats after every job and every ``job_monitoring_interval`` while one runs, so a rise is reported
    within ``interval`` plus that; an idle one heartbeats every ``dequeue_timeout`` (rq's default: ``worker_ttl -
    15``, 405 s). Only the process that started the watch reads (never a forked work horse, which shares the
    object). The warning is logged once per worker: a server evicting under pressure would otherwise repeat it every
    minute; the metrics count every rise.

    A server that denies INFO (an ACL) turns the watch off at start. A count that falls (a restart, a
    ``CONFIG RESETSTAT``) becomes the new baseline.
    """

    def __init__(self, log: logging.Logger, interval: float = EVICTION_WATCH_SECONDS) -> None:
        self.log = log
        self.interval = interval
        self.baseline: int | None = None  # the count at start; None until read
        self.count: int | None = None  # the count last read
        self.warned = False
        self._on = True
        self._pid = 0
        self._next = 0.0
        self._node: str | None = None  # on a cluster: the node the last reading came from

    def start(self, check: EvictionCheck | None, connection: Any = None) -> None:
        """Take the baseline from the worker's start check (:func:`warn_if_evicting`; None when Redis was
        unreachable then, and the first heartbeat's reading becomes the baseline). On a cluster (``connection`` a
        cluster client) the baseline is the count of the primary serving the prefix's slot, which the watch reads
        from then on (the start check's count is every node's)."""
        self._pid = os.getpid()
        self._next = time.monotonic() + self.interval
        if check is not None:
            self.baseline = self.count = check.evicted_keys
            self._on = check.evicted_keys is not None  # INFO denied: nothing to watch
        if self._on and keys.is_cluster(connection):
            self.baseline = self.count = None
            self._read_slot_primary(connection)

    def ride(self, pipeline: Any, connection: Any = None) -> None:
        """Append ``INFO stats`` to ``pipeline`` when a reading is due, and read its reply when it executes.

        A cluster's pipeline refuses INFO (a keyless command: redis-py cannot route it, and a transaction must stay
        in one slot), so on a cluster the reading is one ``INFO stats`` of its own, sent now to the primary serving
        the prefix's slot through ``connection`` (the pipeline's client when not given): at most one round trip per
        ``interval``. Nothing keyless ever goes into a cluster pipeline, and no error of the reading fails the
        heartbeat.
        """
        if not self._on or not self._pid or self._pid != os.getpid():
            return
        at_time = time.monotonic()
        if at_time < self._next:
            return
        self._next = at_time + self.interval
        if keys.is_cluster(pipeline) or keys.is_cluster(connection):
            self._read_slot_primary(connection if connection is not None else pipeline)
            return
        at = len(pipeline.command_stack)
        pipeline.info('stats')

        def read(replies: list[Any]) -> None:
            try:
                self.observe(_evicted_in(replies[at]))
            except Exception:  # an answer of another shape is not worth failing a heartbeat for, nor hiding
                self.log.debug('rq-policies: could not read evicted_keys from the heartbeat (reply %r)',
                               replies[at] if at < len(replies) else None, exc_info=True)

        on_next_execute(pipeline, read)

    def _read_slot_primary(self, cluster: Any) -> None:
        """One reading of ``evicted_keys`` on the primary serving the prefix's slot (where every key of ours and
        rq's is). A reading from another node than the last (a failover, a slot migration) is a new baseline: each
        node counts its own evictions."""
        try:
            node = cluster.get_node_from_key(keys.PREFIX)
            count = _evicted_in(cluster.get_redis_connection(node).info('stats'))
        except Exception:  # unreachable, denied, mid-failover: the next reading tries again; never fails a heartbeat
            self.log.debug('rq-policies: could not read evicted_keys on the cluster', exc_info=True)
            return
        if node.name != self._node:
            self._node = node.name
            self.baseline = self.count = count
            return
        self.observe(count)

    def observe(self, count: int | None) -> bool:
        """Take one reading; True when it is the rise that logged the warning."""
        if count is None:
            return False
        self.count = count
        if self.baseline is None or count < self.baseline:
            self.baseline = count
            return False
        if count == self.baseline or self.warned:
            return False
        self.warned = True
        self.log.warning(
            'rq-policies: Redis evicted %s key(s) since this worker started (evicted_keys %s -> %s): policy state '
            'may have been among them (caps, ledgers, loner markers, throttle slots), so caps may be exceeded and '
            'duplicates admitted. Give Redis more memory and set maxmemory-policy %s (logged once per worker)',
            count - self.baseline, self.baseline, count, SAFE_POLICY,
        )
        return True
