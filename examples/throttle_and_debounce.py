"""Throttle, its trailing edge, Debounce, force and reset, run by a real PolicyWorker with rq's scheduler.

    python examples/throttle_and_debounce.py

Uses REDIS_URL when it is set; otherwise starts an embedded Valkey (pip install "rq-policies[embedded]") on a free
port and stops it at the end. Trailing and debounced jobs wait in rq's scheduled-job registry, so the worker runs
with --with-scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # so this script and the worker import the job functions the same way

from throttle_and_debounce_jobs import poll_account, publish_progress, reindex  # noqa: E402

from rq_policies import PolicyQueue, Throttle  # noqa: E402
from rq_policies.surfaces.testing import RedisServer  # noqa: E402


def wait_until_done(jobs, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for job in jobs:
        while job.get_status(refresh=True) != 'finished':
            if time.monotonic() > deadline:
                raise SystemExit(f'job {job.id} did not finish in {timeout}s (status {job.get_status()})')
            time.sleep(0.1)


def main(url: str) -> None:
    redis = Redis.from_url(url)
    q = PolicyQueue('example', connection=redis)
    seconds, micros = redis.time()
    # Start early in a 2-second slot, so the enqueues below land in one slot (slots follow the server's clock).
    time.sleep((2 - (seconds + micros / 1e6) % 2 + 0.05) % 2)

    print('Throttle(2): one poll per account per slot; extras are dropped (and logged at INFO)')
    first = q.enqueue(poll_account, 7)
    print(f'  enqueue(poll_account, 7) -> job {first.id}')
    print(f'  enqueue(poll_account, 7) -> {q.enqueue(poll_account, 7)}')
    other = q.enqueue(poll_account, 8)
    print(f'  enqueue(poll_account, 8) -> job {other.id}   (another identity)')
    outcome = Throttle.admit(q.create_job(poll_account, args=(7,)), slot=2, connection=redis)
    print(f'  Throttle.admit(...) -> admitted={outcome.admitted}, slot owner {outcome.jid}, '
          f'slot ends at {outcome.slot_ends_at:.0f}')

    print('\nThrottle(2, trailing=True): the first runs now, the last of the slot runs when the slot ends')
    progress = [q.enqueue(publish_progress, 1, percent) for percent in (10, 40, 70, 100)]
    for job in progress:
        status = job.get_status(refresh=False).value
        print(f'  enqueue(publish_progress, 1, {job.args[1]:>3}) -> job {job.id} ({status})')

    print('\nDebounce(1, max_wait=5): a burst of edits runs once, with the last version, 1 s after it stops')
    edits = []
    for version in range(1, 5):
        edits.append(q.enqueue(reindex, 3, version))
        time.sleep(0.2)
    print(f'  4 edits enqueued; pending: job {edits[-1].id} (version 4); the other 3 were replaced and deleted')

    print('\nrunning: rq worker -w rq_policies.PolicyWorker --with-scheduler example')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get('PYTHONPATH', '')]))
    worker = subprocess.Popen(
        [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'rq_policies.PolicyWorker', '--with-scheduler', '--url', url,
         '--logging_level', 'WARNING', 'example'],
        env=env,
    )
    try:
        wait_until_done([first, other, progress[0], progress[-1], edits[-1]])
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    for job in (first, other, progress[0], progress[-1], edits[-1]):
        print(f'  {job.func_name.rsplit(".", 1)[-1]}{job.args}: {job.return_value()!r}')
    gone = [job for job in progress[1:-1] + edits[:-1] if job.exists(job.id, connection=redis)]
    print(f'  superseded jobs left in Redis: {len(gone)}')

    print('\nforce and reset')
    forced = q.force(poll_account, 7)
    print(f'  force(poll_account, 7) -> job {forced.id}   (enqueued now; it owns the slot)')
    print(f'  enqueue(poll_account, 7) -> {q.enqueue(poll_account, 7)}')
    print(f'  reset(poll_account, 7) -> {q.reset(poll_account, 7)} key(s) removed')
    print(f'  enqueue(poll_account, 7) -> job {q.enqueue(poll_account, 7).id}   (the slot is open again)')
    q.empty()


if __name__ == '__main__':
    logging.basicConfig(level=logging.INFO, format='  log: %(message)s', stream=sys.stdout)
    logging.getLogger('rq_policies').setLevel(logging.INFO)
    started = time.monotonic()
    if os.environ.get('REDIS_URL'):
        main(os.environ['REDIS_URL'])
    else:
        with RedisServer() as server:
            print(f'(no REDIS_URL: started an embedded server at {server.url})\n')
            main(server.url)
    print(f'\ndone in {time.monotonic() - started:.1f}s')
