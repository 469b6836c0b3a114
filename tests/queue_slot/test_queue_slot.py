"""QueueSlot: the ledger's scripts called directly, the public API, the fetch under a cap, and in-process workers.

End-to-end runs with forking workers in subprocesses are in test_worker_cap.py.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time

import pytest
from redis import Redis
from rq.defaults import DEFAULT_JOB_MONITORING_INTERVAL
from rq.exceptions import DequeueTimeout
from rq.job import Job, JobStatus, Retry
from rq.queue import Queue

from rq_policies import Cap, PolicyQueue, PolicySimpleWorker, PolicyWorker, QueueSlot
from rq_policies.engine import keys, ops
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import Fetcher, FetchReply, current_fetcher, fetch_call
from rq_policies.engine.ledger import Hold, Ledger, acquire_call
from rq_policies.engine.worker import HOLD_TTL_ENV, _WorkerFetcher
from tests.helpers import jobs
from tests.helpers.records import server_now
from tests.helpers.workers import fetch_as_a_worker


def members(conn: Redis, queue: str) -> dict[str, float]:
    return {m.decode(): s for m, s in conn.zrange(keys.holds(queue), 0, -1, withscores=True)}


# -- lua/acquire_hold.lua -----------------------------------------------------------------------------------------


def acquire(conn: Redis, ledger: str, capacity: int, token: str, ttl: int) -> int:
    return acquire_call(Hold(ledger, token, ttl), capacity).run(conn)


def test_acquire_script_takes_refuses_and_purges_under_the_server_clock(connection):
    ledger = keys.holds('reports')
    assert acquire(connection, ledger, 2, 'a', 30) == 1
    assert acquire(connection, ledger, 2, 'b', 30) == 1
    assert acquire(connection, ledger, 2, 'c', 30) == 0
    held = members(connection, 'reports')
    assert set(held) == {'a', 'b'}
    now = server_now(connection)
    assert all(now + 28 < score <= now + 30.5 for score in held.values())
    assert 30 <= connection.ttl(ledger) <= 31  # the key outlives its last hold and then goes by itself
    # An expired member is purged by the next admission, under the server's clock.
    connection.zadd(ledger, {'a': now - 1})
    assert acquire(connection, ledger, 2, 'c', 30) == 1
    assert set(members(connection, 'reports')) == {'b', 'c'}


def test_acquire_script_replay_finds_its_own_member(connection):
    ledger = keys.holds('reports')
    assert acquire(connection, ledger, 1, 'a', 5) == 1
    before = members(connection, 'reports')['a']
    time.sleep(0.05)
    # At capacity, a replay of the same claim answers 1 again, refreshed, and is not counted twice.
    assert acquire(connection, ledger, 1, 'a', 5) == 1
    assert connection.zcard(ledger) == 1
    assert members(connection, 'reports')['a'] > before
    assert acquire(connection, ledger, 1, 'b', 5) == 0


# -- lua/refresh_holds.lua ----------------------------------------------------------------------------------------


def test_refresh_script_extends_live_holds_and_re_adds_and_counts_lapsed_ones(connection):
    # A refresh comes from the owner of a running job: a hold it finds gone is that job, uncounted. It is written
    # again (the ledger may be over its cap for a while: fetches are refused until it is not) and counted.
    a, b = keys.holds('a'), keys.holds('b')
    now = server_now(connection)
    connection.zadd(a, {'live': now + 2})
    connection.zadd(b, {'expired': now - 1})
    holds = [Hold(a, 'live', 60), Hold(b, 'expired', 60), Hold(a, 'absent', 60)]
    lapsed = Ledger(holds).refresh(connection)
    assert lapsed == holds[1:]  # the reply names the holds that had lapsed
    now = server_now(connection)
    for ledger_key, member in ((a, 'live'), (b, 'expired'), (a, 'absent')):
        assert now + 59 < connection.zscore(ledger_key, member) <= now + 60.5
    assert connection.ttl(a) >= 60 and connection.ttl(b) >= 60
    assert connection.hgetall(keys.LAPSES) == {b'queue:a': b'1', b'queue:b': b'1'}


# -- lua/fetch.lua ------------------------------------------------------------------------------------------------


def _dequeue_script(conn: Redis, queues: list[Queue], token: str, ttl: int = 30) -> list:
    """The fetch reply (decoded by rq_policies.engine.fetch.FetchReply) as ``[queue index, job id, QueueSlot's hold: 1
    or 0]``, or ``[0, waiting, index of each skipped queue...]`` when it took nothing."""
    found = FetchReply.decode(fetch_call(queues, token, ttl, Job.redis_job_namespace_prefix).run(conn))
    if found.job is not None:
        return [found.queue, found.job, int(dict(found.holds).get(QueueSlot.name) == '1')]
    return [0, found.waiting, *found.full]


def test_dequeue_script_pops_through_the_intermediate_list_and_holds_on_capped_queues(connection):
    capped = PolicyQueue('capped', connection=connection)
    free = PolicyQueue('free', connection=connection)
    QueueSlot.set('capped', 1, connection=connection)
    first = capped.enqueue(jobs.sweep_cache, 1)  # a loner: its marker goes with the pop
    second = capped.enqueue(jobs.plain, 2)
    other = free.enqueue(jobs.plain, 3)
    marker = connection.hget(first.key, keys.LONER_FIELD)
    assert connection.get(marker) == first.id.encode()

    assert _dequeue_script(connection, [capped, free], 't1') == [1, first.id, 1]
    assert connection.lrange(capped.intermediate_queue_key, 0, -1) == [first.id.encode()]
    assert set(members(connection, 'capped')) == {'t1'}
    assert connection.get(marker) is None

    # The capped queue is full now: skipped, and the next queue in order is served, without a hold.
    assert _dequeue_script(connection, [capped, free], 't2') == [2, other.id, 0]
    assert set(members(connection, 'capped')) == {'t1'}
    assert connection.lrange(free.intermediate_queue_key, 0, -1) == [other.id.encode()]

    # Nothing to take: {0, how many full queues still have jobs, the index of every full queue}.
    assert _dequeue_script(connection, [free, capped], 't3') == [0, 1, 2]
    assert capped.job_ids == [second.id]

    # An id whose hash is gone is dropped, and the pop goes on to the next one.
    connection.delete(second.key)
    connection.zrem(keys.holds('capped'), 't1')
    ghost_free = capped.enqueue(jobs.plain, 4)
    assert _dequeue_script(connection, [capped], 't4') == [1, ghost_free.id, 1]
    assert connection.lrange(capped.intermediate_queue_key, 0, -1) == [first.id.encode(), ghost_free.id.encode()]


def test_a_replayed_fetch_answers_the_job_the_first_attempt_took(connection, monkeypatch):
    # redis-py resends a command whose reply was lost: the same fetch, same claim token, runs twice. The replay must
    # answer the first attempt's job; popping a second one would strand it on the intermediate list, status queued,
    # its loner marker gone (an identical enqueue admitted, and rq's cleanup failing it without a run).
    q = PolicyQueue('replay', connection=connection)
    QueueSlot.set('replay', 2, connection=connection)
    first = q.enqueue(jobs.sweep_cache, 1)
    second = q.enqueue(jobs.sweep_cache, 2)
    real_run = ops.Call.run

    def lost_reply(self, client):
        if self.script == 'fetch':
            real_run(self, client)
        return real_run(self, client)

    monkeypatch.setattr(ops.Call, 'run', lost_reply)
    job, fetcher = fetch_as_a_worker(q, connection)
    monkeypatch.undo()
    assert job.id == first.id
    assert fetcher.claim.job_id == first.id and len(fetcher.claim.holds) == 1
    assert q.job_ids == [second.id]  # still waiting, not popped
    assert connection.lrange(q.intermediate_queue_key, 0, -1) == [first.id.encode()]
    assert q.enqueued(jobs.sweep_cache, 2)  # its marker is intact
    assert set(members(connection, 'replay')) == {fetcher.claim.token}  # one hold, not two


def test_dequeue_script_racing_processes_never_take_more_than_the_cap(connection, redis_url):
    q = PolicyQueue('race', connection=connection)
    QueueSlot.set('race', 3, connection=connection)
    for i in range(20):
        q.enqueue(jobs.plain, i)
    ctx = multiprocessing.get_context('fork')
    start = ctx.Event()
    procs = [ctx.Process(target=_race_dequeue, args=(redis_url, start, f'p{i}')) for i in range(8)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    taken = connection.lrange('test:taken', 0, -1)
    assert len(taken) == 3
    assert connection.zcard(keys.holds('race')) == 3
    assert connection.llen(q.intermediate_queue_key) == 3
    assert q.count == 17


def _race_dequeue(url: str, start, name: str) -> None:
    conn = Redis.from_url(url)
    queue = PolicyQueue('race', connection=conn)
    start.wait(10)
    for n in range(5):
        result = _dequeue_script(conn, [queue], f'{name}:{n}')
        if result[0]:
            conn.rpush('test:taken', result[1])


# -- the public API -----------------------------------------------------------------------------------------------


def test_capacity_is_stored_in_redis_and_changes_wake_idle_workers(connection):
    pubsub = connection.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(keys.wake('reports'))
    assert QueueSlot.get('reports', connection=connection) is None
    QueueSlot.set('reports', 3, connection=connection)
    assert QueueSlot.get(PolicyQueue('reports', connection=connection), connection=connection) == Cap(3)
    assert connection.hget(keys.CAPACITY, 'reports') == b'3'
    assert QueueSlot.clear('reports', connection=connection) is True
    assert QueueSlot.clear('reports', connection=connection) is False
    assert QueueSlot.get('reports', connection=connection) is None
    got = [_next_message(pubsub) for _ in range(3)]
    assert [m['data'] for m in got] == [b'capacity'] * 3
    pubsub.close()


def _next_message(pubsub, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.2)
        if message is not None:
            return message
    raise AssertionError('no pub/sub message')


@pytest.mark.parametrize('bad', [0, -1, True, False, 1.5, '3', None])
def test_capacity_and_ttl_must_be_positive_integers(connection, bad):
    with pytest.raises(ValueError, match='capacity'):
        QueueSlot.set('reports', bad, connection=connection)
    with pytest.raises(ValueError, match='capacity'):
        QueueSlot.acquire('reports', capacity=bad, connection=connection)
    with pytest.raises(ValueError, match='ttl'):
        QueueSlot.acquire('reports', capacity=1, ttl=bad, connection=connection)
    with pytest.raises(ValueError, match='ttl'):
        QueueSlot.refresh_in(connection.pipeline(), ttl=bad)
    assert connection.keys(f'{RQ}:policies:*') == []  # refused before anything was written


def test_bad_queue_token_and_missing_connection_are_refused(connection):
    with pytest.raises(ValueError, match='queue'):
        QueueSlot.set('', 1, connection=connection)
    with pytest.raises(ValueError, match='queue'):
        QueueSlot.acquire(3, capacity=1, connection=connection)
    with pytest.raises(ValueError, match='token'):
        QueueSlot.acquire('q', capacity=1, token='', connection=connection)
    with pytest.raises(ValueError, match='token'):
        QueueSlot.release('q', token=7, connection=connection)
    with pytest.raises(ValueError, match='connection'):
        QueueSlot.acquire('q', capacity=1)
    assert connection.keys(f'{RQ}:policies:*') == []


def test_acquire_release_in_use_and_idempotent_release(connection):
    assert QueueSlot.acquire('reports', capacity=2, token='a', connection=connection) is True
    assert QueueSlot.acquire('reports', capacity=2, connection=connection) is True  # this thread's token
    assert QueueSlot.acquire('reports', capacity=2, token='c', connection=connection) is False
    assert QueueSlot.status('reports', connection=connection).in_use == 2
    assert [token for token, _ in QueueSlot.status('reports', connection=connection).holders] == sorted(
        ['a', QueueSlot.token()], key=lambda t: members(connection, 'reports')[t]
    )
    assert QueueSlot.release('reports', token='a', connection=connection) is True
    assert QueueSlot.release('reports', token='a', connection=connection) is False  # idempotent: frees nothing
    assert QueueSlot.status('reports', connection=connection).in_use == 1
    assert QueueSlot.release('reports', connection=connection) is True
    assert QueueSlot.status('reports', connection=connection).in_use == 0


def test_in_use_counts_live_holds_only(connection):
    now = server_now(connection)
    connection.zadd(keys.holds('reports'), {'gone': now - 0.5, 'live': now + 30})
    assert QueueSlot.status('reports', connection=connection).in_use == 1
    assert [token for token, _ in QueueSlot.status('reports', connection=connection).holders] == ['live']


def test_stale_release_after_expiry_frees_nothing(connection):
    assert QueueSlot.acquire('reports', capacity=1, ttl=1, token='old', connection=connection)
    time.sleep(1.1)
    # The old hold aged out; its slot is handed to a new claim.
    assert QueueSlot.acquire('reports', capacity=1, ttl=30, token='new', connection=connection)
    assert QueueSlot.release('reports', token='old', connection=connection) is False
    assert set(members(connection, 'reports')) == {'new'}
    assert QueueSlot.acquire('reports', capacity=1, token='third', connection=connection) is False


def test_stale_release_of_an_earlier_claim_of_the_same_thread_frees_nothing(connection):
    first = QueueSlot.claim_token()
    assert QueueSlot.acquire('reports', capacity=1, ttl=1, token=first, connection=connection)
    time.sleep(1.1)
    second = QueueSlot.claim_token()
    assert QueueSlot.acquire('reports', capacity=1, token=second, connection=connection)
    assert QueueSlot.release('reports', token=first, connection=connection) is False
    assert QueueSlot.status('reports', connection=connection).in_use == 1


def test_replayed_acquire_is_not_counted_twice(connection):
    token = QueueSlot.claim_token()
    assert QueueSlot.acquire('reports', capacity=2, token=token, connection=connection)
    assert QueueSlot.acquire('reports', capacity=2, token=token, connection=connection)  # the retry
    assert QueueSlot.status('reports', connection=connection).in_use == 1
    assert QueueSlot.acquire('reports', capacity=2, token='other', connection=connection)
    # Full: a replay still finds its own member, a newcomer is refused.
    assert QueueSlot.acquire('reports', capacity=2, token=token, connection=connection)
    assert QueueSlot.acquire('reports', capacity=2, token='third', connection=connection) is False
    assert QueueSlot.status('reports', connection=connection).in_use == 2


def test_release_and_refresh_ride_a_pipeline(connection):
    pubsub = connection.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(keys.wake('reports'))
    assert QueueSlot.acquire('reports', capacity=3, ttl=5, token='x', connection=connection)
    assert QueueSlot.HELD.snapshot() == {'x': keys.holds('reports')}
    with connection.pipeline() as pipe:
        pipe.ping()
        QueueSlot.refresh_in(pipe, ttl=60)
        assert members(connection, 'reports')['x'] < server_now(connection) + 6  # nothing sent yet
        assert pipe.execute()[-1] == []  # no hold lapsed: the one hold was refreshed
    assert members(connection, 'reports')['x'] > server_now(connection) + 55
    with connection.pipeline() as pipe:
        QueueSlot.release('reports', token='x', connection=pipe)
        assert connection.zcard(keys.holds('reports')) == 1
        assert pipe.execute()[0] == 1
    assert connection.zcard(keys.holds('reports')) == 0
    assert QueueSlot.HELD.snapshot() == {}
    assert _next_message(pubsub)['data'] == f'released {keys.holds("reports")} x'.encode()  # names its hold
    with connection.pipeline() as pipe:
        QueueSlot.refresh_in(pipe)  # nothing held: the pipeline is not touched
        assert len(pipe) == 0
    pubsub.close()


def test_tokens_name_a_thread_and_a_claim_and_change_across_fork():
    token = QueueSlot.token()
    assert token == QueueSlot.token()
    assert token.split(':')[-2:] == [str(os.getpid()), str(threading.get_ident())]
    claims = [QueueSlot.claim_token() for _ in range(3)]
    assert len(set(claims)) == 3 and all(c.startswith(token + ':') for c in claims)
    other: list[str] = []
    thread = threading.Thread(target=lambda: other.append(QueueSlot.token()))
    thread.start()
    thread.join()
    assert other[0] != token
    ctx = multiprocessing.get_context('fork')
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=lambda c: c.send((QueueSlot.token(), QueueSlot.HELD.snapshot())), args=(child,))
    QueueSlot.HELD.add(Hold(keys.holds('q'), 'parent-hold', 30))
    proc.start()
    child_token, child_held = parent.recv()
    proc.join(10)
    assert child_token != token and child_token.split(':')[-2] == str(proc.pid)
    assert child_held == {}  # a forked child never refreshes nor releases its parent's holds


def test_racing_holders_never_exceed_the_capacity(connection, redis_url):
    ctx = multiprocessing.get_context('fork')
    start = ctx.Event()
    procs = [ctx.Process(target=_hammer, args=(redis_url, start)) for _ in range(6)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert connection.llen('test:over') == 0
    assert int(connection.get('test:peak')) == 2  # the cap was reached, and contended
    assert int(connection.get('test:refused')) > 0
    assert QueueSlot.status('hammer', connection=connection).in_use == 0


def _hammer(url: str, start) -> None:
    conn = Redis.from_url(url)
    start.wait(10)

    def loop() -> None:
        for _ in range(25):
            token = QueueSlot.claim_token()
            if not QueueSlot.acquire('hammer', capacity=2, ttl=30, token=token, connection=conn):
                conn.incr('test:refused')
                continue
            running = conn.incr('test:running')
            if running > 2:
                conn.rpush('test:over', running)
            conn.eval("if tonumber(redis.call('GET', KEYS[2]) or 0) < tonumber(ARGV[1]) then "
                      "redis.call('SET', KEYS[2], ARGV[1]) end", 2, 'test:running', 'test:peak', running)
            time.sleep(0.002)
            conn.decr('test:running')
            QueueSlot.release('hammer', token=token, connection=conn)

    threads = [threading.Thread(target=loop) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- PolicyQueue: pushes wake idle workers ------------------------------------------------------------------------


def test_every_push_through_a_policy_queue_publishes_a_wake_up(connection):
    pubsub = connection.pubsub(ignore_subscribe_messages=True)
    pubsub.ssubscribe(keys.wake('pushes'))
    q = PolicyQueue('pushes', connection=connection)
    plain = q.enqueue(jobs.plain, 1)  # no policy: rq's own enqueue path
    loner = q.enqueue(jobs.sweep_cache, 1)  # through the admission script
    many = q.enqueue_many([Queue.prepare_data(jobs.plain, (2,))])
    got = [_next_message(pubsub)['data'].decode() for _ in range(3)]
    assert got == [plain.id, loner.id, many[0].id]
    assert q.job_ids == [plain.id, loner.id, many[0].id]
    pubsub.close()


# -- dequeue_any: the fetch a PolicyWorker makes ------------------------------------------------------------------


@pytest.fixture
def as_policy_worker():
    """dequeue_any applies the fetch-side policies only inside a PolicyWorker (which installs a Fetcher)."""
    token = current_fetcher.set(Fetcher())
    yield
    current_fetcher.reset(token)


def test_full_queue_is_skipped_and_the_others_served_in_order(connection, as_policy_worker):
    a, b, c = (PolicyQueue(name, connection=connection) for name in 'abc')
    QueueSlot.set('a', 1, connection=connection)
    a1, a2 = a.enqueue(jobs.plain, 1), a.enqueue(jobs.plain, 2)
    b1, c1 = b.enqueue(jobs.plain, 3), c.enqueue(jobs.plain, 4)
    taken = []
    for _ in range(3):
        job, queue = PolicyQueue.dequeue_any([a, b, c], None, connection=connection)
        taken.append((queue.name, job.id))
    assert taken == [('a', a1.id), ('b', b1.id), ('c', c1.id)]
    assert isinstance(queue, PolicyQueue)
    assert a.job_ids == [a2.id]
    assert QueueSlot.status('a', connection=connection).in_use == 1
    with pytest.raises(DequeueTimeout):
        PolicyQueue.dequeue_any([a, b, c], 1, connection=connection)
    assert a.job_ids == [a2.id]


def test_uncapped_queues_are_served_exactly_as_stock_rq_serves_them(connection, as_policy_worker):
    def fill(prefix: str) -> None:
        for name in ('x', 'y'):
            q = Queue(f'{prefix}{name}', connection=connection)
            for i in range(3):
                q.enqueue(jobs.plain, i, job_id=f'{prefix}{name}{i}')
            q.enqueue(jobs.plain, 9, job_id=f'{prefix}{name}front', at_front=True)

    fill('s')
    fill('p')
    stock = [Queue(n, connection=connection) for n in ('sx', 'sy')]
    ours = [PolicyQueue(n, connection=connection) for n in ('px', 'py')]
    stock_order, our_order = [], []
    while (got := Queue.dequeue_any(stock, None, connection=connection)) is not None:
        stock_order.append(got[0].id[1:])
    while (got := PolicyQueue.dequeue_any(ours, None, connection=connection)) is not None:
        our_order.append(got[0].id[1:])
    assert our_order == stock_order and len(our_order) == 8
    assert connection.keys(f'{RQ}:policies:slots:*') == []


def test_a_burst_fetch_waits_for_a_full_queue_that_still_has_jobs(connection, as_policy_worker):
    q = PolicyQueue('burst', connection=connection)
    QueueSlot.set('burst', 1, connection=connection)
    q.enqueue(jobs.plain, 1)
    assert QueueSlot.acquire('burst', capacity=1, ttl=1, token='elsewhere', connection=connection)
    started = time.monotonic()
    got = PolicyQueue.dequeue_any([q], None, connection=connection)  # burst: returns once the hold aged out
    assert got is not None and 0.5 < time.monotonic() - started < 10
    assert PolicyQueue.dequeue_any([q], None, connection=connection) is None  # nothing left: burst ends


def test_an_idle_worker_ignores_pushes_to_a_full_queue_but_not_releases():
    fetcher = _WorkerFetcher(hold_ttl=30)
    fetcher._channels = {keys.wake('full'): 'full', keys.wake('open'): 'open'}
    full = frozenset({'full'})

    def message(queue: str, data: str, kind: str = 'smessage') -> dict:
        return {'type': kind, 'channel': keys.wake(queue).encode(), 'data': data.encode()}

    assert fetcher._news(message('full', 'some-job-id'), full) is False
    assert fetcher._news(message('full', 'released'), full) is True
    assert fetcher._news(message('full', 'capacity'), full) is True
    assert fetcher._news(message('open', 'some-job-id'), full) is True
    assert fetcher._news(message('other', 'released'), full) is False
    assert fetcher._news(message('open', '1', kind='ssubscribe'), full) is False


def test_a_waiting_fetch_wakes_on_a_release(connection, redis_url):
    q = PolicyQueue('wake', connection=connection)
    QueueSlot.set('wake', 1, connection=connection)
    q.enqueue(jobs.plain, 1)
    assert QueueSlot.acquire('wake', capacity=1, ttl=60, token='holder', connection=connection)
    fetcher = _WorkerFetcher(hold_ttl=30)
    got: list = []

    def fetch() -> None:
        current_fetcher.set(fetcher)
        got.append(PolicyQueue.dequeue_any([q], 30, connection=Redis.from_url(redis_url)))
        got.append(time.monotonic())

    thread = threading.Thread(target=fetch)
    thread.start()
    time.sleep(1.5)  # well past the first looks: the fetch is waiting now
    assert not got
    released_at = time.monotonic()
    assert QueueSlot.release('wake', token='holder', connection=connection)
    thread.join(10)
    job, queue = got[0]
    assert queue.name == 'wake'
    assert got[1] - released_at < 0.5  # woken, not polled (the poll is 1 s)
    fetcher.close()


def test_a_release_makes_one_idle_worker_look_again_a_capacity_change_all(connection):
    # Two idle workers' fetchers waiting on the same full queue (real pub/sub): a release freed one hold, so only the
    # first to claim its wake-up looks again; the other spends one SET and goes on waiting. A capacity change (or a
    # release published by an older version, naming no hold) is news to everyone.
    QueueSlot.set('herd', 1, connection=connection)
    assert QueueSlot.acquire('herd', capacity=1, ttl=60, token='holder', connection=connection)
    fetchers = [_WorkerFetcher(hold_ttl=30) for _ in range(2)]
    for fetcher in fetchers:
        assert fetcher.listen(connection, ['herd'])

    def waits() -> tuple[list[bool], list[threading.Thread]]:
        """Both fetchers waiting (up to 1 s) in threads of their own; each one's answer lands in the list."""
        results = [False, False]

        def wait(n: int) -> None:
            results[n] = fetchers[n].wait(connection, ['herd'], 1.0, frozenset({'herd'}))

        threads = [threading.Thread(target=wait, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.2)  # both are in get_message now
        return results, threads

    results, threads = waits()
    assert QueueSlot.release('herd', token='holder', connection=connection)
    for thread in threads:
        thread.join(5)
    assert sorted(results) == [False, True]
    assert connection.ttl(keys.woken(f'{keys.holds("herd")} holder')) > 0  # the claim of the wake-up expires

    results, threads = waits()
    QueueSlot.set('herd', 2, connection=connection)
    for thread in threads:
        thread.join(5)
    assert results == [True, True]

    results, threads = waits()
    connection.spublish(keys.wake('herd'), 'released')  # a bare release (a key unparked): no hold named
    for thread in threads:
        thread.join(5)
    assert results == [True, True]
    for fetcher in fetchers:
        fetcher.close()


def test_an_idle_worker_over_full_queues_probes_instead_of_looking_again(connection):
    # One full capped queue and one empty one. Once a look found nothing, the idle wait probes the queue that was not
    # full (one EXISTS) and looks again only when the probe finds a job there (pushed by a stock producer, which
    # publishes no wake-up), on news, or after relook_seconds.
    QueueSlot.set('idlefull', 1, connection=connection)
    assert QueueSlot.acquire('idlefull', capacity=1, ttl=60, token='holder', connection=connection)
    PolicyQueue('idlefull', connection=connection).enqueue(jobs.plain, 1)
    queues = [PolicyQueue('idlefull', connection=connection), PolicyQueue('idleempty', connection=connection)]
    fetcher = _WorkerFetcher(hold_ttl=30)
    assert fetcher.relook_seconds() == 10.0
    assert _WorkerFetcher(hold_ttl=3).relook_seconds() == 1.0
    got: list = []

    def fetch() -> None:
        current_fetcher.set(fetcher)  # a thread starts with a context of its own
        got.append(PolicyQueue.dequeue_any(queues, 30, connection=connection))
        got.append(time.monotonic())

    connection.config_resetstat()
    thread = threading.Thread(target=fetch)
    thread.start()
    time.sleep(3.5)
    stats = connection.info('commandstats')
    looks = stats['cmdstat_evalsha']['calls'] + stats.get('cmdstat_eval', {}).get('calls', 0)
    assert looks <= 3, stats  # the first look, and the one after the subscription landed: no look per second
    assert stats['cmdstat_exists']['calls'] >= 2  # it probed the empty queue once a second instead
    pushed_at = time.monotonic()
    Queue('idleempty', connection=connection).enqueue(jobs.plain, 2)  # stock rq: no wake-up published
    thread.join(10)
    job, queue = got[0]
    assert queue.name == 'idleempty' and got[1] - pushed_at < 1.5
    fetcher.close()


# -- the worker's hold TTL ----------------------------------------------------------------------------------------


def test_hold_ttl_default_is_pinned_to_rqs_heartbeat(connection, monkeypatch):
    monkeypatch.delenv(HOLD_TTL_ENV, raising=False)
    # A hold outlives a missed beat by exactly as much as rq's worker key does: job_monitoring_interval + 60.
    assert QueueSlot.TTL_SECONDS == DEFAULT_JOB_MONITORING_INTERVAL + 60
    worker = PolicyWorker(['q'], connection=connection)
    assert worker.hold_ttl == QueueSlot.TTL_SECONDS
    assert worker._policy_fetcher.hold_ttl == QueueSlot.TTL_SECONDS
    slower = PolicyWorker(['q'], connection=connection, job_monitoring_interval=120)
    assert slower.hold_ttl == 180  # follows the interval, so a hold never lapses between two beats


def test_hold_ttl_from_the_class_or_the_environment_and_validated(connection, monkeypatch):
    monkeypatch.setenv(HOLD_TTL_ENV, '7')
    assert PolicyWorker(['q'], connection=connection, job_monitoring_interval=2).hold_ttl == 7

    class Short(PolicyWorker):
        hold_ttl = 4

    assert Short(['q'], connection=connection, job_monitoring_interval=1).hold_ttl == 4
    with pytest.raises(ValueError, match='hold_ttl'):
        Short(['q'], connection=connection)  # 4 s would lapse between beats 30 s apart
    monkeypatch.setenv(HOLD_TTL_ENV, 'soon')
    with pytest.raises(ValueError, match=HOLD_TTL_ENV):
        PolicyWorker(['q'], connection=connection)
    monkeypatch.setenv(HOLD_TTL_ENV, '0')
    with pytest.raises(ValueError, match=HOLD_TTL_ENV):
        PolicyWorker(['q'], connection=connection)

    class Bad(PolicyWorker):
        hold_ttl = True

    monkeypatch.delenv(HOLD_TTL_ENV)
    with pytest.raises(ValueError, match='hold_ttl'):
        Bad(['q'], connection=connection)
    # A SimpleWorker refreshes from its own thread, so a short hold_ttl is fine with any interval.
    assert PolicySimpleWorker(['q'], connection=connection, job_monitoring_interval=30).hold_ttl == 90


def test_worker_heartbeat_pipeline_carries_the_refresh(connection):
    worker = PolicyWorker(['q'], connection=connection)
    assert QueueSlot.acquire('q', capacity=1, ttl=5, token='w', connection=connection)
    with connection.pipeline() as pipe:
        worker.heartbeat(worker.job_monitoring_interval + 60, pipeline=pipe)
        pipe.execute()
    assert members(connection, 'q')['w'] > server_now(connection) + worker.hold_ttl - 2


def test_a_heartbeat_pipeline_used_again_runs_without_the_refresh_reader(connection, caplog):
    """rq may execute a pipeline again after its heartbeat batch (a retry, a second batch on the same object): the
    refresh's reader reads once, so the second batch's replies are not read by the first one's index (before, this
    logged 'could not read which holds the heartbeat found lapsed (reply None)' with an IndexError)."""
    caplog.set_level(logging.DEBUG)
    worker = PolicyWorker(['q'], connection=connection)
    assert QueueSlot.acquire('q', capacity=1, ttl=5, token='w', connection=connection)
    with connection.pipeline() as pipe:
        worker.heartbeat(worker.job_monitoring_interval + 60, pipeline=pipe)
        pipe.execute()
        pipe.ping()
        assert pipe.execute() == [True]
        assert pipe.execute() == []
    assert 'could not read' not in caplog.text
    assert members(connection, 'q')['w'] > server_now(connection) + worker.hold_ttl - 2


# -- PolicySimpleWorker in-process --------------------------------------------------------------------------------


class ShortSimple(PolicySimpleWorker):
    hold_ttl = 2


def test_simple_worker_keeps_its_hold_live_through_a_long_job(connection, redis_url, monkeypatch):
    monkeypatch.setenv('REDIS_URL', redis_url)
    q = PolicyQueue('long', connection=connection)
    QueueSlot.set('long', 1, connection=connection)
    job = q.enqueue(jobs.sleep_and_record, 'long', 4)
    samples: list[int] = []
    stop = threading.Event()
    observer = Redis.from_url(redis_url)

    def sample() -> None:
        while not stop.is_set():
            if observer.llen('test:span:long') == 1:  # the job is running
                samples.append(QueueSlot.status('long', connection=observer).in_use)
            time.sleep(0.1)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        ShortSimple([q], connection=connection).work(burst=True)
    finally:
        stop.set()
        thread.join()
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert len(samples) > 20  # 4 s of job, twice the 2 s hold_ttl
    assert set(samples) == {1}
    assert QueueSlot.status('long', connection=connection).in_use == 0
    assert connection.exists(keys.holds('long')) == 0


def test_simple_worker_releases_on_success_failure_retry_and_timeout(connection, redis_url, monkeypatch):
    monkeypatch.setenv('REDIS_URL', redis_url)
    q = PolicyQueue('paths', connection=connection)
    QueueSlot.set('paths', 1, connection=connection)
    ok = q.enqueue(jobs.plain, 1)
    failed = q.enqueue(jobs.fail, 2)
    retried = q.enqueue(jobs.fail, 3, retry=Retry(max=1))
    timed_out = q.enqueue(jobs.sleep_and_record, 'paths', 5, job_timeout=1)

    class Short(PolicySimpleWorker):
        hold_ttl = 30  # a leaked hold would stall this cap-1 queue for 30 s

    started = time.monotonic()
    Short([q], connection=connection).work(burst=True)
    assert time.monotonic() - started < 20
    statuses = {j.id: Job.fetch(j.id, connection=connection).get_status() for j in (ok, failed, retried, timed_out)}
    assert statuses == {
        ok.id: JobStatus.FINISHED, failed.id: JobStatus.FAILED, retried.id: JobStatus.FAILED,
        timed_out.id: JobStatus.FAILED,
    }
    assert Job.fetch(retried.id, connection=connection).retries_left == 0  # it did run twice
    assert QueueSlot.status('paths', connection=connection).in_use == 0
    assert connection.llen(q.intermediate_queue_key) == 0
