"""Admission cost of Loner(until='finished', on_conflict='keep_last') and of on_conflict='cancel' against a plain Loner
admission, in one run.

    python bench/keep_last.py [--rounds 15] [--calls 200] [--smoke]

Each variant enqueues the same function with the same kind of arguments; rounds interleave the variants and the
figure is the median per-call wall time (with p25 / p75), printed as a ratio to a plain ``Loner()`` admission:

* ``keep_last admitted``: a free identity (a new one each call): the plain admission path of the mode;
* ``keep_last behind a running job``: the identity's holder runs (a job marked started on a live worker key, set up
  before the round: no worker process, so only the admission is timed), so the call is admitted as the waiting job
  and its hash names the running one;
* ``keep_last replacing the waiting job``: the identity's holder waits, so the call rewrites its payload in place;
* ``cancel admitted`` and ``cancel stopping a running job``: the same two paths of ``on_conflict='cancel'``; behind a
  running job the script also names the new job on the running one and PUBLISHes rq's stop-job command on its
  worker's channel (nobody subscribes here: the publish's cost without a listener);
* ``Loner(until='finished', on_conflict='replace')`` admitted and replacing: the existing mode whose admission path
  (the full one: never admit_narrow.lua, which only decides drops) keep_last shares, for comparison.

``--smoke`` runs every case a few times (CI: the bench still works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, connect, interleaved, report, run_main, server_url, smoke_defaults  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.worker import Worker  # noqa: E402

from rq_policies import Loner, PolicyQueue  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=15)
    parser.add_argument('--calls', type=int, default=200)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, calls=20)

    with server_url() as url:
        conn = connect(url)
        conn.flushdb()
        plain, keep, replace = Loner(), Loner(until='finished', on_conflict='keep_last'), Loner(
            until='finished', on_conflict='replace')
        cancel = Loner(until='finished', on_conflict='cancel')
        q = PolicyQueue('bench_keep_last', connection=conn)
        total = opts.rounds * opts.calls
        # The running holders, one per call of the "behind" case: admitted, then marked started on a worker whose key
        # lives (what rq writes when a worker starts the job; lua/lib/holder_running.lua reads exactly this).
        worker_name = 'bench-keep-last'
        conn.set(Worker.redis_worker_namespace_prefix + worker_name, 1, ex=3600)
        for n in range(total):
            job = q.enqueue(work, f'running-{n}', policy=keep)
            conn.hset(job.key, mapping={'status': 'started', 'worker_name': worker_name})
        for n in range(total):
            job = q.enqueue(work, f'running-c{n}', policy=cancel)
            conn.hset(job.key, mapping={'status': 'started', 'worker_name': worker_name})
        behind, stopping = iter(range(total)), iter(range(total))
        q.enqueue(work, 'waiting', policy=keep)  # the waiting holder every "replacing" call rewrites
        q.enqueue(work, 'waiting-r', policy=replace)

        def admitted_behind(i):
            job = q.enqueue(work, f'running-{next(behind)}', policy=keep)
            assert job is not None

        def stopped_behind(i):
            job = q.enqueue(work, f'running-c{next(stopping)}', policy=cancel)
            assert job is not None

        variants = {
            'Loner admitted': lambda i: q.enqueue(work, i, policy=plain),
            'keep_last admitted': lambda i: q.enqueue(work, -1 - i, policy=keep),
            'keep_last behind a running job': admitted_behind,
            'keep_last replacing the waiting job': lambda i: q.enqueue(work, 'waiting', policy=keep),
            'cancel admitted': lambda i: q.enqueue(work, f'c{i}', policy=cancel),
            'cancel stopping a running job': stopped_behind,
            "replace(until='finished') admitted": lambda i: q.enqueue(work, f'r{i}', policy=replace),
            "replace(until='finished') replacing": lambda i: q.enqueue(work, 'waiting-r', policy=replace),
        }
        info = conn.info('server')
        print(f'server: {info.get("valkey_version") or info.get("redis_version")}; '
              f'{opts.rounds} rounds x {opts.calls} calls\n')
        samples = interleaved(variants, opts.rounds, opts.calls, before_round=lambda: conn.delete(q.key))
        report(samples, 'Loner admitted')
        print(f'\n{"variant":44} {"p25 us":>8} {"p75 us":>8}')
        for name, values in samples.items():
            q1, _, q3 = statistics.quantiles(values, n=4)
            print(f'{name:44} {q1 * 1e6:8.1f} {q3 * 1e6:8.1f}')
        waiting = sum(1 for n in range(total)
                      if conn.hget(q.enqueue(work, f'running-{n}', policy=keep).key, 'policies_loner_next'))
        print(f'\ncheck: {waiting} of {total} jobs admitted behind a running one name it (policies_loner_next)')

        def names_it(n):
            job = q.enqueue(work, f'running-c{n}', policy=cancel)
            raw = conn.hget(job.key, 'policies_loner_next')
            holder = Job.key_for(raw.decode().split()[0]) if raw else None
            return holder is not None and conn.hget(holder, 'policies_cancelled_by') == job.id.encode()

        stopped = sum(1 for n in range(total) if names_it(n))
        print(f'check: {stopped} of {total} running jobs a cancel admission stopped name it (policies_cancelled_by)')
        conn.flushdb()
        return 0 if waiting == total and stopped == total else 1


if __name__ == '__main__':
    run_main(main)
