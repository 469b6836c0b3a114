"""LimitedCapacityWorker: refill under capacity, self re-enqueue, crash-safe running ledger, with real workers."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry

from rq_policies import LimitedCapacityWorker, PolicyQueue, PolicySimpleWorker
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.ledger import Hold, acquire_call
from tests.helpers import EXAMPLES, lcw_jobs
from tests.helpers.cluster import CLUSTER_CLASS, ON_CLUSTER, not_on_cluster
from tests.helpers.workers import stop, wait_for

RUNNING = keys.lcw_running('tests.helpers.lcw_jobs.Backlog')
QUEUED = keys.lcw_queued('tests.helpers.lcw_jobs.Backlog')


# The job classes reach their backlog through REDIS_URL, in this process as in the workers.
pytestmark = pytest.mark.usefixtures('jobs_env')


def fill(connection, items, name='backlog'):
    connection.delete(f'test:backlog:{name}')
    if items:
        connection.rpush(f'test:backlog:{name}', *items)


def max_overlap(connection, name):
    """The largest number of units that ran at once, from their start/end marks on the server's clock."""
    events = []
    for raw in connection.lrange(f'test:span:{name}', 0, -1):
        kind, stamp = raw.decode().split()
        events.append((float(stamp), 0 if kind == 'end' else 1))
    events.sort()  # at one instant, an end sorts before a start: touching spans do not overlap
    now = peak = 0
    for _, is_start in events:
        now += 1 if is_start else -1
        peak = max(peak, now)
    return peak


def start_workers(n, worker_env, url, worker_class='rq_policies.PolicyWorker', log_dir=None):
    procs = []
    for i in range(n):
        out = open(os.path.join(log_dir, f'worker{i}.log'), 'w') if log_dir else subprocess.DEVNULL
        try:
            procs.append(
                subprocess.Popen(
                    [sys.executable, '-m', 'rq.cli', 'worker', '-w', worker_class, '--url', url,
                     *(CLUSTER_CLASS if ON_CLUSTER else []), 'lcw'],
                    env=worker_env, stdout=out, stderr=subprocess.STDOUT,
                )
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # the child has its own copy of the descriptor
    return procs


# -- the refill -------------------------------------------------------------------------------------------------


def test_refill_counts_queued_and_running_jobs(connection):
    fill(connection, ['x'] * 7)
    first = lcw_jobs.Backlog.perform_with_capacity(connection=connection)
    assert len(first) == 2
    assert lcw_jobs.Backlog.perform_with_capacity(connection=connection) == []  # both still queued
    q = PolicyQueue('lcw', connection=connection)
    assert sorted(q.job_ids) == sorted(first)
    job = Job.fetch(first[0], connection=connection)
    assert job.func_name == 'tests.helpers.lcw_jobs.Backlog.perform'
    assert job.retries_left is None  # retries are off
    assert lcw_jobs.Backlog.queued_jobs_count(connection) == 2

    # A running hold counts like a queued job; an expired one does not.
    acquire_call(Hold(RUNNING, 'someone', 60), 5).run(connection)
    connection.set('test:lcw:max', 3)
    assert lcw_jobs.Backlog.perform_with_capacity(connection=connection) == []
    connection.zadd(RUNNING, {'someone': 1})  # expired long ago
    third = lcw_jobs.Backlog.perform_with_capacity(connection=connection)
    assert len(third) == 1

    # A queued job that goes away (deleted by an operator) stops counting.
    Job.fetch(first[0], connection=connection).delete()
    assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 1
    assert lcw_jobs.Backlog.queued_jobs_count(connection) == 3


def test_refill_bounded_by_remaining_work_and_zero_pauses(connection):
    fill(connection, ['x'])
    connection.set('test:lcw:max', 5)
    assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 1
    fill(connection, ['x'] * 9)
    connection.set('test:lcw:max', 0)
    assert lcw_jobs.Backlog.perform_with_capacity(connection=connection) == []
    state = connection.hgetall(keys.lcw_state('tests.helpers.lcw_jobs.Backlog'))
    assert state[b'max'] == b'0' and state[b'remaining'] == b'9' and state[b'queue'] == b'lcw'
    assert connection.zscore(keys.LCW_INDEX, 'tests.helpers.lcw_jobs.Backlog') is not None
    assert 0 < connection.ttl(keys.lcw_state('tests.helpers.lcw_jobs.Backlog')) <= 24 * 3600


def test_concurrent_refills_never_overshoot(connection, redis_url):
    fill(connection, ['x'] * 100)
    connection.set('test:lcw:max', 3)
    barrier = threading.Barrier(8)
    results = []

    def refill():
        from tests.helpers.cluster import connect

        conn = connect(redis_url)
        barrier.wait()
        results.append(len(lcw_jobs.Backlog.perform_with_capacity(connection=conn)))

    threads = [threading.Thread(target=refill) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 3
    assert PolicyQueue('lcw', connection=connection).count == 3


def test_bad_input_raises_before_writing(connection):
    with pytest.raises(ValueError, match=r"remaining_work_count\(\) must return an integer >= 0, got '3'"):
        lcw_jobs.BadCount.perform_with_capacity(connection=connection)

    class Local(LimitedCapacityWorker):
        queue_name = 'lcw'

        def perform_work(self):
            pass

        def remaining_work_count(self):
            return 1

        def max_running_jobs(self):
            return 1

    with pytest.raises(TypeError, match='cannot be imported by its path'):
        Local.perform_with_capacity(connection=connection)

    class NoQueue(lcw_jobs.Backlog):
        queue_name = None

    with pytest.raises(ValueError, match='queue_name must be a non-empty queue name, got None'):
        NoQueue.perform_with_capacity(connection=connection)
    with pytest.raises(TypeError, match='connection is required'):
        lcw_jobs.Backlog.perform_with_capacity(connection=None)
    assert connection.keys(f'{RQ}:*') == []


# -- running, in-process ------------------------------------------------------------------------------------------


def test_simple_worker_drains_the_backlog_by_re_enqueueing(connection):
    fill(connection, ['x'] * 7)
    lcw_jobs.Backlog.unit_seconds, saved = 0.0, lcw_jobs.Backlog.unit_seconds
    try:
        assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 2
        q = PolicyQueue('lcw', connection=connection)
        PolicySimpleWorker([q], connection=connection).work(burst=True)
    finally:
        lcw_jobs.Backlog.unit_seconds = saved
    assert connection.llen('test:backlog:backlog') == 0
    assert connection.llen('test:done:backlog') == 7
    assert connection.zcard(RUNNING) == 0 and connection.zcard(QUEUED) == 0
    # 2 started by the refill, each later one enqueued by a finishing job while work remained. The pool winds down
    # as GitLab's does: a job enqueued while one unit was left may find it taken (at most max - 1 such jobs).
    assert q.finished_job_registry.count == 8
    assert connection.hget(keys.lcw_state('tests.helpers.lcw_jobs.Backlog'), 'remaining') == b'0'


def test_args_reach_perform_work(connection):
    fill(connection, ['1', '2', '3', '4'], name='a')
    fill(connection, ['1', '2'], name='b')
    assert len(lcw_jobs.WithArgs.perform_with_capacity('a', connection=connection)) == 3
    PolicySimpleWorker([PolicyQueue('lcw', connection=connection)], connection=connection).work(burst=True)
    assert connection.llen('test:backlog:a') == 0
    assert connection.llen('test:backlog:b') == 2


def test_job_without_capacity_steps_aside(connection, caplog):
    fill(connection, ['x'] * 3)
    connection.set('test:lcw:max', 1)
    (job_id,) = lcw_jobs.Backlog.perform_with_capacity(connection=connection)
    # Someone else holds the only unit (a job of another refill, or one killed a moment ago).
    acquire_call(Hold(RUNNING, 'elsewhere', 60), 1).run(connection)
    q = PolicyQueue('lcw', connection=connection)
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert 'found no free capacity' in caplog.text
    assert connection.llen('test:backlog:backlog') == 3  # no work done
    assert q.count == 0  # and no successor
    assert connection.zrange(RUNNING, 0, -1) == [b'elsewhere']
    assert Job.fetch(job_id, connection=connection).get_status() == JobStatus.FINISHED


def test_failure_is_logged_released_and_not_re_enqueued(connection, caplog):
    fill(connection, ['fail', 'x', 'x'])
    connection.set('test:lcw:max', 1)
    (job_id,) = lcw_jobs.Backlog.perform_with_capacity(connection=connection)
    q = PolicyQueue('lcw', connection=connection)
    with caplog.at_level(logging.ERROR, logger='rq_policies'):
        PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert f'tests.helpers.lcw_jobs.Backlog job {job_id} failed; not re-enqueued' in caplog.text
    assert job_id in FailedJobRegistry(queue=q)
    assert q.count == 0
    assert connection.zcard(RUNNING) == 0
    # The refill stands in for the retry.
    assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 1


# -- real forking workers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize('worker_class', [
    'rq_policies.PolicyWorker',
    pytest.param('tests.helpers.workers.StockWorker', marks=not_on_cluster(
        "rq 3's own Worker does not start on a cluster (it reads connection.connection_pool)")),
])
def test_real_workers_never_exceed_max_and_drain(connection, worker_env, redis_url, worker_class, tmp_path):
    # Units of a second: with 0.2 s units a loaded machine (CI's load 12) forked each horse after the other unit had
    # ended, and the capacity was never seen used.
    fill(connection, ['sleep:1'] * 12)
    connection.set('test:lcw:max', 2)
    procs = start_workers(3, worker_env, redis_url, worker_class, log_dir=str(tmp_path))
    seen = []
    try:
        assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 2

        def drained():
            seen.append(connection.zcard(RUNNING))
            return connection.llen('test:done:backlog') == 12

        assert wait_for(drained, 40), (tmp_path / 'worker0.log').read_text()[-3000:]
    finally:
        stop(*procs)
    assert max(seen) <= 2
    assert max_overlap(connection, 'backlog') == 2  # never more, and the capacity was used
    assert connection.llen('test:backlog:backlog') == 0
    assert connection.zcard(RUNNING) == 0 and connection.zcard(QUEUED) == 0
    assert PolicyQueue('lcw', connection=connection).count == 0


def test_real_workers_failing_unit_does_not_stop_the_others(connection, worker_env, redis_url, tmp_path):
    fill(connection, ['x'] * 3 + ['fail'] + ['x'] * 6)
    connection.set('test:lcw:max', 2)
    procs = start_workers(2, worker_env, redis_url, log_dir=str(tmp_path))
    try:
        assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 2
        assert wait_for(lambda: connection.llen('test:done:backlog') == 9, 40)
        q = PolicyQueue('lcw', connection=connection)
        assert wait_for(lambda: q.failed_job_registry.count == 1, 10)
    finally:
        stop(*procs)
    assert connection.llen('test:backlog:backlog') == 0
    assert connection.zcard(RUNNING) == 0
    logs = ''.join(p.read_text() for p in tmp_path.iterdir())
    assert 'failed; not re-enqueued' in logs
    assert 'unit failing on purpose' in logs


def test_killed_job_unit_comes_back_by_itself(connection, worker_env, redis_url, tmp_path):
    running = keys.lcw_running('tests.helpers.lcw_jobs.ShortHold')
    fill(connection, ['pid', 'x', 'x'], name='short')
    connection.set('test:lcw:max', 1)
    procs = start_workers(1, worker_env, redis_url, log_dir=str(tmp_path))
    try:
        assert len(lcw_jobs.ShortHold.perform_with_capacity(connection=connection)) == 1
        assert wait_for(lambda: connection.llen('test:pid:short') == 1, 20)
        time.sleep(lcw_jobs.ShortHold.hold_ttl)  # past one ttl: only the refresh keeps the hold alive
        assert lcw_jobs.ShortHold.running_jobs_count(connection) == 1
        os.kill(int(connection.lindex('test:pid:short', 0)), signal.SIGKILL)
        killed_at = time.monotonic()
        # The hold outlives the job (a ledger, not a counter that a crash would leave wrong either way)...
        assert connection.zcard(running) == 1
        assert lcw_jobs.ShortHold.perform_with_capacity(connection=connection) == []
        # ...and lapses by itself within hold_ttl, with nobody releasing it.
        assert wait_for(lambda: lcw_jobs.ShortHold.running_jobs_count(connection) == 0, 10)
        assert time.monotonic() - killed_at <= lcw_jobs.ShortHold.hold_ttl + 1.5
        assert len(lcw_jobs.ShortHold.perform_with_capacity(connection=connection)) == 1
        assert wait_for(lambda: connection.llen('test:backlog:short') == 0, 20)
        assert wait_for(lambda: connection.llen('test:done:short') == 2, 10)
    finally:
        stop(*procs)


@not_on_cluster('the example builds a redis.Redis of its own for one server (examples/limited_capacity_cron.py)')
def test_cron_example_refills_through_rq_cron(connection, worker_env, redis_url):
    """examples/limited_capacity_cron.py: rq's own cron enqueues the refill; one unit fails, the refill replaces it."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / 'limited_capacity_cron.py')],
        env=worker_env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert 'backlog drained: 24 imported, 1 failed' in result.stdout
    assert connection.llen('example:imports:backlog') == 0
    assert FailedJobRegistry('imports', connection=connection).count == 1
