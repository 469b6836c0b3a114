"""What rq-policies assumes of rq, pinned on the installed rq (CI runs this file on rq 2.12 and on rq 3.x).

Each test names one behaviour of rq (or of rq as our classes see it) that rq-policies is built on; when a new rq
release breaks one, this file says which, before a policy misbehaves. ``rq_policies/compat.py`` is where any fix
goes.

* the door protocol: every public enqueue door of rq's ``Queue`` builds its job with ``self.create_job`` and hands
  it to ``self.enqueue_job`` or ``self.schedule_job`` (PolicyQueue's admission sits there);
* the end-of-run pipeline: every ending of a run passes ``Worker.cleanup_execution(job, pipeline)``, on a pipeline
  rq executes once afterwards, after its own write of the job's final status (the end-of-run release rides it);
* a stock rq ``Job`` (``Job.fetch``, registries, admin views) handed to any PolicyQueue path that takes a job;
* ``clean_registries`` over a job parked by per-key Concurrency (in ``rq:deferred:<q>`` with score = now; rq 2.0-2.7's
  ``DeferredJobRegistry.cleanup`` failed such jobs): it stays parked and intact;
* every job status a Loner holder can be in, rq 3's ``ready_to_enqueue`` included, read as ``compat.STATUS_ROLE``
  says by the Loner check, ``PolicyQueue.holder``, the end-of-run release and LimitedCapacityWorker's room;
* who pushes a released dependent (PolicyQueue's ``push_job_id`` on rq 2.12, rq's own Queue on rq 3).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from rq import SimpleWorker, Worker
from rq.decorators import job as job_decorator
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, clean_registries

from rq_policies import Loner, PolicyJob, PolicyQueue
from rq_policies.engine import compat
from rq_policies.engine.fetch import Look, release_claim
from tests.helpers import fetches, jobs, key_jobs
from tests.helpers.workers import StockSimpleWorker

ALL_STATUSES = [status.value for status in JobStatus]


# -- the job statuses ------------------------------------------------------------------------------------------------


def test_every_status_of_this_rq_has_a_role():
    assert set(ALL_STATUSES) <= set(compat.STATUS_ROLE)
    assert set(compat.STATUS_ROLE.values()) == {'waiting', 'running', 'ended'}
    if compat.RQ3:
        assert {'ready_to_enqueue', 'rate_limited'} <= set(ALL_STATUSES)


@pytest.mark.parametrize('status', ALL_STATUSES)
def test_the_loner_check_reads_each_holder_status(connection, status):
    """A holder in a waiting status keeps its identity (a duplicate is dropped, ``holder()`` names it); in any other
    it is free (Loner until='started': a running holder no longer holds either)."""
    q = PolicyQueue('contract', connection=connection)
    holder = q.enqueue(jobs.sweep_cache, 1)
    Job.fetch(holder.id, connection=connection).set_status(status)
    waiting = compat.STATUS_ROLE[status] == 'waiting'
    assert q.holder(jobs.sweep_cache, 1) == (holder.id if waiting else None)
    duplicate = q.enqueue(jobs.sweep_cache, 1)
    assert (duplicate is None) == waiting, (status, duplicate)


@pytest.mark.parametrize('status', ALL_STATUSES)
def test_under_until_finished_a_holder_holds_while_a_live_worker_runs_it(connection, status):
    q = PolicyQueue('contract', connection=connection)
    loner = Loner(until='finished')
    holder = q.enqueue(jobs.plain, 1, policy=loner)
    worker = Worker([q], connection=connection)
    worker.register_birth()
    stock = Job.fetch(holder.id, connection=connection)
    with connection.pipeline() as pipe:
        stock.prepare_for_execution(worker.name, pipe)  # rq's start of a run: status started, worker_name
        pipe.execute()
    if status != 'started':
        stock.set_status(status)
    held = compat.STATUS_ROLE[status] in ('waiting', 'running')
    assert (q.enqueue(jobs.plain, 1, policy=loner) is None) == held, status
    if status == 'started':
        connection.delete(worker.key)  # its worker is gone (killed, its key expired): the run no longer holds
        assert q.enqueue(jobs.plain, 1, policy=loner) is not None


@pytest.mark.parametrize('parent_status', ALL_STATUSES)
def test_a_deferred_holder_holds_while_its_parent_can_still_release_it(connection, parent_status):
    q = PolicyQueue('contract', connection=connection)
    parent = q.enqueue(jobs.plain, 0)
    child = q.enqueue(jobs.sweep_cache, 2, depends_on=parent)
    assert child.get_status() == JobStatus.DEFERRED
    Job.fetch(parent.id, connection=connection).set_status(parent_status)
    releases = parent_status not in ('failed', 'stopped', 'canceled')  # rq leaves the child deferred for good
    assert (q.enqueue(jobs.sweep_cache, 2) is None) == releases, parent_status


@pytest.mark.skipif(not compat.RQ3, reason="rq 3's ReadyJobRegistry")
def test_a_released_dependent_left_ready_to_enqueue_still_holds_its_identity(connection):
    """rq 3 releases a dependent in two steps: to ``ready_to_enqueue`` (out of the deferred registry, into the ready
    one), then onto its queue; when that drain fails the job waits for ``ReadyJobRegistry.cleanup()``."""
    from rq.registry import ReadyJobRegistry

    q = PolicyQueue('contract', connection=connection)
    parent = q.enqueue(jobs.plain, 0)
    child = q.enqueue(jobs.sweep_cache, 3, depends_on=parent)
    parent.set_status(JobStatus.FINISHED)
    moved = q.move_dependents_to_ready(parent)  # the first step only: the drain "failed"
    assert moved == {'contract': [child.id]}
    assert child.get_status() == JobStatus.READY_TO_ENQUEUE
    assert q.deferred_job_registry.get_job_ids() == [] and q.job_ids == [parent.id]
    assert q.holder(jobs.sweep_cache, 3) == child.id
    assert q.enqueue(jobs.sweep_cache, 3) is None
    ReadyJobRegistry(queue=q).cleanup()
    assert q.job_ids == [parent.id, child.id] and child.get_status() == JobStatus.QUEUED
    assert q.enqueue(jobs.sweep_cache, 3) is None


@pytest.mark.parametrize('status', ALL_STATUSES)
def test_the_end_of_run_release_frees_a_loner_identity_only_once_its_job_has_ended(connection, status):
    """What PolicyWorker queues on the end-of-run pipeline (lua/release_markers.lua, ``ended``): a job retried or
    repeated (waiting again) keeps its identity; one that ended frees it."""
    from rq_policies.engine import admission

    q = PolicyQueue('contract', connection=connection)
    holder = q.enqueue(jobs.plain, 1, policy=Loner(until='finished'))
    Job.fetch(holder.id, connection=connection).set_status(status)
    with connection.pipeline() as pipe:
        admission.ended(pipe, q.job_class.redis_job_namespace_prefix, holder.id)
        pipe.execute()
    kept = compat.STATUS_ROLE[status] != 'ended'
    assert (connection.get(holder.connection.hget(holder.key, 'policies_loner')) is not None) == kept, status


@pytest.mark.parametrize('status', ALL_STATUSES)
def test_limited_capacity_counts_a_queued_job_by_its_status(connection, redis_url, monkeypatch, status):
    """LimitedCapacityWorker's room counts a job of its queued set while it waits or runs, and prunes it once ended
    (lua/lib/lcw_room.lua): a job in rq 3's ready_to_enqueue was pruned, and a third job admitted over the cap."""
    from tests.helpers import lcw_jobs

    monkeypatch.setenv('REDIS_URL', redis_url)  # the job class reaches its backlog through it
    connection.rpush('test:backlog:backlog', *['x'] * 5)
    first = lcw_jobs.Backlog.perform_with_capacity(connection=connection)
    assert len(first) == 2  # the class's default cap
    Job.fetch(first[0], connection=connection).set_status(status)
    counted = compat.STATUS_ROLE[status] != 'ended'
    assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == (0 if counted else 1), status


# -- the door protocol -------------------------------------------------------------------------------------------------


class RecordingQueue(Queue):
    """rq's own Queue, recording which of its methods its doors call."""

    calls: list

    def create_job(self, *args, **kwargs):
        job = super().create_job(*args, **kwargs)
        self.calls.append(('create_job', job))
        return job

    def enqueue_job(self, job, *args, **kwargs):
        self.calls.append(('enqueue_job', job))
        return super().enqueue_job(job, *args, **kwargs)

    def schedule_job(self, job, *args, **kwargs):
        self.calls.append(('schedule_job', job))
        return super().schedule_job(job, *args, **kwargs)


DOORS = {
    'enqueue': lambda q: q.enqueue(jobs.plain, 1),
    'enqueue_call': lambda q: q.enqueue_call(jobs.plain, args=(1,)),
    'enqueue_at': lambda q: q.enqueue_at(datetime.now(timezone.utc) + timedelta(minutes=5), jobs.plain, 1),
    'enqueue_in': lambda q: q.enqueue_in(timedelta(minutes=5), jobs.plain, 1),
    'delay': lambda q: job_decorator(q, connection=q.connection)(jobs.plain).delay(1),
    'depends_on': lambda q: q.enqueue(jobs.plain, 1, depends_on=q.enqueue(jobs.plain, 0)),
}


@pytest.mark.parametrize('door', sorted(DOORS))
def test_every_door_builds_its_job_with_create_job_and_hands_it_to_enqueue_or_schedule_job(connection, door):
    q = RecordingQueue('doors', connection=connection)
    q.calls = []
    job = DOORS[door](q)
    calls = [(name, made) for name, made in q.calls if made.id == job.id]
    handed = 'schedule_job' if door in ('enqueue_at', 'enqueue_in') else 'enqueue_job'
    assert [name for name, _ in calls] == ['create_job', handed]
    assert calls[0][1] is calls[1][1] is job  # the very object create_job built


def test_who_pushes_a_released_dependent(connection):
    """rq 2.12 pushes a released dependent through the queue's ``push_job_id`` (ours: replay-safe, wakes idle
    PolicyWorkers); rq 3 through a ``Queue`` its ``ReadyJobRegistry`` builds, rq's own (idle PolicyWorkers see the job
    at their next idle probe). Pinned so that a change either way is noticed."""
    q = PolicyQueue('released', connection=connection)
    parent = q.enqueue(jobs.plain, 0)
    child = q.enqueue(jobs.plain, 1, depends_on=parent)
    parent.set_status(JobStatus.FINISHED)
    q.enqueue_dependents(parent)
    assert child.get_status() == JobStatus.QUEUED and child.id in q.job_ids
    ours = connection.hget(child.key, 'policies_push') is not None  # the field lua/push.lua records
    assert ours == (not compat.RQ3)


# -- the end-of-run pipeline -----------------------------------------------------------------------------------------


class EndingWorker(StockSimpleWorker):
    """rq's SimpleWorker (with the 1 s command-channel wait: a burst's exit took 60 s in CI), recording each
    end-of-run pipeline and what it holds when rq executes it."""

    endings: list

    def cleanup_execution(self, job, pipeline, *args, **kwargs):
        super().cleanup_execution(job, pipeline, *args, **kwargs)
        execute = pipeline.execute
        record = {'job': job.id, 'executed': 0}
        self.endings.append(record)

        def execute_and_record(*a, **k):
            record['executed'] += 1
            record.setdefault('commands', [c[0] for c in pipeline.command_stack])  # the first execute's
            return execute(*a, **k)

        pipeline.execute = execute_and_record


@pytest.mark.parametrize('func, final', [(jobs.plain, JobStatus.FINISHED), (jobs.fail, JobStatus.FAILED)])
def test_every_ending_passes_cleanup_execution_on_a_pipeline_whose_first_execute_writes_the_final_status(
        connection, func, final):
    """PolicyWorker queues its end-of-run release on that pipeline, run at its first execute (worker.py,
    cleanup_execution). rq 2.12's failure path executes the pipeline twice (the failure's writes, then the worker's
    counters): the first holds the final status."""
    q = Queue('endings', connection=connection)
    job = q.enqueue(func, 1)
    worker = EndingWorker([q], connection=connection)
    worker.endings = []
    worker.work(burst=True)
    assert job.get_status() == final
    (ending,) = [e for e in worker.endings if e['job'] == job.id]
    assert ending['executed'] == (2 if compat.LEGACY_FAILURE and final == JobStatus.FAILED else 1)
    # The job's final status is written on that pipeline by its first execute, so a script queued last reads it.
    key = job.key.decode() if isinstance(job.key, bytes) else job.key
    assert any(args[0] == 'HSET' and args[1] == key and 'status' in args for args in ending['commands'])


# -- a stock rq Job handed to every PolicyQueue path -------------------------------------------------------------------


def stock(job, connection):
    fetched = Job.fetch(job.id, connection=connection)
    assert type(fetched) is Job
    return fetched


def test_enqueue_job_takes_a_stock_job(connection):
    q = PolicyQueue('stock', connection=connection)
    made = Job.create(jobs.plain, args=(1,), connection=connection, origin=q.name)
    assert type(made) is Job
    assert q.enqueue_job(made).id == made.id
    assert q.job_ids == [made.id] and made.get_status() == JobStatus.QUEUED


def test__enqueue_job_takes_a_stock_deferred_job(connection):
    """``PolicyQueue(...)._enqueue_job(Job.fetch(deferred_id))``: django-rq's admin "Enqueue" (DataError before)."""
    q = PolicyQueue('stock', connection=connection)
    parent = q.enqueue(jobs.plain, 0)
    child = q.enqueue(jobs.sweep_cache, 4, depends_on=parent)
    fetched = stock(child, connection)
    q._enqueue_job(fetched)
    assert fetched.get_status(refresh=False) == JobStatus.QUEUED  # the caller's object sees the enqueue, as in rq
    assert isinstance(fetched, PolicyJob)  # and, as a PolicyJob now, its delete() frees its identity
    assert q.job_ids == [parent.id, child.id]
    assert q.deferred_job_registry.get_job_ids() == []
    assert q.holder(jobs.sweep_cache, 4) == child.id


def test_schedule_job_takes_a_stock_job(connection):
    q = PolicyQueue('stock', connection=connection)
    made = Job.create(jobs.plain, args=(1,), connection=connection, origin=q.name)
    when = datetime.now(timezone.utc) + timedelta(minutes=5)
    q.schedule_job(made, when)
    assert ScheduledJobRegistry(queue=q).get_job_ids() == [made.id]
    assert made.get_status() == JobStatus.SCHEDULED


def test_get_job_position_remove_and_enqueue_dependents_take_a_stock_job(connection):
    q = PolicyQueue('stock', connection=connection)
    first, second = q.enqueue(jobs.plain, 1), q.enqueue(jobs.sweep_cache, 5)
    assert q.get_job_position(stock(second, connection)) == 1
    assert q.remove(stock(second, connection)) == 1
    assert q.job_ids == [first.id] and q.holder(jobs.sweep_cache, 5) is None
    parent = q.enqueue(jobs.plain, 0)
    child = q.enqueue(jobs.plain, 6, depends_on=parent)
    parent.set_status(JobStatus.FINISHED)
    q.enqueue_dependents(stock(parent, connection))
    assert child.get_status() == JobStatus.QUEUED and child.id in q.job_ids


def test_run_job_takes_a_stock_job(connection):
    q = PolicyQueue('stock', connection=connection, is_async=False)
    made = Job.create(jobs.plain, args=(7,), connection=connection, origin=q.name)
    assert q.run_job(made).get_status() == JobStatus.FINISHED


def test_a_stock_job_of_another_class_is_left_as_it_is(connection):
    class Mine(PolicyJob):
        pass

    plain = Job('x', connection=connection)
    assert compat.adopt_job(plain, Mine) is plain and type(plain) is Job  # a user's subclass may hold state of its own
    assert compat.adopt_job('an-id', PolicyJob) == 'an-id'


# -- clean_registries over a parked job --------------------------------------------------------------------------------


def fetch(conn, token, names=('keys',)):
    return fetches.fetch(conn, token, names)


def test_clean_registries_leaves_a_parked_job_parked_and_intact(connection):
    q = PolicyQueue('keys', connection=connection)
    made = [q.enqueue(key_jobs.one_per_customer, 't', 0, customer='a') for _ in range(2)]
    taken = fetch(connection, 'h:1:1:1')
    assert taken.job_id == made[0].id
    assert isinstance(fetch(connection, 'h:1:1:2'), Look)  # the key is full: the second job is parked
    parked = made[1]
    deferred = DeferredJobRegistry(queue=q)
    before = (connection.hgetall(parked.key), deferred.get_job_ids(), connection.zscore(deferred.key, parked.id))
    assert before[1] == [parked.id] and parked.get_status() == JobStatus.DEFERRED

    clean_registries(q)
    deferred.cleanup()
    q.deferred_job_registry.cleanup()

    after = (connection.hgetall(parked.key), deferred.get_job_ids(), connection.zscore(deferred.key, parked.id))
    assert after == before
    # Still unparked by the release, and taken next.
    release_claim(taken, connection)
    assert q.job_ids == [parked.id] and parked.get_status() == JobStatus.QUEUED
    assert fetch(connection, 'h:1:2:1').job_id == parked.id


# -- a start recorded again (worker_mixin._record_start) ---------------------------------------------------------------


def test_prepare_execution_keeps_the_execution_on_the_worker_before_its_pipeline_runs(connection):
    """``compat.started_executions`` finds the Execution ``prepare_execution`` made for a job on the worker (rq 3's
    ``worker.executions``, rq 2.12's ``worker.execution``), set before the pipeline that writes it: a worker whose
    first attempt failed deletes it before recording the start again. Taken off the worker once found."""
    q = Queue('executions', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    worker = SimpleWorker([q], connection=connection)
    execution = worker.prepare_execution(job)
    assert compat.started_executions(worker, job) == [execution]
    assert compat.started_executions(worker, job) == []
    other = q.enqueue(jobs.plain, 2)
    worker.prepare_execution(other)
    assert compat.started_executions(worker, job) == []


def test_redis_pys_plain_pool_lets_a_work_horse_adopt_a_connection(connection):
    """compat.horse_connection reads redis-py's ConnectionPool internals (``_available_connections``,
    ``_created_connections``, ``_checkpid``, ``_lock``, ``pid``): on a plain pool it must hand a connection out, or
    every horse silently connects again (tests/worker/test_horse_connection.py would skip)."""
    import redis

    if type(getattr(connection, 'connection_pool', None)) is not redis.ConnectionPool:
        pytest.skip('a cluster client: its horses connect as rq\'s do')
    made = compat.horse_connection(connection)
    assert made is not None
    try:
        assert compat.horse_connection_clean(made)
    finally:
        made.disconnect()
