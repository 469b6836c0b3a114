"""Checks of the server's settings the policies depend on: today, that Redis never evicts their keys.

Under memory pressure a server with a ``maxmemory-policy`` other than ``noeviction`` deletes keys to make room, and
the policies' state is ordinary keys: an evicted capacity hash uncaps every queue, an evicted ledger forgets the jobs
running under a cap, an evicted loner marker or throttle slot admits a duplicate. Nothing reports it; the policies
just stop holding. BullMQ requires ``noeviction`` and warns at start; so does a PolicyWorker (at WARNING), and
``rq-policies info`` and the metrics (``rq_policies_eviction_unsafe``) say it too.

A server where ``CONFIG`` is disabled, renamed or denied by an ACL (the README's ACL denies ``@dangerous``, which
holds CONFIG) answers nothing: the policy is then ``'unknown'``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

#: The one setting under which no key of the policies is ever evicted.
SAFE_POLICY = 'noeviction'

#: What the policy reads as when the server does not tell.
UNKNOWN = 'unknown'

#: Under ``volatile-*`` only keys with a TTL go: every policy key that expires by itself.
_VOLATILE_LOSES = (
    'keys with a TTL can be evicted: QueueSlot ledgers (rq:policies:slots:*) and LimitedCapacityWorker ledgers, so '
    'jobs running under a cap are forgotten and the cap is exceeded; throttle slots, pending trailing and debounce '
    'state, and the loner markers of jobs with a ttl, so duplicates are admitted'
)

#: Under ``allkeys-*`` any key goes, the configuration too.
_ALLKEYS_LOSES = (
    'any key can be evicted: the capacity hash (rq:policies:capacity), so every cap silently disappears; QueueSlot '
    'and LimitedCapacityWorker ledgers, so caps are exceeded; loner markers and throttle slots, so duplicates are '
    "admitted; and rq's own queues and jobs"
)


@dataclass(frozen=True)
class EvictionCheck:
    """What the server's ``maxmemory-policy`` means for the policies.

    Attributes:
        maxmemory_policy: the setting as the server reports it, or ``'unknown'`` when it cannot be read.
        unsafe: True when it may evict policy keys, False under ``noeviction``, None when unknown.
        warning: one line saying what it breaks (or that it could not be read); None when it is safe.
    """

    maxmemory_policy: str
    unsafe: bool | None
    warning: str | None


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


def eviction_check(connection: Any) -> EvictionCheck:
    """Read ``maxmemory-policy`` and say what it breaks (see :class:`EvictionCheck`)."""
    policy = maxmemory_policy(connection)
    if policy == SAFE_POLICY:
        return EvictionCheck(policy, False, None)
    if policy == UNKNOWN:
        return EvictionCheck(policy, None, (
            'rq-policies could not read maxmemory-policy (CONFIG is disabled, renamed or denied); make sure it is '
            f'{SAFE_POLICY}, or evicted keys silently break caps, loner markers and throttles'
        ))
    loses = _ALLKEYS_LOSES if policy.startswith('allkeys-') else _VOLATILE_LOSES
    return EvictionCheck(policy, True, (
        f'Redis maxmemory-policy is {policy}, not {SAFE_POLICY}: under memory pressure {loses}. '
        f'Set maxmemory-policy {SAFE_POLICY}'
    ))


def warn_if_evicting(connection: Any, log: logging.Logger) -> EvictionCheck | None:
    """Log :func:`eviction_check`'s warning on ``log``: at WARNING for an evicting policy, at INFO when unknown.

    Never raises: a check that cannot run (Redis unreachable at this moment) must not keep a worker from starting.
    """
    try:
        check = eviction_check(connection)
    except Exception as exc:  # the worker's own first command reports an unreachable Redis
        log.debug('rq-policies: could not check maxmemory-policy: %s', exc)
        return None
    if check.unsafe:
        log.warning('rq-policies: %s', check.warning)
    elif check.warning:
        log.info('rq-policies: %s', check.warning)
    return check
