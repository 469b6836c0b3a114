"""Every runnable script in examples/ runs here, as a user runs it, against the test session's server.

Each runs in a subprocess with ``REDIS_URL`` set to the session's server (so it starts no embedded one), with its own
real workers, and must exit 0 with the output it promises; what it claims about Redis is checked in Redis.
``examples/limited_capacity_cron.py`` runs in ``tests/limited_capacity/test_limited_capacity.py``
(``test_cron_example_refills_through_rq_cron``).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from rq.job import Job
from rq.registry import FinishedJobRegistry

from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import EXAMPLES, ROOT, TESTS

#: Examples run by a test elsewhere, and the test that runs it (its path under tests/).
ELSEWHERE = {
    'limited_capacity_cron.py': ('limited_capacity/test_limited_capacity.py',
                                 'test_cron_example_refills_through_rq_cron'),
    'asyncio_web.py': ('surfaces/test_example_asyncio_web.py', 'test_example_main_runs'),
}


def run_example(name: str, worker_env: dict, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], env=worker_env, cwd=ROOT, capture_output=True, text=True,
        timeout=timeout,
    )
    output = f'{result.stdout[-3000:]}\n{result.stderr[-3000:]}'
    assert result.returncode == 0, f'{name} exited {result.returncode}\n{output}'
    assert '(no REDIS_URL' not in result.stdout, f'{name} started its own server instead of using REDIS_URL'
    return result.stdout


def runnable_examples() -> set[str]:
    return {path.name for path in EXAMPLES.glob('*.py') if "if __name__ == '__main__':" in path.read_text()}


def test_every_runnable_example_has_a_test():
    tested = {'quickstart.py', 'capped_queue.py', 'throttle_and_debounce.py'}
    assert runnable_examples() == tested | set(ELSEWHERE), \
        'a new example needs a test in tests/surfaces/test_examples.py'
    for module, test in ELSEWHERE.values():
        assert f'def {test}(' in (TESTS / module).read_text()


def test_quickstart(connection, worker_env):
    out = run_example('quickstart.py', worker_env)
    assert 'enqueue(sweep_cache, 1)  -> None' in out  # the duplicate was dropped
    assert 'enqueued(sweep_cache, 1) -> True' in out
    assert 'enqueued(sweep_cache, 3) -> False' in out
    first = re.search(r'^enqueue\(sweep_cache, 1\)  -> job (\S+)$', out, flags=re.M).group(1)
    assert f'holder(sweep_cache, 1)   -> {first}' in out
    assert 'jobs waiting on \'cache_sweeps\': 2' in out
    job = Job.fetch(first, connection=connection)  # the worker ran it on our server
    assert job.get_status().value == 'finished'
    assert job.return_value() == 'cache of article 1 refreshed'
    assert re.search(r'^enqueue\(sweep_cache, 1\)  -> job \S+   \(admitted again', out, flags=re.M)


@pytest.mark.long
def test_capped_queue(connection, worker_env):
    out = run_example('capped_queue.py', worker_env)
    done, workers, peak, cap, holds = map(int, re.search(
        r'all (\d+) jobs done by (\d+) workers; at most (\d+) ran at once \(cap (\d+)\); holds left: (\d+)', out,
    ).groups())
    assert (done, workers, cap, holds) == (24, 8, 3, 0)
    assert 1 <= peak <= cap
    # The cap held for every job, not only at the moments the script sampled: no more than 3 ran at once by the
    # jobs' own start and end times (each inside its hold, taken before the start and released after the end).
    jobs = Job.fetch_many(FinishedJobRegistry('reports', connection=connection).get_job_ids(), connection=connection)
    assert len(jobs) == 24
    events = sorted([(job.started_at, 1) for job in jobs] + [(job.ended_at, -1) for job in jobs],
                    key=lambda event: (event[0], event[1]))  # an end before a start at the same instant
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    assert 1 <= most <= 3
    assert connection.zcard(f'{RQ}:policies:slots:reports') == 0


@pytest.mark.long
def test_throttle_and_debounce(connection, worker_env):
    out = run_example('throttle_and_debounce.py', worker_env)
    assert 'enqueue(poll_account, 7) -> None' in out  # an extra in a held slot is dropped
    assert "poll_account(7,): 'polled account 7'" in out
    assert "poll_account(8,): 'polled account 8'" in out
    # trailing throttle: the first of the slot and the last, not the ones between
    assert "publish_progress(1, 10): 'task 1 is 10% done'" in out
    assert "publish_progress(1, 100): 'task 1 is 100% done'" in out
    # debounce: one run, with the last version
    assert "reindex(3, 4): 'document 3 reindexed at version 4'" in out
    assert re.search(r'reset\(poll_account, 7\) -> [1-9]\d* key\(s\) removed', out)
    assert re.search(r'enqueue\(poll_account, 7\) -> job \S+   \(the slot is open again\)', out)
