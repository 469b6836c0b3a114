"""examples/asyncio_web.py: the Starlette app through its TestClient (a Loner drop answered with the waiting job, a
per-key Concurrency job, explain), a real PolicyWorker running what it enqueued, and the example's own main()."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip('starlette')
pytest.importorskip('httpx')

from starlette.testclient import TestClient  # noqa: E402

from rq_policies import PolicyQueue  # noqa: E402
from tests.helpers import EXAMPLES, load_example, with_root  # noqa: E402
from tests.helpers.workers import output, start_worker  # noqa: E402

asyncio_web = load_example('asyncio_web')  # the example puts examples/ on its own sys.path for its jobs module


def test_app_enqueues_through_the_async_doors(connection, redis_url, worker_env):
    with TestClient(asyncio_web.create_app(redis_url)) as client:
        first = client.post('/welcome/7')
        again = client.post('/welcome/7')
        other = client.post('/welcome/8')
        reports = [client.post(f'/reports/acme/q{i}') for i in range(3)]
        status = client.get(f'/jobs/{reports[0].json()["job"]}')
        missing = client.get('/jobs/nope')
    assert first.status_code == 202 and other.status_code == 202
    assert again.status_code == 200 and again.json() == {'dropped': True, 'waiting': first.json()['job']}
    assert [r.status_code for r in reports] == [202, 202, 202]
    assert status.status_code == 200 and status.json()['status'] == 'queued' and status.json()['queue'] == 'reports'
    assert missing.status_code == 404
    assert PolicyQueue('mail', connection=connection).job_ids == [first.json()['job'], other.json()['job']]
    # a real PolicyWorker runs them: ordinary rq jobs
    env = with_root(worker_env, EXAMPLES)
    worker = start_worker(redis_url, ['mail', 'reports'], env, burst=True)
    assert worker.wait(timeout=60) == 0, output(worker)
    from rq.job import Job

    done = Job.fetch(first.json()['job'], connection=connection)
    assert done.get_status() == 'finished' and done.return_value() == 'welcome sent to user 7'
    assert Job.fetch(reports[2].json()['job'], connection=connection).return_value() == 'report q2 of acme built'


def test_example_main_runs(redis_url, worker_env):
    env = dict(worker_env, REDIS_URL=redis_url)
    done = subprocess.run([sys.executable, str(EXAMPLES / 'asyncio_web.py')], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "POST /welcome/7 -> 200 {'dropped': True" in done.stdout and 'status=queued' in done.stdout
