"""PolicyWorkers promote due scheduled jobs inside their fetch (lua/lib/promote.lua): the state rq's scheduler leaves,
by the server's clock, once per job even beside rq's scheduler, and an idle worker wakes for the earliest due time."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from rq import Queue
from rq.job import Job
from rq.scheduler import RQScheduler

from rq_policies import PolicyQueue, QueueSlot
from rq_policies.engine import compat, ops
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import PROMOTE_BATCH, PROMOTE_OWNER, Claim, Look
from tests.helpers import fetches
from tests.helpers.faults import FAULTS, load, lose_reply, producer
from tests.helpers.records import ran, server_now
from tests.helpers.workers import output, start_worker, stop, wait_for, wait_idle

PAST = datetime(2020, 1, 1, tzinfo=timezone.utc)


def fetch(connection, names, token='t1'):
    return fetches.fetch(connection, token, names, ttl=60, burst=False)


def _schedule_set(q: Queue):
    """Three due jobs as rq's users schedule them: one with a ttl, one at_front, one plain; and a queued job ahead."""
    head = q.enqueue('tests.helpers.jobs.plain', 'head')
    p1 = q.enqueue_at(PAST, 'tests.helpers.jobs.plain', 1, ttl=500, result_ttl=77)
    f1 = q.enqueue_at(PAST + timedelta(seconds=1), 'tests.helpers.jobs.plain', 2, at_front=True)
    p2 = q.enqueue_at(PAST + timedelta(seconds=2), 'tests.helpers.jobs.plain', 3, job_timeout=42)
    return [head, p1, f1, p2]


def _fields(connection, job):
    data = {k.decode(): v for k, v in connection.hgetall(job.key).items()}
    for volatile in ('data', 'created_at', 'enqueued_at', 'origin'):
        data.pop(volatile, None)
    return data


def test_promotion_leaves_the_state_rq_scheduler_leaves(connection):
    theirs = _schedule_set(Queue('by-rq', connection=connection))
    ours = _schedule_set(Queue('by-fetch', connection=connection))
    connection.srem(f'{RQ}:queues', f'{RQ}:queue:by-rq', f'{RQ}:queue:by-fetch')  # promotion must put them back
    scheduler = RQScheduler(['by-rq'], connection=connection)
    assert scheduler.acquire_locks() == {'by-rq'}
    scheduler.enqueue_scheduled_jobs()
    before = server_now(connection)
    claim = fetch(connection, ['by-fetch'])
    # rq's scheduler pushed [f1, head, p1, p2]; the fetch promoted the same way and took the head of it, f1.
    order = [j.id for j in theirs]
    assert [raw.decode() for raw in connection.lrange(f'{RQ}:queue:by-rq', 0, -1)] == [order[2], order[0], order[1],
                                                                                      order[3]]
    assert isinstance(claim, Claim) and claim.job_id == ours[2].id
    assert [raw.decode() for raw in connection.lrange(f'{RQ}:queue:by-fetch', 0, -1)] == [ours[0].id, ours[1].id,
                                                                                         ours[3].id]
    for mine, rqs in zip(ours, theirs):
        assert _fields(connection, mine) == _fields(connection, rqs)
        assert abs(connection.ttl(mine.key) - connection.ttl(rqs.key)) <= 1
        job = Job.fetch(mine.id, connection=connection)
        assert job.origin == 'by-fetch' and job.get_status() == 'queued'
    promoted = Job.fetch(ours[1].id, connection=connection)
    assert before - 1 <= promoted.enqueued_at.timestamp() <= server_now(connection)
    assert connection.ttl(ours[1].key) > 490 and Job.fetch(ours[3].id, connection=connection).timeout == 42
    assert connection.zcard(f'{RQ}:scheduled:by-fetch') == connection.zcard(f'{RQ}:scheduled:by-rq') == 0
    assert connection.sismember(f'{RQ}:queues', f'{RQ}:queue:by-fetch')
    assert connection.get(f'{RQ}:scheduler-lock:by-fetch').decode() == PROMOTE_OWNER


def test_a_fetch_promotes_a_bounded_batch_oldest_first(connection):
    q = Queue('batch', connection=connection)
    with connection.pipeline() as pipe:
        jobs = [q.enqueue_at(PAST + timedelta(seconds=i), 'tests.helpers.jobs.plain', i, pipeline=pipe)
                for i in range(PROMOTE_BATCH * 2 + 50)]
        pipe.execute()
    first = fetch(connection, ['batch'])
    assert first.job_id == jobs[0].id
    assert [raw.decode() for raw in connection.lrange(f'{RQ}:queue:batch', 0, -1)] == [
        j.id for j in jobs[1:PROMOTE_BATCH]]
    assert connection.zcard(f'{RQ}:scheduled:batch') == PROMOTE_BATCH + 50
    for n in range(2, 5):
        fetch(connection, ['batch'], token=f't{n}')
    assert connection.zcard(f'{RQ}:scheduled:batch') == 0
    # a due id whose hash is gone is only taken out of the registry, as rq's scheduler does
    connection.zadd(f'{RQ}:scheduled:batch', {'gone': 1})
    fetch(connection, ['batch'], token='t9')
    assert connection.zcard(f'{RQ}:scheduled:batch') == 0
    assert b'gone' not in connection.lrange(f'{RQ}:queue:batch', 0, -1)


def test_a_live_schedulers_queue_is_left_to_it_and_a_stale_lock_taken_over(connection):
    q = Queue('shared', connection=connection)
    job = q.enqueue_at(PAST, 'tests.helpers.jobs.plain', 1)
    scheduler = RQScheduler(['shared'], connection=connection)
    assert scheduler.acquire_locks() == {'shared'}
    look = fetch(connection, ['shared'])
    assert isinstance(look, Look) and connection.zcard(f'{RQ}:scheduled:shared') == 1  # the scheduler's to promote
    now = server_now(connection)
    assert look.until is not None and now + 5 < look.until <= now + 6.5  # when the lock turns stale
    # the scheduler stops refreshing (dead, or stopped): 6 s later its lock is stale and the fetch takes over
    connection.pexpire(RQScheduler.get_locking_key('shared'), 54_000)
    claim = fetch(connection, ['shared'], token='t2')
    assert isinstance(claim, Claim) and claim.job_id == job.id
    assert connection.get(RQScheduler.get_locking_key('shared')).decode() == PROMOTE_OWNER
    # its heartbeat, which comes before its next enqueue pass, finds the queue taken
    q.enqueue_at(PAST, 'tests.helpers.jobs.plain', 2)
    scheduler.heartbeat()
    assert scheduler.acquired_locks == set()
    scheduler.enqueue_scheduled_jobs()
    assert connection.llen(f'{RQ}:queue:shared') == 0 and connection.zcard(f'{RQ}:scheduled:shared') == 1


def test_an_idle_look_reports_the_earliest_due_time(connection):
    q = Queue('later', connection=connection)
    other = Queue('later2', connection=connection)
    now = server_now(connection)
    q.enqueue_at(datetime.fromtimestamp(now + 100, timezone.utc), 'tests.helpers.jobs.plain', 1)
    other.enqueue_at(datetime.fromtimestamp(now + 40, timezone.utc), 'tests.helpers.jobs.plain', 2)
    look = fetch(connection, ['later', 'later2'])
    assert isinstance(look, Look) and int(now + 40) <= look.until <= now + 41


def test_a_worker_runs_due_jobs_without_a_scheduler(connection, worker_env):
    """Debounce, trailing Throttle, a Loner's enqueue_in and a stock rq enqueue_in, with no --with-scheduler: each
    runs once, within a second or so of its due time (the idle worker wakes for it)."""
    worker = start_worker(worker_env['REDIS_URL'], ['promote'], worker_env)
    try:
        q = PolicyQueue('promote', connection=connection)
        stock = Queue('promote', connection=connection)
        wait_idle(connection)
        start = server_now(connection)
        for version in range(3):
            q.enqueue('tests.helpers.promote_jobs.debounced', 'e2e', 'doc', version)
        q.enqueue('tests.helpers.promote_jobs.trailing', 'e2e', 'task', 1)
        q.enqueue('tests.helpers.promote_jobs.trailing', 'e2e', 'task', 2)
        lone = q.enqueue_in(timedelta(seconds=2), 'tests.helpers.promote_jobs.lone', 'e2e', 'lone')
        assert lone is not None
        # held while scheduled
        assert q.enqueue_in(timedelta(seconds=2), 'tests.helpers.promote_jobs.lone', 'e2e', 'lone') is None
        stock.enqueue_in(timedelta(seconds=2), 'tests.helpers.promote_jobs.stamp', 'e2e', 'stock')
        assert wait_for(lambda: len(ran(connection, 'e2e')) >= 5, 10), output(worker)
        time.sleep(1.0)
        rows = ran(connection, 'e2e')
        values = sorted(value for _, value, _ in rows)
        assert values == ['debounce:2', 'lone', 'stock', 'trailing:1', 'trailing:2'], rows
        assert len({jid for jid, _, _ in rows}) == 5
        for _, value, at in rows:
            due = {'debounce:2': 3, 'trailing:1': 0, 'trailing:2': 3, 'lone': 2, 'stock': 2}[value]
            assert at - start <= due + 1.5, (value, at - start)
        assert connection.zcard(f'{RQ}:scheduled:promote') == 0
    finally:
        stop(worker)


@pytest.mark.long
@pytest.mark.parametrize('skew', [3600, -3600])
def test_a_worker_with_a_moved_clock_promotes_by_the_servers(connection, worker_env, skew):
    env = dict(worker_env, RQ_POLICIES_TEST_SKEW=str(skew))
    args = [sys.executable, '-m', 'tests.helpers.skewed_worker', 'worker', '-w', 'rq_policies.PolicyWorker',
            '--url', worker_env['REDIS_URL'], '--logging_level', 'WARNING', 'skew']
    worker = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        q = Queue('skew', connection=connection)
        wait_idle(connection)
        due = server_now(connection) + 3
        q.enqueue_at(datetime.fromtimestamp(due, timezone.utc), 'tests.helpers.promote_jobs.stamp', 'skew', 'x')
        assert wait_for(lambda: ran(connection, 'skew'), 8)
        (_, _, at), = ran(connection, 'skew')
        assert due - 1 <= at <= due + 1.5  # never early (whole-second scores), never late by the host's clock
    finally:
        stop(worker)


@pytest.mark.long
@pytest.mark.slow  # 10-35 s: once in CI (rq 3 + Valkey); the lock protocol is the same on rq 2.12
def test_rq_scheduler_and_four_workers_promote_1000_due_jobs_once(connection, worker_env):
    url = worker_env['REDIS_URL']
    q = Queue('race', connection=connection)
    due = datetime.fromtimestamp(server_now(connection) + 4, timezone.utc)
    with connection.pipeline() as pipe:
        for i in range(1000):
            q.enqueue_at(due, 'tests.helpers.promote_jobs.stamp', 'race', i, pipeline=pipe)
        pipe.execute()
    code = ('import sys; from redis import Redis; from rq.scheduler import RQScheduler; '
            's = RQScheduler(["race"], connection=Redis.from_url(sys.argv[1])); s.acquire_locks(); s.work()')
    scheduler = subprocess.Popen([sys.executable, '-c', code, url], env=worker_env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # in-process workers (the fetch, and so the promotion, is the forking worker's): 1,000 forks would only add time
    workers = [start_worker(url, ['race'], worker_env, worker_class='rq_policies.PolicySimpleWorker')
               for _ in range(4)]
    try:
        assert wait_for(lambda: connection.llen('test:ran:race') >= 1000, 90), output(workers[0])
        time.sleep(2.0)  # a second run of any job would land by now
        rows = ran(connection, 'race')
        assert len(rows) == 1000
        assert sorted(int(value) for _, value, _ in rows) == list(range(1000))
        assert connection.zcard(f'{RQ}:scheduled:race') == 0
    finally:
        stop(scheduler, *workers)


# -- replayed after a lost reply -------------------------------------------------------------------------------------

PROMOTING_FETCH = (b'EVAL', ops.pack('promote'))


def _everywhere(connection, name):
    """Every id on queue ``name`` and its intermediate list, with repeats."""
    return sorted(raw.decode() for key in (f'{RQ}:queue:{name}', f'{RQ}:queue:{name}:intermediate')
                  for raw in connection.lrange(key, 0, -1))


@pytest.mark.parametrize('fault', FAULTS)
def test_a_promoting_fetch_replayed_after_a_lost_reply_promotes_once(connection, fault_proxy, fault):
    load(connection, 'fetch')
    q = Queue('replayed', connection=connection)
    jobs = [q.enqueue_at(PAST + timedelta(seconds=i), 'tests.helpers.jobs.plain', i) for i in range(3)]
    client = producer(fault_proxy)
    lose_reply(fault_proxy, fault, PROMOTING_FETCH)
    claim = fetch(client, ['replayed'])
    assert fault_proxy.seen(PROMOTING_FETCH) >= 2  # the reply was lost, the call was replayed
    assert isinstance(claim, Claim) and claim.job_id == jobs[0].id
    assert _everywhere(connection, 'replayed') == sorted(j.id for j in jobs)  # each once, none lost
    assert connection.lrange(f'{RQ}:queue:replayed:intermediate', 0, -1) == [jobs[0].id.encode()]
    assert connection.zcard(f'{RQ}:scheduled:replayed') == 0


@pytest.mark.parametrize('fault', FAULTS)
def test_a_look_that_only_promotes_replayed_after_a_lost_reply_promotes_once(connection, fault_proxy, fault):
    """A capped queue at its cap: the fetch promotes the due jobs and takes none; its replay promotes nothing more."""
    load(connection, 'fetch')
    QueueSlot.set('capped', 1, connection=connection)
    assert QueueSlot.acquire('capped', 1, ttl=30, token='held', connection=connection)
    q = Queue('capped', connection=connection)
    jobs = [q.enqueue_at(PAST + timedelta(seconds=i), 'tests.helpers.jobs.plain', i) for i in range(3)]
    client = producer(fault_proxy)
    lose_reply(fault_proxy, fault, PROMOTING_FETCH)
    look = fetch(client, ['capped'])
    assert fault_proxy.seen(PROMOTING_FETCH) >= 2
    assert isinstance(look, Look) and look.full == {'capped'}
    assert [raw.decode() for raw in connection.lrange(f'{RQ}:queue:capped', 0, -1)] == [j.id for j in jobs]
    assert connection.zcard(f'{RQ}:scheduled:capped') == 0


@pytest.mark.skipif(not compat.SCHEDULER_RATE_LIMITS, reason="rq 2.12 has no RateLimit")
def test_a_due_rate_limited_job_is_left_for_rqs_scheduler(connection):
    """rq 3's scheduler sends a RateLimit job through rq's rate-limit registry: promotion leaves it in the registry,
    promotes the jobs behind it, and gives the queue's lock up so rq's scheduler can take it."""
    from rq.rate_limit import RateLimit

    q = Queue('limited', connection=connection)
    limited = q.enqueue_at(PAST, 'tests.helpers.jobs.plain', 0, rate_limit=RateLimit('acct', 1))
    plain = [q.enqueue_at(PAST + timedelta(seconds=1 + i), 'tests.helpers.jobs.plain', i) for i in range(2)]
    claim = fetch(connection, ['limited'])
    assert isinstance(claim, Claim) and claim.job_id == plain[0].id
    assert [raw.decode() for raw in connection.lrange(f'{RQ}:queue:limited', 0, -1)] == [plain[1].id]
    assert connection.zrange(f'{RQ}:scheduled:limited', 0, -1) == [limited.id.encode()]
    assert connection.get(RQScheduler.get_locking_key('limited')) is None
    scheduler = RQScheduler(['limited'], connection=connection)
    assert scheduler.acquire_locks() == {'limited'}
    scheduler.enqueue_scheduled_jobs()
    assert connection.zcard(f'{RQ}:scheduled:limited') == 0
    assert Job.fetch(limited.id, connection=connection).get_status() in ('queued', 'rate_limited')


def test_promotion_expires_a_jobs_dependencies_key_as_rqs_scheduler_does(connection):
    """A due job with a ttl whose dependencies key rq keeps (``rq:job::<id>:dependencies``: rq spells it with its job
    prefix, a colon, then the id): rq's scheduler gives that key the job's ttl, and so does the fetch's promotion. It
    gave the ttl to ``rq:job:<id>:dependencies``, a key rq never reads, and left rq's own without one."""
    theirs = Queue('by-rq', connection=connection).enqueue_at(PAST, 'tests.helpers.jobs.plain', 1, ttl=500)
    ours = Queue('by-fetch', connection=connection).enqueue_at(PAST, 'tests.helpers.jobs.plain', 1, ttl=500)
    for job in (theirs, ours):
        connection.sadd(job.dependencies_key, 'a-finished-parent')  # what rq leaves of a job that had dependencies
        connection.persist(job.dependencies_key)
    scheduler = RQScheduler(['by-rq'], connection=connection)
    assert scheduler.acquire_locks() == {'by-rq'}
    scheduler.enqueue_scheduled_jobs()
    assert isinstance(fetch(connection, ['by-fetch']), Claim)
    assert 490 < connection.ttl(theirs.dependencies_key) <= 500
    assert 490 < connection.ttl(ours.dependencies_key) <= 500
    assert not connection.exists(ours.redis_job_namespace_prefix + ours.id + ':dependencies')
