"""One error type for every bad argument (issue 33): a policy's constructor, an enqueue's option, an admin call and a
job's request (Snooze, BackOff) refuse a bad argument with :class:`InvalidArgument` (a ValueError and a TypeError
too, so ``except`` clauses written against either keep working) naming the argument and the value, and nothing in
Redis changes: what was there before the call is there after it, byte for byte."""

from __future__ import annotations

import pytest

from rq_policies import (
    BackOff,
    Concurrency,
    Debounce,
    Fair,
    InvalidArgument,
    InvalidSetting,
    Loner,
    PolicyError,
    PolicyQueue,
    QueueRate,
    QueueSlot,
    Rate,
    Snooze,
    Throttle,
    policy,
)
from tests.helpers import bad_input_jobs as jobs
from tests.helpers import fair_jobs


def snapshot(conn):
    return {key: (conn.type(key), conn.dump(key)) for key in conn.scan_iter(count=1000)}


def _enqueue(**options):
    return lambda q: q.enqueue(jobs.plain, 'x', **options)


# (id, call(q), the argument the error must name)
BAD_CALLS = [
    # constructors
    ('Loner-until', lambda q: Loner(until='done'), 'until'),
    ('Loner-ttl-negative', lambda q: Loner(ttl=-5), 'ttl'),
    ('Loner-ttl-text', lambda q: Loner(ttl='5'), 'ttl'),
    ('Loner-on_conflict', lambda q: Loner(on_conflict='ignore'), 'on_conflict'),
    ('Throttle-slot', lambda q: Throttle(0), 'slot'),
    ('Throttle-trailing', lambda q: Throttle(60, trailing='yes'), 'trailing'),
    ('Debounce-wait', lambda q: Debounce(-1), 'wait'),
    ('Debounce-max_wait', lambda q: Debounce(60, max_wait=10), 'max_wait'),
    ('Concurrency-limit', lambda q: Concurrency(0), 'limit'),
    ('Concurrency-key', lambda q: Concurrency(2, key='customer'), 'key'),
    ('Concurrency-scope', lambda q: Concurrency(2, scope='a:b'), 'scope'),
    ('Rate-per', lambda q: Rate(5, per=0), 'per'),
    ('Fair-key', lambda q: Fair(key='tenant'), 'key'),
    ('Fair-weight', lambda q: Fair(key=lambda a, k: a[0], weight=0), 'weight'),
    ('Fair-on_conflict', lambda q: Fair(key=lambda a, k: a[0], on_conflict='replace'), 'on_conflict'),
    ('policy-decorator-empty', lambda q: policy(), 'policy'),
    ('policy-decorator-not-callable', lambda q: policy(Loner())(42), 'policy'),
    ('policy-unique_context', lambda q: policy(Loner(), unique_context=3)(jobs.plain), 'unique_context'),
    ('Snooze-seconds', lambda q: Snooze(-1), 'seconds'),
    ('Snooze-max_snoozes', lambda q: Snooze(5, max_snoozes=0), 'max_snoozes'),
    ('BackOff-key', lambda q: BackOff(5, key='yes'), 'key'),
    # enqueue options
    ('enqueue-policy-string', _enqueue(policy='loner'), 'policy'),
    ('enqueue-policy-list', _enqueue(policy=[Loner(), 'throttle']), 'policy'),
    ('enqueue-wait_replicas', _enqueue(wait_replicas=-1), 'wait_replicas'),
    ('enqueue-priority', lambda q: q.enqueue(fair_jobs.work, 't', tenant='a', priority=5000), 'priority'),
    ('enqueue-key-type', lambda q: q.enqueue(jobs.per_customer, 1.5), 'key'),
    # admin calls
    ('QueueSlot.set-capacity', lambda q: QueueSlot.set('bad-args', 0, connection=q.connection), 'capacity'),
    ('QueueSlot.set-queue', lambda q: QueueSlot.set('', 3, connection=q.connection), 'queue'),
    ('QueueSlot.set-connection', lambda q: QueueSlot.set('bad-args', 3), 'connection'),
    ('QueueRate.set-limit', lambda q: QueueRate.set('bad-args', 0, connection=q.connection), 'limit'),
    ('QueueRate.set-burst', lambda q: QueueRate.set('bad-args', 2, burst=3, connection=q.connection), 'burst'),
    ('Concurrency.set-limit', lambda q: Concurrency.set('s', 'k', -1, connection=q.connection), 'limit'),
    ('Concurrency.set-scope', lambda q: Concurrency.set('s:x', 'k', 1, connection=q.connection), 'scope'),
    ('Concurrency.set-key', lambda q: Concurrency.set('s', 1.5, 1, connection=q.connection), 'key'),
    ('Rate.set-per', lambda q: Rate.set('s', 'k', 1, per=0, connection=q.connection), 'per'),
    ('Fair.set-weight', lambda q: Fair.set(fair_jobs.SCOPE, 'k', 0, connection=q.connection), 'weight'),
    ('Fair.pause-scope', lambda q: Fair.pause('a:b', 'k', connection=q.connection), 'scope'),
    ('Fair.pause-connection', lambda q: Fair.pause(fair_jobs.SCOPE, 'k'), 'connection'),
    ('Fair.status-key', lambda q: Fair.status(fair_jobs.SCOPE, None, connection=q.connection), 'key'),
]


@pytest.fixture
def q(connection):
    queue = PolicyQueue('bad-args', connection=connection)
    queue.enqueue(jobs.unique, 'seed')  # something in Redis that must stay as it is
    queue.enqueue(jobs.per_customer, 'seed-customer')
    QueueSlot.set('bad-args', 3, connection=connection)
    Fair.set(fair_jobs.SCOPE, 'seeded', 2, connection=connection)
    return queue


@pytest.mark.parametrize(('call', 'argument'), [case[1:] for case in BAD_CALLS], ids=[case[0] for case in BAD_CALLS])
def test_every_bad_argument_is_an_invalid_argument_naming_it_and_nothing_is_written(q, call, argument):
    before = snapshot(q.connection)
    with pytest.raises(InvalidArgument) as caught:
        call(q)
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, TypeError) and isinstance(error, PolicyError)
    assert argument in error.argument, (error.argument, str(error))
    assert argument in str(error), str(error)
    assert snapshot(q.connection) == before


def test_the_admin_calls_error_keeps_its_name_and_is_an_invalid_argument(connection):
    with pytest.raises(InvalidSetting) as caught:
        QueueSlot.set('bad-args', 0, connection=connection)
    assert isinstance(caught.value, InvalidArgument) and caught.value.argument == 'capacity'
    assert 'capacity' in str(caught.value) and '0' in str(caught.value)


def test_except_clauses_written_for_the_old_types_still_catch_it(connection):
    with pytest.raises(ValueError, match="until must be 'started' or 'finished', got 'done'"):
        Loner(until='done')
    with pytest.raises(TypeError, match='policy'):
        PolicyQueue('x', connection=connection).enqueue(jobs.plain, policy='loner')
