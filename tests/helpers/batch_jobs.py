"""Job functions the Batch tests enqueue; importable by worker subprocesses as ``tests.helpers.batch_jobs`` (the
repository's root is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time

from redis import Redis
from rq import get_current_job


def _conn() -> Redis:
    """A connection of its own in a worker subprocess (``REDIS_URL``), else the running job's (an in-process
    worker's)."""
    url = os.environ.get('REDIS_URL')
    if url:
        return Redis.from_url(url)
    return get_current_job().connection


def shop_of(args: tuple, kwargs: dict) -> str:
    """The Batch tests' key function: the payload's ``shop``."""
    return args[0]['shop']


def collect(items: list) -> int:
    """A batch job: records its id and its items (``test:batch:runs``, one line per run: ``<job id> <n> <item
    ids>``), then returns how many it got."""
    conn = _conn()
    job = get_current_job()
    conn.rpush('test:batch:runs', f'{job.id} {len(items)} {",".join(str(i["id"]) for i in items)}')
    if os.environ.get('REDIS_URL'):
        conn.close()
    return len(items)


def collect_slowly(items: list) -> int:
    """:func:`collect`, each run recorded at its start (``test:batch:starts``: ``<job id> <server time>``) and
    sleeping ``items[0]['sleep']`` seconds before it records its end (a worker killed meanwhile leaves no end)."""
    conn = _conn()
    job = get_current_job()
    seconds, micros = conn.time()
    conn.rpush('test:batch:starts', f'{job.id} {seconds + micros / 1e6:.6f}')
    time.sleep(float(items[0].get('sleep', 0)))
    conn.rpush('test:batch:runs', f'{job.id} {len(items)} {",".join(str(i["id"]) for i in items)}')
    if os.environ.get('REDIS_URL'):
        conn.close()
    return len(items)


def fail_first(items: list) -> int:
    """Fails the batch's first run (``test:batch:failed`` counts runs), then records as :func:`collect` does."""
    conn = _conn()
    runs = conn.incr('test:batch:failed')
    if os.environ.get('REDIS_URL'):
        conn.close()
    if runs == 1:
        raise RuntimeError('the first run of this batch fails')
    return collect(items)
