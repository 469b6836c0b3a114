"""What a metrics scrape costs: the collector over 1,000 live holds and 1,000 loner markers.

Prints medians (milliseconds) of, in interleaved rounds:

* ``scrape, empty``: the collector's exposition with no policy state;
* ``scrape, loaded``: the same with 1,000 live QueueSlot holds over 10 capped queues, 1,000 waiting loner markers,
  5 LimitedCapacityWorker classes with 20 running holds each, and drop counters;
* ``stock rq stats``: what rq's own ``rq info`` reads for the same 10 queues (length and the started, finished and
  failed registries' sizes), the reference the ratio is taken against;
* ``rq-policies info``: the full snapshot the command prints (SCAN over the markers), for comparison.

Usage: ``python bench/metrics.py [--rounds N] [--smoke]``; uses REDIS_URL when set, else a throwaway server.
``--smoke`` loads the same state and takes a few rounds (CI: the bench still works).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the loner jobs name this module as bench.metrics

from common import add_smoke, run_main, smoke_defaults  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies import Loner, PolicyQueue, QueueSlot, UnknownQueueWarning  # noqa: E402
from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.ledger import Hold, acquire_call  # noqa: E402
from rq_policies.surfaces import state  # noqa: E402
from rq_policies.surfaces.metrics import registry_for  # noqa: E402

# A bench caps and limits fresh queues before their first job, on purpose.
warnings.simplefilter('ignore', UnknownQueueWarning)

QUEUES = [f'bench{i}' for i in range(10)]


def noop(x):
    return x


def load(conn: Redis) -> None:
    for name in QUEUES:
        QueueSlot.set(name, 1000, connection=conn)
        for j in range(100):
            assert QueueSlot.acquire(name, capacity=1000, ttl=600, token=f'host:{j}:1:1', connection=conn)
            QueueSlot.HELD.discard(f'host:{j}:1:1')  # stand-ins for other workers' holds: not this process's to refresh
    q = PolicyQueue(QUEUES[0], connection=conn)
    for i in range(1000):
        q.enqueue('bench.metrics.noop', i, policy=Loner())
    for i in range(5):
        path = f'bench.Worker{i}'
        conn.hset(keys.lcw_state(path), mapping={'queue': 'imports', 'max': 20, 'remaining': 500, 'updated': 0})
        conn.zadd(keys.LCW_INDEX, {path: time.time()})
        with conn.pipeline(transaction=False) as pipe:
            for j in range(20):
                acquire_call(Hold(keys.lcw_running(path), f'h:{j}:job', 600), 20).run(pipe)
            pipe.execute()
    for name in QUEUES:
        conn.hset(keys.DROPS, f'loner:{name}', 17)


def stock_stats(conn: Redis) -> list[tuple[int, ...]]:
    rows = []
    for name in QUEUES:
        q = Queue(name, connection=conn)
        rows.append((q.count, q.started_job_registry.count, q.finished_job_registry.count, q.failed_job_registry.count))
    return rows


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def run(conn: Redis, rounds: int) -> None:
    conn.flushdb()
    empty_registry = registry_for(conn)
    empty = [timed(lambda: generate_latest(empty_registry)) for _ in range(rounds)]
    load(conn)
    assert QueueSlot.status(QUEUES[0], connection=conn).in_use == 100
    assert len(conn.keys(keys.PREFIX + 'loner:*')) == 1000
    registry = registry_for(conn)
    loaded, stock, info = [], [], []
    for _ in range(rounds):  # interleaved, so drift hits all three alike
        loaded.append(timed(lambda: generate_latest(registry)))
        stock.append(timed(lambda: stock_stats(conn)))
        info.append(timed(lambda: state.snapshot(conn, limit=20)))
    med = {name: statistics.median(values) for name, values in
           (('empty', empty), ('loaded', loaded), ('stock', stock), ('info', info))}
    print(f'rounds: {rounds} (medians, ms)')
    print(f'scrape, empty            {med["empty"]:7.2f}')
    print(f'scrape, loaded           {med["loaded"]:7.2f}   overhead of the state {med["loaded"] - med["empty"]:+.2f}')
    print(f'stock rq stats (10 q)    {med["stock"]:7.2f}')
    print(f'rq-policies info         {med["info"]:7.2f}')
    print(f'ratio scrape/stock rq    {med["loaded"] / med["stock"]:7.2f}x')
    conn.flushdb()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=30)
    add_smoke(parser)
    args = parser.parse_args()
    smoke_defaults(args, rounds=3)
    url = os.environ.get('REDIS_URL')
    if url:
        run(Redis.from_url(url), args.rounds)
        return 0
    from rq_policies.surfaces.testing import RedisServer

    with RedisServer() as server:
        run(server.client(), args.rounds)
    return 0


if __name__ == '__main__':
    run_main(main)
