"""The cost of a plain enqueue (a job without a policy) on PolicyQueue against stock rq.Queue, measured in one run:
the admission script's write (one round trip), rq's own pipeline with the replay-safe push it replaced, and for
``enqueue_many`` (which keeps rq's pipeline) the guarded push against the unguarded one before it.

    python bench/push.py [--rounds 15] [--calls 200] [--many 100] [--smoke]

``PolicyQueue.enqueue`` of a job without a policy is one ``lua/admit.lua`` call with no policy: the job written as rq
writes it, once (a resend finds the job's ``created_at`` and writes nothing). The "rq's pipeline" variant is the
path before it (rq's ``enqueue_job``: the SADD of rq's queues set, then a MULTI/EXEC with the hash and
``lua/push.lua``); ``enqueue_many`` still takes rq's pipeline, whose push is ``lua/push.lua``, and the "unguarded"
variant is that push as it was before (RPUSH and PUBLISH). Rounds interleave the variants; figures are median
per-call times and their ratios to stock ``Queue.enqueue`` (and, for ``enqueue_many``, to stock
``Queue.enqueue_many`` of ``--many`` jobs). ``--smoke`` runs every case a few times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import noop  # noqa: E402
from common import add_smoke, connect, interleaved, report, run_main, server_url, smoke_defaults  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies import PolicyQueue  # noqa: E402
from rq_policies.engine import keys  # noqa: E402


class RqPipelineQueue(PolicyQueue):
    """PolicyQueue with a plain enqueue on rq's own pipeline and the replay-safe push, as before the admission script
    wrote it."""

    @staticmethod
    def _writes_plain(job: Any, pipeline: Any, kwargs: dict[str, Any]) -> bool:
        return False


class UnguardedQueue(PolicyQueue):
    """PolicyQueue with the push as it was before the replay-safe one: RPUSH/LPUSH and PUBLISH on rq's pipeline."""

    def push_job_id(self, job_id: str, pipeline: Any = None, at_front: bool = False) -> None:
        Queue.push_job_id(self, job_id, pipeline=pipeline, at_front=at_front)
        pipeline.publish(keys.wake(self.name), job_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=15)
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--many', type=int, default=100)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, calls=20, many=10)

    with server_url() as url:
        conn = connect(url)
        conn.flushdb()
        stock = Queue('bench_stock', connection=conn)
        guarded = PolicyQueue('bench_guarded', connection=conn)
        unguarded = UnguardedQueue('bench_unguarded', connection=conn)
        pipelined = RqPipelineQueue('bench_pipelined', connection=conn)

        def flush_lists() -> None:
            conn.delete(stock.key, guarded.key, unguarded.key, pipelined.key)

        info = conn.info('server')
        print(f'server: {info.get("valkey_version") or info.get("redis_version")}; '
              f'{opts.rounds} rounds x {opts.calls} calls\n')
        samples = interleaved({
            'stock Queue.enqueue': lambda i: stock.enqueue(noop, i),
            'PolicyQueue.enqueue (admission script)': lambda i: guarded.enqueue(noop, i),
            "PolicyQueue.enqueue (rq's pipeline)": lambda i: pipelined.enqueue(noop, i),
        }, opts.rounds, opts.calls, before_round=flush_lists)
        ratios = report(samples, 'stock Queue.enqueue')
        change = ratios['PolicyQueue.enqueue (admission script)'] / ratios[
            "PolicyQueue.enqueue (rq's pipeline)"]
        spread = {name: statistics.quantiles(values, n=4) for name, values in samples.items()}
        for name, (q1, _, q3) in spread.items():
            print(f'  {name:44} quartiles {q1 * 1e6:8.1f} .. {q3 * 1e6:8.1f} us')
        print(f"\nadmission script / rq's pipeline: {change:.3f}\n")

        def many(queue: Queue):
            return lambda i: queue.enqueue_many([Queue.prepare_data(noop, (i, n)) for n in range(opts.many)])

        samples = interleaved({
            f'stock Queue.enqueue_many ({opts.many} jobs)': many(stock),
            f'PolicyQueue.enqueue_many ({opts.many}, guarded)': many(guarded),
            f'PolicyQueue.enqueue_many ({opts.many}, unguarded)': many(unguarded),
        }, opts.rounds, max(1, opts.calls // 20), before_round=flush_lists)
        ratios = report(samples, f'stock Queue.enqueue_many ({opts.many} jobs)')
        names = list(ratios)
        print(f'\nguarded / unguarded: {ratios[names[1]] / ratios[names[2]]:.3f}')
        conn.flushdb()


if __name__ == '__main__':
    run_main(main)
