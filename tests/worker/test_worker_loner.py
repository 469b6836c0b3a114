"""Loner end to end with real forking workers started as `rq worker -w rq_policies.PolicyWorker`."""

from __future__ import annotations

import pytest
from rq import Queue
from rq.job import Callback, Dependency, Job, JobStatus

from rq_policies import PolicyQueue
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs
from tests.helpers.cluster import not_on_cluster
from tests.helpers.workers import output, start_worker, stop, wait_for


def test_forking_worker_runs_loners_and_clears_markers(connection, redis_url, worker_env):
    q = PolicyQueue('e2e', connection=connection)
    admitted = [q.enqueue(jobs.record, 'e2e', i) for i in range(5)]
    assert all(admitted)
    assert all(q.enqueue(jobs.record, 'e2e', i) is None for i in range(5))
    worker = start_worker(redis_url, ['e2e'], worker_env, burst=True)
    assert worker.wait(60) == 0, output(worker)
    ran = [x.decode() for x in connection.lrange('test:ran:e2e', 0, -1)]
    assert sorted(ran) == sorted(j.id for j in admitted)
    assert all(keys.is_drop_counter(k.decode()) for k in connection.keys(f'{RQ}:policies:*'))  # only drop counters stay
    assert connection.llen(q.intermediate_queue_key) == 0
    for job in admitted:
        assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED


@pytest.mark.long
def test_identity_is_free_while_the_job_runs(connection, redis_url, worker_env):
    q = PolicyQueue('running', connection=connection)
    first = q.enqueue(jobs.slow_loner, 'running', 3)
    worker = start_worker(redis_url, ['running'], worker_env)
    try:
        assert wait_for(lambda: connection.llen('test:ran:running') == 1)
        assert Job.fetch(first.id, connection=connection).get_status() == JobStatus.STARTED
        assert q.enqueued(jobs.slow_loner, 'running', 3) is False
        second = q.enqueue(jobs.slow_loner, 'running', 3)
        assert second is not None
        assert q.enqueue(jobs.slow_loner, 'running', 3) is None  # the second one waits now
        assert wait_for(lambda: connection.llen('test:ran:running') == 2, timeout=30)
    finally:
        stop(worker)


@not_on_cluster("rq 3's own Worker does not start on a cluster (it reads connection.connection_pool)")
def test_stock_worker_reads_our_jobs_and_the_marker_heals(connection, redis_url, worker_env):
    q = PolicyQueue('stock', connection=connection)
    job = q.enqueue(jobs.record, 'stock', 1)
    worker = start_worker(redis_url, ['stock'], worker_env, worker_class='tests.helpers.workers.StockWorker',
                          burst=True)
    assert worker.wait(60) == 0, output(worker)
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    # A stock worker does not clear the marker, but its holder no longer waits: the identity is free.
    assert q.enqueued(jobs.record, 'stock', 1) is False
    assert q.enqueue(jobs.record, 'stock', 1) is not None
    assert Queue('stock', connection=connection).count == 1


def test_a_deferred_loner_whose_parent_failed_frees_its_identity(connection, redis_url, worker_env):
    """rq leaves the child of a failed parent deferred for good: it can never run, so it holds no identity."""
    q = PolicyQueue('orphans', connection=connection)
    parent = q.enqueue(jobs.fail, 1)
    child = q.enqueue(jobs.sweep_cache, 7, depends_on=parent)
    assert child is not None and q.enqueue(jobs.sweep_cache, 7) is None  # held while the parent may still succeed
    worker = start_worker(redis_url, ['orphans'], worker_env, burst=True)
    assert worker.wait(timeout=60) == 0, output(worker)
    assert Job.fetch(parent.id, connection=connection).get_status() == JobStatus.FAILED
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.DEFERRED  # rq never cleans it
    assert not q.enqueued(jobs.sweep_cache, 7)
    again = q.enqueue(jobs.sweep_cache, 7)
    assert again is not None and again.id != child.id


def test_a_deferred_loner_allowed_to_outlive_a_failed_parent_keeps_its_identity(connection):
    q = PolicyQueue('orphans', connection=connection)
    parent = q.enqueue(jobs.fail, 1)
    child = q.enqueue(jobs.sweep_cache, 8, depends_on=Dependency(jobs=[parent], allow_failure=True))
    assert child is not None
    parent.set_status(JobStatus.FAILED)
    assert q.enqueued(jobs.sweep_cache, 8) and q.enqueue(jobs.sweep_cache, 8) is None


def test_a_deferred_loner_whose_parent_callback_raised_frees_its_identity(connection, redis_url, worker_env):
    q = PolicyQueue('orphans', connection=connection)
    parent = q.enqueue(jobs.plain, 1, on_success=Callback(jobs.raising_callback))
    child = q.enqueue(jobs.sweep_cache, 9, depends_on=parent)
    assert child is not None and q.enqueue(jobs.sweep_cache, 9) is None
    worker = start_worker(redis_url, ['orphans'], worker_env, burst=True)
    assert worker.wait(timeout=60) == 0, output(worker)
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.DEFERRED
    assert q.enqueue(jobs.sweep_cache, 9) is not None
