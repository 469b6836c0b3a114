"""Loner: one waiting job per identity per queue."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from rq import Queue
from rq.decorators import job as job_decorator
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from rq_policies import Loner, PipelineNotSupported, PolicyJob, PolicyQueue, PolicySimpleWorker
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs
from tests.helpers.workers import race


def test_duplicate_dropped_and_enqueued_answers(connection, caplog):
    q = PolicyQueue('cache_sweeps', connection=connection)
    first = q.enqueue(jobs.sweep_cache, 1)
    assert isinstance(first, Job)
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        assert q.enqueue(jobs.sweep_cache, 1) is None
    assert first.id in caplog.text
    assert q.count == 1
    assert q.enqueued(jobs.sweep_cache, 1) is True
    assert q.enqueued(jobs.sweep_cache, 2) is False
    assert PolicyQueue('other', connection=connection).enqueued(jobs.sweep_cache, 1) is False
    assert q.holder(jobs.sweep_cache, 1) == first.id
    assert q.holder(jobs.sweep_cache, 2) is None
    assert connection.hget(keys.DROPS, 'loner:cache_sweeps') == b'1'


def test_admitted_job_is_an_ordinary_rq_job(connection):
    q = PolicyQueue('cache_sweeps', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1, job_timeout=30, description='d', meta={'a': 1})
    stock = Queue('cache_sweeps', connection=connection)
    assert stock.job_ids == [job.id]
    fetched = Job.fetch(job.id, connection=connection)
    assert fetched.get_status() == JobStatus.QUEUED
    assert fetched.args == (1,)
    assert fetched.timeout == 30
    assert fetched.description == 'd'
    assert fetched.meta == {'a': 1}
    assert fetched.origin == 'cache_sweeps'
    assert fetched.enqueued_at is not None
    assert connection.sismember(Queue.redis_queues_keys, stock.key)


def test_per_call_policy_and_switching_off(connection):
    q = PolicyQueue('q', connection=connection)
    assert q.enqueue(jobs.plain, 1, policy=Loner()) is not None
    assert q.enqueue(jobs.plain, 1, policy=Loner()) is None
    assert q.enqueue(jobs.plain, 1) is not None  # no declared policy on plain
    assert q.enqueue(jobs.sweep_cache, 5) is not None
    assert q.enqueue(jobs.sweep_cache, 5, policy=None) is not None  # declared one switched off
    assert q.count == 4


def test_every_door(connection):
    q = PolicyQueue('doors', connection=connection)
    assert q.enqueue_call(jobs.sweep_cache, args=(1,)) is not None
    assert q.enqueue_call(jobs.sweep_cache, args=(1,)) is None
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    scheduled = q.enqueue_at(at, jobs.sweep_cache, 2)
    assert scheduled is not None
    assert scheduled.id in ScheduledJobRegistry(queue=q)
    assert Job.fetch(scheduled.id, connection=connection).get_status() == JobStatus.SCHEDULED
    assert q.enqueue_at(at, jobs.sweep_cache, 2) is None
    assert q.enqueue_in(timedelta(minutes=5), jobs.sweep_cache, 2) is None
    assert q.enqueue(jobs.sweep_cache, 2) is None  # scheduled holds the identity too
    assert q.enqueue_in(timedelta(minutes=5), jobs.sweep_cache, 3) is not None
    many = q.enqueue_many(
        [
            Queue.prepare_data(jobs.sweep_cache, (1,)),
            Queue.prepare_data(jobs.sweep_cache, (4,)),
            Queue.prepare_data(jobs.sweep_cache, (4,)),
            Queue.prepare_data(jobs.plain, (4,)),
        ]
    )
    assert len(many) == 4
    assert many[0] is None and many[2] is None
    assert isinstance(many[1], Job) and isinstance(many[3], Job)
    # a string import path reads the declared policy of the imported function
    assert q.enqueue('tests.helpers.jobs.sweep_cache', 4) is None
    assert q.enqueue('tests.helpers.jobs.sweep_cache', 9) is not None


def test_job_decorator_delay(connection):
    q = PolicyQueue('delayed', connection=connection)
    delayed = job_decorator(q, connection=connection)(jobs.sweep_cache)
    assert delayed.delay(7) is not None
    assert delayed.delay(7) is None


def test_unique_context_narrows_identity(connection):
    q = PolicyQueue('accounts', connection=connection)
    assert q.enqueue(jobs.sync_account, 1, reason='a') is not None
    assert q.enqueue(jobs.sync_account, 1, reason='b') is None
    assert q.enqueue(jobs.sync_account, 2, reason='a') is not None
    assert q.enqueued(jobs.sync_account, 1, reason='zzz') is True


def test_unencodable_argument_raises_and_writes_nothing(connection):
    q = PolicyQueue('q', connection=connection)
    before = connection.dbsize()
    with pytest.raises(TypeError, match=r'args\[0\]'):
        q.enqueue(jobs.sweep_cache, object())
    assert connection.dbsize() == before


def test_pipeline_with_policy_is_refused(connection):
    q = PolicyQueue('q', connection=connection)
    with connection.pipeline() as pipe:
        with pytest.raises(PipelineNotSupported, match="queue 'q'"):
            q.enqueue(jobs.sweep_cache, 1, pipeline=pipe)
    assert connection.dbsize() == 0
    with connection.pipeline() as pipe:  # without a policy a pipeline works as in rq
        job = q.enqueue(jobs.plain, 1, pipeline=pipe)
        pipe.execute()
    assert q.job_ids == [job.id]


def test_marker_cleared_on_removal_paths(connection):
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1)
    job.delete()
    assert q.enqueued(jobs.sweep_cache, 1) is False
    assert connection.keys(f'{RQ}:policies:loner:*') == []

    job = q.enqueue(jobs.sweep_cache, 1)
    job.cancel()
    assert connection.keys(f'{RQ}:policies:loner:*') == []
    assert q.enqueue(jobs.sweep_cache, 1) is not None

    q.empty()
    assert connection.keys(f'{RQ}:policies:loner:*') == []
    job = q.enqueue(jobs.sweep_cache, 1)
    q.remove(job)
    assert connection.keys(f'{RQ}:policies:loner:*') == []
    assert q.enqueue(jobs.sweep_cache, 1) is not None


def test_stale_marker_is_free(connection):
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1)
    Job.fetch(job.id, connection=connection).delete()  # a stock Job: not hooked
    assert connection.keys(f'{RQ}:policies:loner:*') != []
    assert q.enqueued(jobs.sweep_cache, 1) is False
    second = q.enqueue(jobs.sweep_cache, 1)
    assert second is not None and second.id != job.id


def test_marker_expires_with_job_ttl(connection):
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1, ttl=100)
    marker = keys.loner('q', connection.hget(job.key, keys.LONER_FIELD).decode().rsplit(':', 1)[1])
    assert 0 < connection.ttl(marker) <= 100
    assert 0 < connection.ttl(job.key) <= 100


def test_worker_take_clears_marker_and_reruns_allowed(connection):
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1)
    w = PolicySimpleWorker([q], connection=connection)
    assert w.work(burst=True)
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert connection.keys(f'{RQ}:policies:loner:*') == []
    assert connection.llen(q.intermediate_queue_key) == 0
    assert q.enqueue(jobs.sweep_cache, 1) is not None


def test_deferred_job_holds_identity(connection):
    q = PolicyQueue('q', connection=connection)
    parent = q.enqueue(jobs.plain, 1)
    child = q.enqueue(jobs.sweep_cache, 1, depends_on=parent)
    assert child is not None
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.DEFERRED
    assert connection.ttl(child.key) == -1  # the lease is dropped once rq has set up the dependency
    assert q.enqueue(jobs.sweep_cache, 1) is None
    assert q.enqueue(jobs.sweep_cache, 1, depends_on=parent) is None
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.FINISHED
    assert q.enqueue(jobs.sweep_cache, 1) is not None


def test_sixteen_processes_one_job(connection, redis_url):
    outcomes = race(redis_url, 'race', lambda q: q.enqueue(jobs.sweep_cache, 42))
    winners = [o for o in outcomes if o]
    assert len(winners) == 1
    assert PolicyQueue('race', connection=connection).job_ids == winners


@pytest.mark.parametrize('door', ['enqueue_in', 'enqueue_many', 'delay', 'depends_on'])
def test_sixteen_processes_one_waiting_job_at_every_door(connection, redis_url, door):
    parent = PolicyQueue('race', connection=connection).enqueue(jobs.plain, 0) if door == 'depends_on' else None
    calls = {
        'enqueue_in': lambda q: q.enqueue_in(timedelta(minutes=5), jobs.sweep_cache, 42),
        'enqueue_many': lambda q: q.enqueue_many([PolicyQueue.prepare_data(jobs.sweep_cache, (42,))])[0],
        'delay': lambda q: job_decorator(q, connection=q.connection)(jobs.sweep_cache).delay(42),
        'depends_on': lambda q: q.enqueue(jobs.sweep_cache, 42, depends_on=parent.id),
    }
    outcomes = race(redis_url, 'race', calls[door])
    winners = [o for o in outcomes if o]
    assert len(winners) == 1, outcomes
    q = PolicyQueue('race', connection=connection)
    assert q.holder(jobs.sweep_cache, 42) == winners[0]
    # Exactly one job hash of sweep_cache was written: a loser leaves nothing behind.
    written = [key for key in connection.scan_iter(f'{RQ}:job:*') if b':' not in key[len(f'{RQ}:job:'):]]
    funcs = [Job.fetch(key.decode()[len(f'{RQ}:job:'):], connection=connection).func_name for key in written]
    assert funcs.count('tests.helpers.jobs.sweep_cache') == 1


def test_stock_worker_with_policy_queue_class_fetches_as_stock(connection):
    """Only a PolicyWorker can release a hold, so a stock worker given PolicyQueue must not take one."""
    from rq_policies import QueueSlot
    from tests.helpers.workers import StockSimpleWorker

    QueueSlot.set('stockq', 1, connection=connection)
    q = PolicyQueue('stockq', connection=connection)
    first, second = q.enqueue(jobs.plain, 1), q.enqueue(jobs.plain, 2)
    worker = StockSimpleWorker([q], connection=connection, queue_class=PolicyQueue)
    assert worker.work(burst=True)
    assert first.get_status(refresh=True) == second.get_status(refresh=True) == JobStatus.FINISHED
    assert connection.zcard(keys.holds('stockq')) == 0


def test_fast_path_drops_a_seen_duplicate_without_building_it(connection):
    q = PolicyQueue('fast', connection=connection)
    held = q.enqueue(jobs.sweep_cache, 'hot')
    assert q.enqueue(jobs.sweep_cache, 'hot') is None  # full path: sees the identity held, remembers it
    before = connection.hlen(held.key), connection.dbsize()
    for _ in range(5):
        assert q.enqueue(jobs.sweep_cache, 'hot') is None  # fast path: the admission probe, no job written
    assert (connection.hlen(held.key), connection.dbsize()) == before
    assert connection.hget(keys.DROPS, 'loner:fast') == b'6'


def test_fast_path_never_decides_on_memory_alone(connection):
    q = PolicyQueue('fast', connection=connection)
    q.enqueue(jobs.sweep_cache, 'hot')
    assert q.enqueue(jobs.sweep_cache, 'hot') is None
    PolicySimpleWorker([q], connection=connection).work(burst=True)  # the holder leaves: the hint is now stale
    fresh = q.enqueue(jobs.sweep_cache, 'hot')
    assert fresh is not None and q.holder(jobs.sweep_cache, 'hot') == fresh.id
    # options the full path refuses are refused even when a hint exists
    assert q.enqueue(jobs.sweep_cache, 'hot') is None
    with connection.pipeline() as pipe, pytest.raises(PipelineNotSupported):
        q.enqueue(jobs.sweep_cache, 'hot', pipeline=pipe)
    # a replay of the holder's own id is admitted again, not dropped
    assert q.enqueue(jobs.sweep_cache, 'hot', job_id=fresh.id) is not None


# -- drop-in: what rq's own objects and tools see (tests/rq_suite/run.py runs rq's suite the same way) ---------------


def test_remove_takes_a_plain_rq_job_and_frees_the_identity(connection):
    """Registries, Job.fetch and rq-dashboard hand out plain rq Jobs; stock rq's remove() takes them."""
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1)
    plain = Job.fetch(job.id, connection=connection)
    assert type(plain) is Job
    assert q.remove(plain) == 1
    assert q.job_ids == []
    assert connection.keys(f'{RQ}:policies:loner:*') == []
    assert q.enqueue(jobs.sweep_cache, 1) is not None


def test_policy_job_equals_the_plain_rq_job_with_its_id_both_ways(connection):
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1)
    other = q.enqueue(jobs.sweep_cache, 2)
    plain = Job.fetch(job.id, connection=connection)
    assert job == plain
    assert plain == job  # Python asks the subclass (PolicyJob) first
    assert not job != plain
    assert not plain != job
    assert job != other and plain != other and other != plain
    assert hash(job) == hash(plain)
    assert plain in [job] and job in [plain] and job in {plain}
    assert Queue('q', connection=connection).get_jobs() == [job, other]
    assert job != job.id  # a Job is not its id, as in stock rq


def test_reprs_read_like_rq_ones(connection):
    """An admitted job is an ordinary rq job: logs and tools that parse rq's reprs read ours the same way."""
    q = PolicyQueue('q', connection=connection)
    job = q.enqueue(jobs.sweep_cache, 1, description='d')
    assert str(q) == '<Queue q>'
    assert repr(q) == "Queue('q')"
    assert str(job) == f'<Job {job.id}: d>'
    assert repr(job).startswith(f'Job({job.id!r}, enqueued_at=')

    class MyQueue(PolicyQueue):
        pass

    class MyJob(PolicyJob):
        pass

    assert str(MyQueue('q', connection=connection)) == '<MyQueue q>'  # a user's own subclass keeps its name
    assert str(MyJob.create(jobs.plain, connection=connection)).startswith('<MyJob ')


def test_worker_keeps_a_custom_queue_class_visible(connection):
    """A PolicyWorker fetches through a subclass of the queue class it is given: that class stays visible."""

    class CustomQueue(Queue):
        pass

    q = CustomQueue('custom', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    worker = PolicySimpleWorker([q], connection=connection, queue_class=CustomQueue)
    assert issubclass(worker.queue_class, CustomQueue) and issubclass(worker.queue_class, PolicyQueue)
    assert worker.queue_class.wrapped_queue_class is CustomQueue
    assert worker.queue_class.__name__ == 'CustomQueue'
    assert PolicySimpleWorker([q], connection=connection, queue_class=CustomQueue).queue_class is worker.queue_class
    seen = []
    original = worker.execute_job

    def execute_job(job, queue):
        seen.append(queue)
        return original(job, queue)

    worker.execute_job = execute_job
    assert worker.work(burst=True)
    assert job.get_status(refresh=True) == JobStatus.FINISHED
    [queue] = seen
    assert isinstance(queue, CustomQueue) and type(queue).__name__ == 'CustomQueue'
    assert str(queue) == '<CustomQueue custom>'
    stock = PolicySimpleWorker(['plain'], connection=connection, queue_class=Queue)
    assert stock.queue_class is PolicyQueue


def test_an_unimportable_path_warns_once_that_it_gets_no_policy(connection, caplog):
    """A typo in an enqueue path must not silently switch a Loner off."""
    from rq_policies.engine import queue as queue_module

    q = PolicyQueue('q', connection=connection)
    path = 'tests.helpers.jobs.sweep_cahce'  # sic
    queue_module._UNIMPORTABLE_WARNED.difference_update(
        {path, 'tests.helpers.jobs.no_such_module_either.f'})  # once per process
    with caplog.at_level(logging.DEBUG, logger='rq_policies'):
        assert q.enqueue(path, 1) is not None
        assert q.enqueue(path, 1) is not None  # no policy could be read: not a loner
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and path in r.getMessage()]
    assert len(warnings) == 1
    assert 'no policy' in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='rq_policies'):
        assert q.enqueue('tests.helpers.jobs.no_such_module_either.f', 1) is not None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert q.enqueue('tests.helpers.jobs.sweep_cache', 1) is not None
    assert q.enqueue('tests.helpers.jobs.sweep_cache', 1) is None  # the right path still reads the declared Loner
