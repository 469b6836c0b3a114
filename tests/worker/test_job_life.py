"""A job's life costs a PolicyWorker fewer round trips than rq's own worker, with what rq's readers see unchanged
(issue 34): the worker's idle state rides the heartbeat after the job, a bare heartbeat is not sent twice within
``HEARTBEAT_COALESCE_SECONDS``, that heartbeat also asks whether workers are suspended (rq asks before every fetch),
and the job's end heartbeat rides the end of run's transaction. What each of those must keep: a suspension made while
a job runs stops the next fetch; the worker's hash says busy while a job runs and idle after, with the ttl rq gives
it; a finished job's hash has rq's fields.
"""

from __future__ import annotations

import pytest
from rq.job import Job, JobStatus
from rq.suspension import resume
from rq.worker import Worker

from rq_policies import PolicyQueue, PolicySimpleWorker, PolicyWorker
from tests.helpers import jobs

pytestmark = pytest.mark.usefixtures('jobs_env')

WORKERS = [PolicySimpleWorker, PolicyWorker]


@pytest.mark.parametrize('worker_class', WORKERS, ids=lambda c: c.__name__)
def test_a_suspension_made_while_a_job_runs_stops_the_next_fetch(connection, worker_class):
    queue = PolicyQueue('life', connection=connection)
    first = queue.enqueue(jobs.suspend_workers, 'susp')
    rest = [queue.enqueue(jobs.record_plain, 'susp') for _ in range(3)]
    try:
        worker_class([queue], connection=connection).work(burst=True)
        ran = [x.decode() for x in connection.lrange('test:ran:susp', 0, -1)]
        assert ran == [first.id]  # a burst worker exits once suspended, before any other fetch (rq's rule)
        assert [job.get_status() for job in rest] == [JobStatus.QUEUED] * 3
    finally:
        resume(connection)
    worker_class([queue], connection=connection).work(burst=True)
    assert len(connection.lrange('test:ran:susp', 0, -1)) == 4


@pytest.mark.parametrize('worker_class', WORKERS, ids=lambda c: c.__name__)
def test_the_worker_reads_busy_while_a_job_runs_and_idle_after(connection, worker_class):
    queue = PolicyQueue('life', connection=connection)
    for _ in range(3):
        queue.enqueue(jobs.worker_state, 'st', job_timeout=600)
    worker = worker_class([queue], connection=connection)
    worker.work(burst=True, max_jobs=3)
    seen = [x.decode().split() for x in connection.lrange('test:state:st', 0, -1)]
    assert [state for state, _ in seen] == ['busy'] * 3
    if worker_class is PolicySimpleWorker:  # the worker's key lives as long as the job may run (rq's ttl for it)
        assert all(int(ttl) > 600 for _, ttl in seen), seen
    assert Worker.find_by_key(worker.key, connection=connection).get_state() == 'idle'


def test_between_jobs_the_worker_is_idle_in_redis(connection):
    queue = PolicyQueue('life', connection=connection)
    queue.enqueue(jobs.plain, 1)
    worker = PolicySimpleWorker([queue], connection=connection)
    worker.bootstrap()
    result = worker.dequeue_job_and_maintain_ttl(None)
    worker.execute_job(*result)
    worker.heartbeat()  # rq's work loop sends this after every job
    assert connection.hget(worker.key, 'state') == b'idle'
    worker.teardown()


@pytest.mark.parametrize('worker_class', WORKERS, ids=lambda c: c.__name__)
def test_a_finished_job_has_rqs_fields(connection, worker_class):
    queue = PolicyQueue('life', connection=connection)
    job = queue.enqueue(jobs.plain, 7)
    worker_class([queue], connection=connection).work(burst=True)
    job = Job.fetch(job.id, connection=connection)
    assert job.get_status() == JobStatus.FINISHED and job.return_value() == 7
    assert job.started_at <= job.ended_at and job.last_heartbeat is not None and job.last_heartbeat >= job.started_at
    assert job.worker_name is not None


@pytest.mark.parametrize('capped', [False, True], ids=['uncapped', 'capped'])
def test_a_simple_workers_end_of_run_carries_its_bookkeeping(connection, capped):
    """PolicySimpleWorker: the end of run's transaction carries the worker's heartbeat, idle state, the suspension
    question, the fetch's claim record's deletion and (the keeper disarmed first) the release of the job's holds, so
    the heartbeat rq's work loop sends after the job has nothing left to carry: right after execute_job, before any
    other call, the queue's hold is free, the claim record gone and the worker idle in Redis."""
    from rq_policies import QueueSlot
    from rq_policies.engine import keys

    queue = PolicyQueue('life', connection=connection)
    if capped:
        QueueSlot.set('life', 1, connection=connection)
    queue.enqueue(jobs.plain, 1)
    worker = PolicySimpleWorker([queue], connection=connection)
    worker.bootstrap()
    try:
        job, q = worker.dequeue_job_and_maintain_ttl(None)
        if capped:
            assert QueueSlot.status('life', connection=connection).in_use == 1
        worker.execute_job(job, q)
        assert QueueSlot.status('life', connection=connection).in_use == 0
        assert worker._pending_releases == []  # nothing left for the heartbeat to carry
        assert list(connection.scan_iter(match=keys.claim('*'))) == []
        assert connection.hget(worker.key, 'state') == b'idle'
        assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    finally:
        worker.teardown()
