"""Fuzzing the public doors: every case ends in a clear error or a correct result, and a rejected call changes
nothing already in Redis. Each property test runs its hypothesis search and then checks it tried its whole budget
of cases, on its own: no test depends on another having run before it."""

from __future__ import annotations

import string
import subprocess
import sys
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rq_policies import Debounce, PolicyConfigurationError, PolicyQueue, QueueSlot, Throttle
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.policy import MAX_CAPACITY, MAX_SECONDS
from tests.helpers import jobs

CASES: dict[str, int] = {}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

anything = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**20, max_value=10**20), st.floats(allow_nan=True),
    st.text(max_size=20), st.binary(max_size=20), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.just(object()), st.just(timedelta(seconds=5)),
)
queue_names = st.text(alphabet=string.printable + 'éü☃\u0000', min_size=1, max_size=30)


def _tried(search, *fixtures) -> int:
    """Run one hypothesis search (``search`` is a @given function; ``fixtures`` fill its other arguments) and return
    how many cases it tried."""
    CASES[search.__name__] = 0
    search(*fixtures)
    return CASES[search.__name__]


def snapshot(conn):
    """Every key with its type, value and expiry flag: what "nothing changed" compares."""
    out = {}
    for key in conn.scan_iter(count=1000):
        out[key] = (conn.type(key), conn.dump(key), conn.ttl(key) > 0)
    return out


def seeded(conn):
    q = PolicyQueue('seed', connection=conn)
    q.enqueue(jobs.sweep_cache, 'seed')
    QueueSlot.set('seed', 3, connection=conn)
    QueueSlot.acquire('seed', capacity=3, token='holder', connection=conn)
    return q


def positive(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def whole_seconds(value):
    return positive(value) and value <= MAX_SECONDS


@SETTINGS
@given(slot=anything, trailing=anything)
def _throttle_arguments(slot, trailing):
    CASES['_throttle_arguments'] = CASES.get('_throttle_arguments', 0) + 1
    if whole_seconds(slot) and isinstance(trailing, bool):
        assert Throttle(slot, trailing=trailing).slot == slot
        return
    with pytest.raises((ValueError, TypeError)) as info:
        Throttle(slot, trailing=trailing)
    assert ('slot' in str(info.value)) or ('trailing' in str(info.value))


def test_throttle_arguments():
    assert _tried(_throttle_arguments) >= SETTINGS.max_examples


@SETTINGS
@given(wait=anything, max_wait=anything)
def _debounce_arguments(wait, max_wait):
    CASES['_debounce_arguments'] = CASES.get('_debounce_arguments', 0) + 1
    ok = whole_seconds(wait) and (max_wait is None or (whole_seconds(max_wait) and max_wait >= wait))
    if ok:
        Debounce(wait, max_wait=max_wait)
        return
    with pytest.raises((ValueError, TypeError)) as info:
        Debounce(wait, max_wait=max_wait)
    assert 'wait' in str(info.value)


def test_debounce_arguments():
    assert _tried(_debounce_arguments) >= SETTINGS.max_examples


@SETTINGS
@given(capacity=anything, ttl=anything)
def _capacity_and_ttl_rejected_without_a_trace(connection, capacity, ttl):
    CASES['_capacity_and_ttl_rejected_without_a_trace'] = CASES.get('_capacity_and_ttl_rejected_without_a_trace', 0) + 1
    connection.flushdb()
    seeded(connection)
    before = snapshot(connection)
    valid_cap, valid_ttl = positive(capacity) and capacity <= MAX_CAPACITY, whole_seconds(ttl)
    if not valid_cap:
        with pytest.raises(ValueError, match='capacity'):
            QueueSlot.set('seed', capacity, connection=connection)
    if not (valid_cap and valid_ttl):
        with pytest.raises(ValueError, match='capacity|ttl'):
            QueueSlot.acquire('seed', capacity=capacity, ttl=ttl, token='x', connection=connection)
        assert snapshot(connection) == before
    else:
        assert QueueSlot.acquire('seed', capacity=capacity, ttl=ttl, token='x', connection=connection) in (True, False)


def test_capacity_and_ttl_rejected_without_a_trace(connection):
    assert _tried(_capacity_and_ttl_rejected_without_a_trace, connection) >= SETTINGS.max_examples


@SETTINGS
@given(args=st.lists(anything, max_size=3), name=queue_names)
def _job_arguments_and_queue_names(connection, args, name):
    CASES['_job_arguments_and_queue_names'] = CASES.get('_job_arguments_and_queue_names', 0) + 1
    connection.flushdb()
    seeded(connection)
    q = PolicyQueue(name, connection=connection)
    before = snapshot(connection)
    try:
        job = q.enqueue(jobs.sweep_cache, *args)
    except TypeError as exc:
        assert 'args[' in str(exc) or 'kwargs' in str(exc)
        assert snapshot(connection) == before
        return
    except Exception as exc:  # pickling failures of rq itself (e.g. object()) are rq's own clear errors
        assert snapshot(connection) == before, exc
        return
    assert job is not None
    assert q.enqueue(jobs.sweep_cache, *args) is None
    assert q.enqueued(jobs.sweep_cache, *args)
    for key in connection.scan_iter(f'{RQ}:policies:*'):
        assert key.startswith(f'{RQ}:policies:'.encode())
    assert connection.get(keys.loner(name, connection.hget(job.key, keys.LONER_FIELD).decode().rsplit(':', 1)[1]))


def test_job_arguments_and_queue_names(connection):
    assert _tried(_job_arguments_and_queue_names, connection) >= SETTINGS.max_examples


@SETTINGS
@given(policy=anything)
def _policy_argument_of_enqueue(connection, policy):
    CASES['_policy_argument_of_enqueue'] = CASES.get('_policy_argument_of_enqueue', 0) + 1
    connection.flushdb()
    q = seeded(connection)
    before = snapshot(connection)
    if policy is None or policy == []:  # "no policy": enqueued as stock rq would
        assert q.enqueue(jobs.plain, 1, policy=policy) is not None
        return
    with pytest.raises((TypeError, PolicyConfigurationError), match='policy'):
        q.enqueue(jobs.plain, 1, policy=policy)
    assert snapshot(connection) == before


def test_policy_argument_of_enqueue(connection):
    assert _tried(_policy_argument_of_enqueue, connection) >= SETTINGS.max_examples


def test_huge_payloads(connection):
    q = PolicyQueue('huge', connection=connection)
    big = 'x' * (8 * 1024 * 1024)
    job = q.enqueue(jobs.sweep_cache, big)
    assert job is not None and q.enqueue(jobs.sweep_cache, big) is None
    assert len(q.fetch_job(job.id).args[0]) == len(big)
    assert q.enqueue(jobs.sweep_cache, big + 'y') is not None


def _cli(*args, env):
    return subprocess.run([sys.executable, '-m', 'rq_policies', *args], capture_output=True, text=True,
                          env=env, timeout=60)


CLI_CASES = [
    ('cap', 'seed', 'three'), ('cap', 'seed', '-1'), ('cap', 'seed', '0'), ('cap', 'seed', '1.5'),
    ('cap', 'seed', '2', '--clear'),
    ('cap', 'no-such-queue', '2'), ('cap', '', '2'), ('reset', 'seed', 'not a path'), ('reset', 'seed', '.x'),
    ('reset', 'seed', 'tests.helpers.jobs.sweep_cache', '--kwarg', 'novalue'), ('info', '--json', 'no-such-queue'),
    ('exporter', '--port', '0'), ('exporter', '--port', 'http'), ('cap', 'seed', '\u2603'), ('info', '--limit', 'x'),
    ('cap', 'seed', '99999999999999999999999'), ('nosuchcommand',),
]


@pytest.mark.parametrize('argv', CLI_CASES, ids=lambda a: ' '.join(a)[:40] or 'empty')
def test_cli_rejects_bad_input_cleanly(connection, redis_url, worker_env, argv):
    seeded(connection)
    before = snapshot(connection)
    env = dict(worker_env, RQ_REDIS_URL=redis_url)
    result = _cli(*argv, env=env)
    assert result.returncode != 0, (argv, result.stdout)
    assert 'Traceback' not in result.stderr, result.stderr
    assert result.stderr.strip(), argv
    assert snapshot(connection) == before


def test_cli_unreachable_redis(worker_env):
    env = dict(worker_env, RQ_REDIS_URL='redis://127.0.0.1:1/0')
    for argv in (('info',), ('cap', 'q', '2'), ('reset', 'q', 'tests.helpers.jobs.sweep_cache', '1')):
        result = _cli(*argv, env=env)
        assert result.returncode != 0 and 'Traceback' not in result.stderr
        assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
