"""Real faults between the client and the server: late and lost replies (through tests/helpers/faultproxy.py), scripts
flushed from the server's cache while producers and workers run.

A lost reply is the case a retrying client makes dangerous: the server ran the command, the client did not hear
it and sends the very same command again. Every script call of the plugin must answer such a replay as the first
attempt did and write nothing twice.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError
from redis.retry import Retry
from rq import Queue
from rq.job import Job
from rq.job import Retry as JobRetry
from rq.registry import ScheduledJobRegistry

from rq_policies import Loner, PolicyQueue, PolicySimpleWorker, PolicyWorker, QueueSlot
from rq_policies.engine import keys, ledger, ops
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs, lcw_jobs
from tests.helpers import throttle_jobs as tj
from tests.helpers.faults import ADMIT_WRITE, FAULTS, burst, load, lose_reply, producer, queued, ran_ids
from tests.helpers.throttle_helpers import ran, wait_for_phase
from tests.helpers.workers import assert_given_up, output, start_worker, stop, wait_for

pytestmark = pytest.mark.usefixtures('jobs_env')  # tests.helpers.jobs and friends record through it


# -- the proxy itself ------------------------------------------------------------------------------------------------


def test_proxy_delays_drops_and_stalls(connection, fault_proxy):
    client = Redis.from_url(fault_proxy.url, socket_timeout=2, retry=Retry(ExponentialBackoff(), 0))
    assert client.ping()
    fault_proxy.delay_reply(0.5, match=b'PING')
    started = time.monotonic()
    assert client.ping()
    assert time.monotonic() - started >= 0.45
    fault_proxy.drop_reply(match=b'INCR')
    with pytest.raises(ConnectionError):
        client.incr('test:proxy')
    assert connection.get('test:proxy') == b'1'  # the server ran it; only the reply was lost
    fault_proxy.stall(0.5)
    started = time.monotonic()
    assert client.ping()
    assert time.monotonic() - started >= 0.45
    fault_proxy.stall(0.5, match=b'ECHO')
    assert client.ping()  # not stalled: the stall starts with the matching request
    started = time.monotonic()
    assert client.echo('late') == b'late'
    assert time.monotonic() - started >= 0.45
    assert [kind for kind, _ in fault_proxy.fired] == ['delay', 'drop', 'stall']


# -- admissions under lost replies -----------------------------------------------------------------------------------


@pytest.mark.parametrize('fault', FAULTS)
def test_loner_enqueue_with_a_lost_reply_is_queued_and_runs_once(connection, fault_proxy, fault):
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    lose_reply(fault_proxy, fault, ADMIT_WRITE)
    job = q.enqueue(jobs.record, 'loner-lost')
    assert job is not None
    assert fault_proxy.seen(ADMIT_WRITE) >= 2  # the reply was lost, the call was replayed
    assert queued(connection, 'faults') == [job.id]
    assert PolicyQueue('faults', connection=connection).holder(jobs.record, 'loner-lost') == job.id
    burst(connection, 'faults')
    assert ran_ids(connection, 'loner-lost') == [job.id]


@pytest.mark.parametrize('fault', FAULTS)
def test_force_with_a_lost_reply_is_queued_and_runs_once(connection, fault_proxy, fault):
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    first = q.enqueue(jobs.record, 'forced')
    lose_reply(fault_proxy, fault, ADMIT_WRITE)
    forced = q.force(jobs.record, 'forced')
    assert fault_proxy.seen(ADMIT_WRITE) >= 3
    assert queued(connection, 'faults') == [first.id, forced.id]
    burst(connection, 'faults')
    assert sorted(ran_ids(connection, 'forced')) == sorted([first.id, forced.id])


@pytest.mark.parametrize('fault', FAULTS)
def test_trailing_throttle_with_a_lost_reply_is_pending_once_and_runs_once(connection, fault_proxy, fault):
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    tag = f'trailing-{fault}'
    wait_for_phase(connection, 2, 0.05, 0.8)  # both calls in one 2 s slot
    leading = q.enqueue(tj.publish_progress, 't1', 0, tag=tag)
    lose_reply(fault_proxy, fault, ADMIT_WRITE)
    trailing = q.enqueue(tj.publish_progress, 't1', 1, tag=tag)
    assert leading is not None and trailing is not None
    assert fault_proxy.seen(ADMIT_WRITE) >= 3
    registry = ScheduledJobRegistry('faults', connection=connection)
    assert registry.get_job_ids() == [trailing.id]
    assert queued(connection, 'faults') == [leading.id]
    time.sleep(2.2)  # past the slot's end: the trailing job is due
    burst(connection, 'faults', scheduler=True)
    assert [(job_id, value) for job_id, value, _ in ran(connection, tag)] == [(leading.id, '0'), (trailing.id, '1')]


@pytest.mark.parametrize('fault', FAULTS)
def test_debounce_with_a_lost_reply_is_pending_once_and_runs_once(connection, fault_proxy, fault):
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    tag = f'debounce-{fault}'
    lose_reply(fault_proxy, fault, ADMIT_WRITE)
    job = q.enqueue(tj.reindex, 'doc', 1, tag=tag)
    assert job is not None
    assert fault_proxy.seen(ADMIT_WRITE) >= 2
    assert ScheduledJobRegistry('faults', connection=connection).get_job_ids() == [job.id]
    assert queued(connection, 'faults') == []
    time.sleep(2.2)  # Debounce(1): due a second (whole seconds) after the call
    burst(connection, 'faults', scheduler=True)
    assert [(job_id, value) for job_id, value, _ in ran(connection, tag)] == [(job.id, '1')]


@pytest.mark.parametrize('kind', ['debounce', 'trailing'])
@pytest.mark.parametrize('fault', ['delay', 'drop'])
def test_an_in_place_rewrite_with_a_lost_reply_is_applied_once(connection, fault_proxy, fault, kind):
    """An enqueue that rewrites the pending job in place (Debounce, a trailing Throttle) loses its reply; before its
    resend reaches the server, another enqueue rewrites the pending job again. The resend is answered as the first
    attempt was (the pending job's id) and writes nothing: the later payload stays, no job of the call's own id.

    A late or dropped reply only: there the first attempt has run before the other enqueue. Under a stall both
    attempts reach the server after it, in either order, so which payload is the later one is not defined."""
    load(connection, 'admit')
    direct = PolicyQueue('faults', connection=connection)
    if kind == 'debounce':
        func, ident = tj.reindex_slow, 'doc'
    else:
        func, ident = tj.publish_minute, 'task'
        wait_for_phase(connection, 60, 0.5, 50)  # the window's winner, then the extras, in one window
        assert direct.enqueue(func, ident, 0) is not None
    pending = direct.enqueue(func, ident, 1)
    registry = ScheduledJobRegistry('faults', connection=connection)
    [(_, score)] = connection.zrange(registry.key, 0, -1, withscores=True)
    attempts: list = []
    later: list = []

    def before_each() -> None:  # in the proxy's thread, before each attempt reaches the server
        if attempts:  # the resend: another producer rewrites the pending job first
            later.append(direct.enqueue(func, ident, 3))
        attempts.append(time.monotonic())

    match = (*ADMIT_WRITE, b'merge-call')
    fault_proxy.before_request(before_each, match=match, times=2)
    lose_reply(fault_proxy, fault, match)
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    merged = q.enqueue(func, ident, 2, job_id='merge-call')
    assert len(attempts) == 2 and fault_proxy.seen(match) >= 2  # the first attempt and its resend
    [third] = later
    assert merged.id == third.id == pending.id  # every handle is the pending job
    stored = Job.fetch(pending.id, connection=connection)
    assert stored.args == (ident, 3) and stored.get_status() == 'scheduled'  # the resend did not write 2 over 3
    assert connection.hget(pending.key, 'policies_replaced_by') == third_call_id(connection, pending.id)
    assert connection.zrange(registry.key, 0, -1, withscores=True)[0][0] == pending.id.encode()
    assert len(registry.get_job_ids()) == 1 and not connection.exists(f'{RQ}:job:merge-call')
    assert connection.get(keys.superseded('merge-call')).startswith(
        f'{"debounce" if kind == "debounce" else "throttle"} {pending.id} merged '.encode())
    assert connection.hget(keys.DROPS, f'{"debounce" if kind == "debounce" else "throttle"}:faults') is None


def third_call_id(connection: Redis, pending_id: str) -> bytes:
    """The id the last rewriting call drew (its merge record names the pending job): what policies_replaced_by
    must hold once that call's rewrite is the last one applied."""
    for key in connection.scan_iter(keys.superseded('*')):
        value = connection.get(key)
        if value and b' merged ' in value and key != keys.superseded('merge-call').encode():
            return key[len(keys.superseded('')):]
    raise AssertionError('no merge record of the later call')


@pytest.mark.parametrize('fault', FAULTS)
def test_limited_capacity_refill_with_a_lost_reply_pushes_each_job_once(connection, fault_proxy, fault):
    load(connection, 'lcw_enqueue')
    conn = producer(fault_proxy)
    connection.set('test:lcw:max', 10)
    connection.rpush('test:backlog:backlog', 'a', 'b', 'c')
    lose_reply(fault_proxy, fault, (b'EVAL', b'tests.helpers.lcw_jobs.Backlog'))
    enqueued = lcw_jobs.Backlog.perform_with_capacity(connection=conn)
    assert fault_proxy.seen((b'EVAL', b'tests.helpers.lcw_jobs.Backlog')) >= 2
    assert len(enqueued) == 3  # the replay answers with the jobs the first attempt wrote
    assert queued(connection, 'lcw') == enqueued
    assert lcw_jobs.Backlog.queued_jobs_count(connection) == 3
    burst(connection, 'lcw')
    assert sorted(raw.decode() for raw in connection.lrange('test:done:backlog', 0, -1)) == ['a', 'b', 'c']
    assert queued(connection, 'lcw') == []


#: Only LimitedCapacityWorker's finish call carries the msgpack key ``successor``.
LCW_FINISH = (b'EVAL', ops.pack('successor'))


@pytest.mark.parametrize('between', ['nothing', 'the successor ran', 'room opened'])
def test_limited_capacity_finish_sent_twice_writes_nothing_more(connection, between):
    """The same lcw_finish call twice, as redis-py resends it after a lost reply: the second answers as the first
    did and pushes nothing, whatever happened between the two: nothing; the successor already ran and rq deleted its
    hash (``result_ttl=0``), which a check of the successor's hash cannot tell from "never written"; or another job
    of the class went away, so that there is room now where the first attempt found none."""
    cls = lcw_jobs.Backlog
    running = keys.lcw_running(cls.class_path())
    limit = 1 if between == 'room opened' else 2
    connection.set('test:lcw:max', limit)
    connection.rpush('test:backlog:backlog', 'a', 'b', 'c')
    waiting = cls.perform_with_capacity(connection=connection) if between == 'room opened' else []
    assert len(waiting) == (1 if between == 'room opened' else 0)  # a waiting job fills the class's only room
    assert ledger.acquire_call(ledger.Hold(running, 'finishing', 60), 5).run(connection) == 1
    call = cls._finish_call((), connection, 'lcw', limit, 3, 'finishing')
    successor = call.args['successor']

    first = call.run(connection)
    after_first = queued(connection, 'lcw')
    if between == 'room opened':
        assert [int(first[0]), first[1]] == [1, b''] and after_first == waiting  # no room: no successor
        Job.fetch(waiting[0], connection=connection).delete()  # an operator deleted the waiting job
    else:
        assert [int(first[0]), first[1]] == [1, successor.encode()] and after_first == [successor]
        if between == 'the successor ran':
            Job.fetch(successor, connection=connection).delete()  # what rq does once a result_ttl=0 job succeeded
    expected = [] if between != 'nothing' else after_first
    assert queued(connection, 'lcw') == expected

    replayed = call.run(connection)
    assert queued(connection, 'lcw') == expected  # the replay pushed nothing
    assert replayed == first  # and answered as the first attempt did
    if between != 'nothing':
        assert not connection.exists(Job.key_for(successor))


def test_limited_capacity_finish_with_a_lost_reply_never_runs_its_successor_twice(
        connection, fault_proxy, redis_url, worker_env):
    """End to end: a forking PolicyWorker, connected through the proxy with a retrying client, runs a job whose
    finish reply is lost (the server ran it, the connection closed). Before the replay reaches the server, another
    worker has already run the successor the first attempt pushed (a ``result_ttl=0`` class: rq deleted its hash on
    success). The replay must not push that successor again, or it runs twice.

    A late reply is no replay in a worker: rq raises a worker's ``socket_timeout`` to its dequeue timeout plus 10 s
    (415 s), so a worker waits for a slow reply; only a broken connection makes it resend."""
    load(connection, 'lcw_finish', 'lcw_enqueue', 'acquire_hold')
    cls = lcw_jobs.Ephemeral
    connection.set('test:lcw:max', 1)
    connection.rpush('test:backlog:ephemeral', 'a', 'b', 'c')
    [first_job] = cls.perform_with_capacity(connection=connection)
    connection.set('test:lcw:max', 3)
    sent, successor_ran, replaying = threading.Event(), threading.Event(), threading.Event()

    def before_finish() -> None:  # in the proxy's thread, before each finish request of the proxied worker
        if not sent.is_set():
            sent.set()
            return
        successor_ran.wait(10)  # the replay reaches the server only once the successor has run
        replaying.set()

    fault_proxy.before_request(before_finish, match=LCW_FINISH, times=2)
    fault_proxy.drop_reply(match=LCW_FINISH)
    worker = start_worker(fault_proxy.url, ['lcw'], worker_env,
                          extra=['--connection-class', 'tests.helpers.faultproxy.RetryingRedis'])
    try:
        assert wait_for(sent.is_set, timeout=30), output(worker)
        assert wait_for(lambda: len(queued(connection, 'lcw')) == 1, timeout=5)
        [successor] = queued(connection, 'lcw')  # the first attempt pushed it
        burst_one = PolicySimpleWorker([PolicyQueue('lcw', connection=connection)], connection=connection)
        burst_one.work(burst=True, max_jobs=1)  # another worker runs the successor before the replay arrives
        assert not connection.exists(Job.key_for(successor))
        successor_ran.set()
        assert wait_for(replaying.is_set, timeout=15), output(worker)
        assert wait_for(lambda: connection.llen('test:backlog:ephemeral') == 0 and not queued(connection, 'lcw')
                        and cls.running_jobs_count(connection) == 0, timeout=30), output(worker)
    finally:
        stop(worker)
    assert fault_proxy.seen(LCW_FINISH) >= 2, output(worker)
    ran = ran_ids(connection, 'ephemeral')
    assert ran[:2] == [first_job, successor] and len(ran) == len(set(ran)) == 3, ran


# -- jobs without a policy: rq's own pipelines, replayed ----------------------------------------------------------


def plain_write(job_id: str):
    """What only the pipeline that writes job ``job_id`` carries: its EXEC and the job's id (rq sends a transaction
    in one write, so the proxy sees it whole)."""
    return (b'EXEC', job_id.encode())


def plain_admit(job_id: str):
    """What only the admission call that writes job ``job_id`` without a policy carries (a public door's plain
    enqueue, ``admission.write_plain``)."""
    return (*ADMIT_WRITE, f'{RQ}:job:'.encode() + job_id.encode())


@pytest.mark.parametrize('fault', FAULTS)
def test_a_plain_enqueue_with_a_lost_reply_is_pushed_once_and_runs_once(connection, fault_proxy, fault):
    """A job with no policy is written by the admission script with no check (it was rq's own enqueue pipeline:
    MULTI, the job's hash, the push, EXEC). redis-py resends the call after a lost reply; the id must still be pushed
    once (it was pushed twice and ran twice: the double run a 10-minute soak caught, docs/reliability.md)."""
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    lose_reply(fault_proxy, fault, plain_admit('plain-lost'))
    job = q.enqueue(jobs.record_plain, 'plain-lost', job_id='plain-lost')
    assert fault_proxy.seen(plain_admit('plain-lost')) >= 2  # the call was sent again
    assert queued(connection, 'faults') == [job.id]
    burst(connection, 'faults')
    assert ran_ids(connection, 'plain-lost') == [job.id]


def test_a_plain_enqueue_with_a_lost_reply_runs_once_on_a_forking_worker(connection, fault_proxy, redis_url,
                                                                         worker_env):
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    lose_reply(fault_proxy, 'delay', plain_admit('plain-forked'))
    job = q.enqueue(jobs.record_plain, 'plain-forked', job_id='plain-forked')
    assert fault_proxy.seen(plain_admit('plain-forked')) >= 2
    worker = start_worker(redis_url, ['faults'], worker_env, burst=True)
    try:
        assert worker.wait(60) == 0, output(worker)
    finally:
        stop(worker)
    assert ran_ids(connection, 'plain-forked') == [job.id], output(worker)
    assert queued(connection, 'faults') == []


@pytest.mark.parametrize('fault', FAULTS)
def test_a_plain_enqueue_many_with_a_lost_reply_pushes_each_job_once(connection, fault_proxy, fault):
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    # One transaction for the three jobs, the only one (matched by its job too: the SCRIPT LOAD that a pool's first
    # pipeline sends before it carries the push's source, whose comments say EXEC).
    lose_reply(fault_proxy, fault, (b'MULTI', b'EXEC', f'{RQ}:job:many-0'.encode()))
    made = q.enqueue_many([PolicyQueue.prepare_data(jobs.record_plain, ('many',), job_id=f'many-{n}')
                           for n in range(3)])
    # (the proxy records each request's first 4 KiB)
    assert fault_proxy.seen((b'MULTI', f'{RQ}:job:many-0'.encode())) >= 2
    assert queued(connection, 'faults') == [job.id for job in made] == ['many-0', 'many-1', 'many-2']
    burst(connection, 'faults')
    assert sorted(ran_ids(connection, 'many')) == ['many-0', 'many-1', 'many-2']


def _move_like_rqs_scheduler(connection: Redis, name: str, job_id: str) -> None:
    """What rq's scheduler does with a due job (rq.scheduler.RQScheduler.enqueue_scheduled_jobs): a stock Queue
    pushes it and removes it from the scheduled registry, in one transaction."""
    queue, registry = Queue(name, connection=connection), ScheduledJobRegistry(name, connection=connection)
    with connection.pipeline() as pipe:
        queue._enqueue_job(Job.fetch(job_id, connection=connection), pipeline=pipe)
        registry.remove(job_id, pipeline=pipe)
        pipe.execute()


def test_a_plain_enqueue_at_replayed_after_the_scheduler_moved_it_is_not_scheduled_again(connection, fault_proxy):
    """A scheduled plain job's ZADD is idempotent only while the job is still in the registry: when rq's scheduler
    moved it to the queue before the resend arrived, the replay put it back, and the scheduler pushed it again (two
    runs)."""
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    attempts = []

    def before_each() -> None:  # in the proxy's thread, before each attempt reaches the server
        if attempts:  # the replay: the scheduler has moved the due job meanwhile
            _move_like_rqs_scheduler(connection, 'faults', 'plain-at')
        attempts.append(time.monotonic())

    fault_proxy.before_request(before_each, match=plain_admit('plain-at'), times=2)
    fault_proxy.delay_reply(0.4, match=plain_admit('plain-at'))
    job = q.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), jobs.record_plain, 'plain-at',
                       job_id='plain-at')
    assert len(attempts) == 2  # the first attempt and its replay
    assert queued(connection, 'faults') == [job.id]
    assert ScheduledJobRegistry('faults', connection=connection).get_job_ids() == []  # not put back
    burst(connection, 'faults', scheduler=True)
    assert ran_ids(connection, 'plain-at') == [job.id]


@pytest.mark.parametrize('fault', ['delay', 'drop'])
def test_a_retry_push_with_a_lost_reply_pushes_once(connection, fault_proxy, fault):
    """A PolicyWorker retries a failed job by pushing it again through PolicyQueue (rq's ``job.retry`` inside the
    worker's failure pipeline); a resent pipeline must not push it twice, while the legitimate second push (the
    retry itself, after the first push was taken) does push."""
    conn = producer(fault_proxy)
    job = PolicyQueue('faults', connection=connection).enqueue(jobs.record_plain, 'retried', job_id='retried',
                                                               retry=JobRetry(max=2))
    assert connection.lpop(f'{RQ}:queue:faults') == b'retried'  # a worker took it; it failed
    lose_reply(fault_proxy, fault, plain_write('retried'))
    job = Job.fetch(job.id, connection=conn)
    with conn.pipeline() as pipe:
        job.retry(PolicyQueue('faults', connection=conn), pipe)
        pipe.execute()
    assert fault_proxy.seen(plain_write('retried')) >= 2
    assert queued(connection, 'faults') == ['retried']


def test_a_plain_result_ttl_0_job_that_ran_before_the_resend_arrived_runs_once(connection, fault_proxy):
    """A ``result_ttl=0`` job is deleted as soon as it succeeds. When it ran between its enqueue and the resend of
    that enqueue, the resent transaction wrote its hash again (no push record in it any more) and pushed it: it ran
    a second time, and its rewritten hash stayed forever, ``queued`` in no queue."""
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy))
    attempts = []

    def before_each() -> None:  # in the proxy's thread, before each attempt reaches the server
        if attempts:  # the resend: a worker has taken and run the job meanwhile, and rq deleted it (result_ttl=0)
            assert connection.lpop(f'{RQ}:queue:faults') == b'plain-ttl0'
            connection.rpush('test:ran:plain-ttl0', 'plain-ttl0')  # what jobs.record_plain records
            Job.fetch('plain-ttl0', connection=connection).delete()
        attempts.append(time.monotonic())

    fault_proxy.before_request(before_each, match=plain_admit('plain-ttl0'), times=2)
    fault_proxy.delay_reply(0.4, match=plain_admit('plain-ttl0'))
    job = q.enqueue(jobs.record_plain, 'plain-ttl0', job_id='plain-ttl0', result_ttl=0)
    assert len(attempts) == 2
    assert ran_ids(connection, 'plain-ttl0') == [job.id]
    assert queued(connection, 'faults') == []
    assert not connection.exists(job.key)  # not brought back by the resend
    burst(connection, 'faults')
    assert ran_ids(connection, 'plain-ttl0') == [job.id]


def hold_the_resend(fault_proxy, match: bytes) -> threading.Event:
    """Delay the reply to the one request carrying ``match`` past a 3 s client timeout, and hold its resend back until
    the returned event is set (a real worker runs the job meanwhile)."""
    written, job_ran = threading.Event(), threading.Event()

    def before_each() -> None:  # in the proxy's thread, before each attempt reaches the server
        if written.is_set():  # the resend: it reaches the server only once the worker has run the job
            job_ran.wait(20)
        written.set()

    fault_proxy.before_request(before_each, match=match, times=2)
    fault_proxy.delay_reply(3.5, match=match)
    return job_ran


def test_a_result_ttl_0_loner_job_that_ran_before_the_resend_arrived_runs_once(connection, fault_proxy):
    """The same with a policy: a Loner job with ``result_ttl=0`` that a real worker ran (its marker released, rq
    deleting its hash) between its admission and the resend of that admission. The resend found no hash to tell it
    was a replay and the identity free: admitted again, it ran a second time."""
    load(connection, 'admit')
    q = PolicyQueue('faults', connection=producer(fault_proxy, timeout=3))
    match = f'{RQ}:job:loner-ttl0'.encode()  # the one request that writes the job
    job_ran = hold_the_resend(fault_proxy, match)
    made: list = []
    producing = threading.Thread(target=lambda: made.append(q.enqueue(
        jobs.record_plain, 'loner-ttl0', job_id='loner-ttl0', result_ttl=0, policy=Loner())), name='producer')
    producing.start()
    try:
        assert wait_for(lambda: Job.exists('loner-ttl0', connection=connection), timeout=10)
        burst(connection, 'faults')  # a real worker runs it meanwhile, and rq deletes it (result_ttl=0)
        assert ran_ids(connection, 'loner-ttl0') == ['loner-ttl0']
        assert not Job.exists('loner-ttl0', connection=connection)
    finally:
        job_ran.set()
        producing.join(30)
    assert made and made[0] is not None and made[0].id == 'loner-ttl0'
    assert fault_proxy.seen(match) >= 2  # the admission was sent again, after the job had run
    assert queued(connection, 'faults') == []
    assert not Job.exists('loner-ttl0', connection=connection)  # not written again by the resend
    burst(connection, 'faults')
    assert ran_ids(connection, 'loner-ttl0') == ['loner-ttl0']


#: One instant for rq's and this package's clocks, so that a job's times are byte-equal between two enqueues.
FROZEN = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=timezone.utc)


_READ = {b'hash': Redis.hgetall, b'list': lambda c, k: c.lrange(k, 0, -1), b'set': Redis.smembers,
         b'zset': lambda c, k: c.zrange(k, 0, -1, withscores=True), b'string': Redis.get}


def _everything(connection: Redis) -> dict:
    """Every key with its type, its contents (a hash field for field) and whether it expires."""
    return {key: (kind, _READ[kind](connection, key), connection.ttl(key) > 0)
            for key in connection.scan_iter(count=1000) for kind in [connection.type(key)]}


PLAIN_DOORS = {
    'enqueue': lambda q: q.enqueue(jobs.record_plain, 'same', job_id='same', description='d', meta={'m': 1}),
    'at_front': lambda q: q.enqueue(jobs.record_plain, 'same', job_id='same', at_front=True, retry=JobRetry(max=2)),
    'ttl': lambda q: q.enqueue(jobs.record_plain, 'same', job_id='same', ttl=300, result_ttl=5, failure_ttl=60),
    'enqueue_call': lambda q: q.enqueue_call(jobs.record_plain, args=('same',), job_id='same', timeout=7),
    'drawn id': lambda q: q.enqueue(jobs.record_plain, 'same'),
    'enqueue_at': lambda q: q.enqueue_at(FROZEN + timedelta(minutes=5), jobs.record_plain, 'same', job_id='same'),
    'enqueue_in': lambda q: q.enqueue_in(timedelta(seconds=90), jobs.record_plain, 'same', job_id='same', ttl=600,
                                         at_front=True),
}


@pytest.mark.parametrize('door', list(PLAIN_DOORS))
def test_a_plain_job_is_written_exactly_as_stock_rq_writes_it(connection, monkeypatch, door):
    """The admission script writes a job without a policy: every key it leaves (the job's hash field for field, the
    queue or the scheduled registry, rq's queues set) is byte-for-byte what stock ``rq.Queue`` leaves, and nothing
    more, but for a job rq deletes soon after it runs (``result_ttl`` under a minute): its replay record, which
    expires."""
    import rq.job
    import rq.queue

    import rq_policies.engine.queue

    for module in (rq.job, rq.queue, rq_policies.engine.queue):
        monkeypatch.setattr(module, 'now', lambda: FROZEN)
    monkeypatch.setattr(rq.job, 'uuid4', lambda: 'drawn-id')  # the same id for a job whose id rq draws
    PLAIN_DOORS[door](Queue('same', connection=connection))
    stock = _everything(connection)
    connection.flushdb()
    PLAIN_DOORS[door](PolicyQueue('same', connection=connection))
    ours = _everything(connection)
    if door == 'ttl':  # result_ttl=5
        assert ours.pop(keys.pushed('same').encode())[2] is True
    assert ours == stock


@pytest.mark.parametrize('door', ['enqueue', 'enqueue_at'])
def test_a_kept_plain_job_that_ran_before_the_resend_arrived_stays_finished(connection, fault_proxy, door):
    """A kept job (rq's default ``result_ttl``) that a worker ran between its enqueue and the resend of that enqueue:
    the resent transaction wrote rq's enqueue fields again, and the finished job read ``queued``, its
    ``started_at``/``ended_at``/``worker_name`` blanked, until its result expired. A resend must write nothing."""
    load(connection, 'admit')
    # The reply comes 3.5 s late, past a 3 s timeout: room for a real worker to run the job before the resend.
    q = PolicyQueue('faults', connection=producer(fault_proxy, timeout=3))
    match = f'{RQ}:job:plain-kept'.encode()  # the one request that writes the job, whichever code sends it
    job_ran = hold_the_resend(fault_proxy, match)
    made: list = []
    if door == 'enqueue':
        def call() -> None:
            made.append(q.enqueue(jobs.record_plain, 'plain-kept', job_id='plain-kept'))
    else:
        def call() -> None:
            made.append(q.enqueue_at(datetime.now(timezone.utc) - timedelta(seconds=1), jobs.record_plain,
                                     'plain-kept', job_id='plain-kept'))
    producing = threading.Thread(target=call, name='producer')
    producing.start()
    try:
        assert wait_for(lambda: Job.exists('plain-kept', connection=connection), timeout=10)
        burst(connection, 'faults', scheduler=door == 'enqueue_at')  # a real worker runs it meanwhile
        ran_once = connection.hgetall(Job.key_for('plain-kept'))
        assert ran_once[b'status'] == b'finished' and ran_once[b'started_at'] and ran_once[b'ended_at']
    finally:
        job_ran.set()
        producing.join(30)
    assert made and made[0].id == 'plain-kept'
    assert fault_proxy.seen(match) >= 2  # the write was sent again, after the job had run
    after = connection.hgetall(Job.key_for('plain-kept'))
    assert after == ran_once  # written once: still finished, its start and end intact
    assert Job.fetch('plain-kept', connection=connection).get_status() == 'finished'
    assert queued(connection, 'faults') == [] and ScheduledJobRegistry('faults', connection=connection).count == 0
    burst(connection, 'faults', scheduler=True)
    assert ran_ids(connection, 'plain-kept') == ['plain-kept']


# -- a script cache flushed under load -------------------------------------------------------------------------------


class Flusher:
    """``SCRIPT FLUSH`` on the server every ``interval`` seconds from a thread of its own, for as long as it runs."""

    def __init__(self, redis_url: str, interval: float = 0.05) -> None:
        self.conn = Redis.from_url(redis_url)
        self.interval = interval
        self.flushes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='script-flusher', daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.conn.script_flush()
            self.flushes += 1

    def __enter__(self) -> Flusher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.conn.close()


def test_a_script_call_recovers_from_a_flush_right_before_it(connection, fault_proxy, redis_url):
    """The worst moment, every time: the server's script cache is flushed just before each script call arrives,
    the retried one too (redis-py's own fallback, SCRIPT LOAD then EVALSHA, loses that race)."""
    admin = Redis.from_url(redis_url)
    conn = Redis.from_url(fault_proxy.url)
    q = PolicyQueue('faults', connection=conn)
    fault_proxy.before_request(admin.script_flush, match=b'EVAL', times=1000)
    job = q.enqueue(jobs.record, 'flushed')
    assert job is not None and queued(connection, 'faults') == [job.id]
    assert q.enqueue(jobs.record, 'flushed') is None
    worker = PolicySimpleWorker([q], connection=conn)
    worker.work(burst=True)
    assert ran_ids(connection, 'flushed') == [job.id]
    assert len(fault_proxy.fired) >= 3  # the enqueue, the duplicate, the worker's fetch
    admin.close()


def test_limited_capacity_jobs_recover_from_a_flush_before_every_script(connection, fault_proxy, redis_url):
    """The refill, the job's hold (its acquire script rides a MULTI), its finish and the worker's fetch and heartbeat
    pipeline, each with the script cache flushed right before it."""
    admin = Redis.from_url(redis_url)
    conn = Redis.from_url(fault_proxy.url)
    connection.set('test:lcw:max', 2)
    connection.rpush('test:backlog:backlog', 'a', 'b', 'c')
    fault_proxy.before_request(admin.script_flush, match=b'EVAL', times=1000)
    assert len(lcw_jobs.Backlog.perform_with_capacity(connection=conn)) == 2
    PolicySimpleWorker([PolicyQueue('lcw', connection=conn)], connection=conn).work(burst=True)
    assert sorted(raw.decode() for raw in connection.lrange('test:done:backlog', 0, -1)) == ['a', 'b', 'c']
    assert lcw_jobs.Backlog.running_jobs_count(connection) == 0
    assert len(fault_proxy.fired) >= 8
    admin.close()


def test_a_script_riding_a_pipeline_recovers_from_a_flush_before_execute(connection, fault_proxy, redis_url):
    """redis-py loads a pipeline's scripts (SCRIPT EXISTS, SCRIPT LOAD) and then sends the pipeline: a flush in
    between made execute() raise NoScriptError. The worker's heartbeat pipeline carries the hold refresh."""
    admin = Redis.from_url(redis_url)
    conn = Redis.from_url(fault_proxy.url)
    QueueSlot.set('faults', 2, connection=connection)
    assert QueueSlot.acquire('faults', 2, ttl=30, token='pipe-hold', connection=connection)
    try:
        # The forking worker's heartbeat: an in-process one leaves the refresh to its keeper.
        worker = PolicyWorker([PolicyQueue('faults', connection=conn)], connection=conn)
        fault_proxy.before_request(admin.script_flush, match=b'EVAL', times=1000)
        for _ in range(3):
            with conn.pipeline() as pipe:
                worker.heartbeat(90, pipeline=pipe)  # rq's prepare_job_execution and maintain_heartbeats do this
                pipe.execute()
        assert fault_proxy.fired  # the refresh rode the pipeline, and the cache was flushed right before it
        # Refreshed: acquired for 30 s, now hold_ttl (90 s) ahead.
        assert 60 < connection.zscore(keys.holds('faults'), 'pipe-hold') - connection.time()[0] <= 91
    finally:
        QueueSlot.release('faults', 'pipe-hold', connection=connection)
        admin.close()


@pytest.mark.long
def test_producers_and_a_worker_under_a_script_flush_every_50ms(connection, redis_url):
    """An enqueue loop and a worker burst (capped queue: fetch script, hold refresh on the heartbeat pipeline,
    release) while the script cache is flushed every 50 ms: no NoScriptError escapes, every job runs once."""
    QueueSlot.set('flushed', 2, connection=connection)
    q = PolicyQueue('flushed', connection=connection)
    with Flusher(redis_url) as flusher:
        admitted = []
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < 1.0 or i < 100:
            job = q.enqueue(jobs.record, 'flush-loop', i)
            assert job is not None
            admitted.append(job.id)
            assert q.enqueue(jobs.record, 'flush-loop', i) is None  # its duplicate, dropped
            i += 1
        burst(connection, 'flushed')
    assert flusher.flushes >= 10
    assert sorted(ran_ids(connection, 'flush-loop')) == sorted(admitted)
    assert q.count == 0 and QueueSlot.status('flushed', connection=connection).in_use == 0


def test_a_forking_worker_under_a_script_flush_every_5ms_stays_up_and_runs_each_job_once(
        connection, redis_url, worker_env):
    """The reported failure: a worker died in dequeue_any. A forking PolicyWorker (rq worker -w) on a capped queue,
    its fetch, hold refresh and release scripts racing a flush every 5 ms (harsher than the report's 50 ms, so that
    the race is lost within a few seconds every time on the code before the fix)."""
    QueueSlot.set('flushed', 1, connection=connection)
    q = PolicyQueue('flushed', connection=connection)
    worker = start_worker(redis_url, ['flushed'], worker_env)
    try:
        with Flusher(redis_url, interval=0.005):
            admitted = [q.enqueue(jobs.record, 'forking', i).id for i in range(150)]
            done = wait_for(lambda: connection.llen('test:ran:forking') >= len(admitted), timeout=60)
            alive = worker.poll() is None
    finally:
        stop(worker)
    log = output(worker)
    assert 'NoScriptError' not in log, log
    assert alive and done, log
    assert sorted(ran_ids(connection, 'forking')) == sorted(admitted)
    assert QueueSlot.status('flushed', connection=connection).in_use == 0


def test_a_job_whose_fetch_reply_was_lost_is_taken_by_the_next_fetch_not_stranded(connection, fault_proxy):
    """The fetch script took a job (moved to the intermediate list, its hold, its claim record), and its reply was
    lost: the connection dropped, no retry left (redis-py's retries spent, the server restarting). The worker's next
    fetch sends the same claim token, so the claim record answers that job with its hold: the job runs, nothing is
    left on the intermediate list for rq's cleanup to fail unrun a minute later, and no second job is popped."""
    from rq_policies.engine.fetch import current_fetcher
    from rq_policies.engine.worker import _WorkerFetcher

    QueueSlot.set('lostread', 1, connection=connection)
    first = PolicyQueue('lostread', connection=connection).enqueue(jobs.plain, 1)
    second = PolicyQueue('lostread', connection=connection).enqueue(jobs.plain, 2)
    client = Redis.from_url(fault_proxy.url, socket_timeout=2, retry=Retry(ExponentialBackoff(), 0))
    queue = PolicyQueue('lostread', connection=client)
    fetcher = _WorkerFetcher(30)
    context = current_fetcher.set(fetcher)
    try:
        load(client, 'fetch')  # the first attempt runs the script (not a NOSCRIPT answer)
        fault_proxy.drop_reply(match=b'EVALSHA')
        with pytest.raises(ConnectionError):
            queue.dequeue_any([queue], None, connection=client)
        taken = queue.dequeue_any([queue], None, connection=client)
    finally:
        current_fetcher.reset(context)
        fetcher.close()
        client.close()
    assert taken is not None and taken[0].id == first.id
    assert [raw.decode() for raw in connection.lrange(queue.intermediate_queue_key, 0, -1)] == [first.id]
    assert queued(connection, 'lostread') == [second.id]


def test_a_lost_fetch_that_left_full_queues_out_is_replayed_over_the_queues_it_sent(connection, fault_proxy):
    """A worker leaves the queues it knows full out of its fetches (issue 34). The reply of such a fetch is lost;
    by the replay the worker would look at every queue again (a release, a relook). The replay sends the queues the
    lost fetch sent, so its claim record's queue index names the queue the job was taken from, and no second job is
    popped."""
    from rq_policies.engine.fetch import current_fetcher
    from rq_policies.engine.worker import _WorkerFetcher

    full = [f'lostfull{i}' for i in range(5)]
    for name in full:
        QueueSlot.set(name, 1, connection=connection)
        assert QueueSlot.acquire(name, capacity=1, ttl=600, token=f'elsewhere:{name}', connection=connection)
        ledger.PROCESS.discard(f'elsewhere:{name}')
    ids = [PolicyQueue('lostmany', connection=connection).enqueue(jobs.plain, i).id for i in range(4)]
    client = Redis.from_url(fault_proxy.url, socket_timeout=2, retry=Retry(ExponentialBackoff(), 0))
    queues = [PolicyQueue(name, connection=client) for name in [*full, 'lostmany']]
    fetcher = _WorkerFetcher(30)
    context = current_fetcher.set(fetcher)
    try:
        load(client, 'fetch')  # the first attempt runs the script (not a NOSCRIPT answer)
        # The first fetch finds the full queues full and subscribes their wake-ups; the second leaves them out after.
        for expected in ids[:2]:
            taken = PolicyQueue.dequeue_any(queues, None, connection=client)
            assert taken is not None and taken[0].id == expected
        assert set(fetcher.skip) == set(full)
        fault_proxy.drop_reply(match=b'EVALSHA')
        with pytest.raises(ConnectionError):
            PolicyQueue.dequeue_any(queues, None, connection=client)
        assert [q.name for q in fetcher.resume_queues] == ['lostmany']
        fetcher.forget_full()  # as a release or a relook would: the next fetch looks at every queue
        taken = PolicyQueue.dequeue_any(queues, None, connection=client)
    finally:
        current_fetcher.reset(context)
        fetcher.close()
        client.close()
    assert taken is not None and (taken[0].id, taken[1].name) == (ids[2], 'lostmany')
    assert queued(connection, 'lostmany') == [ids[3]]
    for name in full:
        assert [token for token, _ in QueueSlot.status(name, connection=connection).holders] == [f'elsewhere:{name}']


def test_a_stop_while_the_fetch_reply_is_on_its_way_gives_the_holds_back_and_names_the_job(connection, fault_proxy,
                                                                                          worker_env):
    """The fetch script took a job (intermediate list, hold, claim record) and its reply is still on its way when a
    SIGTERM reaches the idle worker: rq raises StopRequested in the middle of the read, so the worker never learns
    what it took. Before quitting it reads the fetch's claim record: the hold goes back at once (not after the hold
    ttl, 90 s here), the job goes back to the head of its queue (not left on the intermediate list for rq's cleanup
    to fail unrun) and the log names the job."""
    import signal

    QueueSlot.set('midread', 1, connection=connection)
    q = PolicyQueue('midread', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    # the fetch: an EVAL naming a claim record and this queue (the worker's preloaded scripts, one chunk of Lua
    # source, can hold the first two strings in their comments)
    fault_proxy.delay_reply(5.0, match=(b'EVAL', keys.claim('').encode(), q.key.encode()))
    worker = start_worker(fault_proxy.url, ['midread'], dict(worker_env, REDIS_URL=fault_proxy.url))
    try:
        assert wait_for(lambda: connection.llen(q.intermediate_queue_key) == 1, timeout=30), output(worker)
        assert QueueSlot.status('midread', connection=connection).in_use == 1
        time.sleep(0.3)  # the worker waits in the read of the delayed reply
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(15) == 0, output(worker)
    finally:
        stop(worker)
    assert_given_up(connection, worker, q, job)
