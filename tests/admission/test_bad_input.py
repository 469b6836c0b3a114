"""Bad arguments at enqueue get an error naming the argument and the function, and nothing in Redis changes: nesting
too deep (or a value that contains itself), lone surrogates where Redis needs text (per-key keys, keyword names),
numbers and dates that cannot be written out. Valid odd values (lone surrogates, bytes, NaN as arguments or as
unique_context's value) are admitted with a stable identity."""

from __future__ import annotations

import datetime as dt
import math
import re
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rq_policies import Concurrency, InvalidArgument, InvalidSetting, PolicyError, PolicyQueue, QueueSlot
from rq_policies.engine import identity
from rq_policies.engine.identity import MAX_DEPTH, digest
from tests.helpers import bad_input_jobs as jobs

# derandomize: the same cases on every run, whatever ran before (deterministic and order-independent).
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

POLICY_FUNCTIONS = [jobs.plain, jobs.unique, jobs.unique_by_first, jobs.throttled, jobs.debounced, jobs.one_per_call,
                    jobs.per_customer]


def nested(depth, leaf=1):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def cyclic():
    value = []
    value.append(value)
    return value


def snapshot(conn):
    out = {}
    for key in conn.scan_iter(count=1000):
        out[key] = (conn.type(key), conn.dump(key), conn.ttl(key) > 0)
    return out


@pytest.fixture
def q(connection):
    queue = PolicyQueue('bad-input', connection=connection)
    queue.enqueue(jobs.unique, 'seed')
    queue.enqueue(jobs.per_customer, 'seed-customer')
    QueueSlot.set('bad-input', 3, connection=connection)
    return queue


def refused(q, call, argument, function):
    """``call(q)`` raises InvalidArgument naming ``argument`` and ``function``; Redis is left as it was."""
    before = snapshot(q.connection)
    with pytest.raises(InvalidArgument) as caught:
        call(q)
    error = caught.value
    assert isinstance(error, ValueError) and isinstance(error, PolicyError)
    assert error.argument.startswith(argument) or argument in error.argument, str(error)
    assert error.function == function and function in str(error), str(error)
    assert snapshot(q.connection) == before
    return error


@pytest.mark.parametrize('func', POLICY_FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize('depth', [MAX_DEPTH + 1, 5000], ids=['past-identity-limit', 'past-recursion-limit'])
def test_deep_arguments_are_named(q, func, depth):
    name = f'tests.helpers.bad_input_jobs.{func.__name__}'
    too_deep = nested(depth)
    # A plain job takes what rq takes, and unique_by_first's identity is its first argument only: only rq's own
    # limit (its description, repr() of every argument) applies to the rest.
    if depth > 1000 or func not in (jobs.plain, jobs.unique_by_first):
        refused(q, lambda q: q.enqueue(func, 'c1', too_deep), 'args[1]', name)
        refused(q, lambda q: q.enqueue(func, 'c1', payload=too_deep), "kwargs['payload']", name)
        refused(q, lambda q: q.enqueue_in(timedelta(seconds=30), func, 'c1', too_deep), 'args[1]', name)
    else:
        assert q.enqueue(func, 'c1', too_deep) is not None


@pytest.mark.parametrize('func', POLICY_FUNCTIONS[1:], ids=lambda f: f.__name__)
def test_an_argument_that_contains_itself_is_named(q, func):
    if func is jobs.unique_by_first:  # its identity is args[0] only: the cycle elsewhere is rq's to pickle
        refused(q, lambda q: q.enqueue(func, cyclic()), 'the value unique_context returned',
                f'tests.helpers.bad_input_jobs.{func.__name__}')
        return
    refused(q, lambda q: q.enqueue(func, 'c1', 2, cyclic()), 'args[2]', f'tests.helpers.bad_input_jobs.{func.__name__}')


def test_the_depth_limit_is_the_same_for_positional_and_keyword_arguments():
    assert digest('f', 'q', [nested(MAX_DEPTH)]) == digest('f', 'q', [nested(MAX_DEPTH)])
    assert digest('f', 'q', [], {'a': nested(MAX_DEPTH)})
    for args, kwargs, where in (([nested(MAX_DEPTH + 1)], {}, 'args[0]'),
                                ([], {'a': nested(MAX_DEPTH + 1)}, "kwargs['a']")):
        with pytest.raises(InvalidArgument, match=re.escape(where) + r' in a call of f \(queue \'q\'\)'):
            digest('f', 'q', args, kwargs)


def test_deep_nesting_from_a_deep_stack_is_named():
    """MAX_DEPTH levels from a caller already deep in its own stack hit Python's limit first: still named."""
    def at_depth(n):
        if n:
            return at_depth(n - 1)
        return digest('f', 'q', [1, {'x': nested(MAX_DEPTH)}])

    import sys
    with pytest.raises(InvalidArgument, match=r'args\[1\]'):
        at_depth(sys.getrecursionlimit() - 150)


def test_a_lone_surrogate_in_a_per_key_key_is_named(q):
    error = refused(q, lambda q: q.enqueue(jobs.per_customer, '\ud800', 'x'), 'Concurrency(2, key=',
                    'tests.helpers.bad_input_jobs.per_customer')
    assert 'args[0]' in error.argument and 'lone surrogate' in str(error)
    error = refused(q, lambda q: q.enqueue(jobs.per_shop, 1, shop='ok\udfff'), 'Rate(',
                    'tests.helpers.bad_input_jobs.per_shop')
    assert "kwargs['shop']" in error.argument and "at index 2" in str(error)
    # The same check guards the keys given by hand (no function then), as the admin API's one error for bad input.
    with pytest.raises(InvalidSetting, match='key'):
        Concurrency.set('customers', '\ud800', 3, connection=q.connection)
    with pytest.raises(InvalidArgument, match='scope'):
        Concurrency(1, scope='s\ud800')
    # Text that only looks odd is fine: a key of non-ASCII text is stored and read back.
    job = q.enqueue(jobs.per_customer, 'caf\u00e9 \u2603', 'x')
    assert job is not None and job.get_status() == 'queued'


def test_a_lone_surrogate_in_a_keyword_name_is_named(q):
    for func in (jobs.plain, jobs.unique, jobs.throttled):
        error = refused(q, lambda q, func=func: q.enqueue(func, 1, **{'bad\ud800': 2}), 'the name of keyword argument',
                        f'tests.helpers.bad_input_jobs.{func.__name__}')
        assert "'bad\\ud800'" in error.argument


def test_numbers_and_dates_that_cannot_be_written_out_are_named(q):
    refused(q, lambda q: q.enqueue(jobs.unique, 'a', 10 ** 5000), 'args[1]', 'tests.helpers.bad_input_jobs.unique')
    late = dt.datetime(9999, 12, 31, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    error = refused(q, lambda q: q.enqueue(jobs.throttled, when=late), "kwargs['when']",
                    'tests.helpers.bad_input_jobs.throttled')
    assert 'out of range in UTC' in str(error)
    import decimal
    error = refused(q, lambda q: q.enqueue(jobs.debounced, amount=decimal.Decimal('1e999999999999')),
                    "kwargs['amount']", 'tests.helpers.bad_input_jobs.debounced')  # was a raw decimal.Overflow
    assert 'cannot be normalized' in str(error)


def test_odd_but_valid_values_are_admitted_with_a_stable_identity(q):
    """Lone surrogates, bytes and NaN as arguments (or as unique_context's value) are encodable: escaped, hexed and
    written out, so they admit once and drop the duplicate, and the job gets them back unchanged."""
    for args in (('\ud800',), (b'\xff\x00',), (math.nan,), ({'k\udfff': [math.nan, b'']},)):
        first = q.enqueue(jobs.unique, *args)
        assert first is not None
        assert q.enqueue(jobs.unique, *args) is None  # the same identity: dropped as a duplicate
        assert repr(q.fetch_job(first.id).args) == repr(args)
    assert q.enqueue(jobs.unique, '\ud801') is not None  # another surrogate, another identity
    assert q.enqueue(jobs.unique_by_first, '\udc80', 1) is not None
    assert q.enqueue(jobs.unique_by_first, '\udc80', 2) is None


# -- properties --------------------------------------------------------------------------------------------------

leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.binary(max_size=4),
                   st.text(st.characters(min_codepoint=0, max_codepoint=0xdfff), max_size=4))
trees = st.recursive(leaves, lambda children: st.one_of(
    st.lists(children, max_size=3), st.dictionaries(st.text(max_size=2), children, max_size=2)), max_leaves=8)


@SETTINGS
@given(value=trees, depth=st.integers(min_value=0, max_value=3 * MAX_DEPTH), as_kwarg=st.booleans())
def test_identity_encodes_or_names_the_argument(value, depth, as_kwarg):
    """Any nesting depth, text with surrogates, bytes, NaN: a digest, or InvalidArgument naming the argument; never
    RecursionError, UnicodeError or OverflowError."""
    value = nested(depth, value)
    args, kwargs, where = ([], {'v': value}, "kwargs['v']") if as_kwarg else ([value], {}, 'args[0]')
    try:
        found = digest('f', 'q', args, kwargs)
    except InvalidArgument as error:
        assert error.argument == where and 'nested deeper than' in str(error)
        assert depth >= MAX_DEPTH - 8  # only nesting past the limit (the tree adds up to 8 levels of its own)
        return
    assert re.fullmatch('[0-9a-f]{64}', found) and found == digest('f', 'q', args, kwargs)


@SETTINGS
@given(key=st.text(st.characters(min_codepoint=0, max_codepoint=0xdfff), min_size=1, max_size=6))
def test_a_per_key_key_is_admitted_or_refused_by_name(connection, key):
    q = PolicyQueue('bad-input-keys', connection=connection)
    try:
        key.encode('utf-8')
        valid = True
    except UnicodeEncodeError:
        valid = False
    before = snapshot(connection)
    if valid:
        assert q.enqueue(jobs.per_customer, key, 'x') is not None
        return
    with pytest.raises(InvalidArgument, match=re.escape('args[0]') + '.*tests.helpers.bad_input_jobs.per_customer'):
        q.enqueue(jobs.per_customer, key, 'x')
    assert snapshot(connection) == before


def test_identity_module_names_the_limit():
    assert identity.MAX_DEPTH == MAX_DEPTH == 100


def test_asking_and_resetting_name_a_deep_argument_too(q):
    before = snapshot(q.connection)
    for ask in (lambda: q.holder(jobs.unique, nested(5000)), lambda: q.enqueued(jobs.unique, 'a', nested(150)),
                lambda: q.reset(jobs.throttled, x=nested(5000))):
        with pytest.raises(InvalidArgument,
                           match=r'(args\[\d\]|kwargs\[.x.\]) in a call of tests\.helpers\.bad_input_jobs\.'):
            ask()
    assert snapshot(q.connection) == before
    assert q.holder(jobs.unique, 'seed') is not None  # the probe still finds the holder of an identity
