"""The admin API (rq_policies.engine.admin): every run-time setting family has set/get/clear/status with one shape.

One parametrized test per promise, over every family: the types returned, the argument order (what, then the values,
then connection=), the errors on bad input (InvalidSetting naming the argument and the value, and nothing in Redis
changed by the refused call), the unknown-queue warning, and the 0.2 names still working behind a DeprecationWarning.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
from rq.queue import Queue

from rq_policies import (
    Cap,
    Concurrency,
    InvalidSetting,
    KeyLimit,
    KeyRate,
    KeyStatus,
    PolicyQueue,
    QueueRate,
    QueueSlot,
    Rate,
    RateStatus,
    SlotStatus,
    UnknownQueueWarning,
)
from rq_policies.engine import ledger
from rq_policies.engine.fetch import Claim, Look, fetch_call, read_reply
from tests.helpers import key_jobs


@dataclass(frozen=True)
class Family:
    """One setting family: the class, what the setting is for, values to set, the setting they make, what the
    parameters after ``what`` are called, and bad calls ``(what, values, the argument the error must name, the value
    as its repr appears in the message)``."""

    cls: Any
    what: tuple
    values: tuple
    setting: Any
    value_names: tuple
    status_type: type
    bad: tuple

    def __str__(self) -> str:
        return self.cls.__name__


FAMILIES = [
    Family(QueueSlot, ('admin-q',), (3,), Cap(3), ('capacity',), SlotStatus, (
        (('admin-q',), (0,), 'capacity', '0'),
        (('admin-q',), ('3',), 'capacity', "'3'"),
        (('admin-q',), (True,), 'capacity', 'True'),
        (('admin-q',), (2**31,), 'capacity', str(2**31)),
        (('',), (3,), 'queue', "''"),
        ((7,), (3,), 'queue', '7'),
    )),
    Family(QueueRate, ('admin-q',), (5, 60, 2), QueueRate(5, 60, 2), ('limit', 'per', 'burst'), RateStatus, (
        (('admin-q',), (0, 60, 1), 'limit', '0'),
        (('admin-q',), (5, 0.5, 1), 'per', '0.5'),
        (('admin-q',), (5, 60, 6), 'burst', '6'),
        (('',), (5, 60, 1), 'queue', "''"),
    )),
    Family(Concurrency, ('admin-scope', 'acme'), (4,), KeyLimit(4), ('limit',), KeyStatus, (
        (('admin-scope', 'acme'), (0,), 'limit', '0'),
        (('admin-scope', 'acme'), ('4',), 'limit', "'4'"),
        (('a:b', 'acme'), (4,), 'scope', "'a:b'"),
        (('', 'acme'), (4,), 'scope', "''"),
        (('admin-scope', 1.5), (4,), 'key', '1.5'),
        (('admin-scope', None), (4,), 'key', 'None'),
    )),
    Family(Rate, ('admin-scope', 'acme'), (5, 60, 2), KeyRate(5, 60, 2), ('limit', 'per', 'burst'), RateStatus, (
        (('admin-scope', 'acme'), (0, 60, 1), 'limit', '0'),
        (('admin-scope', 'acme'), (5, 0, 1), 'per', '0'),
        (('admin-scope', 'acme'), (5, 60, 9), 'burst', '9'),
        (('a:b', 'acme'), (5, 60, 1), 'scope', "'a:b'"),
        (('admin-scope', 2.5), (5, 60, 1), 'key', '2.5'),
    )),
]

WHAT_NAMES = {QueueSlot: ('queue',), QueueRate: ('queue',), Concurrency: ('scope', 'key'), Rate: ('scope', 'key')}


def snapshot(conn) -> dict[bytes, Any]:
    """Every key with its type and value: equal before and after a call that wrote nothing."""
    out = {}
    for key in conn.scan_iter(count=1000):
        kind = conn.type(key)
        if kind == b'hash':
            out[key] = conn.hgetall(key)
        elif kind == b'zset':
            out[key] = conn.zrange(key, 0, -1, withscores=True)
        elif kind == b'list':
            out[key] = conn.lrange(key, 0, -1)
        elif kind == b'set':
            out[key] = conn.smembers(key)
        else:
            out[key] = conn.get(key)
    return out


def answers(conn) -> dict[bytes, bytes]:
    """The answers admin calls keep (``rq:policies:answer:<request id>``, lua/lib/answer.lua), each checked to expire
    within a minute."""
    from rq_policies.engine import keys

    found = {}
    for key in conn.scan_iter(match=keys.answer('*'), count=1000):
        assert 0 < conn.ttl(key) <= keys.ANSWER_TTL, key
        found[key] = conn.get(key)
    return found


def settings(conn) -> dict[bytes, Any]:
    """:func:`snapshot` without the answers admin calls keep: the state a call leaves, whatever its request id."""
    kept = answers(conn)
    return {key: value for key, value in snapshot(conn).items() if key not in kept}


@pytest.fixture
def seen(connection):
    """The queue the queue families use, known to rq (a producer has enqueued to it)."""
    PolicyQueue('admin-q', connection=connection).enqueue(key_jobs.per_shop, 't', shop='x')


@pytest.mark.parametrize('family', FAMILIES, ids=str)
def test_set_get_clear_have_one_shape(connection, seen, family):
    cls = family.cls
    assert cls.get(*family.what, connection=connection) is None
    made = cls.set(*family.what, *family.values, connection=connection)
    assert made == family.setting and type(made) is type(family.setting)
    assert dataclasses.is_dataclass(made) and type(made).__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.limit = 99  # type: ignore[misc]  # no field of a setting can be changed in place
    assert cls.get(*family.what, connection=connection) == made
    again = cls.set(*family.what, *family.values, connection=connection)  # setting twice is setting once
    assert again == made and cls.get(*family.what, connection=connection) == made
    status = cls.status(*family.what, connection=connection)
    assert type(status) is family.status_type and type(status).__dataclass_params__.frozen
    assert cls.clear(*family.what, connection=connection) is True
    assert cls.get(*family.what, connection=connection) is None
    assert cls.clear(*family.what, connection=connection) is False


@pytest.mark.parametrize('family', FAMILIES, ids=str)
def test_the_arguments_come_in_one_order(family):
    """What the setting is for, then its values, then connection= (the same names across families)."""
    names = WHAT_NAMES[family.cls]
    for verb, after in (('set', family.value_names), ('get', ()), ('clear', ()), ('status', ())):
        params = list(inspect.signature(getattr(family.cls, verb)).parameters.values())
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional[:len(names) + len(after)] == [*names, *after], (verb, positional)
        every = [p.name for p in params]
        assert 'connection' in every and every.index('connection') >= len(names) + len(after), (verb, every)
        assert params[every.index('connection')].default is None, verb


@pytest.mark.parametrize('family', FAMILIES, ids=str)
def test_bad_input_names_the_argument_and_changes_nothing(connection, seen, family):
    cls = family.cls
    cls.set(*family.what, *family.values, connection=connection)  # a setting already there must survive
    before = snapshot(connection)
    for what, values, argument, shown in family.bad:
        with pytest.raises(InvalidSetting) as raised:
            cls.set(*what, *values, connection=connection)
        message = str(raised.value)
        assert argument in message and shown in message, (what, values, message)
        assert isinstance(raised.value, ValueError)
        assert snapshot(connection) == before, (what, values)
        if argument in WHAT_NAMES[cls]:  # a bad target is refused by every verb, each naming it
            for verb in ('get', 'clear', 'status'):
                with pytest.raises(InvalidSetting, match=argument):
                    getattr(cls, verb)(*what, connection=connection)
                assert snapshot(connection) == before, verb
    for verb, args in (('set', (*family.what, *family.values)), ('get', family.what), ('clear', family.what),
                       ('status', family.what)):
        with pytest.raises(InvalidSetting, match='connection'):
            getattr(cls, verb)(*args)
    assert snapshot(connection) == before
    assert cls.get(*family.what, connection=connection) == family.setting


@pytest.mark.parametrize('cls,values', [(QueueSlot, (2,)), (QueueRate, (5, 60, 1))], ids=['QueueSlot', 'QueueRate'])
def test_a_queue_nothing_has_seen_warns_and_is_set_anyway(connection, cls, values):
    with pytest.warns(UnknownQueueWarning, match="'never-seen'"):
        made = cls.set('never-seen', *values, connection=connection)
    assert cls.get('never-seen', connection=connection) == made
    PolicyQueue('seen-queue', connection=connection).enqueue(key_jobs.per_shop, 't', shop='x')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        cls.set('seen-queue', *values, connection=connection)  # a queue rq knows: no warning
        cls.set('never-seen', *values, connection=connection)  # configured now: known, no warning


def test_the_02_names_warn_and_still_work(connection, seen):
    def old(call, *args, **kwargs):
        with pytest.warns(DeprecationWarning, match='removed in rq-policies 0.4') as caught:
            out = call(*args, connection=connection, **kwargs)
        assert caught[0].filename == __file__  # the warning points at the caller's line
        return out

    assert old(QueueSlot.set_capacity, 'admin-q', 3) is None
    assert QueueSlot.get('admin-q', connection=connection) == Cap(3)
    assert old(QueueSlot.capacity, 'admin-q') == 3
    assert old(QueueSlot.in_use, 'admin-q') == 0
    assert old(QueueSlot.holders, 'admin-q') == []
    assert old(QueueSlot.clear_capacity, 'admin-q') is True
    assert old(QueueSlot.capacity, 'admin-q') is None

    assert old(Concurrency.override, 's', 'k', 2) is False  # True when the key had an override before
    assert old(Concurrency.override, 's', 'k', 3) is True
    assert old(Concurrency.overridden, 's', 'k') == 3
    assert old(Concurrency.in_use, 's', 'k') == 0
    assert Concurrency.get('s', 'k', connection=connection) == KeyLimit(3)

    status = old(Rate.status, 's', 'k', 5, 1, 2)  # 0.2's form: the caller gives the rate
    assert status == RateStatus(2, status.next_at, None)
    assert old(Rate.status, 's', 'k', limit=5, per=1).available == 1  # burst 1 by default, as in 0.2
    with pytest.raises(TypeError, match='unexpected keyword'):
        Rate.status('s', 'k', limits=5, connection=connection)


def test_a_per_key_rate_set_at_run_time_wins_over_the_declared_one_at_fetch(connection):
    """Rate.set reaches the fetch script: a key parked under its declared 5/1s burst 2 gets a larger burst."""
    scope = 'tests.helpers.key_jobs.per_shop'
    q = PolicyQueue('rate', connection=connection)
    made = [q.enqueue(key_jobs.per_shop, 't', shop='a') for _ in range(6)]
    queues = [Queue('rate', connection=connection)]

    def fetch(token):
        return read_reply(fetch_call(queues, token, 90).run(connection), queues, token, 90)

    try:
        got = [fetch(f'h:1:0:{i}') for i in range(3)]
        assert [g.job_id for g in got[:2]] == [made[0].id, made[1].id] and isinstance(got[2], Look)
        assert Rate.parked(scope, 'a', connection=connection) == [j.id for j in made[2:]]
        assert Rate.status(scope, 'a', connection=connection).available == 0  # the declared rate, read off the job
        assert [row['rate'] for row in Rate.key_rows(connection, scope)] == [(5, 1, 2)]
        Rate.set(scope, 'a', 100, 1, 100, connection=connection)
        assert [(r['rate'], r['set_at_run_time']) for r in Rate.key_rows(connection, scope)] == [((100, 1, 100), True)]
        assert Rate.status(scope, 'a', connection=connection).available >= 90
        got = [fetch(f'h:1:1:{i}') for i in range(4)]
        assert [g.job_id for g in got if isinstance(g, Claim)] == [j.id for j in made[2:]]
        assert Rate.clear(scope, 'a', connection=connection) is True
        assert Rate.get(scope, 'a', connection=connection) is None
    finally:
        for token in ledger.PROCESS.snapshot():
            ledger.PROCESS.discard(token)


def test_concurrency_status_reads_the_limit_in_force(connection):
    q = PolicyQueue('keys', connection=connection)
    for _ in range(3):
        q.enqueue(key_jobs.one_per_customer, 't', 0, customer='c')
    scope = 'tests.helpers.key_jobs.one_per_customer'
    queues = [Queue('keys', connection=connection)]
    try:
        for i in range(3):
            read_reply(fetch_call(queues, f'h:2:0:{i}', 90).run(connection), queues, f'h:2:0:{i}', 90)
        status = Concurrency.status(scope, 'c', connection=connection)
        assert status.in_use == 1 and len(status.parked) == 2 and not status.overridden
        assert status.limit == 1  # declared on the parked jobs
        Concurrency.set(scope, 'c', 5, connection=connection)
        status = Concurrency.status(scope, 'c', connection=connection)
        assert status.limit == 5 and status.overridden
    finally:
        for token in ledger.PROCESS.snapshot():
            ledger.PROCESS.discard(token)


@pytest.mark.parametrize('family', FAMILIES, ids=str)
def test_set_and_clear_with_a_lost_reply_leave_what_one_call_leaves(connection, fault_proxy, seen, family):
    """redis-py resends a call whose reply was lost: a set or a clear that already landed, run again, leaves the same
    state as one call (and set still answers the setting)."""
    from redis import Redis
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError
    from redis.retry import Retry

    cls = family.cls
    proxied = Redis.from_url(fault_proxy.url, socket_timeout=0.5, socket_connect_timeout=1,
                             retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                             retry_on_error=[ConnectionError, TimeoutError])
    write = b'HSET' if cls in (QueueSlot, QueueRate) else b'EVALSHA'
    try:
        proxied.ping()
        _loaded(connection, 'clear_setting', 'key_setting')
        cls.set(*family.what, *family.values, connection=connection)
        once = settings(connection)
        assert cls.clear(*family.what, connection=connection) is True
        cleared = settings(connection)

        fault_proxy.drop_reply(match=write)
        seen_before = fault_proxy.seen(write)
        assert cls.set(*family.what, *family.values, connection=proxied) == family.setting
        assert fault_proxy.seen(write) - seen_before >= 2  # the reply was lost, the call was sent again
        assert settings(connection) == once

        delete = family.what[-1].encode()  # what the clear's command carries (one script: lua/clear_setting.lua,
        fault_proxy.drop_reply(match=delete)  # lua/key_setting.lua; before, QueueSlot's and QueueRate's an HDEL)
        seen_before = fault_proxy.seen(delete)
        # the replay answers what the first attempt did (it removed the setting), not the False of a second HDEL
        assert cls.clear(*family.what, connection=proxied) is True
        assert fault_proxy.seen(delete) - seen_before >= 2
        assert settings(connection) == cleared and cls.get(*family.what, connection=connection) is None
        assert cls.clear(*family.what, connection=proxied) is False  # a new call: nothing left to clear
        # each call's answer kept a minute under its request id: one per call, not per attempt
        assert sorted(answers(connection).values()) == [b'0', b'1', b'1']
    finally:
        proxied.close()


def _proxied(fault_proxy):
    from redis import Redis
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError
    from redis.retry import Retry

    proxied = Redis.from_url(fault_proxy.url, socket_timeout=0.5, socket_connect_timeout=1,
                             retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                             retry_on_error=[ConnectionError, TimeoutError])
    proxied.ping()
    return proxied


def _loaded(connection, *names):
    """The server knows these scripts: the first attempt runs the script (a NOSCRIPT answer ran nothing, and its lost
    reply would test no replay)."""
    from rq_policies.engine import scripts

    for name in names:
        connection.script_load(scripts.script(name).script)


def test_a_reset_whose_reply_is_lost_answers_the_first_runs_count(connection, fault_proxy):
    """``PolicyQueue.reset`` (``rq-policies reset``, the dashboard's reset) counts the keys it removed: its replay
    after a lost reply removed nothing more and answered 0; it answers the first run's count now."""
    from rq_policies import Loner, Throttle
    from rq_policies.engine import keys

    PolicyQueue('admin-q', connection=connection).enqueue(key_jobs.per_shop, 't', shop='x',
                                                          policy=[Loner(), Throttle(3600)])
    _loaded(connection, 'reset')
    proxied = _proxied(fault_proxy)
    try:
        q = PolicyQueue('admin-q', connection=proxied)
        fault_proxy.drop_reply(match=b'EVALSHA')
        seen_before = fault_proxy.seen(b'EVALSHA')
        assert q.reset(key_jobs.per_shop, 't', shop='x', policy=[Loner(), Throttle(3600)]) == 2  # marker, slot
        assert fault_proxy.seen(b'EVALSHA') - seen_before >= 2
        assert q.reset(key_jobs.per_shop, 't', shop='x', policy=[Loner(), Throttle(3600)]) == 0  # a new call
    finally:
        proxied.close()
    assert [k.decode() for k in connection.keys(keys.PREFIX + 'loner:*')] == []
    assert sorted(answers(connection).values()) == [b'0', b'2']  # each call's answer, kept a minute


def test_a_hold_release_whose_reply_is_lost_answers_true(connection, fault_proxy):
    """``QueueSlot.release`` says whether the hold was still there: its replay after a lost reply said False."""
    assert QueueSlot.acquire('admin-q', 2, token='manual', connection=connection)
    _loaded(connection, 'release_hold')
    proxied = _proxied(fault_proxy)
    try:
        fault_proxy.drop_reply(match=b'manual')  # the release's command (a ZREM before, now lua/release_hold.lua)
        seen_before = fault_proxy.seen(b'manual')
        assert QueueSlot.release('admin-q', token='manual', connection=proxied) is True
        assert fault_proxy.seen(b'manual') - seen_before >= 2
        assert QueueSlot.release('admin-q', token='manual', connection=proxied) is False  # a new call
    finally:
        proxied.close()
        ledger.PROCESS.discard('manual')
    assert QueueSlot.status('admin-q', connection=connection).in_use == 0
    with connection.pipeline() as pipe:  # on a pipeline it is a bare ZREM, its answer read by nobody
        assert QueueSlot.release('admin-q', token='manual', connection=pipe) is True
        pipe.execute()
