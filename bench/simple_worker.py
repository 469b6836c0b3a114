"""PolicySimpleWorker (capped and uncapped) against stock rq SimpleWorker, in one run: throughput on no-op jobs.

    python bench/simple_worker.py [--jobs 300] [--workers 2] [--rounds 7] [--headroom 4] [--baseline PATH] [--smoke]

Uses REDIS_URL when it is set (the database is flushed first: point it at a scratch database), otherwise starts its
own server with rq_policies.surfaces.testing.RedisServer.

Three variants, each with ``--workers`` in-process workers (``rq worker -w ...``) up on a queue of its own for the
whole run: stock ``rq.SimpleWorker`` fed by ``rq.Queue``; ``PolicySimpleWorker`` on an uncapped queue; and
``PolicySimpleWorker`` on a queue capped ``--headroom`` above the worker count (every job takes a hold and the cap
never refuses one: what is measured is the hold's cost, its keeper's included, not waiting). Rounds hand every
variant the same batch in turn, the order rotating every round, so drift on a shared machine hits them alike.
Throughput is jobs / (last job's end - first job's start), from rq's own ``started_at``/``ended_at``
(common.drain_rate). The figure that matters is the median of the per-round ratios to stock (x1.000 = stock; target
>= 0.95 for both policy variants), printed with the spread of those ratios. On a shared machine throughput swings
with the neighbours, so the CPU each job costs is printed beside it: the workers' (Linux /proc) and the server's
(INFO cpu). Last, the processes the capped workers had as children, sampled after every round: their keepers, one
per worker for its whole life (the code before forked one per job, each gone by the time of the sample).

``--baseline PATH`` (a checkout of another revision, e.g. ``git worktree add /tmp/base main``) adds both policy
variants run from that checkout's code, in the same rounds: a change's before and after, each against stock.

``--smoke`` runs one small round: CI's proof that the bench still works, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.job import Job
from rq.registry import FinishedJobRegistry
from rq.utils import now as rq_now
from rq.worker import Worker

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_jobs  # noqa: E402
from common import add_smoke, drain_rate, run_main, server_url, smoke_defaults, start_workers, stop_workers, wait_until  # noqa: E402

from rq_policies import PolicyQueue, QueueSlot  # noqa: E402

STOCK = 'stock rq.SimpleWorker'
VARIANTS = {
    # name: (worker class, producer class, capped)
    STOCK: ('rq.worker.SimpleWorker', Queue, False),
    'PolicySimpleWorker, uncapped': ('rq_policies.PolicySimpleWorker', PolicyQueue, False),
    'PolicySimpleWorker, capped': ('rq_policies.PolicySimpleWorker', PolicyQueue, True),
}
TARGET = 0.95
#: The prefix of the variants run from ``--baseline``'s checkout.
BASELINE = 'baseline: '


@dataclass
class Sample:
    jobs_per_second: float
    worker_cpu_ms: float  # per job, the worker processes (and any children they reaped)
    server_cpu_ms: float  # per job, the Redis server (INFO cpu; the producer's enqueue included: PolicyQueue's or rq's)


def _cpu_seconds(procs: list[subprocess.Popen]) -> float:
    total = 0
    for proc in procs:
        with open(f'/proc/{proc.pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf('SC_CLK_TCK')


def _server_cpu(conn: Redis) -> float:
    info = conn.info('cpu')
    return float(info['used_cpu_user']) + float(info['used_cpu_sys'])


def _children(procs: list[subprocess.Popen]) -> set[int]:
    """Pids of the live children of these worker processes (Linux /proc)."""
    wanted = {proc.pid for proc in procs}
    found = set()
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in wanted:
            found.add(int(entry))
    return found


def one_round(conn: Redis, variant: str, queue_name: str, jobs: int, procs: list[subprocess.Popen]) -> Sample:
    _, producer, capped = VARIANTS[variant.removeprefix(BASELINE)]
    q = producer(queue_name, connection=conn)
    registry = FinishedJobRegistry(queue_name, connection=conn)
    before = registry.count
    datas = [Queue.prepare_data(bench_jobs.noop, (i,), result_ttl=600) for i in range(jobs)]
    cpu0, server0 = _cpu_seconds(procs), _server_cpu(conn)
    batch = q.enqueue_many(datas)
    enqueued = rq_now()
    wait_until(lambda: registry.count >= before + jobs, 300, f'{jobs} jobs')
    cpu1, server1 = _cpu_seconds(procs), _server_cpu(conn)
    rate = drain_rate(Job.fetch_many([job.id for job in batch], connection=conn), enqueued)
    if capped:
        wait_until(lambda: not QueueSlot.status(queue_name, connection=conn).in_use, 10,
                   'the holds released (one leaked?)')
    return Sample(rate, (cpu1 - cpu0) * 1000 / jobs, (server1 - server0) * 1000 / jobs)


def run(url: str, jobs: int, workers: int, rounds: int, headroom: int, baseline: str | None = None) -> int:
    conn = Redis.from_url(url)
    conn.flushdb()
    names = list(VARIANTS)
    if baseline:
        names += [BASELINE + name for name in VARIANTS if name != STOCK]
    queues = {name: f'simple-{i}' for i, name in enumerate(names)}
    results: dict[str, list[Sample]] = {name: [] for name in names}
    procs: dict[str, list[subprocess.Popen]] = {}
    children_seen: set[int] = set()
    print(f'{jobs} no-op jobs a round, {workers} in-process workers per variant, {rounds} interleaved rounds, '
          f'cap {workers + headroom} on the capped queue')
    try:
        for name in names:
            worker_class, _, capped = VARIANTS[name.removeprefix(BASELINE)]
            if capped:
                QueueSlot.set(queues[name], workers + headroom, connection=conn)
            procs[name] = start_workers(url, worker_class, queues[name], workers,
                                        tree=baseline if name.startswith(BASELINE) else None)
        for queue_name in queues.values():
            up = Queue(queue_name, connection=conn)
            wait_until(lambda up=up: Worker.count(queue=up) == workers, 60, 'workers')
        time.sleep(0.5)
        capped_procs = procs['PolicySimpleWorker, capped']
        for name in names:
            one_round(conn, name, queues[name], max(jobs // 5, 5), procs[name])  # warm-up, not counted
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                results[name].append(one_round(conn, name, queues[name], jobs, procs[name]))
                if name == 'PolicySimpleWorker, capped':
                    children_seen |= _children(capped_procs)
            print(f'  round {r + 1}: ' + ', '.join(
                f'{name} {results[name][-1].jobs_per_second:.0f}/s' for name in names), flush=True)
        children_seen |= _children(capped_procs)
    finally:
        stop_workers([proc for group in procs.values() for proc in group])
    conn.flushdb()

    base_rate = statistics.median(s.jobs_per_second for s in results[STOCK])
    base_cpu = statistics.median(s.worker_cpu_ms for s in results[STOCK])
    base_server = statistics.median(s.server_cpu_ms for s in results[STOCK])
    print('  x = median of the per-round throughput ratios to stock (rounds: their spread)')
    for name in names:
        ratios = [a.jobs_per_second / b.jobs_per_second for a, b in zip(results[name], results[STOCK])]
        rate = statistics.median(s.jobs_per_second for s in results[name])
        cpu = statistics.median(s.worker_cpu_ms for s in results[name])
        server = statistics.median(s.server_cpu_ms for s in results[name])
        ratio = statistics.median(ratios)
        mark = ''
        if name != STOCK:
            ok = ratio >= TARGET
            mark = f'  target >= {TARGET}: {"ok" if ok else "MISSED"}'
        print(f'  {name:<30} {rate:7.1f} jobs/s (median x{rate / base_rate:.3f})  paired x{ratio:.3f} '
              f'(rounds {min(ratios):.3f}-{max(ratios):.3f})  worker CPU {cpu:5.2f} ms/job '
              f'(x{cpu / base_cpu:.3f})  server CPU {server:5.3f} ms/job (x{server / base_server:.3f}){mark}')
    print(f'  processes the capped workers had as children over the run (sampled after each round): '
          f'{len(children_seen)} for {workers} workers')
    return 0  # figures, not a gate: a shared machine swings; a miss is printed as MISSED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--jobs', type=int, default=300)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--headroom', type=int, default=4, help='the capped queue allows workers + this many')
    parser.add_argument('--baseline', help='a checkout of another revision: its policy workers run beside these')
    add_smoke(parser)
    args = parser.parse_args()
    smoke_defaults(args, jobs=20, rounds=1)
    with server_url() as url:
        return run(url, args.jobs, args.workers, args.rounds, args.headroom, args.baseline)


if __name__ == '__main__':
    run_main(main)
