"""The contract every registered policy keeps, parametrized over the registry.

A new policy gets these tests by registering (defining its class) and giving its cases in its test folder's
``examples.py`` (``EXAMPLES`` and ``INVALID`` under its registered name, found by tests/helpers/cases.py):

* a replayed call (redis-py retries a command whose reply was lost, with the same arguments) writes nothing more;
* ``reset`` clears everything the policy wrote for an identity;
* every key it writes is under ``rq:policies:``, is one of its own key families (built and parsed by keys.py), and
  expires, or is freed by the operation that ends its purpose (a marker held while its job waits);
* ``info --json`` shows its state, and a drop is counted under its name for the metrics;
* bad arguments raise an error naming the argument.

A per-job fetch policy (declared on the function, its setting on each job hash: ``EXAMPLES``, ``INVALID``) gets:

* under each example one start of a key is taken and the next job of that key is parked, out of the way of the job
  of another key behind it, which is served; a replayed fetch and a replayed release move nothing twice;
* the release gives the parked job back to the front of its queue, and it starts;
* what the fetch writes is under ``rq:policies:`` and expires or is freed when the last parked job goes back;
* bad arguments raise an error naming the argument.

A fetch policy (its settings live in Redis: ``SETTINGS`` and ``INVALID``, set and cleared through its admin API)
gets:

* under each example setting one start is taken and the next refused without a pop, and a refused fetch replayed
  writes nothing;
* its setting is listed (its ``queue_settings`` hash, ``info --json``, the headline) and clearing it lets the job start;
* what the fetch writes is under ``rq:policies:`` and expires;
* bad settings raise an error naming the argument and change nothing in Redis.
"""

from __future__ import annotations

import time

import pytest
from rq.queue import Queue

from rq_policies import PolicyQueue
from rq_policies.engine import keys, ops
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import Claim, Look, fetch_call, read_reply
from rq_policies.engine.policy import ADMISSION, FETCH, registered
from rq_policies.engine.views import views_of
from rq_policies.surfaces import state
from tests.helpers import cases, jobs
from tests.helpers.throttle_helpers import clear_of_a_slot_edge

CASES = [
    pytest.param(example, id=repr(example)) for cls in registered(ADMISSION) for example in cases.examples(cls)
]
INVALID = [
    pytest.param(cls, kwargs, argument, id=f'{cls.name}-{argument}-{kwargs}')
    for cls in registered(ADMISSION) for kwargs, argument in cases.invalid(cls)
]
RQ_KEYS = (f'{RQ}:job:', f'{RQ}:queue:', f'{RQ}:scheduled:', f'{RQ}:queues')


def test_every_admission_policy_gives_examples():
    assert registered(ADMISSION), 'no admission policy registered'
    for cls in registered(ADMISSION):
        assert cases.examples(cls), f'{cls.name}: EXAMPLES must give at least one instance for the contract suite'


def shape(conn):
    """Every key with its type and members (not values that carry a time): what a replay must not change."""
    out = {}
    for raw in sorted(conn.keys('*')):
        key = raw.decode()
        kind = conn.type(key).decode()
        if kind == 'list':
            out[key] = ('list', tuple(conn.lrange(key, 0, -1)))
        elif kind == 'zset':
            out[key] = ('zset', tuple(conn.zrange(key, 0, -1)))
        elif kind == 'hash':
            out[key] = ('hash', tuple(sorted(conn.hkeys(key))))
        elif kind == 'set':
            out[key] = ('set', tuple(sorted(conn.smembers(key))))
        elif key.startswith(keys.SUPERSEDED_PREFIX):
            out[key] = (kind, _timeless_record(conn.get(key)))
        else:
            out[key] = (kind, conn.get(key))
    return out


def _timeless_record(value: bytes) -> bytes:
    """A record under the tombstone prefix without what carries a time: a merge record's created_at (``<policy>
    <pending id> merged <created_at>``), a rewrite guard's run time and payload (``rewrite ...``)."""
    if value.startswith(b'rewrite '):
        return b'rewrite'
    if b' merged ' in value:
        return value.rsplit(b' ', 1)[0]
    return value


def enqueue(conn, example, job_id):
    q = PolicyQueue('contract', connection=conn)
    return q.enqueue(jobs.plain, 1, policy=example, job_id=job_id)


@pytest.mark.parametrize('example', CASES)
def test_a_replayed_admission_writes_nothing_more(connection, monkeypatch, example):
    assert enqueue(connection, example, 'contract-1') is not None
    once = shape(connection)
    connection.flushdb()
    lost_reply_once(monkeypatch)
    job = enqueue(connection, example, 'contract-1')
    monkeypatch.undo()
    assert job is not None and job.id == 'contract-1'  # the replay answers as the first attempt would have
    assert shape(connection) == once


def lost_reply_once(monkeypatch):
    real_run = ops.Call.run

    def lost_reply(self, client):
        real_run(self, client)  # the first attempt lands; its reply is lost and redis-py sends the call again
        return real_run(self, client)

    monkeypatch.setattr(ops.Call, 'run', lost_reply)


@pytest.mark.parametrize('example', CASES)
def test_a_replayed_force_writes_nothing_more(connection, monkeypatch, example):
    q = PolicyQueue('contract', connection=connection)
    clear_of_a_slot_edge(connection, getattr(example, 'slot', None))  # the two runs in one slot (Throttle)
    assert q.force(jobs.plain, 1, policy=example, job_id='contract-f') is not None
    once = shape(connection)
    connection.flushdb()
    lost_reply_once(monkeypatch)
    job = q.force(jobs.plain, 1, policy=example, job_id='contract-f')
    monkeypatch.undo()
    assert job is not None and job.id == 'contract-f'
    assert shape(connection) == once


@pytest.mark.parametrize('example', CASES)
def test_a_replayed_trailing_or_replacing_call_writes_nothing_more(connection, monkeypatch, example):
    q = PolicyQueue('contract', connection=connection)
    clear_of_a_slot_edge(connection, getattr(example, 'slot', None))  # the two runs in one slot (Throttle)
    q.enqueue(jobs.plain, 1, policy=example, job_id='contract-0')
    second = q.enqueue(jobs.plain, 1, policy=example, job_id='contract-2')
    once = shape(connection)
    connection.flushdb()
    q.enqueue(jobs.plain, 1, policy=example, job_id='contract-0')
    lost_reply_once(monkeypatch)
    again = q.enqueue(jobs.plain, 1, policy=example, job_id='contract-2')
    monkeypatch.undo()
    assert (again is None) == (second is None)
    if again is not None:
        assert again.get_status(refresh=False) == second.get_status(refresh=False)
    assert {k: v for k, v in shape(connection).items() if not keys.is_drop_counter(k)} == {
        k: v for k, v in once.items() if not keys.is_drop_counter(k)
    }


@pytest.mark.parametrize('example', CASES)
def test_reset_clears_everything_the_policy_wrote(connection, example):
    q = PolicyQueue('contract', connection=connection)
    first = q.enqueue(jobs.plain, 1, policy=example)
    q.enqueue(jobs.plain, 1, policy=example)  # a second call: a drop, a trailing extra, a replacement
    assert first is not None
    q.reset(jobs.plain, 1, policy=example)
    left = [k.decode() for k in connection.keys(keys.PREFIX + '*')]
    # the framework's own: counters, the tombstones of dropped pending jobs and the reset's kept answer (they
    # expire; see keys.py)
    tombstones = [k for k in left if k.startswith(keys.SUPERSEDED_PREFIX)]
    assert all(connection.ttl(k) > 0 for k in tombstones)
    answers = [k for k in left if keys.is_answer(k)]
    assert len(answers) == 1 and 0 < connection.ttl(answers[0]) <= keys.ANSWER_TTL
    assert [k for k in left if not keys.is_drop_counter(k) and k not in tombstones and k not in answers] == []


@pytest.mark.parametrize('example', CASES)
def test_every_key_is_its_own_family_and_expires_or_is_freed(connection, example):
    q = PolicyQueue('contract', connection=connection)
    q.enqueue(jobs.plain, 1, policy=example)
    q.enqueue(jobs.plain, 1, policy=example)
    families = type(example).identity_families
    for raw in connection.keys('*'):
        key = raw.decode()
        if key.startswith(RQ_KEYS):
            continue
        assert key.startswith(keys.PREFIX), key
        if keys.is_drop_counter(key):
            continue  # counters, documented in keys.py
        if key.startswith(keys.SUPERSEDED_PREFIX):
            assert connection.ttl(key) > 0, key  # the framework's tombstone of a superseded pending job
            continue
        family = next((f for f in families if f.parse(key)), None)
        assert family is not None, f'{key} is not one of {example.name}\'s key families'
        assert family.parse(key)[0] == 'contract'
        assert connection.pttl(key) > 0 or family.while_waiting, f'{key} never expires'


@pytest.mark.parametrize('example', CASES)
def test_info_shows_the_policy_state_and_drops_count_under_its_name(connection, example):
    q = PolicyQueue('contract', connection=connection)
    q.enqueue(jobs.plain, 1, policy=example)
    second = q.enqueue(jobs.plain, 1, policy=example)
    snap = state.snapshot(connection, ['contract'])['queues']['contract']
    families = type(example).identity_families
    assert sum(snap[f.name]['count'] for f in families) >= 1
    if second is None:  # dropped: counted for the metrics under the policy's one name
        assert snap['drops'] == {example.name: 1}
        assert {'policy': example.name, 'queue': 'contract', 'count': 1} in state.drops(connection)


@pytest.mark.parametrize('cls, kwargs, argument', INVALID)
def test_bad_arguments_name_the_argument(connection, cls, kwargs, argument):
    with pytest.raises((TypeError, ValueError), match=argument):
        cls(**kwargs)
    assert connection.dbsize() == 0


# -- fetch policies -------------------------------------------------------------------------------------------------

QUEUE_FETCH = [cls for cls in registered(FETCH) if not cls.per_job]
FETCH_CASES = [
    pytest.param(cls, settings, id=f'{cls.name}-{settings}') for cls in QUEUE_FETCH
    for settings in cases.settings(cls)
]
FETCH_INVALID = [
    pytest.param(cls, kwargs, argument, id=f'{cls.name}-{argument}-{kwargs}')
    for cls in QUEUE_FETCH for kwargs, argument in cases.invalid(cls)
]



def test_every_fetch_policy_gives_setting_examples_and_invalid_settings():
    assert QUEUE_FETCH, 'no fetch policy registered'
    for cls in QUEUE_FETCH:
        assert cases.settings(cls), f'{cls.name}: SETTINGS must give at least one setting'
        assert cases.invalid(cls), f'{cls.name}: INVALID must list settings its set() refuses'


def fetch(conn, token):
    queues = [Queue('contract', connection=conn)]
    call = fetch_call(queues, token, 90)
    return call, read_reply(call.run(conn), queues, token, 90)


@pytest.mark.parametrize('cls, settings', FETCH_CASES)
def test_a_setting_allows_one_start_then_refuses_without_a_pop(connection, cls, settings):
    q = PolicyQueue('contract', connection=connection)
    q.enqueue(jobs.plain, 1)
    second = q.enqueue(jobs.plain, 2)
    cases.configure(cls, connection, 'contract', **settings)
    _, first = fetch(connection, 'h:1:1:1')
    assert isinstance(first, Claim)
    call, refused = fetch(connection, 'h:1:1:2')
    assert isinstance(refused, Look) and refused.full == {'contract'} and refused.waiting == 1
    assert connection.lrange(q.key, 0, -1) == [second.id.encode()]
    before = shape(connection)
    call.run(connection)  # a refused fetch replayed (a lost reply) writes nothing
    assert shape(connection) == before


@pytest.mark.parametrize('cls, settings', FETCH_CASES)
def test_a_setting_is_listed_and_clearing_it_lets_the_job_start(connection, cls, settings):
    q = PolicyQueue('contract', connection=connection)
    q.enqueue(jobs.plain, 1)
    q.enqueue(jobs.plain, 2)
    cases.configure(cls, connection, 'contract', **settings)
    written = {k.decode() for k in connection.keys(keys.PREFIX + '*')}
    assert written and all(k.startswith(keys.PREFIX) for k in written)
    assert connection.hexists(cls.queue_settings, 'contract')  # its queue_settings hash lists the queue
    assert 'contract' in state.queue_names(connection)
    entry = state.snapshot(connection, None)['queues']['contract']
    section = views_of(cls.name).queue_info(connection, ['contract'], state.server_now(connection), None)[
        'contract']
    fields = section.as_json()
    assert fields and set(fields) <= set(entry)  # info --json shows the policy's fields
    assert section.headline(), f'{cls.name}: the info headline says nothing of its setting'
    fetch(connection, 'h:1:1:1')
    assert isinstance(fetch(connection, 'h:1:1:2')[1], Look)
    cases.unconfigure(cls, connection, 'contract')
    assert not connection.hexists(cls.queue_settings, 'contract')
    assert isinstance(fetch(connection, 'h:1:1:3')[1], Claim)


@pytest.mark.parametrize('cls, settings', FETCH_CASES)
def test_what_a_fetch_writes_is_its_own_and_expires(connection, cls, settings):
    q = PolicyQueue('contract', connection=connection)
    q.enqueue(jobs.plain, 1)
    q.enqueue(jobs.plain, 2)
    cases.configure(cls, connection, 'contract', **settings)
    setting = {k: connection.dump(k) for k in connection.keys(keys.PREFIX + '*')}
    fetch(connection, 'h:1:1:1')
    fetch(connection, 'h:1:1:2')
    for raw in connection.keys('*'):
        key = raw.decode()
        if key.startswith(RQ_KEYS) or raw in setting:
            continue
        assert key.startswith(keys.PREFIX), key
        assert connection.pttl(key) > 0, f'{key}, written by a {cls.name} fetch, never expires'
    assert {k: connection.dump(k) for k in setting} == setting  # a fetch reads the setting, never writes it


@pytest.mark.parametrize('cls, kwargs, argument', FETCH_INVALID)
def test_bad_settings_name_the_argument_and_change_nothing(connection, cls, kwargs, argument):
    good = cases.settings(cls)[0]
    cases.configure(cls, connection, 'contract', **good)
    before = shape(connection)
    with pytest.raises((TypeError, ValueError), match=argument):
        cases.configure(cls, connection, 'contract', **{**good, **kwargs})
    assert shape(connection) == before


# -- per-job fetch policies (declared on the function) ---------------------------------------------------------------

PER_JOB = [cls for cls in registered(FETCH) if cls.per_job]
PER_JOB_CASES = [pytest.param(example, id=repr(example)) for cls in PER_JOB if not cases.no_limit(cls)
                 for example in cases.examples(cls)]
PER_JOB_INVALID = [
    pytest.param(cls, kwargs, argument, id=f'{cls.name}-{argument}-{kwargs}')
    for cls in PER_JOB for kwargs, argument in cases.invalid(cls)
]


def test_every_per_job_fetch_policy_gives_examples_and_invalid_arguments():
    assert PER_JOB, 'no per-job fetch policy registered'
    for cls in PER_JOB:
        assert cases.examples(cls), f'{cls.name}: EXAMPLES must give at least one instance for the contract suite'
        assert cases.invalid(cls), f'{cls.name}: INVALID must list arguments it refuses'


def per_job_fetch(conn, token):
    queues = [Queue('contract', connection=conn)]
    call = fetch_call(queues, token, 90)
    return call, read_reply(call.run(conn), queues, token, 90)


def start_then_park(conn, example):
    """Two jobs of one key, then one of another key; the first starts, the second is parked, the third starts."""
    q = PolicyQueue('contract', connection=conn)
    first = q.enqueue(jobs.plain, 1, policy=example)
    second = q.enqueue(jobs.plain, 1, policy=example)
    other = q.enqueue(jobs.plain, 2, policy=example)
    _, taken = per_job_fetch(conn, 'h:1:1:1')
    assert isinstance(taken, Claim) and taken.job_id == first.id
    call, behind = per_job_fetch(conn, 'h:1:1:2')
    assert isinstance(behind, Claim) and behind.job_id == other.id  # no head-of-line blocking
    assert second.get_status() == 'deferred'
    assert conn.llen(q.key) == 0
    return q, taken, second, call


def wait_for_start(conn, job_id, first_token):
    """Fetch (as an idle worker does, each fetch serving the due keys) until ``job_id`` starts; its claim."""
    deadline = time.monotonic() + 5
    n = 0
    while time.monotonic() < deadline:
        n += 1
        _, got = per_job_fetch(conn, f'{first_token}:{n}')
        if isinstance(got, Claim):
            assert got.job_id == job_id
            return got
        time.sleep(0.05)
    raise AssertionError(f'{job_id} never started')


@pytest.mark.parametrize('example', PER_JOB_CASES)
def test_a_key_at_its_limit_parks_its_job_and_serves_the_next(connection, example):
    q, taken, second, call = start_then_park(connection, example)
    before = shape(connection)
    call.run(connection)  # the fetch replayed (its reply lost): it answers the same job, moves nothing
    assert shape(connection) == before
    from rq_policies.engine.fetch import release_claim

    release_claim(taken, connection)
    after = shape(connection)
    release_claim(taken, connection)  # the release replayed: nothing moves twice
    assert shape(connection) == after
    wait_for_start(connection, second.id, 'h:1:2')  # the key frees (a release, or its rate): the parked job runs
    assert connection.llen(q.key) == 0


@pytest.mark.parametrize('example', PER_JOB_CASES)
def test_what_a_per_job_fetch_writes_is_its_own_and_expires_or_is_freed(connection, example):
    q, taken, second, _ = start_then_park(connection, example)
    from rq_policies.engine.fetch import release_claim

    release_claim(taken, connection)
    wait_for_start(connection, second.id, 'h:1:3')
    for raw in connection.keys('*'):
        key = raw.decode()
        if key.startswith(RQ_KEYS) or key.startswith(f'{RQ}:deferred:'):
            continue
        assert key.startswith(keys.PREFIX), key
        assert connection.pttl(key) > 0, f'{key}, written by a {example.name} fetch, never expires'
    assert connection.exists(keys.KEY_DUE) == 0  # no parked job left: the due index is gone
    assert connection.zcard(f'{RQ}:deferred:contract') == 0


@pytest.mark.parametrize('cls, kwargs, argument', PER_JOB_INVALID)
def test_bad_per_job_arguments_name_the_argument(connection, cls, kwargs, argument):
    with pytest.raises((TypeError, ValueError), match=argument):
        cls(**kwargs)
    assert connection.dbsize() == 0
