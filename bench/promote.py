"""Promotion inside the fetch (lua/lib/promote.lua): what scheduled jobs cost a PolicyWorker's fetch, and what an idle
PolicyWorker costs the server while its queues hold future-dated jobs.

    python bench/promote.py [--queues 5] [--future 10000] [--due 1000] [--rounds 9] [--calls 200]
                            [--idle-queues 50] [--idle-jobs 5000] [--idle-seconds 20] [--smoke]

1. The fetch: ``lua/fetch.lua`` taking one queued job from ``--queues`` queues, against the same fetch over queues
   with ``--future`` future-dated jobs (due in an hour) and ``--due`` due jobs in their scheduled registries, once
   those due jobs are promoted (a fetch promotes 100 at most, oldest first; the bench runs fetches until none is
   due). Target: within 1.2x of the fetch over queues with no scheduled job. Stock rq's ``Queue.dequeue_any`` over
   the same kind of queues is printed as the reference line. Rounds interleave the variants; median per-call times.
2. Idle cost: one PolicyWorker (``rq worker -w rq_policies.PolicyWorker``, no ``--with-scheduler``) over
   ``--idle-queues`` queues holding ``--idle-jobs`` future-dated jobs in all, idle: the server's
   ``total_commands_processed`` (commands run inside scripts included) over ``--idle-seconds``, per second, the
   bench's own INFO calls taken out. Target: <= 10 commands a second. A stock rq worker over the same queues (which
   blocks in BLMOVE/BLPOP, but needs ``--with-scheduler`` for the scheduled jobs) is measured the same way, with its
   scheduler, for comparison.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import add_smoke, connect, interleaved, report, run_main, server_url, smoke_defaults, stop_workers  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.fetch import FetchReply, fetch_call  # noqa: E402
from rq_policies.surfaces.testing import RedisServer  # noqa: E402


def fill(conn, queues: list[Queue], jobs: int) -> None:
    """``jobs`` queued no-op jobs, spread over ``queues``."""
    with conn.pipeline() as pipe:
        for i in range(jobs):
            queues[i % len(queues)].enqueue('bench_jobs.noop', i, pipeline=pipe)
        pipe.execute()


def schedule(conn, queues: list[Queue], count: int, when: datetime) -> None:
    with conn.pipeline() as pipe:
        for i in range(count):
            queues[i % len(queues)].enqueue_at(when, 'bench_jobs.noop', i, pipeline=pipe)
        pipe.execute()


def fetch_cost(conn, opts) -> dict[str, float]:
    plain = [Queue(f'plain{i}', connection=conn) for i in range(opts.queues)]
    scheduled = [Queue(f'sched{i}', connection=conn) for i in range(opts.queues)]
    stock = [Queue(f'stock{i}', connection=conn) for i in range(opts.queues)]
    need = opts.rounds * opts.calls + 200
    for queues in (plain, scheduled, stock):
        fill(conn, queues, need)
    server_now = conn.time()[0]
    schedule(conn, scheduled, opts.future, datetime.fromtimestamp(server_now + 3600, timezone.utc))
    schedule(conn, scheduled, opts.due, datetime.fromtimestamp(server_now - 60, timezone.utc))
    calls = {name: fetch_call(queues, f'bench-{name}', 60, burst=False) for name, queues in
             (('plain', plain), ('sched', scheduled))}
    tokens = iter(range(10**9))

    def fresh(name):
        # a new claim token per fetch, as the worker's loop gives it: the same token would find the claim record and
        # answer the recorded reply (a replay), without fetching
        token = f'bench-{name}-{next(tokens)}'
        return calls[name].arg('token', token).set_key('claim', keys.claim(token))

    promoting = 0
    while any(conn.zcount(f'rq:scheduled:{q.name}', '-inf', server_now + 1) for q in scheduled):
        fresh('sched').run(conn)
        promoting += 1
    print(f'fetch: {opts.queues} queues; {opts.future} future-dated and {opts.due} due jobs on the scheduled ones '
          f'(promoted by {promoting} fetches); {opts.rounds} rounds x {opts.calls} calls')

    def run(name):
        def one(_):
            reply = fresh(name).run(conn)
            assert FetchReply.decode(reply).job, 'a fetch found no job: raise --rounds/--calls fill'
        return one

    samples = interleaved({
        'stock Queue.dequeue_any': lambda _: Queue.dequeue_any(stock, None, connection=conn),
        'fetch, no scheduled job': run('plain'),
        f'fetch, {opts.future} future-dated (+{opts.due} promoted)': run('sched'),
    }, opts.rounds, opts.calls)
    ratios = report(samples, 'stock Queue.dequeue_any')
    key = f'fetch, {opts.future} future-dated (+{opts.due} promoted)'
    flat = statistics.median(samples[key]) / statistics.median(samples['fetch, no scheduled job'])
    print(f'\nscheduled / none: {flat:.3f}  (target <= 1.2: {"ok" if flat <= 1.2 else "MISSED"})')
    assert conn.zcard('rq:scheduled:sched0') >= opts.future // opts.queues - 1
    return {'flat': flat, **ratios}


def idle_cost(opts, worker_class: str, scheduler: bool) -> float:
    """Commands a second the server runs while one idle worker serves the queues (a server of its own)."""
    with RedisServer() as server:
        conn = server.client()
        queues = [Queue(f'idle{i}', connection=conn) for i in range(opts.idle_queues)]
        now = conn.time()[0]
        with conn.pipeline() as pipe:
            for i in range(opts.idle_jobs):
                when = datetime.fromtimestamp(now + 3600 + i, timezone.utc)
                queues[i % len(queues)].enqueue_at(when, 'bench_jobs.noop', i, pipeline=pipe)
            pipe.execute()
        import os
        import subprocess
        env = dict(os.environ, REDIS_URL=server.url)
        here = str(Path(__file__).resolve().parent)
        env['PYTHONPATH'] = os.pathsep.join([here, str(Path(here).parent), env.get('PYTHONPATH', '')])
        args = [sys.executable, '-m', 'rq.cli', 'worker', '-w', worker_class, '--url', server.url,
                '--logging_level', 'ERROR', *(['--with-scheduler'] if scheduler else []), *[q.name for q in queues]]
        worker = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not conn.scard('rq:workers') and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(min(3.0, opts.idle_seconds))  # past start-up (registration, the first look, maintenance)
            before = conn.info('stats')['total_commands_processed']
            started = time.monotonic()
            time.sleep(opts.idle_seconds)
            after = conn.info('stats')['total_commands_processed']
            elapsed = time.monotonic() - started
        finally:
            stop_workers([worker])
        return (after - before - 1) / elapsed  # the INFO that read `after` counted itself


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--queues', type=int, default=5)
    parser.add_argument('--future', type=int, default=10000)
    parser.add_argument('--due', type=int, default=1000)
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--idle-queues', type=int, default=50)
    parser.add_argument('--idle-jobs', type=int, default=5000)
    parser.add_argument('--idle-seconds', type=float, default=20.0)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, future=1000, due=150, rounds=2, calls=20, idle_jobs=500, idle_seconds=3)

    with server_url() as url:
        conn = connect(url)
        conn.flushdb()
        info = conn.info('server')
        print(f'server: {info.get("valkey_version") or info.get("redis_version")}\n')
        fetch_cost(conn, opts)
        conn.flushdb()

    print(f'\nidle: one worker over {opts.idle_queues} queues, {opts.idle_jobs} future-dated jobs, '
          f'{opts.idle_seconds:g} s')
    ours = idle_cost(opts, 'rq_policies.PolicyWorker', scheduler=False)
    stock = idle_cost(opts, 'rq.Worker', scheduler=True)
    print(f'{"PolicyWorker (promotes itself)":44} {ours:8.1f} commands/s  (target <= 10: '
          f'{"ok" if ours <= 10 else "MISSED"})')
    print(f'{"stock Worker --with-scheduler":44} {stock:8.1f} commands/s')
    return 0


if __name__ == '__main__':
    run_main(main)
