"""Job functions the Fair tests enqueue; importable by worker subprocesses as ``tests.helpers.fair_jobs`` (the
repository's root is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time

from redis import Redis
from rq import get_current_job

from rq_policies import Concurrency, Fair, policy

SCOPE = 'tenants'


def _conn() -> Redis:
    return Redis.from_url(os.environ['REDIS_URL'])


def _record(tag: str, tenant: str, seconds: float) -> None:
    """Record this job's start (its ordinal among all starts of ``tag``, its tenant, its id), then sleep."""
    conn = _conn()
    n = conn.incr(f'test:fair:{tag}:n')
    conn.rpush(f'test:fair:{tag}', f'{n} {tenant} {get_current_job().id}')
    conn.close()
    if seconds:
        time.sleep(seconds)


@policy(Fair(key=lambda a, k: k['tenant'], weight=lambda a, k: 3 if k.get('plan') == 'pro' else 1, scope=SCOPE))
def work(tag, seconds=0.0, *, tenant, plan='free'):
    _record(tag, tenant, seconds)


@policy(Fair(key=lambda a, k: k['tenant'], scope='capped', max_waiting=25))
def capped(tag, *, tenant):
    _record(tag, tenant, 0)


@policy(Fair(key=lambda a, k: k['tenant'], scope='raising', max_waiting=3, on_conflict='raise'))
def raising(tag, *, tenant):
    _record(tag, tenant, 0)


@policy(Fair(key=lambda a, k: k['tenant'], scope='ranked', priority=lambda a, k: k.get('urgency', 0)))
def ranked(tag, *, tenant, urgency=0):
    _record(tag, tenant, 0)


def starts(conn: Redis, tag: str) -> list[tuple[int, str, str]]:
    """Every recorded start of ``tag``, in start order: (ordinal, tenant, job id)."""
    out = []
    for raw in conn.lrange(f'test:fair:{tag}', 0, -1):
        n, tenant, job_id = raw.decode().split(' ')
        out.append((int(n), tenant, job_id))
    return sorted(out)


@policy(Fair(key=lambda a, k: k['tenant'], scope='paged'),
        Concurrency(10, key=lambda a, k: k['tenant'], scope='paged', cost=lambda a, k: k['pages']))
def paged(tag, seconds, *, tenant, pages):
    """Fair between tenants, each tenant's running pages capped at 10 (Concurrency(10, cost=pages))."""
    conn = _conn()
    job_id = get_current_job().id
    start = conn.time()
    conn.rpush(f'test:fair:{tag}', f'{tenant} {job_id} start {start[0] + start[1] / 1e6:.6f}')
    time.sleep(seconds)
    end = conn.time()
    conn.rpush(f'test:fair:{tag}', f'{tenant} {job_id} end {end[0] + end[1] / 1e6:.6f}')
    conn.close()
