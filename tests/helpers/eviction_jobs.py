"""Real evictions on a real server, for the eviction tests (tests/faults/test_eviction.py) and the jobs they enqueue."""

from __future__ import annotations

import time

from redis import Redis
from rq import get_current_job

from rq_policies import PolicyWorker
from rq_policies.engine import keys

FILLER = b'x' * 20_000


def evict(conn: Redis, at_least: int = 5, prefix: str = '') -> int:
    """Make the server evict at least ``at_least`` keys, for real; return how many it evicted.

    Filler keys are written idle for a day (RESTORE ... IDLETIME), maxmemory is set just above the memory in use under
    allkeys-lru, and new filler keys are written until INFO stats counts the evictions: LRU takes the idlest keys,
    the filler, not the keys a test or a worker just touched. maxmemory is lifted again and the maxmemory-policy put
    back before returning. ``prefix`` starts the filler keys' names: on a cluster node, a hash tag of a slot it
    serves (a node refuses any other key with MOVED).
    """
    before = int(conn.info('stats')['evicted_keys'])
    policy = conn.config_get('maxmemory-policy')['maxmemory-policy']
    conn.set(f'{prefix}filler:seed', FILLER)
    payload = conn.dump(f'{prefix}filler:seed')
    with conn.pipeline(transaction=False) as pipe:
        for i in range(at_least * 4):
            pipe.restore(f'{prefix}filler:old:{i}', 0, payload, replace=True, idletime=86400)
        pipe.execute()
    conn.config_set('maxmemory-policy', 'allkeys-lru')
    conn.config_set('maxmemory', int(conn.info('memory')['used_memory']) + 5 * len(FILLER))
    try:
        for i in range(at_least * 20):
            if int(conn.info('stats')['evicted_keys']) >= before + at_least:
                break
            conn.set(f'{prefix}filler:new:{i}', FILLER)
        else:
            raise AssertionError('the server evicted nothing')
    finally:
        conn.config_set('maxmemory', 0)
        conn.config_set('maxmemory-policy', policy)
    return int(conn.info('stats')['evicted_keys']) - before


def evict_in_job(seconds_after: float = 0.0) -> int:
    """A job that makes its server evict keys, then runs on for ``seconds_after`` (the worker heartbeats meanwhile).
    On a cluster: the primary serving the prefix's slot, where every key of rq and of ours is."""
    job = get_current_job()
    server, prefix, done = job.connection, '', 'test:evicted'
    if keys.is_cluster(server):
        server = server.get_redis_connection(server.get_node_from_key(keys.PREFIX))
        prefix = done = f'{keys.KEY_PREFIX}:test:'
        done += 'evicted'
    count = evict(server, prefix=prefix)
    job.connection.rpush(done, count)
    time.sleep(seconds_after)
    return count


class QuickWatchWorker(PolicyWorker):
    """A PolicyWorker that reads evicted_keys on every heartbeat and heartbeats every second while a job runs."""

    eviction_watch_seconds = 0.0

    def __init__(self, *args, **kwargs):
        kwargs['job_monitoring_interval'] = 1
        super().__init__(*args, **kwargs)
