"""Rate per key: the fetch script's GCRA per key, its parking and unparking, and real forking PolicyWorkers.

The end-to-end jobs record their start under the server's clock, per key (tests/helpers/key_jobs.py), so the window
bound is checked on what actually started.
"""

from __future__ import annotations

import time

import pytest

from rq_policies import Concurrency, PolicyQueue, Rate, explain
from rq_policies.engine import keys
from rq_policies.engine.fetch import Claim, Look, release_claim
from rq_policies.policies.rate.views import RateViews
from tests.helpers import fetches, key_jobs
from tests.helpers.workers import output, start_worker, stop, wait_for

SHOP_SCOPE = 'tests.helpers.key_jobs.per_shop'


def fetch(conn, token, names=('rate',)):
    return fetches.fetch(conn, token, names)


def test_the_rate_and_key_are_stored_on_the_job(connection):
    q = PolicyQueue('rate', connection=connection)
    job = q.enqueue(key_jobs.per_shop, 't', shop='s1')
    assert connection.hget(job.key, 'policies_key_rate') == f'5 1 2 {SHOP_SCOPE}:s1'.encode()


def test_bad_arguments_name_the_argument(connection):
    with pytest.raises(ValueError, match='burst'):
        Rate(5, burst=6)
    with pytest.raises(ValueError, match='per'):
        Rate(5, per=0)
    with pytest.raises(TypeError, match='key'):
        Rate(5, key='shop')
    q = PolicyQueue('rate', connection=connection)
    with pytest.raises(TypeError, match='1.5'):
        q.enqueue(key_jobs.per_shop, 't', shop=1.5)
    assert connection.dbsize() == 0


def test_a_key_over_its_rate_parks_its_jobs_and_gives_them_back_when_the_rate_allows(connection):
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='a') for _ in range(5)]
    other = q.enqueue(key_jobs.per_shop, 't', shop='b')
    got = [fetch(connection, f'h:1:0:{i}') for i in range(4)]
    assert [g.job_id for g in got[:3]] == [made[0].id, made[1].id, other.id]  # the burst of 2, then the other key
    assert isinstance(got[3], Look) and got[3].until is not None
    assert Rate.parked(SHOP_SCOPE, 'a', connection=connection) == [j.id for j in made[2:]]
    assert made[2].get_status() == 'deferred'
    assert got[0].holds == ()  # a rate takes no hold
    status = Rate.status(SHOP_SCOPE, 'a', connection=connection)  # the parked jobs' declared 5/1s burst 2
    assert status.available == 0 and status.next_at > 0
    # one start every 0.2 s from now: the parked jobs come back in their order, one per emission interval
    started = []
    deadline = time.monotonic() + 5
    n = 0
    while len(started) < 3 and time.monotonic() < deadline:
        n += 1
        found = fetch(connection, f'h:1:1:{n}')
        if isinstance(found, Claim):
            started.append((found.job_id, time.monotonic()))
        else:
            time.sleep(0.02)
    assert [job_id for job_id, _ in started] == [j.id for j in made[2:]]
    assert connection.exists(keys.KEY_DUE) == 0
    assert connection.hget(made[2].key, 'policies_key_rate_paid') is None  # the paid mark goes with the start


def test_a_refusal_by_one_per_key_policy_consumes_nothing_of_another(connection):
    q = PolicyQueue('rate', connection=connection)
    first = q.enqueue(key_jobs.both_limits, 't', customer='c1', shop='s1')
    same_customer = q.enqueue(key_jobs.both_limits, 't', customer='c1', shop='s2')
    same_shop = q.enqueue(key_jobs.both_limits, 't', customer='c2', shop='s1')
    taken = fetch(connection, 'h:2:0:1')
    assert taken.job_id == first.id
    tat_s1 = connection.get(keys.KEY_TAT_PREFIX + 'both:s1')
    assert isinstance(fetch(connection, 'h:2:0:2'), Look)
    # Refused by its customer's Concurrency: shop s2's rate was not consumed.
    assert Concurrency.parked('both', 'c1', connection=connection) == [same_customer.id]
    assert connection.get(keys.KEY_TAT_PREFIX + 'both:s2') is None
    # Refused by shop s1's rate: customer c2 holds nothing.
    assert Rate.parked('both', 's1', connection=connection) == [same_shop.id]
    assert Concurrency.status('both', 'c2', connection=connection).in_use == 0
    assert connection.get(keys.KEY_TAT_PREFIX + 'both:s1') == tat_s1
    # The customer's release gives its job back; now its shop's rate allows it (s2 was never used), and it runs.
    release_claim(taken, connection)
    again = fetch(connection, 'h:2:1:1')
    assert again.job_id == same_customer.id


def test_explain_says_when_the_next_start_is_allowed(connection):
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='acme') for _ in range(3)]
    fetch(connection, 'h:3:0:1')
    fetch(connection, 'h:3:0:2')
    assert isinstance(fetch(connection, 'h:3:0:3'), Look)
    part = next(p for p in explain(made[2].id, connection)['policies'] if p['policy'] == 'key_rate')
    assert 'next start allowed in' in part['verdict'] and '(parked, position 1)' in part['verdict']
    rows = RateViews.key_rows(connection, SHOP_SCOPE)
    assert [(r['key'], r['parked']) for r in rows] == [('acme', 1)]
    (panel,) = RateViews.panels(connection, connection.time()[0], 10)
    assert panel['rows'][0][:2] == ['acme', 1]


def test_every_window_of_every_key_stays_within_the_rate_with_real_workers(connection, redis_url, worker_env):
    q = PolicyQueue('rate', connection=connection)
    shops = ['s0', 's1', 's2']
    for n in range(30):
        q.enqueue(key_jobs.per_shop, 'win', shop=shops[n % 3])
    workers = [start_worker(redis_url, ['rate'], worker_env, worker_class='tests.helpers.key_jobs.FetchTimesWorker')
               for _ in range(4)]
    try:
        assert wait_for(lambda: sum(len(v) for v in key_jobs.spans(connection, 'win').values()) == 60, 60), \
            output(workers[0])
    finally:
        for w in workers:
            stop(w)
    fetched = key_jobs.fetch_times(connection)
    assert sorted(fetched) == shops
    for shop in shops:
        # The rate decides on the fetch script's clock, which lies within each fetch's (before, after) interval: a
        # window is over its bound only when more fetches than the bound surely fell inside it.
        spans = sorted(fetched[shop])
        assert len(spans) == 10  # every key progressed to the end
        for window in (1.0, 2.0):
            bound = 5 * window / 1 + 2  # limit * window / per + burst
            for start, _ in spans:
                surely_inside = sum(1 for before, after in spans if before >= start and after < start + window)
                assert surely_inside <= bound, (shop, window, surely_inside, spans)
        # ... and the rate held them back: ten starts at 5 a second, burst 2, take at least 8 intervals of 0.2 s
        # (the latest end of a fetch less the earliest start of one bounds the true spread from above)
        assert max(after for _, after in spans) - min(before for before, _ in spans) >= (10 - 2) * 0.2 - 0.01, spans


# -- cost (Rate(cost=)): a job uses `cost` starts of its key's rate ------------------------------------------------


def _shop(args, kwargs):
    return kwargs['shop']


def test_a_costed_job_moves_its_key_s_rate_on_by_its_cost_and_parked_ones_pay_theirs(connection):
    costed = Rate(10, per=1, burst=10, key=_shop, scope='costed', cost=4)
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='a', policy=costed) for _ in range(5)]
    other = q.enqueue(key_jobs.per_shop, 't', shop='b', policy=costed)
    assert connection.hget(made[0].key, 'policies_key_rate') == b'10 1 10*4 costed:a'
    got = [fetch(connection, f'h:c:0:{i}') for i in range(5)]
    # A start is allowed while the key's rate has one; each moves it on by 4 intervals (0.4 s): a full bucket of 10
    # takes 3 jobs of cost 4, then the key waits; the other key is not touched.
    assert [g.job_id for g in got[:4]] == [made[0].id, made[1].id, made[2].id, other.id]
    assert isinstance(got[4], Look)
    assert Rate.parked('costed', 'a', connection=connection) == [made[3].id, made[4].id]
    started, n, deadline = [], 0, time.monotonic() + 5
    while len(started) < 2 and time.monotonic() < deadline:
        n += 1
        found = fetch(connection, f'h:c:1:{n}')
        if isinstance(found, Claim):
            started.append(time.monotonic())
        else:
            time.sleep(0.01)
    assert len(started) == 2
    assert started[1] - started[0] >= 0.3, started  # the second parked job waited for the first one's cost (0.4 s)


def test_a_cost_above_the_limit_is_refused_naming_it_and_nothing_is_written(connection):
    with pytest.raises(ValueError, match='cost'):
        Rate(5, cost=6)
    with pytest.raises(ValueError, match='cost'):
        Rate(5, cost=0)
    q = PolicyQueue('rate', connection=connection)
    by_call = Rate(5, key=_shop, cost=lambda a, k: 7)
    with pytest.raises(ValueError, match='cost'):
        q.enqueue(key_jobs.per_shop, 't', shop='a', policy=by_call)
    assert connection.dbsize() == 0
