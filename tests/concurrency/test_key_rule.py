"""A per-key limit stated as a rule over the key (``Tiers``, ``Concurrency.set_rule``/``Rate.set_rule``): stored once
per scope in Redis and read by the script that decides, below a per-key ``set`` and above every job's declared
setting, so producers with different code cannot make a key's limit drift.

The fetch-level tests drive ``lua/fetch.lua`` directly; the invariant runs real forking PolicyWorkers in subprocesses
and two producer subprocesses whose functions declare different limits for one scope, and checks the start and end
records of every job (server clock).
"""

from __future__ import annotations

import json

import pytest
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry
from rq.job import Job

from rq_policies import Concurrency, InvalidArgument, PolicyQueue, Rate, Tiers, explain
from rq_policies.engine import keys
from rq_policies.engine.fetch import Claim, Look, release_claim
from rq_policies.policies.concurrency.views import ConcurrencyViews
from rq_policies.policies.rate.views import RateViews
from tests.helpers import drift, fetches, key_jobs
from tests.helpers.cli import run as run_cli

CUSTOMER_SCOPE = 'tests.helpers.key_jobs.per_customer'
RULE = Tiers({'premium:': 3, 'free:': 1}, default=2)


def fetch(conn, token, names=('keys',)):
    return fetches.fetch(conn, token, names)


def customer(q, customer, seconds=0.0, tag='t'):
    return q.enqueue(key_jobs.per_customer, tag, seconds, customer=customer)


def cli(*args, env):
    return run_cli(*args, env=env, url=env['REDIS_URL'])  # on the cluster cell, with the cluster's client class


def take_all(conn, prefix, n):
    """Fetch ``n`` times; the job ids taken."""
    return [got.job_id for i in range(n) if isinstance(got := fetch(conn, f'{prefix}:{i}'), Claim)]


# -- the rule in the deciding script ---------------------------------------------------------------------------------


def test_a_rule_gives_each_key_its_tier_s_limit_over_the_declared_one(connection):
    q = PolicyQueue('keys', connection=connection)
    premium = [customer(q, 'premium:acme') for _ in range(5)]
    free = [customer(q, 'free:bob') for _ in range(3)]
    other = [customer(q, 'trial:x') for _ in range(3)]
    assert Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=connection) == RULE
    assert Concurrency.get_rule(CUSTOMER_SCOPE, connection=connection) == RULE
    taken = take_all(connection, 'h:1:1', 12)
    # every job declares 2; the rule says premium 3, free 1, anything else 2
    assert [j for j in taken if j in {p.id for p in premium}] == [p.id for p in premium[:3]]
    assert [j for j in taken if j in {f.id for f in free}] == [free[0].id]
    assert [j for j in taken if j in {o.id for o in other}] == [o.id for o in other[:2]]
    assert Concurrency.parked(CUSTOMER_SCOPE, 'premium:acme', connection=connection) == [p.id for p in premium[3:]]


def test_without_a_rule_the_declared_limit_applies_and_clearing_the_rule_restores_it(connection):
    q = PolicyQueue('keys', connection=connection)
    made = [customer(q, 'free:bob') for _ in range(4)]
    Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=connection)
    first = fetch(connection, 'h:2:0:0')
    assert isinstance(first, Claim) and isinstance(fetch(connection, 'h:2:0:1'), Look)  # free: 1
    assert Concurrency.clear_rule(CUSTOMER_SCOPE, connection=connection) is True
    assert Concurrency.clear_rule(CUSTOMER_SCOPE, connection=connection) is False
    assert Concurrency.get_rule(CUSTOMER_SCOPE, connection=connection) is None
    release_claim(first, connection)  # gives one parked job back; the declared 2 applies again
    taken = take_all(connection, 'h:2:1', 4)
    assert taken == [made[1].id, made[2].id]


def test_a_per_key_setting_stays_on_top_of_the_rule(connection):
    q = PolicyQueue('keys', connection=connection)
    made = [customer(q, 'free:bob') for _ in range(4)]
    Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=connection)
    Concurrency.set(CUSTOMER_SCOPE, 'free:bob', 3, connection=connection)
    assert take_all(connection, 'h:3:0', 4) == [j.id for j in made[:3]]
    status = Concurrency.status(CUSTOMER_SCOPE, 'free:bob', connection=connection)
    assert (status.limit, status.overridden, status.source) == (3, True, 'set')
    Concurrency.clear(CUSTOMER_SCOPE, 'free:bob', connection=connection)
    status = Concurrency.status(CUSTOMER_SCOPE, 'free:bob', connection=connection)
    assert (status.limit, status.overridden, status.source) == (1, False, "rule tier 'free:'")


def test_a_rule_is_a_value():
    windows = Tiers({'big:': [(10, 1), (500, 3600)]}, default=(1, 60))
    assert hash(windows) == hash(Tiers({'big:': [(10, 1), (500, 3600)]}, default=(1, 60)))
    assert windows != Tiers({'big:': [(10, 1)]}, default=(1, 60))
    assert repr(RULE) == "Tiers({'premium:': 3, 'free:': 1}, default=2)"


def test_the_longest_matching_prefix_wins():
    rule = Tiers({'p': 5, 'premium:': 10, 'premium:vip:': 20}, default=1)
    assert rule.resolve('premium:vip:acme') == (20, 'premium:vip:')
    assert rule.resolve('premium:acme') == (10, 'premium:')
    assert rule.resolve('pro') == (5, 'p')
    assert rule.resolve('free') == (1, '')


def test_the_script_resolves_prefixes_as_the_python_side_does(connection):
    rule = Tiers({'p': 5, 'premium:': 4, 'premium:vip:': 3}, default=1)
    Concurrency.set_rule(CUSTOMER_SCOPE, rule, connection=connection, force=True)
    q = PolicyQueue('keys', connection=connection)
    for key in ('premium:vip:a', 'premium:b', 'pz', 'zz'):
        for _ in range(6):
            customer(q, key)
        taken = take_all(connection, f'h:4:{key}', 7)
        assert len(taken) == rule.resolve(key)[0], key


# -- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(('make', 'argument', 'value'), [
    (lambda: Tiers({'premium:': 0}, default=1), "tiers['premium:']", '0'),
    (lambda: Tiers({'premium:': 2}, default=True), 'default', 'True'),
    (lambda: Tiers({'': 2}, default=1), 'tiers', "''"),
    (lambda: Tiers({3: 2}, default=1), 'tiers', '3'),
    (lambda: Tiers([('a', 1)], default=1), 'tiers', "[('a', 1)]"),
    (lambda: Tiers({'a': 1}, default=None), 'default', 'None'),
    (lambda: Tiers({f'p{i}': 1 for i in range(65)}, default=1), 'tiers', '65'),
    (lambda: 5, 'rule', '5'),
])
def test_a_bad_rule_names_the_argument_and_value_and_nothing_is_written(connection, make, argument, value):
    Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=connection, force=True)
    before = connection.hgetall(keys.KEY_RULES)
    with pytest.raises(InvalidArgument) as raised:
        Concurrency.set_rule(CUSTOMER_SCOPE, make(), connection=connection, force=True)
    assert raised.value.argument == argument and value in str(raised.value)
    assert connection.hgetall(keys.KEY_RULES) == before


def test_a_rule_of_an_unknown_scope_is_refused_unless_forced(connection):
    with pytest.raises(InvalidArgument, match='nosuchscope'):
        Concurrency.set_rule('nosuchscope', RULE, connection=connection)
    assert connection.exists(keys.KEY_RULES) == 0
    with pytest.raises(InvalidArgument, match='scope'):
        Concurrency.set_rule('a:b', RULE, connection=connection, force=True)
    Concurrency.set_rule('nosuchscope', RULE, connection=connection, force=True)
    # a scope with a rule is a scope in use: a per-key setting of it needs no force
    Concurrency.set('nosuchscope', 'k', 4, connection=connection)


# -- lost replies ---------------------------------------------------------------------------------------------------


def test_set_and_clear_rule_through_a_proxy_that_loses_their_replies_answer_as_the_first_run(connection,
                                                                                             fault_proxy):
    proxied = Redis.from_url(
        fault_proxy.url, socket_timeout=0.5, retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
        retry_on_error=[ConnectionError, TimeoutError],
    )
    proxied.ping()
    fault_proxy.drop_reply(match=b'HSET')
    assert Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=proxied, force=True) == RULE
    assert fault_proxy.seen(b'HSET') >= 2
    assert Concurrency.get_rule(CUSTOMER_SCOPE, connection=connection) == RULE
    assert connection.hlen(keys.KEY_RULES) == 1
    fault_proxy.drop_reply(match=b'EVAL')
    assert Concurrency.clear_rule(CUSTOMER_SCOPE, connection=proxied) is True  # the replay answers the first run
    assert fault_proxy.seen(b'EVAL') >= 2
    assert connection.exists(keys.KEY_RULES) == 0


# -- what it shows --------------------------------------------------------------------------------------------------


def test_status_key_rows_and_explain_name_the_rule_that_gave_the_limit(connection):
    q = PolicyQueue('keys', connection=connection)
    made = [customer(q, 'premium:acme') for _ in range(4)] + [customer(q, 'zed') for _ in range(3)]
    Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=connection)
    take_all(connection, 'h:6:0', 8)
    status = Concurrency.status(CUSTOMER_SCOPE, 'premium:acme', connection=connection)
    assert (status.limit, status.in_use, status.source) == (3, 3, "rule tier 'premium:'")
    assert Concurrency.status(CUSTOMER_SCOPE, 'zed', connection=connection).source == 'rule default'
    rows = {r['key']: r for r in ConcurrencyViews.key_rows(connection, CUSTOMER_SCOPE)}
    assert (rows['premium:acme']['limit'], rows['premium:acme']['source']) == (3, "rule tier 'premium:'")
    assert (rows['zed']['limit'], rows['zed']['source']) == (2, 'rule default')
    lines = ConcurrencyViews.key_lines(list(rows.values()), 0.0)
    assert any("3/3 (rule tier 'premium:')" in line for line in lines), lines
    (panel,) = ConcurrencyViews.panels(connection, connection.time()[0], 10)
    cells = {row[0]: row[2] for row in panel['rows']}
    assert (cells['premium:acme'].text, cells['premium:acme'].sub) == ('3', "rule tier 'premium:'")
    found = explain(made[3].id, connection=connection)
    words = str(found)
    assert "rule tier 'premium:'" in words and '3/3' in words, words
    Concurrency.clear_rule(CUSTOMER_SCOPE, connection=connection)
    assert Concurrency.status(CUSTOMER_SCOPE, 'premium:acme', connection=connection).source == 'declared'


# -- Rate: the same hook ---------------------------------------------------------------------------------------------


def test_a_rate_rule_gives_each_key_its_tier_s_rate(connection):
    scope = 'tests.helpers.key_jobs.per_shop'  # declares Rate(5, per=1, burst=2)
    q = PolicyQueue('keys', connection=connection)
    Rate.set_rule(scope, Tiers({'big:': (50, 60, 4)}, default=(1, 60)), connection=connection, force=True)
    stored = Rate.get_rule(scope, connection=connection)
    assert stored.tiers['big:'].limit == 50 and stored.default.limit == 1
    for shop in ('big:a', 'small:b'):
        for _ in range(6):
            q.enqueue(key_jobs.per_shop, 't', shop=shop)
    taken = take_all(connection, 'h:7:0', 12)
    shops = [connection.hget(Job.key_for(j), 'policies_key_rate') for j in taken]
    assert sum(b'big:a' in s for s in shops) == 4  # the big tier's burst of 4, not the declared 2
    assert sum(b'small:b' in s for s in shops) == 1  # the default's burst of 1
    # what shows it: the rate in force and which rule gave it
    assert Rate.status(scope, 'small:b', connection=connection).next_at > connection.time()[0] + 30  # 1 a minute
    rows = {r['key']: r for r in RateViews.key_rows(connection, scope)}
    assert (rows['big:a']['rate'], rows['big:a']['source']) == ((50, 60, 4), "rule tier 'big:'")
    assert (rows['small:b']['rate'], rows['small:b']['source']) == ((1, 60, 1), 'rule default')
    assert any("(rule tier 'big:')" in line for line in RateViews.key_lines(list(rows.values()), 0.0))
    parked = Rate.parked(scope, 'small:b', connection=connection)[0]
    part = next(p for p in explain(parked, connection)['policies'] if p['policy'] == 'key_rate')
    assert '1/60s burst 1 (rule default)' in part['verdict'] and part['source'] == 'rule default', part
    with pytest.raises(InvalidArgument) as raised:
        Rate.set_rule(scope, Tiers({'big:': (0, 60)}, default=(1, 60)), connection=connection, force=True)
    assert raised.value.argument.startswith("tiers['big:']")
    assert Rate.get_rule(scope, connection=connection) == stored


# -- two producers with different code, real forking workers ---------------------------------------------------------


def test_two_producers_declaring_different_limits_never_drift_a_key_past_its_rule(connection, redis_url, worker_env):
    """Producer A's code declares 6 for scope 'tiered', producer B's 1, both enqueueing at once for three keys while
    four forking PolicyWorkers run them; the scope's rule says premium 3, free 1, others 2. The sweep over every
    job's start and end records: no key ever ran more than its rule allows (without the rule in the fetch script,
    the loose producer's jobs run 4 at once on every key)."""
    found = drift.run('ours', connection, redis_url, worker_env, 'drift-ours')
    result = drift.summary(found)
    for key, row in result['keys'].items():
        assert len(found[key]) == 2 * 2 * 8, key  # every job of both producers ran
        assert row['max_running'] <= row['limit'], (key, row, found[key])
    assert result['over_admitted'] == 0
    assert result['keys']['premium:a']['max_running'] >= 2  # the loose tier's room is used, not the strict one's
    assert connection.zcard(keys.KEY_DUE) == 0


def test_the_keys_command_shows_the_scope_s_rule_and_the_override_command_its_source(connection, worker_env):
    q = PolicyQueue('keys', connection=connection)
    for _ in range(4):
        customer(q, 'premium:acme')
    Concurrency.set_rule(CUSTOMER_SCOPE, RULE, connection=connection)
    take_all(connection, 'h:9:0', 4)
    shown = cli('keys', CUSTOMER_SCOPE, env=worker_env)
    assert shown.returncode == 0, shown.stderr
    assert f"concurrency rule of scope {CUSTOMER_SCOPE}: {RULE!r}" in shown.stdout, shown.stdout
    assert "key premium:acme  3/3 (rule tier 'premium:') in use, 1 parked" in shown.stdout, shown.stdout
    data = json.loads(cli('keys', CUSTOMER_SCOPE, '--json', env=worker_env).stdout)
    assert data['rules'] == {'concurrency': repr(RULE)}
    assert data['policies']['concurrency'][0]['source'] == "rule tier 'premium:'"
    status = cli('override', CUSTOMER_SCOPE, 'premium:acme', env=worker_env)
    assert "limit 3 (rule tier 'premium:')" in status.stdout, status.stdout
