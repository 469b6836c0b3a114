"""Batch in one process: the admission parks each member on its key, the fetch script forms one batch job (fetched
here as a worker's fetch makes it), its payload as the function receives it, max_wait and min_size by the server's
clock, a member's handle, bad input, replays through the fault proxy, a failed batch retried as a batch, and the
composition with Fair and Concurrency. Real forking workers killed mid-run: tests/batch/test_batch_workers.py."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry as RedisRetry
from rq import Retry
from rq.job import Job
from rq.registry import DeferredJobRegistry

from rq_policies import (
    Batch,
    Concurrency,
    Fair,
    InvalidArgument,
    PolicyConfigurationError,
    PolicyQueue,
    PolicySimpleWorker,
    Rate,
    Throttle,
    batch_of,
    explain,
)
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import Claim, Look
from rq_policies.policies.batch.rules import MEMBER_TTL
from tests.batch.examples import INVALID
from tests.helpers import batch_jobs, fetches
from tests.helpers.workers import wait_for

_tokens = iter(range(10**9))
SCOPE = 'tests.helpers.batch_jobs.collect'


def fetch(conn, names=('b',)):
    return fetches.fetch(conn, f'h:batch:{next(_tokens)}', names)


def member(q, shop, i, policy, func=batch_jobs.collect, **kwargs):
    return q.enqueue(func, {'shop': shop, 'id': i}, policy=policy, **kwargs)


def runs(conn):
    """The batch runs recorded by tests.helpers.batch_jobs: (job id, [item ids])."""
    out = []
    for line in conn.lrange('test:batch:runs', 0, -1):
        jid, _, ids = line.decode().split(' ')
        out.append((jid, [int(i) for i in ids.split(',')]))
    return out


def test_members_wait_parked_as_stock_rq_reads_them_and_size_forms_one_batch_job(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=3, max_wait=60)
    members = [member(q, 'acme', i, policy) for i in range(4)]
    assert [m.get_status(refresh=False) for m in members] == ['deferred'] * 4
    stock = Job.fetch(members[0].id, connection=connection)
    assert stock.get_status() == 'deferred' and stock.args == ({'shop': 'acme', 'id': 0},)
    assert set(DeferredJobRegistry('b', connection=connection).get_job_ids()) == {m.id for m in members}
    assert connection.llen(q.key) == 0
    got = fetch(connection)
    assert isinstance(got, Claim)
    batch = Job.fetch(got.job_id, connection=connection)
    assert batch.func_name == batch_jobs.collect.__module__ + '.collect'
    assert batch.args == ([{'shop': 'acme', 'id': 0}, {'shop': 'acme', 'id': 1}, {'shop': 'acme', 'id': 2}],)
    assert batch.kwargs == {} and batch.origin == 'b'
    assert [batch_of(m).id for m in members[:3]] == [batch.id] * 3
    assert batch_of(members[3]) is None and members[3].get_status() == 'deferred'
    # a formed member is a handle: it goes a day after its batch formed (the batch job holds its payload)
    assert all(0 < connection.ttl(m.key) <= MEMBER_TTL for m in members[:3]) and connection.ttl(members[3].key) == -1
    assert set(DeferredJobRegistry('b', connection=connection).get_job_ids()) == {members[3].id}
    assert connection.hget(batch.key, 'policies_batch') is None  # the batch job is no member: it is not parked
    assert isinstance(fetch(connection), Look)  # one member left, max_wait not passed: no batch


def test_max_wait_forms_a_smaller_batch_by_the_server_s_clock_and_an_idle_look_names_when(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=10, max_wait=0.6)
    first = member(q, 'acme', 1, policy)
    member(q, 'acme', 2, policy)
    admitted = float(connection.hget(first.key, 'batch_at'))
    look = fetch(connection)
    assert isinstance(look, Look)
    due = connection.zscore(keys.KEY_DUE, f'batch:{SCOPE}:acme')
    assert due == pytest.approx(admitted + 0.6, abs=1e-3)
    got = None
    deadline = time.monotonic() + 10
    while not isinstance(got, Claim) and time.monotonic() < deadline:
        got = fetch(connection)
        time.sleep(0.02)
    assert isinstance(got, Claim)
    seconds, micros = connection.time()
    assert seconds + micros / 1e6 >= admitted + 0.6
    assert Job.fetch(got.job_id, connection=connection).args == ([{'shop': 'acme', 'id': 1},
                                                                   {'shop': 'acme', 'id': 2}],)
    assert connection.exists(keys.KEY_DUE) == 0


def test_min_size_keeps_a_lone_member_waiting_past_max_wait_until_the_next_comes(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=5, max_wait=0.1, min_size=2)
    lone = member(q, 'acme', 1, policy)
    time.sleep(0.3)
    assert isinstance(fetch(connection), Look)
    assert connection.zscore(keys.KEY_DUE, f'batch:{SCOPE}:acme') is None  # nothing to look at until one more comes
    second = member(q, 'acme', 2, policy)
    got = fetch(connection)  # max_wait passed since the first: two wait, the batch forms at once
    assert isinstance(got, Claim)
    assert batch_of(lone).id == batch_of(second).id == got.job_id


def test_keys_batch_apart_and_each_member_goes_into_exactly_one_batch(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=4, max_wait=0.2)
    members = {(shop, i): member(q, shop, i, policy) for i in range(10) for shop in ('a', 'b', 'c')}
    worker = PolicySimpleWorker([q], connection=connection)
    worker.work(burst=True, max_jobs=100)
    done = runs(connection)
    assert sorted(len(ids) for _, ids in done) == [2, 2, 2, 4, 4, 4, 4, 4, 4]
    seen: dict[tuple[str, int], str] = {}
    for jid, ids in done:
        batch = Job.fetch(jid, connection=connection)
        shops = {item['shop'] for item in batch.args[0]}
        assert len(shops) == 1 and batch.get_status() == 'finished'
        for i in ids:
            key = (shops.pop() if not shops else next(iter(shops)), i)
            assert key not in seen
            seen[key] = jid
    assert set(seen) == set(members)
    for key, job in members.items():
        assert batch_of(job).id == seen[key]
    assert connection.exists(keys.KEY_DUE) == 0  # what Batch wrote is gone with its last member
    assert connection.llen(keys.KEY_PARKED_PREFIX('batch', f'{SCOPE}:a')) == 0
    assert connection.zcard(f'{RQ}:deferred:b') == 0


def test_a_cancelled_or_deleted_member_is_left_out_of_its_batch(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=3, max_wait=60)
    members = [member(q, 'acme', i, policy) for i in range(4)]
    members[0].cancel()
    members[1].delete()
    got = None
    members.append(member(q, 'acme', 4, policy))
    got = fetch(connection)
    assert isinstance(got, Claim)
    assert Job.fetch(got.job_id, connection=connection).args == ([{'shop': 'acme', 'id': i} for i in (2, 3, 4)],)
    assert batch_of(members[0]) is None


def test_a_member_s_status_reads_its_batch_job_s_and_explain_names_the_batch(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    first = member(q, 'acme', 1, policy)
    waiting = explain(first.id, connection)
    [entry] = [p for p in waiting['policies'] if p['policy'] == 'batch']
    assert entry['position'] == 0 and entry['waiting'] == 1 and 'waiting for its batch' in entry['verdict']
    second = member(q, 'acme', 2, policy)
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    batch = batch_of(first)
    assert batch.get_status() == 'finished' and batch.return_value() == 2
    [entry] = [p for p in explain(second.id, connection)['policies'] if p['policy'] == 'batch']
    assert entry['batch'] == batch.id and entry['batch_status'] == 'finished'
    assert f'member of batch job {batch.id} (status finished)' in entry['verdict']
    [entry] = [p for p in explain(batch.id, connection)['policies'] if p['policy'] == 'batch']
    assert entry['members'] == [first.id, second.id]


def test_a_failed_batch_is_retried_as_the_same_batch(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    members = [member(q, 'acme', i, policy, func=batch_jobs.fail_first, retry=Retry(max=1)) for i in range(2)]
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    batch = batch_of(members[0])
    assert connection.get('test:batch:failed') == b'2'  # failed once, then ran again
    assert batch.get_status() == 'finished'
    assert runs(connection) == [(batch.id, [0, 1])]
    assert batch_of(members[1]).id == batch.id


# -- bad input: an error naming the argument and the value, nothing written ------------------------------------------


@pytest.mark.parametrize('kwargs, argument', INVALID['batch'], ids=[f'{a}-{k}' for k, a in INVALID['batch']])
def test_bad_arguments_name_the_argument_and_the_value_and_write_nothing(connection, kwargs, argument):
    with pytest.raises(InvalidArgument, match=argument) as raised:
        Batch(**kwargs)
    assert raised.value.argument == argument
    if argument in kwargs:
        assert repr(kwargs[argument])[:3] in str(raised.value)
    assert connection.dbsize() == 0


@pytest.mark.parametrize('call', [
    lambda q, p: q.enqueue(batch_jobs.collect, {'shop': 'a', 'id': 1}, 2, policy=p),
    lambda q, p: q.enqueue(batch_jobs.collect, items={'shop': 'a', 'id': 1}, policy=p),
], ids=['two-args', 'kwargs'])
def test_a_member_that_is_not_one_payload_is_refused_and_nothing_is_written(connection, call):
    q = PolicyQueue('b', connection=connection)
    before = member(q, 'a', 0, Batch(key=batch_jobs.shop_of, size=5, max_wait=60))
    shape = {k: connection.dump(k) for k in connection.keys('*')}
    with pytest.raises(InvalidArgument, match='args'):
        call(q, Batch(key=lambda a, k: 'a', size=5, max_wait=60))
    assert {k: connection.dump(k) for k in connection.keys('*')} == shape
    assert before.get_status() == 'deferred'


def test_a_scheduled_member_another_serializer_and_a_batch_with_loner_are_refused(connection):
    from datetime import timedelta

    from rq_policies import Loner

    q = PolicyQueue('b', connection=connection)
    with pytest.raises(PolicyConfigurationError, match='scheduled'):
        q.enqueue_in(timedelta(seconds=5), batch_jobs.collect, {'shop': 'a', 'id': 1},
                     policy=Batch(key=batch_jobs.shop_of, size=2, max_wait=1))
    from rq.serializers import JSONSerializer

    with pytest.raises(PolicyConfigurationError, match='serializer'):
        PolicyQueue('b', connection=connection, serializer=JSONSerializer).enqueue(
            batch_jobs.collect, {'shop': 'a', 'id': 1}, policy=Batch(key=batch_jobs.shop_of, size=2, max_wait=1))
    with pytest.raises(PolicyConfigurationError, match='Loner'):
        q.enqueue(batch_jobs.collect, {'shop': 'a', 'id': 1},
                  policy=[Batch(key=batch_jobs.shop_of, size=2, max_wait=1), Loner()])
    assert connection.dbsize() == 0


# -- replays: the forming fetch and a member's admission with their replies lost --------------------------------------


def _proxied(fault_proxy):
    conn = Redis.from_url(fault_proxy.url, socket_timeout=0.5,
                          retry=RedisRetry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                          retry_on_error=[ConnectionError, TimeoutError])
    conn.ping()
    return conn


def test_a_forming_fetch_whose_reply_is_lost_forms_one_batch(connection, fault_proxy):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    members = [member(q, 'acme', i, policy) for i in range(5)]
    fetch(connection)  # loads the script past the proxy's count: the lost reply is the forming call's
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'EVAL')
        got = fetch(proxied)
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()
    # the first fetch formed and took members 0, 1; the replayed one answered its own claim: members 2, 3 once
    assert isinstance(got, Claim)
    assert Job.fetch(got.job_id, connection=connection).args == ([{'shop': 'acme', 'id': 2},
                                                                   {'shop': 'acme', 'id': 3}],)
    assert batch_of(members[2]).id == batch_of(members[3]).id == got.job_id
    assert batch_of(members[4]) is None
    assert connection.llen(keys.KEY_PARKED_PREFIX('batch', f'{SCOPE}:acme')) == 1
    batches = {connection.hget(m.key, 'batch_id') for m in members[:4]}
    assert len(batches) == 2 and connection.llen(q.key) == 0


def test_a_forming_fetch_that_takes_nothing_replayed_after_a_lost_reply_forms_nothing_again(connection, fault_proxy):
    """A fetch from another queue forms the key's batch (the due phase serves every key) and takes nothing, so no
    claim record answers its replay: the script runs again whole, and finds the batch's members gone from the key."""
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    members = [member(q, 'acme', i, policy) for i in range(3)]
    fetch(connection, ('other',))  # loads the script; forms the first batch (0, 1), takes nothing
    members.append(member(q, 'acme', 3, policy))  # (2, 3) are due now
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'EVAL')
        got = fetch(proxied, ('other',))
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()
    assert isinstance(got, Look)
    assert connection.llen(q.key) == 2
    formed = [j.decode() for j in connection.lrange(q.key, 0, -1)]
    assert [Job.fetch(j, connection=connection).args[0] for j in formed] == [
        [{'shop': 'acme', 'id': 0}, {'shop': 'acme', 'id': 1}], [{'shop': 'acme', 'id': 2}, {'shop': 'acme', 'id': 3}]]
    assert [batch_of(m).id for m in members] == [formed[0], formed[0], formed[1], formed[1]]
    assert connection.exists(keys.KEY_PARKED_PREFIX('batch', f'{SCOPE}:acme'), keys.KEY_DUE) == 0


def test_an_admission_whose_reply_is_lost_parks_the_member_once(connection, fault_proxy):
    proxied = _proxied(fault_proxy)
    try:
        q = PolicyQueue('b', connection=proxied)
        fault_proxy.drop_reply(match=b'EVAL')
        job = member(q, 'acme', 1, Batch(key=batch_jobs.shop_of, size=2, max_wait=60))
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()
    parked = connection.lrange(keys.KEY_PARKED_PREFIX('batch', f'{SCOPE}:acme'), 0, -1)
    assert parked == [job.id.encode()]
    assert connection.zcard(f'{RQ}:deferred:b') == 1


# -- composition ----------------------------------------------------------------------------------------------------


def test_other_policies_apply_to_each_member_at_the_door(connection):
    q = PolicyQueue('b', connection=connection)
    policy = [Batch(key=batch_jobs.shop_of, size=2, max_wait=60), Throttle(60)]
    first = member(q, 'acme', 1, policy)
    assert member(q, 'acme', 1, policy) is None  # the same payload within the window: dropped at the door
    second = member(q, 'acme', 2, policy)
    got = fetch(connection)
    assert isinstance(got, Claim) and batch_of(first).id == batch_of(second).id == got.job_id


def test_with_fair_a_batch_takes_its_key_s_turn(connection):
    q = PolicyQueue('b', connection=connection)
    fair = Fair(key=batch_jobs.shop_of, scope='shops')
    policy = [Batch(key=batch_jobs.shop_of, size=2, max_wait=60), fair]
    for i in range(4):
        for shop in ('a', 'b'):
            member(q, shop, i, policy)
    plain = [q.enqueue(batch_jobs.collect, {'shop': 'a', 'id': 100 + i}, policy=fair) for i in range(3)]
    assert Fair.waiting('b', 'shops', 'b', connection=connection) == []  # members are Batch's, not in a line
    order = []
    for _ in range(10):
        got = fetch(connection)
        if isinstance(got, Claim):
            order.append(got.job_id)
    assert len(order) == 4 + 3  # four batches of two, three plain Fair jobs
    shop_of = {}
    for jid in order:
        args = Job.fetch(jid, connection=connection).args[0]
        shop_of[jid] = args[0]['shop'] if isinstance(args, list) else args['shop']
    # the keys alternate while both wait: a batch is one start of its key, as a plain job is
    shops = [shop_of[j] for j in order]
    assert shops[:4] in (['a', 'b'] * 2, ['b', 'a'] * 2) and shops.count('a') == 5 and shops.count('b') == 2
    assert {j for j in order} >= {p.id for p in plain}


def test_with_concurrency_a_batch_costs_the_sum_of_its_members_costs(connection):
    q = PolicyQueue('b', connection=connection)
    policy = [Batch(key=batch_jobs.shop_of, size=2, max_wait=60),
              Concurrency(5, key=batch_jobs.shop_of, scope='shops')]
    for i in range(6):
        member(q, 'acme', i, policy)
    first, second = fetch(connection), fetch(connection)
    assert isinstance(first, Claim) and isinstance(second, Claim)
    assert connection.hget(Job.key_for(first.job_id), 'policies_concurrency') == b'5*2 shops:acme'
    assert [hold.policy for hold in first.holds] == ['concurrency']
    assert isinstance(fetch(connection), Look)  # 2 + 2 of 5 units held: the third batch (2 more) waits
    assert len(Concurrency.parked('shops', 'acme', connection=connection)) == 1
    assert Concurrency.status('shops', 'acme', connection=connection).in_use == 2  # two holds, of 2 units each
    from rq_policies.engine.fetch import release_claim

    release_claim(first, connection)
    assert wait_for(lambda: isinstance(fetch(connection), Claim), 5)


def test_a_batch_s_cost_is_at_most_its_key_s_limit(connection):
    q = PolicyQueue('b', connection=connection)
    policy = [Batch(key=batch_jobs.shop_of, size=3, max_wait=60),
              Concurrency(2, key=batch_jobs.shop_of, scope='shops')]
    for i in range(3):
        member(q, 'acme', i, policy)
    got = fetch(connection)
    assert isinstance(got, Claim)  # 3 members of cost 1: the batch costs 2, the whole key, not 3 (never)
    assert connection.hget(Job.key_for(got.job_id), 'policies_concurrency') == b'2*2 shops:acme'


def test_with_rate_a_batch_pays_the_sum_of_its_members_costs(connection):
    q = PolicyQueue('b', connection=connection)
    policy = [Batch(key=batch_jobs.shop_of, size=2, max_wait=60),
              Rate(4, per=3600, burst=4, key=batch_jobs.shop_of, scope='shops')]
    for i in range(6):
        member(q, 'acme', i, policy)
    first, second = fetch(connection), fetch(connection)
    assert isinstance(first, Claim) and isinstance(second, Claim)
    assert connection.hget(Job.key_for(first.job_id), 'policies_key_rate').decode().endswith('*2 shops:acme')
    assert isinstance(fetch(connection), Look)  # 4 starts' worth of the hour's burst paid: the third waits


def test_a_batch_job_is_created_and_enqueued_at_its_forming_by_the_server_s_clock(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    members = [member(q, 'acme', i, policy) for i in range(2)]
    before = connection.time()
    got = fetch(connection)
    after = connection.time()
    batch = Job.fetch(got.job_id, connection=connection)
    low, high = before[0] + before[1] / 1e6, after[0] + after[1] / 1e6
    assert low - 1e-6 <= batch.enqueued_at.timestamp() <= high + 1e-6
    assert batch.created_at == batch.enqueued_at
    assert float(connection.hget(batch.key, 'batch_formed_at')) == pytest.approx(batch.enqueued_at.timestamp(),
                                                                                  abs=1e-5)
    assert batch.enqueued_at.timestamp() >= float(connection.hget(members[1].key, 'batch_at'))


def test_the_page_s_job_view_names_a_member_s_batch_and_a_batch_s_members(connection):
    pytest.importorskip('flask', reason="the dashboard needs Flask: pip install 'rq-policies[dashboard]'")
    from rq_policies.surfaces.dashboard import create_app

    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    first, second = member(q, 'acme', 1, policy), member(q, 'acme', 2, policy)
    got = fetch(connection)
    client = create_app(connection).test_client()
    html = client.get(f'/job?id={first.id}').get_data(as_text=True)
    assert 'data-policy="batch"' in html and f'member of batch job {got.job_id}' in html
    html = client.get(f'/job?id={got.job_id}').get_data(as_text=True)
    assert 'data-policy="batch"' in html and 'a batch of 2 member(s)' in html and second.id in html


def test_idle_workers_are_told_when_a_key_s_batch_is_due_and_woken_when_it_fills(connection):
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=30)
    pubsub = connection.pubsub()
    pubsub.ssubscribe(keys.wake('b'))
    try:
        assert wait_for(lambda: (pubsub.get_sharded_message(timeout=0.1) or {}).get('type') == 'ssubscribe', 5)
        first = member(q, 'acme', 1, policy)
        told = pubsub.get_sharded_message(timeout=5)
        at = float(connection.hget(first.key, 'batch_at'))
        head, _, due = told['data'].decode().partition(' ')
        assert head == 'scheduled' and float(due) == pytest.approx(at + 30, abs=1e-3)  # the idle wait ends then
        second = member(q, 'acme', 2, policy)
        woken = pubsub.get_sharded_message(timeout=5)
        assert woken['data'].decode() == second.id  # the key filled: a push's wake-up, any idle worker looks now
    finally:
        pubsub.close()


def test_info_the_page_and_the_metrics_read_a_state_with_waiting_members_and_batches(connection):
    pytest.importorskip('flask', reason="the dashboard needs Flask: pip install 'rq-policies[dashboard]'")
    from rq_policies.surfaces import state
    from rq_policies.surfaces.dashboard import create_app
    from rq_policies.surfaces.metrics import PolicyCollector

    q = PolicyQueue('b', connection=connection)
    policy = [Batch(key=batch_jobs.shop_of, size=2, max_wait=60),
              Concurrency(5, key=batch_jobs.shop_of, scope='shops')]
    for i in range(3):
        member(q, 'acme', i, policy)
    assert isinstance(fetch(connection), Claim)  # one batch formed and taken, one member waiting
    snapshot = state.snapshot(connection, None)
    assert 'b' in snapshot['queues']
    client = create_app(connection).test_client()
    assert client.get('/').status_code == 200
    assert client.get('/state.json').status_code == 200
    assert list(PolicyCollector(connection).collect())


def test_a_member_met_on_its_queue_s_list_is_parked_again_not_run_alone(connection):
    """A member put back on its queue's list (by hand, rq's requeue): the fetch's admit_job parks it on its key again,
    and it goes into a batch like the others."""
    q = PolicyQueue('b', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)
    first = member(q, 'acme', 1, policy)
    parked = keys.KEY_PARKED_PREFIX('batch', f'{SCOPE}:acme')
    connection.lrem(parked, 0, first.id)
    connection.zrem(f'{RQ}:deferred:b', first.id)
    connection.hset(first.key, 'status', 'queued')
    connection.rpush(q.key, first.id)
    assert isinstance(fetch(connection), Look)
    assert first.get_status() == 'deferred' and connection.lrange(parked, 0, -1) == [first.id.encode()]
    second = member(q, 'acme', 2, policy)
    got = fetch(connection)
    assert isinstance(got, Claim) and batch_of(first).id == batch_of(second).id == got.job_id


def test_the_asyncio_door_parks_a_member_as_the_sync_door_does(connection, redis_url):
    import asyncio

    from rq_policies.surfaces.aio import AsyncPolicyQueue
    from tests.helpers.cluster import aconnect

    policy = Batch(key=batch_jobs.shop_of, size=2, max_wait=60)

    async def main():
        client = aconnect(redis_url)
        try:
            q = AsyncPolicyQueue('b', connection=client)
            return [await q.enqueue(batch_jobs.collect, {'shop': 'acme', 'id': i}, policy=policy) for i in range(2)]
        finally:
            await client.aclose()

    members = asyncio.run(main())
    assert [m.get_status(refresh=False) for m in members] == ['deferred', 'deferred']
    got = fetch(connection)
    assert isinstance(got, Claim)
    assert Job.fetch(got.job_id, connection=connection).args == ([{'shop': 'acme', 'id': 0},
                                                                   {'shop': 'acme', 'id': 1}],)
