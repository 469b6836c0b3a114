"""Rate per key with several windows (``Rate(windows=[(limit, per), (limit, per, burst), ...], key=...)``): the job
field, bad input, parking by whichever window holds (and ``explain`` naming it), unparking paid in every window, cost,
the run-time setting, lost replies, and real forking PolicyWorkers.
"""

from __future__ import annotations

import time

import pytest
from rq.queue import Queue

from rq_policies import InvalidArgument, InvalidSetting, KeyRate, PolicyQueue, Rate, RateWindow, explain
from rq_policies.engine import keys
from rq_policies.engine.admin import read_tats
from rq_policies.engine.fetch import Claim, FetchReply, Look, fetch_call
from rq_policies.policies.rate.views import RateViews
from tests.helpers import fetches, key_jobs
from tests.helpers.records import server_now
from tests.helpers.workers import output, start_worker, stop, wait_for

SHOP_SCOPE = 'tests.helpers.key_jobs.per_shop'


def _shop(args, kwargs):
    return kwargs['shop']


def fetch(conn, token, names=('rate',)):
    return fetches.fetch(conn, token, names)


def dump(conn):
    """Every key and its value, but the answers admin calls keep a minute (lua/lib/answer.lua)."""
    return {k: conn.dump(k) for k in conn.keys('*') if not k.startswith(keys.answer('').encode())}


def key_tats(conn, key_id, windows):
    return read_tats(conn.get(keys.KEY_TAT_PREFIX(key_id)), tuple(RateWindow(*w) for w in windows), server_now(conn))


def part(conn, job_id):
    return next(p for p in explain(job_id, conn)['policies'] if p['policy'] == 'key_rate')


def test_the_windows_are_stored_on_the_job_and_one_window_as_before(connection):
    q = PolicyQueue('rate', connection=connection)
    two = Rate(windows=[(5, 10, 5), (3, 1, 3)], key=_shop, scope='win')
    assert two.windows == (RateWindow(3, 1, 3), RateWindow(5, 10, 5)) and (two.limit, two.per, two.burst) == (3, 1, 3)
    assert repr(two) == "Rate(windows=[(3, 1, 3), (5, 10, 5)], key=_shop, scope='win')"
    job = q.enqueue(key_jobs.per_shop, 't', shop='a', policy=two)
    assert connection.hget(job.key, 'policies_key_rate') == b'3,5 1,10 3,5 win:a'
    costed = Rate(windows=[(3, 1, 3), (5, 10, 5)], key=_shop, scope='win', cost=2)
    job = q.enqueue(key_jobs.per_shop, 't', shop='a', policy=costed)
    assert connection.hget(job.key, 'policies_key_rate') == b'3,5 1,10 3,5*2 win:a'
    # One window given as windows is the Rate it always was: the same field, byte for byte, and the same repr.
    one, plain = Rate(windows=[(5, 1, 2)], key=_shop, scope='win'), Rate(5, per=1, burst=2, key=_shop, scope='win')
    assert repr(one) == repr(plain) == "Rate(5, per=1, burst=2, key=_shop, scope='win')"
    a = q.enqueue(key_jobs.per_shop, 't', shop='b', policy=one)
    b = q.enqueue(key_jobs.per_shop, 't', shop='b', policy=plain)
    assert connection.hget(a.key, 'policies_key_rate') == connection.hget(b.key, 'policies_key_rate') == b'5 1 2 win:b'


@pytest.mark.parametrize('kwargs, words', [
    ({'windows': []}, 'it is empty'),
    ({'windows': [(0, 1)]}, 'limit must be a positive integer, got 0'),
    ({'windows': [(3, -1)]}, 'per must be a whole number of seconds >= 1 (an int), got -1'),
    ({'windows': [(3, 1), (5, 1)]}, 'per=1 is given twice'),
    ({'windows': [(3, 'x')]}, "got 'x'"),
    ({'windows': [(3, 1, 9)]}, 'burst must be at most limit (3), got 9'),
    ({'windows': 'abc'}, 'a str is not a list'),
    ({'limit': 5, 'windows': [(3, 1), (5, 60)]}, 'windows replaces limit, per and burst'),
])
def test_bad_windows_name_the_argument_and_nothing_is_written(connection, kwargs, words):
    with pytest.raises(InvalidArgument) as raised:
        Rate(key=_shop, **kwargs)
    assert raised.value.argument == 'windows' and words in str(raised.value), raised.value
    assert f'windows={kwargs["windows"]!r}' in str(raised.value)
    Rate.set('win', 'a', windows=[(3, 1), (5, 60)], connection=connection, force=True)
    before = dump(connection)
    with pytest.raises(InvalidSetting) as raised:
        Rate.set('win', 'a', connection=connection, force=True, **kwargs)
    assert raised.value.argument == 'windows' and words in str(raised.value)
    assert dump(connection) == before


def test_a_cost_above_the_smallest_window_s_limit_is_refused_and_nothing_is_written(connection):
    with pytest.raises(InvalidArgument, match='cost must be at most the limit \\(3\\), got 4'):
        Rate(windows=[(10, 1, 10), (3, 60)], cost=4)
    q = PolicyQueue('rate', connection=connection)
    by_call = Rate(windows=[(10, 1, 10), (3, 60)], key=_shop, cost=lambda a, k: 4)
    with pytest.raises(InvalidArgument, match='cost'):
        q.enqueue(key_jobs.per_shop, 't', shop='a', policy=by_call)
    assert connection.dbsize() == 0


def test_the_longer_window_parks_the_key_s_job_consumes_nothing_and_explain_names_it(connection):
    """Ten a second but two a minute: the third start of the key waits for the minute window, which ``explain`` and
    ``Rate.status`` name; the refusal wrote nothing of either window; the other key runs."""
    rate = Rate(windows=[(10, 1, 10), (2, 60, 2)], key=_shop, scope='win')
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='a', policy=rate) for _ in range(3)]
    other = q.enqueue(key_jobs.per_shop, 't', shop='b', policy=rate)
    t0 = server_now(connection)
    got = [fetch(connection, f'h:5:0:{i}') for i in range(2)]
    assert [g.job_id for g in got] == [made[0].id, made[1].id]
    stored = connection.get(keys.KEY_TAT_PREFIX('win:a'))
    assert fetch(connection, 'h:5:0:2').job_id == other.id  # the third of key a is parked, b runs
    assert Rate.parked('win', 'a', connection=connection) == [made[2].id]
    assert connection.get(keys.KEY_TAT_PREFIX('win:a')) == stored  # the refusal consumed no window
    assert isinstance(fetch(connection, 'h:5:0:3'), Look)
    status = Rate.status('win', 'a', connection=connection)
    assert status.available == 0 and status.held_by == RateWindow(2, 60, 2)
    assert t0 + 29 < status.next_at < t0 + 31
    said = part(connection, made[2].id)
    assert 'rate 10/1s burst 10 + 2/60s burst 2' in said['verdict']
    assert 'held by its 60 s window, 2/60s burst 2' in said['verdict'], said
    assert said['held_by'] == {'limit': 2, 'per': 60, 'burst': 2}
    assert said['windows'] == [{'limit': 10, 'per': 1, 'burst': 10}, {'limit': 2, 'per': 60, 'burst': 2}]
    (row,) = RateViews.key_rows(connection, 'win')
    assert row['windows'] == [(10, 1, 10), (2, 60, 2)] and row['rate'] == (10, 1, 10)
    assert RateViews.key_lines([row], t0)[0].startswith('key a  rate 10/1s burst 10 + 2/60s burst 2: 1 parked')


def test_a_parked_job_comes_back_with_its_start_paid_in_every_window(connection):
    rate = Rate(windows=[(1, 1), (100, 60, 100)], key=_shop, scope='win')
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='a', policy=rate) for _ in range(2)]
    assert fetch(connection, 'h:6:0:1').job_id == made[0].id
    assert isinstance(fetch(connection, 'h:6:0:2'), Look)
    assert 'held by its 1 s window, 1/1s burst 1' in part(connection, made[1].id)['verdict']
    deadline, n = time.monotonic() + 5, 2
    while True:  # fetch as an idle worker does, until the due key gives the parked job back and it starts
        n += 1
        before = server_now(connection)
        if isinstance(fetch(connection, f'h:6:0:{n}'), Claim):
            break
        assert time.monotonic() < deadline, 'the parked job never came back'
        time.sleep(0.05)
    # Its start was paid, when it came back (in this last fetch, after `before`), in every window: each arrival time
    # moved on by its interval from then (1 s and 0.6 s); one unpaid would be at most that fetch's own time.
    words = connection.get(keys.KEY_TAT_PREFIX('win:a')).decode().split()
    assert words[2::3] == ['1', '60']
    assert float(words[0]) >= before + 1 - 1e-6 and float(words[3]) >= before + 0.6 - 1e-6, (words, before)
    assert connection.hget(made[1].key, 'policies_key_rate_paid') is None


def test_a_costed_job_moves_every_window_on_by_its_cost(connection):
    rate = Rate(windows=[(10, 1, 10), (20, 60, 20)], key=_shop, scope='win', cost=4)
    q = PolicyQueue('rate', connection=connection)
    q.enqueue(key_jobs.per_shop, 't', shop='a', policy=rate)
    assert isinstance(fetch(connection, 'h:7:0:1'), Claim)
    now = server_now(connection)
    second, minute = key_tats(connection, 'win:a', [(10, 1, 10), (20, 60, 20)])
    assert second - now == pytest.approx(0.4, abs=0.05) and minute - now == pytest.approx(12, abs=0.1)


def test_a_run_time_rate_of_several_windows_wins_and_clears(connection):
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='s') for _ in range(3)]
    set_to = Rate.set(SHOP_SCOPE, 's', windows=[(2, 60, 2), (1, 1)], connection=connection)
    assert set_to == KeyRate(windows=[(1, 1, 1), (2, 60, 2)]) == Rate.get(SHOP_SCOPE, 's', connection=connection)
    assert repr(set_to) == 'KeyRate(windows=[(1, 1, 1), (2, 60, 2)])'
    assert connection.hget(keys.KEY_RATES, f'{SHOP_SCOPE}:s') == b'1,2 1,60 1,2'
    assert fetch(connection, 'h:8:0:1').job_id == made[0].id
    assert isinstance(fetch(connection, 'h:8:0:2'), Look)  # its declared 5/1s burst 2 would have let it start
    said = part(connection, made[1].id)
    assert '(set at run time)' in said['verdict'] and 'held by its 1 s window' in said['verdict']
    assert Rate.clear(SHOP_SCOPE, 's', connection=connection) is True
    assert Rate.get(SHOP_SCOPE, 's', connection=connection) is None
    # The declared rate again: its one window reads the arrival time of its own period (one start owed, 0.2 s).
    assert Rate.status(SHOP_SCOPE, 's', connection=connection).available == 1


def test_a_taking_fetch_whose_reply_is_lost_counts_the_key_s_start_once_in_every_window(connection, fault_proxy):
    from tests.helpers.faults import load, producer

    rate = Rate(windows=[(3, 1, 3), (5, 60, 5)], key=_shop, scope='win')
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='a', policy=rate) for _ in range(2)]
    proxied = producer(fault_proxy, timeout=0.5)
    try:
        load(proxied, 'fetch')
        call = fetch_call([Queue('rate', connection=proxied)], 'h:9:0:1', 90)
        fault_proxy.drop_reply(match=b'EVALSHA')
        seen = fault_proxy.seen(b'EVALSHA')
        reply = FetchReply.decode(call.run(proxied))
        assert fault_proxy.seen(b'EVALSHA') - seen >= 2  # the reply was lost, the call sent again
    finally:
        proxied.close()
    assert reply.job == made[0].id and reply.replayed
    now = server_now(connection)
    second, minute = key_tats(connection, 'win:a', [(3, 1, 3), (5, 60, 5)])
    # one start in each window (1/3 s and 12 s), not two: the minute window's shows it whatever the time since
    assert second - now <= 1 / 3 and 11 < minute - now <= 12


def test_set_and_clear_of_windows_with_a_lost_reply_leave_what_one_call_leaves(connection, fault_proxy):
    from tests.helpers.faults import load, producer

    windows = [(3, 1, 3), (5, 60)]
    Rate.set('win', 'acme', windows=windows, connection=connection, force=True)
    once = dump(connection)
    Rate.clear('win', 'acme', connection=connection)
    proxied = producer(fault_proxy, timeout=0.5)
    try:
        load(proxied, 'key_setting')
        fault_proxy.drop_reply(match=b'EVALSHA')
        seen = fault_proxy.seen(b'EVALSHA')
        assert Rate.set('win', 'acme', windows=windows, connection=proxied, force=True) == KeyRate(windows=windows)
        assert fault_proxy.seen(b'EVALSHA') - seen >= 2
        assert dump(connection) == once
        fault_proxy.drop_reply(match=b'EVALSHA')
        seen = fault_proxy.seen(b'EVALSHA')
        assert Rate.clear('win', 'acme', connection=proxied) is True  # the replay answers what the first run did
        assert fault_proxy.seen(b'EVALSHA') - seen >= 2
    finally:
        proxied.close()
    assert Rate.get('win', 'acme', connection=connection) is None


@pytest.mark.long
def test_every_window_of_every_key_keeps_its_bound_with_real_workers(connection, redis_url, worker_env):
    """Three a second (burst 3) and five in ten seconds (burst 5) per shop, four workers, two shops: a window of
    limit L and burst B lets at most L + B - 1 starts into any window of its period (GCRA), so at most 5 in any
    second and 9 in any ten seconds; both windows held (the 1-s window spreads the first five, the 10-s window the
    next four, 2 s apart), and ``explain`` named the 10-s window while it held a parked job."""
    q = PolicyQueue('rate', connection=connection)
    shops = ['s0', 's1']
    for n in range(18):
        q.enqueue(key_jobs.per_shop_windows, 'win', shop=shops[n % 2])
    workers = [start_worker(redis_url, ['rate'], worker_env, worker_class='tests.helpers.key_jobs.FetchTimesWorker')
               for _ in range(4)]
    verdicts: list[str] = []
    scope = 'tests.helpers.key_jobs.per_shop_windows'

    def named() -> bool:
        for job_id in Rate.parked(scope, 's0', connection=connection)[:1]:
            verdicts.append(part(connection, job_id)['verdict'])
        return any('held by its 10 s window' in v for v in verdicts)

    try:
        assert wait_for(named, timeout=20, interval=0.2), verdicts[-3:] or output(workers[0])
        assert wait_for(lambda: sum(len(v) for v in key_jobs.spans(connection, 'win').values()) == 36, 40), \
            output(workers[0])
    finally:
        for w in workers:
            stop(w)
    fetched = key_jobs.fetch_times(connection)
    assert sorted(fetched) == shops
    for shop in shops:
        spans = sorted(fetched[shop])
        assert len(spans) == 9
        for width, bound in ((1.0, 3 + 3 - 1), (10.0, 5 + 5 - 1)):
            for start, _ in spans:
                inside = sum(1 for before, after in spans if before >= start and after < start + width)
                assert inside <= bound, (shop, width, inside, spans)
        # held: the first five span at least 2/3 s (the 1-s window: three at once, then one every 1/3 s), the nine
        # at least 8 s (the 10-s window: five at once, then one every 2 s from 2 s on); the latest end of a fetch
        # less the earliest start of one bounds the true spread from above
        assert max(after for _, after in spans[:5]) - min(before for before, _ in spans[:5]) >= 2 / 3 - 0.01, spans
        assert max(after for _, after in spans) - min(before for before, _ in spans) >= 8 - 0.01, spans
