"""Per-key job functions bench/keys.py enqueues, apart from bench_jobs.py: declaring them imports rq_policies, and a
stock rq.Worker's work horse importing bench_jobs for a plain job would then import the whole package (compiled
from source where no bytecode is written) on every job, which bench/worker.py's stock baseline must not pay."""

from __future__ import annotations

import os
import time

from bench_jobs import record_start
from redis import Redis

from rq_policies import Concurrency, policy


def _customer(args, kwargs):
    return kwargs['customer']


def _keyed(limit: int):
    return policy(Concurrency(limit, key=_customer, scope='bench'))


def plain_noop(i: int, customer: int = 0) -> int:
    """bench/keys.py: the same no-op with no per-key policy (the plain and capped variants)."""
    return i


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
