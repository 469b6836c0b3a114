"""A job's successful end without rq's WATCH and SMEMBERS round trips (issue 34): ``lua/end_guard.lua`` checks the
job's dependents in the same write as rq's end transaction (:func:`rq_policies.engine.compat.guarded_end`). What it
must keep: a job with dependents hands them over (rq's own end, sent when the guard stops the EXEC); an end whose
reply was lost is written once (the worker's counters, the job's results); a script cache emptied right before the
end still hands the dependents over; rq's readers see the same job.
"""

from __future__ import annotations

import pytest
from redis import Redis
from rq.job import Job, JobStatus
from rq.worker import Worker

from rq_policies import PolicyQueue, PolicySimpleWorker, PolicyWorker
from rq_policies.engine import keys, scripts
from rq_policies.engine.compat import RQ3
from tests.helpers import jobs
from tests.helpers.cluster import not_on_cluster
from tests.helpers.faultproxy import RetryingRedis
from tests.helpers.workers import wait_for

pytestmark = pytest.mark.usefixtures('jobs_env')

WORKERS = [PolicySimpleWorker, PolicyWorker]


def _calls(connection, name: str) -> int:
    return int(connection.info('commandstats').get(f'cmdstat_{name}', {}).get('calls', 0))


def _end_of(job_id: str) -> tuple[bytes, ...]:
    """What only the guarded end of job ``job_id`` carries: the guard's EVALSHA, the WATCH of its dependents, EXEC."""
    return (scripts.script('end_guard').sha.encode(), f'{job_id}:dependents'.encode(), b'EXEC')


def _results(job: Job) -> int:
    return len(job.results())


@pytest.mark.parametrize('worker_class', WORKERS, ids=lambda c: c.__name__)
def test_a_jobs_end_reads_no_dependents_and_sends_no_watch_of_its_own(connection, fault_proxy, worker_class):
    """Five jobs without dependents, through the fault proxy (which sees every write): no write reads a job's
    dependents (rq's SMEMBERS, a round trip before every end: five before this change), and each end's WATCH goes
    in the same write as its transaction."""
    queue = PolicyQueue('lean', connection=connection)
    ids = [queue.enqueue(jobs.record_plain, 'lean').id for _ in range(5)]
    through = Redis.from_url(fault_proxy.url)
    worker = worker_class([PolicyQueue('lean', connection=through)], connection=through)
    worker.work(burst=True)
    assert [x.decode() for x in connection.lrange('test:ran:lean', 0, -1)] == ids
    for job_id in ids:
        assert fault_proxy.seen((b'SMEMBERS', f'{job_id}:dependents'.encode())) == 0, \
            [chunk for chunk in fault_proxy._seen if b'SMEMBERS' in chunk]
    # Never a WATCH of the dependents as a write of its own: each goes with its end's EXEC. (Counted as 5 writes at
    # first; CI's rq 2.12 lane at load 5 saw 6 once: an end sent again (the guard then writes nothing, which the
    # results and the worker's counter below check), so the count of such writes is not the property.)
    watches = [c for c in fault_proxy._seen if b'WATCH' in c and b':dependents' in c]
    assert [c for c in watches if b'EXEC' not in c] == [], watches
    for job_id in ids:
        assert fault_proxy.seen((b'WATCH', f'{job_id}:dependents'.encode(), b'EXEC')) >= 1, watches
        job = Job.fetch(job_id, connection=connection)
        assert job.get_status() == JobStatus.FINISHED and job.return_value() == 'lean'
        assert _results(job) == 1
    assert queue.started_job_registry.get_job_ids() == []
    assert sorted(queue.finished_job_registry.get_job_ids()) == sorted(ids)
    assert Worker.find_by_key(worker.key, connection=connection).successful_job_count == 5


@pytest.mark.parametrize('worker_class', WORKERS, ids=lambda c: c.__name__)
def test_a_job_with_dependents_hands_them_over(connection, worker_class):
    """A job with two dependents (one on another queue): the guard stops the lean EXEC, rq's own end runs and
    enqueues them, and they run; the parent is written once (one result, one successful job counted)."""
    queue = PolicyQueue('lean', connection=connection)
    other = PolicyQueue('lean-other', connection=connection)
    parent = queue.enqueue(jobs.record_plain, 'deps')
    first = queue.enqueue(jobs.record_plain, 'deps', depends_on=parent)
    second = other.enqueue(jobs.record_plain, 'deps', depends_on=parent)
    assert first.get_status() == JobStatus.DEFERRED
    worker = worker_class([queue, other], connection=connection)
    worker.work(burst=True)
    ran = [x.decode() for x in connection.lrange('test:ran:deps', 0, -1)]
    assert ran[0] == parent.id and sorted(ran[1:]) == sorted([first.id, second.id])
    for job in (parent, first, second):
        assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert _results(Job.fetch(parent.id, connection=connection)) == 1
    assert Worker.find_by_key(worker.key, connection=connection).successful_job_count == 3


@pytest.mark.parametrize('client', [Redis, RetryingRedis], ids=['no-resend', 'redis-py-resends'])
def test_an_end_whose_reply_was_lost_is_written_once(connection, fault_proxy, client):
    """The end's write reaches the server, its reply is lost (the connection closed): the job ends finished once.
    Sent again, by redis-py (a client with a retry) or by the worker once the server answers (without one), the
    guard finds the end written and stops the EXEC: one result, the worker's successful count 1, nothing started."""
    queue = PolicyQueue('lean', connection=connection)
    job = queue.enqueue(jobs.record_plain, 'lost')
    fault_proxy.drop_reply(match=_end_of(job.id))
    through = client.from_url(fault_proxy.url)
    worker = PolicySimpleWorker([PolicyQueue('lean', connection=through)], connection=through)
    worker.work(burst=True)
    assert fault_proxy.fired, 'the end was not matched'
    assert connection.lrange('test:ran:lost', 0, -1) == [job.id.encode()]
    found = Job.fetch(job.id, connection=connection)
    assert found.get_status() == JobStatus.FINISHED
    assert _results(found) == 1
    assert Worker.find_by_key(worker.key, connection=connection).successful_job_count == 1
    assert queue.started_job_registry.get_job_ids() == []
    assert queue.finished_job_registry.get_job_ids() == [job.id]


def test_the_guard_sent_twice_writes_nothing_the_second_time(connection):
    """lua/end_guard.lua run twice with the same arguments after the end it guards was written (a resend): it answers
    'written' (2) both times and writes nothing but its own short-lived key, whatever came after that end; before
    the end, it answers 0 and writes nothing; with a dependent, 1."""
    queue = PolicyQueue('lean', connection=connection)
    job = queue.enqueue(jobs.plain, 1)
    started, guard = queue.started_job_registry.key, keys.end_guard(job.id)
    call = [job.dependents_key, job.key, started, guard]
    connection.zadd(started, {f'{job.id}:e1': 1e10})
    connection.hset(job.key, mapping={'status': 'started', 'ended_at': ''})
    run = lambda: scripts.run('end_guard', connection, call, ['2026-12-07T20:00:00.000001Z', f'{job.id}:e1', 1000])  # noqa: E731
    assert run() == 0 and not connection.exists(guard)
    connection.zrem(started, f'{job.id}:e1')
    connection.hset(job.key, mapping={'status': 'finished', 'ended_at': '2026-12-07T20:00:00.000001Z'})
    before = {key: connection.dump(key) for key in connection.keys('*') if key != guard.encode()}
    assert run() == 2 and run() == 2
    assert {key: connection.dump(key) for key in connection.keys('*') if key != guard.encode()} == before
    assert 0 < connection.pttl(guard) <= 1000
    connection.hset(job.key, 'status', 'scheduled')  # a repeat re-enqueued by that end: still this end's ended_at
    connection.sadd(job.dependents_key, 'child')
    assert run() == 2
    connection.zadd(started, {f'{job.id}:e1': 1e10})  # not written yet, and a dependent: rq's own end hands it over
    assert run() == 1
    connection.hset(job.key, 'ended_at', '')
    connection.zrem(started, f'{job.id}:e1')  # the execution gone (rq's cleanup), the end not written: it runs
    connection.delete(job.dependents_key)
    assert run() == 0


@pytest.mark.parametrize('worker_class', WORKERS, ids=lambda c: c.__name__)
def test_a_script_flush_right_before_the_end_still_hands_the_dependents_over(connection, fault_proxy, worker_class,
                                                                             redis_url):
    """SCRIPT FLUSH just before the parent's end reaches the server: the guard answers NOSCRIPT, the transaction
    runs as if the job had no dependents, and the worker hands them over after it (rq's hand-over without a
    pipeline): the dependent runs, the parent is written once."""
    queue = PolicyQueue('lean', connection=connection)
    parent = queue.enqueue(jobs.record_plain, 'flush')
    child = queue.enqueue(jobs.record_plain, 'flush', depends_on=parent)
    flushed = []
    fault_proxy.before_request(lambda: flushed.append(Redis.from_url(redis_url).script_flush()),
                               match=_end_of(parent.id))
    through = Redis.from_url(fault_proxy.url)
    worker = worker_class([PolicyQueue('lean', connection=through)], connection=through)
    worker.work(burst=True)
    assert flushed == [True]
    assert wait_for(lambda: connection.llen('test:ran:flush') == 2, 10)
    assert [x.decode() for x in connection.lrange('test:ran:flush', 0, -1)] == [parent.id, child.id]
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.FINISHED
    assert _results(Job.fetch(parent.id, connection=connection)) == 1


@not_on_cluster("stock rq's Worker does not run on a cluster client, and the end there is rq's own (docs/cluster.md)")
def test_rqs_readers_see_a_lean_end_as_a_stock_one(connection):
    """The job hash fields, registries, result and worker counters a stock worker's end leaves, the same after a
    PolicySimpleWorker's lean end (compared field by field, timestamps and ids aside)."""
    from rq import Queue, SimpleWorker

    from rq_policies.engine import compat

    class Stock(SimpleWorker):
        subscribe = compat.subscribe  # rq's, its exit not waiting up to 60 s on redis-py 8.2 (the worker's key gone)

    def ended(worker_class, queue_class, name):
        queue = queue_class(name, connection=connection)
        job = queue.enqueue(jobs.plain, 5, result_ttl=600)
        worker = worker_class([queue], connection=connection)
        worker.work(burst=True)
        fields = {k.decode(): v for k, v in connection.hgetall(job.key).items()}
        found = Job.fetch(job.id, connection=connection)
        seen = Worker.find_by_key(worker.key, connection=connection)
        return (sorted(fields), fields['status'], found.return_value(), _results(found),
                queue.finished_job_registry.get_job_ids() == [job.id], queue.started_job_registry.count,
                seen.successful_job_count, seen.failed_job_count, connection.ttl(job.key) > 0)

    stock = ended(Stock, Queue, 'stock')
    ours = ended(PolicySimpleWorker, PolicyQueue, 'ours')
    ignore = {'policies_queue'} if RQ3 else set()
    assert [f for f in ours[0] if f not in ignore and not f.startswith('policies')] == stock[0], (ours[0], stock[0])
    assert ours[1:] == stock[1:]
