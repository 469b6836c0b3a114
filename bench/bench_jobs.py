"""Job functions the benchmarks enqueue; the worker subprocesses import them from bench/ on their PYTHONPATH."""

from __future__ import annotations

import os
import time

from redis import Redis


def noop(i: int) -> int:
    return i


def record_start(seconds: float) -> None:
    """Record the start (server clock) and the worker, then sleep: the release-to-start benchmark reads these."""
    conn = Redis.from_url(os.environ['REDIS_URL'])
    seconds_now, micros = conn.time()
    conn.rpush('bench:starts', f'{seconds_now + micros / 1e6:.6f} {os.environ.get("RQ_WORKER_ID", "?")}')
    conn.close()
    time.sleep(seconds)


def work(x):
    """The function the enqueue benchmarks enqueue (never run there)."""
    return x


def _customer(args, kwargs):
    return kwargs['customer']


def _keyed(limit: int):
    from rq_policies import Concurrency, policy

    return policy(Concurrency(limit, key=_customer, scope='bench'))


@_keyed(64)
def keyed_noop(i: int, customer: int = 0) -> int:
    """bench/keys.py: a no-op under a per-key limit that never binds (64 per key, far above the worker count)."""
    return i


@_keyed(1)
def keyed_record_start(seconds: float, customer: int = 0) -> None:
    """bench/keys.py: one at a time per key; records its start as :func:`record_start` does, then sleeps."""
    record_start(seconds)


@_keyed(2)
def keyed_starve(seconds: float, customer: int = 0) -> None:
    """bench/keys.py: two at a time per key; records its key and start (server clock) on ``bench:starve``."""
    conn = Redis.from_url(os.environ['REDIS_URL'])
    seconds_now, micros = conn.time()
    conn.rpush('bench:starve', f'{customer} {seconds_now + micros / 1e6:.6f}')
    conn.close()
    time.sleep(seconds)
