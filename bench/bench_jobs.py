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
