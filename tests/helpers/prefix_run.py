"""A representative run of rq-policies under rq's key prefix, for tests/engine/test_key_prefix.py.

Run as ``python -m tests.helpers.prefix_run`` (the repository's root on ``PYTHONPATH``) with ``RQ_KEY_PREFIX``
and ``REDIS_URL`` in the environment (rq 3 reads the prefix once, at import, so a process of its own is the honest
way to set it): every door (enqueue, enqueue_call, enqueue_in, enqueue_at,
enqueue_many), Loner, Throttle, Debounce, Concurrency, QueueSlot's cap and QueueRate's rate, a forking PolicyWorker
that runs them all (burst), ``rq-policies info`` and the dashboard's page data. Prints one JSON line: what ran, and
what the CLI and the page saw. The caller scans the server.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

from redis import Redis
from rq import Queue
from rq.job import Job

from rq_policies import Debounce, Loner, PolicyQueue, QueueRate, QueueSlot, Throttle
from rq_policies.engine import keys
from rq_policies.surfaces.dashboard import data
from tests.helpers import jobs, key_jobs


def main() -> None:
    url = os.environ['REDIS_URL']
    conn = Redis.from_url(url)
    try:
        run(conn, url)
    finally:
        conn.close()


def run(conn: Redis, url: str) -> None:
    q = PolicyQueue('pfx', connection=conn)
    capped = PolicyQueue('pfx-capped', connection=conn)
    rated = PolicyQueue('pfx-rated', connection=conn)
    ids: dict[str, list[str | None]] = {}

    def keep(name: str, job) -> None:
        ids.setdefault(name, []).append(job.id if job is not None else None)

    keep('plain', q.enqueue(jobs.plain, 1))
    keep('call', q.enqueue_call(jobs.plain, args=(2,)))
    keep('loner', q.enqueue(jobs.plain, 3, policy=Loner()))
    keep('loner', q.enqueue(jobs.plain, 3, policy=Loner()))  # dropped: the identity is held
    keep('loner_finished', q.enqueue(jobs.plain, 4, policy=Loner(until='finished')))
    keep('throttle', q.enqueue(jobs.plain, 5, policy=Throttle(60)))
    keep('throttle', q.enqueue(jobs.plain, 5, policy=Throttle(60)))  # dropped: the window is taken
    keep('debounce', q.enqueue(jobs.plain, 6, policy=Debounce(1)))
    keep('debounce', q.enqueue(jobs.plain, 6, policy=Debounce(1)))  # merged into the pending one
    keep('in', q.enqueue_in(datetime.timedelta(seconds=1), jobs.plain, 7))
    keep('at', q.enqueue_at(datetime.datetime.now(datetime.timezone.utc), jobs.plain, 8))
    for job in q.enqueue_many([Queue.prepare_data(jobs.plain, (9,)), Queue.prepare_data(jobs.plain, (10,))]):
        keep('many', job)
    for i in range(3):
        keep('capped', capped.enqueue(jobs.plain, 100 + i))
        keep('rated', rated.enqueue(jobs.plain, 200 + i))
        keep('concurrency', q.enqueue(key_jobs.per_customer, 'pfx', 0.05, customer='acme'))

    QueueSlot.set('pfx-capped', 1, connection=conn)
    QueueRate.set('pfx-rated', 50, per=1, burst=5, connection=conn)
    # the CLI and the page, while jobs wait
    cli = subprocess.run([sys.executable, '-m', 'rq_policies', 'info', '--json', '--url', url],
                         capture_output=True, text=True, timeout=60)
    page = data.overview(conn)
    time.sleep(1.2)  # the debounced and enqueue_in jobs fall due; the worker's fetch promotes them
    worker = subprocess.run(
        [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'rq_policies.PolicyWorker', '--burst', '--url', url,
         '--logging_level', 'WARNING', 'pfx', 'pfx-capped', 'pfx-rated'],
        capture_output=True, text=True, timeout=120,
    )
    statuses = {name: [Job.fetch(i, connection=conn).get_status() if i else None for i in found]
                for name, found in ids.items()}
    print(json.dumps({
        'prefix': keys.PREFIX,
        'job_key': Job.key_for('x') if isinstance(Job.key_for('x'), str) else Job.key_for('x').decode(),
        'statuses': statuses,
        'worker': worker.returncode, 'worker_output': worker.stdout[-2000:] + worker.stderr[-2000:],
        # the whole JSON when it succeeded (the test parses it; info's per-queue jobs made it outgrow 4000 chars)
        'cli': cli.returncode,
        'cli_output': cli.stdout if cli.returncode == 0 else cli.stdout[-4000:] + cli.stderr[-2000:],
        'page_queues': sorted(row['name'] for row in page['queues']['rows']),
        'page_panels': sorted(p['title'] for p in page['panels']),
    }, default=str))


if __name__ == '__main__':
    main()
