"""Fair in one process: the admission script files a job in its key's line, the fetch script takes turns by virtual
time (fetched here as a worker's fetch makes it, so every start is counted exactly), the admin calls, and replays
through the fault proxy. Real forking workers: tests/fair/test_fair_workers.py."""

from __future__ import annotations

import multiprocessing

import pytest
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry
from rq.job import Job
from rq.registry import DeferredJobRegistry

from rq_policies import Concurrency, Fair, InvalidSetting, PolicyQueue, explain
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import Claim, Look
from rq_policies.engine.views import Shown
from rq_policies.policies.fair.rules import BacklogFull, FairPause, FairWeight
from rq_policies.policies.fair.views import FairViews
from tests.helpers import fair_jobs, fetches, jobs

SCOPE = fair_jobs.SCOPE



_tokens = iter(range(10**9))


def fetch(conn, names=('fair',)):
    return fetches.fetch(conn, f'h:fair:{next(_tokens)}', names)


def work(q, tenant, plan='free', **kwargs):
    return q.enqueue(fair_jobs.work, 't', tenant=tenant, plan=plan, **kwargs)


def take(conn, n, names=('fair',)):
    """The job ids of the next ``n`` fetches (None where a fetch took nothing)."""
    out = []
    for _ in range(n):
        got = fetch(conn, names)
        out.append(got.job_id if isinstance(got, Claim) else None)
    return out


def test_a_fair_job_waits_deferred_in_its_key_s_line_as_stock_rq_reads_it(connection):
    q = PolicyQueue('fair', connection=connection)
    job = work(q, 'acme')
    assert job.get_status(refresh=False) == 'deferred'
    stock = Job.fetch(job.id, connection=connection)
    assert stock.get_status() == 'deferred' and stock.origin == 'fair'
    assert stock.kwargs == {'tenant': 'acme', 'plan': 'free'}
    assert DeferredJobRegistry('fair', connection=connection).get_job_ids() == [job.id]
    assert connection.llen(q.key) == 0
    assert Fair.waiting('fair', SCOPE, 'acme', connection=connection) == [job.id]
    got = fetch(connection)
    assert isinstance(got, Claim) and got.job_id == job.id
    assert Job.fetch(job.id, connection=connection).get_status() == 'queued'  # the worker marks it started
    assert DeferredJobRegistry('fair', connection=connection).get_job_ids() == []
    assert isinstance(fetch(connection), Look)


def test_two_backlogged_keys_of_weights_3_and_1_start_3_to_1_in_every_window(connection):
    q = PolicyQueue('fair', connection=connection)
    tenant = {}
    for _ in range(300):
        tenant[work(q, 'pro', plan='pro').id] = 'pro'
    for _ in range(100):
        tenant[work(q, 'free').id] = 'free'
    order = [tenant[j] for j in take(connection, 400)]
    for start in range(0, 400 - 40 + 1):
        window = order[start:start + 40]
        assert 29 <= window.count('pro') <= 31, (start, ''.join('P' if t == 'pro' else 'f' for t in window))
    assert order.count('pro') == 300


def test_a_newcomer_behind_5000_jobs_of_another_key_starts_within_one_round(connection):
    q = PolicyQueue('fair', connection=connection)
    for _ in range(5000):
        work(q, 'big')
    take(connection, 7)
    for _ in range(20):
        job = work(q, 'small')
        waited = take(connection, 2)
        assert job.id in waited, 'a newcomer waited more than one round (2 keys active)'
    assert Fair.status(SCOPE, 'big', 'fair', connection=connection).waiting == 5000 - 7 - 20


def test_each_key_of_many_starts_once_per_round(connection):
    q = PolicyQueue('fair', connection=connection)
    tenant = {}
    for _ in range(20):
        for i in range(10):
            tenant[work(q, f'k{i}').id] = f'k{i}'
    order = [tenant[j] for j in take(connection, 200)]
    for r in range(20):
        assert sorted(order[10 * r:10 * r + 10]) == sorted(f'k{i}' for i in range(10)), r


def test_priority_within_a_key_higher_first_fifo_among_equals_and_keys_still_take_turns(connection):
    q = PolicyQueue('fair', connection=connection)
    low = work(q, 'a', priority=-5)
    plain = [work(q, 'a') for _ in range(2)]
    high = [work(q, 'a', priority=10) for _ in range(2)]
    other = work(q, 'b')
    got = take(connection, 6)
    assert got[0] == high[0].id and other.id in got[:2]
    assert [j for j in got if j != other.id] == [high[0].id, high[1].id, plain[0].id, plain[1].id, low.id]
    assert got.index(other.id) == 1


def test_priority_from_the_policy_s_function_and_the_enqueue_s_wins(connection):
    q = PolicyQueue('fair', connection=connection)
    calm = q.enqueue(fair_jobs.ranked, 't', tenant='a')
    urgent = q.enqueue(fair_jobs.ranked, 't', tenant='a', urgency=50)
    forced_low = q.enqueue(fair_jobs.ranked, 't', tenant='a', urgency=50, priority=-1)
    assert take(connection, 3) == [urgent.id, calm.id, forced_low.id]


def test_priority_on_enqueue_never_reaches_the_function_and_bad_values_name_the_argument(connection):
    q = PolicyQueue('fair', connection=connection)
    job = work(q, 'a', priority=3)
    assert 'priority' not in Job.fetch(job.id, connection=connection).kwargs
    for bad in (1.5, True, 1001, '3'):
        with pytest.raises(ValueError, match='priority'):
            work(q, 'a', priority=bad)
    with pytest.raises(ValueError, match='weight'):
        q.enqueue(fair_jobs.work, 't', tenant='a', policy=Fair(key=lambda a, k: k['tenant'],
                                                                weight=lambda a, k: 0))
    with pytest.raises(TypeError, match='key'):
        q.enqueue(fair_jobs.work, 't', tenant=['a'])
    assert Fair.waiting('fair', SCOPE, 'a', connection=connection) == [job.id]
    # Without Fair declared, priority= is the function's own keyword, as with stock rq.
    plain = q.enqueue(jobs.record, 'p', priority=2, policy=None)
    assert Job.fetch(plain.id, connection=connection).kwargs == {'priority': 2}


def test_a_queue_s_plain_jobs_come_first_then_the_keys_take_turns(connection):
    q = PolicyQueue('fair', connection=connection)
    fair = [work(q, 'a') for _ in range(2)]
    plain = [q.enqueue(jobs.plain, i) for i in range(2)]
    assert take(connection, 5) == [plain[0].id, plain[1].id, fair[0].id, fair[1].id, None]


def test_pause_keeps_a_key_s_jobs_waiting_others_flow_and_resume_brings_it_back(connection):
    q = PolicyQueue('fair', connection=connection)
    a = [work(q, 'a') for _ in range(3)]
    b = [work(q, 'b') for _ in range(3)]
    assert Fair.pause(SCOPE, 'a', connection=connection) is True
    assert Fair.pause(SCOPE, 'a', connection=connection) is False
    later = work(q, 'a')  # admitted while paused: it waits too
    assert take(connection, 4) == [b[0].id, b[1].id, b[2].id, None]
    status = Fair.status(SCOPE, 'a', 'fair', connection=connection)
    assert status.paused and not status.active and status.waiting == 4
    assert all(Job.fetch(j.id, connection=connection).get_status() == 'deferred' for j in a + [later])
    entry = explain(later.id, connection=connection)
    fair_entry = next(e for e in entry['policies'] if e['policy'] == 'fair')
    assert fair_entry['paused'] and '4th in line' in fair_entry['verdict'] and 'a paused' in fair_entry['verdict']
    assert Fair.resume(SCOPE, 'a', connection=connection) is True
    assert Fair.resume(SCOPE, 'a', connection=connection) is False
    assert take(connection, 5) == [a[0].id, a[1].id, a[2].id, later.id, None]


def test_pause_status_counts_a_key_s_waiting_jobs_on_every_queue_even_once_it_left_the_active_sets(connection):
    one, two = PolicyQueue('fair', connection=connection), PolicyQueue('fair2', connection=connection)
    made = [work(one, 'a'), work(one, 'a'), work(two, 'a'), work(one, 'b')]
    assert Fair.pause_status(SCOPE, 'a', connection=connection) == FairPause(False, {'fair': 2, 'fair2': 1})
    assert Fair.pause_status(SCOPE, 'nobody', connection=connection) == FairPause(False, {})
    Fair.pause(SCOPE, 'a', connection=connection)
    # the fetches meet the paused key and take it out of both queues' active sets (it is noted in its pausedin set)
    assert take(connection, 2) == [made[3].id, None] and take(connection, 1, ('fair2',)) == [None]
    assert not connection.zscore('rq:policies:fair:active:fair2', f'{SCOPE}:a')
    assert Fair.pause_status(SCOPE, 'a', connection=connection) == FairPause(True, {'fair': 2, 'fair2': 1})
    before = {k: connection.dump(k) for k in connection.keys('*')}
    with pytest.raises(InvalidSetting, match='scope must be'):
        Fair.pause_status('a:b', 'a', connection=connection)
    with pytest.raises(InvalidSetting, match='key must be'):
        Fair.pause_status(SCOPE, 'x' * 1001, connection=connection)
    assert {k: connection.dump(k) for k in connection.keys('*')} == before


def test_a_resumed_key_joins_at_the_queue_s_virtual_time_without_credit(connection):
    q = PolicyQueue('fair', connection=connection)
    tenant = {}
    for t in ('a', 'b'):
        for _ in range(60):
            tenant[work(q, t).id] = t
    Fair.pause(SCOPE, 'a', connection=connection)
    take(connection, 40)  # b alone: its virtual time runs ahead
    Fair.resume(SCOPE, 'a', connection=connection)
    order = [tenant[j] for j in take(connection, 20)]
    assert order.count('a') in (10, 11), ''.join(order)  # turns alternate: no burst of a's paused-time credit


def test_a_weight_set_at_run_time_wins_and_clear_restores_the_declared_one(connection):
    q = PolicyQueue('fair', connection=connection)
    tenant = {}
    for t in ('a', 'b'):
        for _ in range(100):
            tenant[work(q, t).id] = t
    assert Fair.set(SCOPE, 'a', 4, connection=connection) == FairWeight(4)
    assert Fair.get(SCOPE, 'a', connection=connection) == FairWeight(4)
    order = [tenant[j] for j in take(connection, 50)]
    assert 39 <= order.count('a') <= 41, ''.join(order)
    assert Fair.clear(SCOPE, 'a', connection=connection) is True
    assert Fair.clear(SCOPE, 'a', connection=connection) is False
    assert Fair.get(SCOPE, 'a', connection=connection) is None
    order = [tenant[j] for j in take(connection, 40)]
    assert 19 <= order.count('a') <= 21, ''.join(order)
    for bad, argument in ((0, 'weight'), (1001, 'weight'), (2.0, 'weight')):
        with pytest.raises(InvalidSetting, match=argument):
            Fair.set(SCOPE, 'a', bad, connection=connection)
    with pytest.raises(InvalidSetting, match='scope'):
        Fair.set('a:b', 'a', 2, connection=connection)
    assert Fair.get(SCOPE, 'a', connection=connection) is None


def test_a_deleted_or_cancelled_waiting_job_is_skipped_without_using_its_key_s_turn(connection):
    q = PolicyQueue('fair', connection=connection)
    a = [work(q, 'a') for _ in range(3)]
    b = [work(q, 'b') for _ in range(2)]
    a[0].delete()
    a[1].cancel()
    assert take(connection, 4) == [a[2].id, b[0].id, b[1].id, None]


def test_what_fair_writes_is_freed_when_its_lines_drain(connection):
    q = PolicyQueue('fair', connection=connection)
    for t in ('a', 'b'):
        for _ in range(3):
            work(q, t)
    take(connection, 6)
    left = [k.decode() for k in connection.keys(f'{RQ}:policies:fair:*')]
    assert left == [], left
    assert connection.zcard(f'{RQ}:deferred:fair') == 0


def _produce(url, barrier, results):
    from rq_policies import PolicyQueue

    conn = Redis.from_url(url)
    q = PolicyQueue('fair', connection=conn)
    barrier.wait()
    admitted = 0
    for _ in range(20):
        if q.enqueue(fair_jobs.capped, 'race', tenant='x') is not None:
            admitted += 1
    conn.close()
    results.put(admitted)


def test_max_waiting_under_16_racing_producers_never_exceeds_the_cap(connection, redis_url):
    ctx = multiprocessing.get_context('fork')
    barrier, results = ctx.Barrier(16), ctx.Queue()
    procs = [ctx.Process(target=_produce, args=(redis_url, barrier, results)) for _ in range(16)]
    for p in procs:
        p.start()
    admitted = sum(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    assert admitted == 25
    assert len(Fair.waiting('fair', 'capped', 'x', connection=connection)) == 25
    assert int(connection.hget(f'{RQ}:policies:drops', 'fair:fair') or 0) == 16 * 20 - 25
    # One start frees one place in the line.
    assert isinstance(fetch(connection), Claim)
    q = PolicyQueue('fair', connection=connection)
    assert q.enqueue(fair_jobs.capped, 'race', tenant='x') is not None
    assert q.enqueue(fair_jobs.capped, 'race', tenant='x') is None
    assert q.enqueue(fair_jobs.capped, 'race', tenant='y') is not None  # another key has its own cap


def test_max_waiting_with_on_conflict_raise_raises_backlog_full_and_writes_nothing(connection):
    q = PolicyQueue('fair', connection=connection)
    made = [q.enqueue(fair_jobs.raising, 't', tenant='x') for _ in range(3)]
    before = set(connection.keys('*'))
    with pytest.raises(BacklogFull) as info:
        q.enqueue(fair_jobs.raising, 't', tenant='x')
    assert info.value.waiting == 3 and info.value.first == made[0].id and info.value.queue == 'fair'
    assert info.value.scope == 'raising' and 'max_waiting' in str(info.value)
    new = {k.decode() for k in set(connection.keys('*')) - before}
    assert all(k.startswith(f'{RQ}:policies:drops') for k in new), new  # only the drop counters
    assert len(Fair.waiting('fair', 'raising', 'x', connection=connection)) == 3


def test_explain_key_rows_info_and_panels_show_each_key_s_line_and_share(connection):
    q = PolicyQueue('fair', connection=connection)
    for _ in range(3):
        work(q, 'acme', plan='pro')
    jobs_b = [work(q, 'beta') for _ in range(4)]
    Fair.pause(SCOPE, 'gamma', connection=connection)
    work(q, 'gamma')
    fetch(connection)  # gamma leaves the active set when met... or stays off: it was paused at admission
    entry = next(e for e in explain(jobs_b[2].id, connection=connection)['policies'] if e['policy'] == 'fair')
    assert '3rd in line' in entry['verdict'] and '2 key(s) taking turns' in entry['verdict'], entry['verdict']
    assert entry['weight'] == 1 and entry['active_keys'] == 2
    rows = {r['key']: r for r in FairViews.key_rows(connection, 'fair')}
    assert rows[f'{SCOPE}:acme']['share'] == pytest.approx(0.75) and rows[f'{SCOPE}:beta']['share'] == 0.25
    assert rows[f'{SCOPE}:gamma']['paused'] and rows[f'{SCOPE}:gamma']['waiting'] == 1
    panels = FairViews.panels(connection, 0.0, 20)
    assert panels and panels[0]['title'] == 'Fair share: fair'
    assert [row[3] for row in panels[0]['rows'] if row[0] == f'{SCOPE}:acme'] == ['75%']
    state = FairViews.cluster_info(connection, 0.0, 20)
    lines = state.rows(Shown(0.0))
    assert any('beta' in line and 'share 25%' in line for line in lines), lines


def test_a_key_at_its_concurrency_limit_never_stalls_the_other_keys(connection):
    fair = Fair(key=lambda a, k: a[0], scope='shared')
    limited = [fair, Concurrency(1, key=lambda a, k: a[0], scope='shared')]
    q = PolicyQueue('fair', connection=connection)
    a = [q.enqueue(jobs.plain, 'a', policy=limited) for _ in range(3)]
    b = [q.enqueue(jobs.plain, 'b', policy=fair) for _ in range(3)]
    # a starts, b starts; each later turn of a hands its job to a's Concurrency line (a is at its limit: parked,
    # first in that line) and the same fetch goes on to b.
    assert take(connection, 5) == [a[0].id, b[0].id, b[1].id, b[2].id, None]
    assert Concurrency.parked('shared', 'a', connection=connection) == [a[1].id, a[2].id]


# -- replays: every Fair script with its reply lost, through the fault proxy -----------------------------------


def _proxied(fault_proxy):
    from rq_policies.engine import scripts

    server = Redis(*fault_proxy.target)  # past the proxy: loading counts as no request of the test's
    for name in ('fair_pause', 'clear_setting'):  # a NOSCRIPT answer ran nothing: its lost reply tests no replay
        server.script_load(scripts.script(name).script)
    server.close()
    conn = Redis.from_url(fault_proxy.url, socket_timeout=0.5, retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                          retry_on_error=[ConnectionError, TimeoutError])
    conn.ping()
    return conn


def test_an_admission_whose_reply_is_lost_files_the_job_once(connection, fault_proxy):
    proxied = _proxied(fault_proxy)
    try:
        q = PolicyQueue('fair', connection=proxied)
        fault_proxy.drop_reply(match=b'EVAL')
        job = work(q, 'a', priority=2)
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()
    assert Fair.waiting('fair', SCOPE, 'a', connection=connection) == [job.id]
    assert connection.zcard(f'{RQ}:deferred:fair') == 1
    assert connection.get(f'{RQ}:policies:fair:seq:fair:{SCOPE}:a') == b'1'
    assert take(connection, 2) == [job.id, None]


def test_a_fetch_whose_reply_is_lost_takes_one_job_of_the_line(connection, fault_proxy):
    q = PolicyQueue('fair', connection=connection)
    a = [work(q, 'a') for _ in range(3)]
    b = work(q, 'b')
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'EVAL')
        got = fetch(proxied)
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()
    assert got.job_id == a[0].id
    assert Fair.waiting('fair', SCOPE, 'a', connection=connection) == [a[1].id, a[2].id]
    assert take(connection, 4) == [b.id, a[1].id, a[2].id, None]  # a's one turn was charged once


def test_a_pause_and_a_resume_whose_replies_are_lost_act_once(connection, fault_proxy):
    q = PolicyQueue('fair', connection=connection)
    a = [work(q, 'a') for _ in range(2)]
    b = work(q, 'b')
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'EVAL')
        # the replay answers what the first attempt did: the key was not paused yet (it said False before)
        assert Fair.pause(SCOPE, 'a', connection=proxied) is True
        assert take(connection, 2) == [b.id, None]
        fault_proxy.drop_reply(match=b'EVAL')
        assert Fair.resume(SCOPE, 'a', connection=proxied) is True  # it was paused
        assert fault_proxy.seen(b'EVAL') >= 4
        assert Fair.resume(SCOPE, 'a', connection=proxied) is False  # a new call: not paused any more
    finally:
        proxied.close()
    assert connection.zcard(f'{RQ}:policies:fair:active:fair') == 1
    assert take(connection, 3) == [a[0].id, a[1].id, None]


def test_a_pause_already_in_force_replayed_after_a_lost_reply_still_says_so(connection, fault_proxy):
    """The answer kept is the first run's, whichever it was: a pause of a paused key says False on its replay too."""
    Fair.pause(SCOPE, 'a', connection=connection)
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'EVAL')
        assert Fair.pause(SCOPE, 'a', connection=proxied) is False
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()


def test_a_weight_clear_whose_reply_is_lost_answers_true_once(connection, fault_proxy):
    Fair.set(SCOPE, 'weighty', 5, connection=connection)
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'weighty')  # the clear (a bare HDEL before, now lua/clear_setting.lua)
        assert Fair.clear(SCOPE, 'weighty', connection=proxied) is True  # the HDEL's replay said False
        assert fault_proxy.seen(b'weighty') >= 2
        assert Fair.clear(SCOPE, 'weighty', connection=proxied) is False
    finally:
        proxied.close()
    assert Fair.get(SCOPE, 'weighty', connection=connection) is None


def _cli(*args, env):
    import subprocess
    import sys

    return subprocess.run([sys.executable, '-m', 'rq_policies', *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_fair_commands_pause_resume_weight_keys_and_info(connection, worker_env):
    q = PolicyQueue('fair', connection=connection)
    for t in ('acme', 'beta'):
        work(q, t)
    paused = _cli('fair', 'pause', SCOPE, 'acme', env=worker_env)
    assert paused.returncode == 0 and 'paused' in paused.stdout, paused.stderr
    assert Fair.status(SCOPE, 'acme', 'fair', connection=connection).paused
    weight = _cli('fair', 'weight', SCOPE, 'beta', '4', env=worker_env)
    assert weight.returncode == 0 and Fair.get(SCOPE, 'beta', connection=connection) == FairWeight(4)
    bad = _cli('fair', 'weight', SCOPE, 'beta', '0', env=worker_env)
    assert bad.returncode != 0 and 'weight' in bad.stderr
    shown = _cli('fair', 'keys', 'fair', env=worker_env)
    assert f'key {SCOPE}:beta  1 waiting, weight 4 (set at run time), share 100%' in shown.stdout, shown.stdout
    assert f'key {SCOPE}:acme  1 waiting' in shown.stdout and 'paused' in shown.stdout
    info = _cli('info', env=worker_env)
    assert info.returncode == 0 and 'Fair on queue fair' in info.stdout, info.stdout + info.stderr
    resumed = _cli('fair', 'resume', SCOPE, 'acme', env=worker_env)
    assert resumed.returncode == 0 and not Fair.status(SCOPE, 'acme', 'fair', connection=connection).paused


def test_the_asyncio_door_takes_priority_out_of_the_call_too(connection, redis_url):
    import asyncio

    from redis.asyncio import Redis as AsyncRedis

    from rq_policies.surfaces.aio import AsyncPolicyQueue

    async def main():
        client = AsyncRedis.from_url(redis_url)
        q = AsyncPolicyQueue('fair', connection=client)
        low = await q.enqueue(fair_jobs.work, 't', tenant='a')
        high = await q.enqueue(fair_jobs.work, 't', tenant='a', priority=7)
        await client.aclose()
        return low, high

    low, high = asyncio.run(main())
    assert 'priority' not in Job.fetch(high.id, connection=connection).kwargs
    assert take(connection, 2) == [high.id, low.id]


def test_a_handed_back_fair_job_goes_back_to_its_key_s_line_its_pause_and_its_priority_hold(connection):
    """A Fair job taken by a fetch whose worker died before the start is handed back (lua/hand_back.lua) to the head
    of its queue's list; the next fetch meets it there and files it again in its key's line (issue 31's history
    run: such a job started during its key's pause, and ahead of its key's higher-priority jobs): while the key is
    paused it waits deferred, and once resumed it starts by its priority among its key's jobs."""
    from rq_policies.engine import keys
    from rq_policies.engine.fetch import hand_back

    q = PolicyQueue('fair', connection=connection)
    low = work(q, 'a', priority=1)
    token = 'h:fair:died'
    got = fetches.fetch(connection, token, ['fair'])
    assert isinstance(got, Claim) and got.job_id == low.id
    high = work(q, 'a', priority=5)
    connection.delete(keys.claim(token))  # its claim lapses: the taker died between its fetch and the start
    assert Fair.pause(SCOPE, 'a', connection=connection) is True
    assert hand_back(connection, [q]) == [(low.id, 'fair')]
    assert connection.lrange(q.key, 0, -1) == [low.id.encode()]
    assert take(connection, 2) == [None, None]  # paused: the handed-back job is filed in its line, not run
    assert connection.llen(q.key) == 0
    assert Job.fetch(low.id, connection=connection).get_status() == 'deferred'
    assert set(DeferredJobRegistry('fair', connection=connection).get_job_ids()) == {low.id, high.id}
    assert Fair.status(SCOPE, 'a', 'fair', connection=connection).waiting == 2
    assert Fair.resume(SCOPE, 'a', connection=connection) is True
    assert take(connection, 3) == [high.id, low.id, None]  # its priority, among its key's jobs


def test_a_fair_job_requeued_by_stock_rq_is_filed_in_its_key_s_line(connection):
    """The same for a Fair job put back on its queue's list by anything else (``rq requeue`` of a failed Fair job,
    rq's own cleanup retrying it): filed in its key's line, under its key's turn and pause."""
    q = PolicyQueue('fair', connection=connection)
    a = work(q, 'a')
    assert take(connection, 1) == [a.id]
    connection.lrem(q.intermediate_queue_key, 1, a.id)
    connection.hset(a.key, 'status', 'queued')
    connection.lpush(q.key, a.id)  # as rq's requeue leaves it
    assert Fair.pause(SCOPE, 'a', connection=connection) is True
    assert take(connection, 1) == [None]
    assert Job.fetch(a.id, connection=connection).get_status() == 'deferred'
    assert Fair.resume(SCOPE, 'a', connection=connection) is True
    assert take(connection, 2) == [a.id, None]


def test_a_fetch_that_files_a_handed_back_job_and_whose_reply_is_lost_files_it_once(connection, fault_proxy):
    """The fetch that meets a handed-back Fair job on the list files it in its key's line, and its reply is lost:
    the replay finds the job in the line once (not twice, not back on the list), and each job of the key starts once,
    in its line's order."""
    q = PolicyQueue('fair', connection=connection)
    a = [work(q, 'a') for _ in range(2)]
    assert take(connection, 1) == [a[0].id]
    connection.lrem(q.intermediate_queue_key, 1, a[0].id)
    connection.lpush(q.key, a[0].id)  # back on the list, as a hand-back or rq's requeue leaves it
    assert Fair.pause(SCOPE, 'a', connection=connection) is True  # the fetch files it and takes nothing
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'EVAL')
        assert isinstance(fetch(proxied), Look)
        assert fault_proxy.seen(b'EVAL') >= 2
    finally:
        proxied.close()
    assert connection.llen(q.key) == 0
    assert Fair.waiting('fair', SCOPE, 'a', connection=connection) == [a[0].id, a[1].id]
    assert Fair.resume(SCOPE, 'a', connection=connection) is True
    assert take(connection, 3) == [a[0].id, a[1].id, None]
