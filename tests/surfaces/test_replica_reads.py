"""Replica reads for the surfaces that only read (``--read-from-replicas``, ``read_from_replicas=True``;
rq_policies/replicas.py, docs/cluster.md).

On a real cluster (the session's under ``RQ_POLICIES_CLUSTER=1 RQ_KEY_PREFIX='{rq}'``, else one of this module's own
with a hash-tagged prefix; skipped without one): ``rq-policies info`` and ``explain``, the collector, the exporter
and the page read the replica of the prefix's slot, shown by the nodes' own counters (``INFO commandstats`` after
``CONFIG RESETSTAT``: the replica answers the reads, the primary answers none), and once ``WAIT`` says the replica
has every write, what they show equals what the primary gives. Scripts, writes and the page's actions still reach
the primary. On a single server the option is refused, in one line naming it. And ``wait_for_replicas``, the opt-in
``WAIT`` after an admin write: 1 once the replica has the write, 0 after its timeout when the replica is stopped or
there is none.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from redis import Redis
from redis.commands import READ_COMMANDS

from rq_policies import Concurrency, Loner, PolicyQueue, QueueSlot, Throttle
from rq_policies.engine import keys
from rq_policies.engine.compat import RQ3
from rq_policies.engine.exceptions import PolicyConfigurationError
from rq_policies.policies.concurrency.views import ConcurrencyViews
from rq_policies.surfaces import replicas
from rq_policies.surfaces.testing import free_port
from tests.helpers import fetches, jobs, key_jobs, with_root
from tests.helpers.cli import assert_one_line_error
from tests.helpers.cluster import CLUSTER_CLASS, ValkeyCluster, not_on_cluster

CLUSTER_READY = RQ3 and keys.hash_tag(keys.PREFIX) is not None
on_cluster = [
    pytest.mark.cluster,
    pytest.mark.skipif(not CLUSTER_READY,
                       reason="a cluster needs rq 3 and a hash-tagged prefix: RQ_KEY_PREFIX='{rq}' pytest -m cluster"),
]

#: The keyed commands redis-py may send a replica (its READ_COMMANDS), lower-cased as INFO commandstats names them.
READS = {name.lower() for name in READ_COMMANDS}

#: A per-key scope (a Concurrency's scope is its function's path unless it names one).
SCOPE = 'tests.helpers.key_jobs.per_customer'


# -- a cluster whose prefix slot has a replica the clients know -----------------------------------------------------


@pytest.fixture(scope='module')
def replica_cluster(session_cluster):
    """The session's cluster, or one of this module's own (3 primaries, 3 replicas)."""
    if not CLUSTER_READY:
        pytest.skip("a cluster needs rq 3 and a hash-tagged prefix: RQ_KEY_PREFIX='{rq}' pytest -m cluster")
    if session_cluster is not None:
        yield session_cluster
        return
    with ValkeyCluster(primaries=3, replicas=1) as found:
        yield found


@pytest.fixture
def nodes(replica_cluster):
    """(primary, replica) of the prefix's slot, once every node's CLUSTER SLOTS lists that replica (a client reads
    its slot map from any node: one without the replica would send every read to the primary)."""
    replica_cluster.flush()
    deadline = time.monotonic() + 30
    while True:
        primary, replica = replica_cluster.owner_of(keys.PREFIX)
        if replica is not None and all(_lists_replica(replica_cluster, port, replica.port)
                                       for port in replica_cluster.ports):
            break
        assert time.monotonic() < deadline, 'the prefix slot has no replica every node knows'
        time.sleep(0.1)
    try:
        yield primary, replica
    finally:
        replica_cluster.flush()


def _lists_replica(replica_cluster, port: int, replica_port: int) -> bool:
    c = replica_cluster.node_client(port)
    try:
        return any(int(node[1]) == replica_port for entry in c.execute_command('CLUSTER SLOTS') for node in entry[2:])
    except Exception:
        return False
    finally:
        c.close()


@pytest.fixture
def cluster(replica_cluster, nodes):
    client = replica_cluster.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def env(worker_env, replica_cluster):
    return with_root(dict(worker_env, RQ_KEY_PREFIX=os.environ['RQ_KEY_PREFIX']))


def replicated(replica_cluster, primary) -> None:
    """Block until the slot's replica has every write the primary took so far: one write of this client's, then
    ``WAIT 1`` (the replication stream is in order, so its acknowledgement covers every earlier write)."""
    c = replica_cluster.node_client(primary.port)
    try:
        c.incr(keys.PREFIX + 'test:replicated')
        assert c.execute_command('WAIT', 1, 10_000) == 1, 'the replica did not acknowledge within 10 s'
    finally:
        c.close()


def reads_on(replica_cluster, node) -> dict[str, int]:
    """Calls of each keyed read command on ``node`` since the last reset."""
    c = replica_cluster.node_client(node.port)
    try:
        stats = c.info('commandstats')
    finally:
        c.close()
    calls = {name[len('cmdstat_'):]: int(value['calls']) for name, value in stats.items()}
    return {name: count for name, count in calls.items() if name in READS}


def scripts_on(replica_cluster, node) -> int:
    """Script calls (EVALSHA, EVAL) on ``node`` since the last reset."""
    c = replica_cluster.node_client(node.port)
    try:
        stats = c.info('commandstats')
    finally:
        c.close()
    return sum(int(stats.get(f'cmdstat_{command}', {}).get('calls', 0)) for command in ('evalsha', 'eval'))


def _on_node(replica_cluster, node, command: str, *args: str) -> Any:
    """``command`` sent to ``node`` itself (not through a cluster client's routing)."""
    c = replica_cluster.node_client(node.port)
    try:
        return c.execute_command(command.upper(), *args)
    finally:
        c.close()


def steady(value: Any) -> Any:
    """``value`` with every float (server times, seconds left on a window: they move between two reads) blanked, in
    text too (``expires in 88.4 s``)."""
    if isinstance(value, dict):
        return {k: steady(v) for k, v in value.items()}
    if isinstance(value, list):
        return [steady(v) for v in value]
    if isinstance(value, float):
        return '<float>'
    if isinstance(value, str):
        return re.sub(_MOVING, '<moment>', value)
    return value


#: What moves in a text between two reads: a clock time (``05:42:12``, with its date), a time left or past
#: (``in 90 s``, ``12 s ago``), seconds with a fraction (``expires in 88.4 s``).
_MOVING = re.compile(r'([0-9-]+[T ])?[0-9]{2}:[0-9]{2}:[0-9]{2}(\+[0-9:]+| UTC)?|in [0-9.]+ [a-z]+|[0-9.]+ [a-z]+ ago'
                     r'|[0-9]+\.[0-9]+')


def some_state(cluster) -> Any:
    """Loner jobs waiting, a throttled one, a cap with a live hold, a Concurrency key at its limit with jobs parked:
    reads of hashes, sorted sets, lists, strings, and the SCANs of the identity lists and the per-key rows."""
    q = PolicyQueue('emails', connection=cluster)
    held = [q.enqueue(jobs.plain, i, policy=Loner()) for i in range(4)]
    q.enqueue(jobs.plain, 'news', policy=Throttle(600))
    QueueSlot.set('emails', 2, connection=cluster)
    assert QueueSlot.acquire('emails', 2, token='web-1', connection=cluster)
    keyed = PolicyQueue('keys', connection=cluster)
    for _ in range(4):
        keyed.enqueue(key_jobs.per_customer, 't', 0, customer='acme')  # Concurrency(2) per customer
    for i in range(3):
        fetches.fetch(cluster, f'h:13:0:{i}', ('keys',))  # 2 start, the third parks the other 2
    assert [row[:4] for row in [[r['key'], r['in_use'], r['limit'], r['parked']]
                                for r in ConcurrencyViews.key_rows(cluster, SCOPE)]] == [['acme', 2, 2, 2]]
    return held[0]


def cli(env, *args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'rq_policies', *args, *CLUSTER_CLASS, '--url', url], env=env,
                          capture_output=True, text=True, timeout=60)


# -- on a cluster ----------------------------------------------------------------------------------------------------


class TestOnACluster:
    pytestmark = on_cluster

    def test_info_and_explain_read_the_replica_and_match_the_primary(self, cluster, replica_cluster, nodes, env):
        primary, replica = nodes
        job = some_state(cluster)
        replicated(replica_cluster, primary)
        url = replica_cluster.url

        replica_cluster.reset_stats()
        from_replica = cli(env, 'info', '--json', '--read-from-replicas', url=url)
        assert from_replica.returncode == 0, from_replica.stderr
        on_replica, on_primary = reads_on(replica_cluster, replica), reads_on(replica_cluster, primary)
        assert on_replica.get('scan', 0) >= 1 and on_replica.get('hgetall', 0) + on_replica.get('hmget', 0) >= 1, \
            on_replica
        assert on_primary == {}, f'reads reached the primary: {on_primary}'

        replica_cluster.reset_stats()
        from_primary = cli(env, 'info', '--json', url=url)
        assert from_primary.returncode == 0, from_primary.stderr
        assert reads_on(replica_cluster, replica) == {}  # without the option every read is the primary's
        assert reads_on(replica_cluster, primary).get('scan', 0) >= 1
        shown = json.loads(from_replica.stdout)
        assert shown['queues']['emails']['capacity'] == 2 and shown['queues']['emails']['loner']['waiting'] == 4
        assert shown['policies']['concurrency']['scopes'][SCOPE]['parked'] == 2
        assert steady(shown) == steady(json.loads(from_primary.stdout))

        replica_cluster.reset_stats()
        explained = cli(env, 'explain', job.id, '--json', '--read-from-replicas', url=url)
        assert explained.returncode == 0, explained.stderr
        assert reads_on(replica_cluster, replica).get('hmget', 0) >= 1
        assert reads_on(replica_cluster, primary) == {}
        plain = cli(env, 'explain', job.id, '--json', url=url)
        a, b = steady(json.loads(explained.stdout)), steady(json.loads(plain.stdout))
        assert a == b

    def test_the_collector_and_the_exporter_read_the_replica(self, cluster, replica_cluster, nodes, env):
        prometheus_client = pytest.importorskip('prometheus_client')
        from prometheus_client.parser import text_string_to_metric_families

        from rq_policies.surfaces.metrics import PolicyCollector

        primary, replica = nodes
        some_state(cluster)
        replicated(replica_cluster, primary)

        def samples(collector) -> dict[tuple, float]:
            registry = prometheus_client.CollectorRegistry(auto_describe=False)
            registry.register(collector)
            text = prometheus_client.generate_latest(registry).decode()
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(text) for s in family.samples}

        replica_cluster.reset_stats()
        reading = PolicyCollector(cluster, read_from_replicas=True)
        try:
            from_replica = samples(reading)
        finally:
            reading.close()
        on_replica, on_primary = reads_on(replica_cluster, replica), reads_on(replica_cluster, primary)
        assert on_replica.get('hgetall', 0) >= 1 and on_primary == {}, (on_replica, on_primary)
        assert cluster.load_balancing_strategy is None  # the caller's client is left as it was
        from_primary = samples(PolicyCollector(cluster))
        assert from_replica[('rq_policies_queue_slots_capacity', (('queue', 'emails'),))] == 2
        assert from_replica[('rq_policies_queue_slots_in_use', (('queue', 'emails'),))] == 1
        assert from_replica == from_primary

        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, '-m', 'rq_policies', 'exporter', '--port', str(port), '--addr', '127.0.0.1',
             '--read-from-replicas', *CLUSTER_CLASS, '--url', replica_cluster.url],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            body = None
            deadline = time.monotonic() + 30
            while body is None:
                try:
                    replica_cluster.reset_stats()
                    with urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=5) as response:
                        body = response.read().decode()
                except OSError:
                    assert proc.poll() is None, proc.communicate()[1]
                    assert time.monotonic() < deadline, 'the exporter never answered'
                    time.sleep(0.2)
            assert 'rq_policies_queue_slots_capacity{queue="emails"} 2.0' in body
            assert reads_on(replica_cluster, replica).get('hgetall', 0) >= 1
            assert reads_on(replica_cluster, primary) == {}
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err

    def test_the_page_reads_the_replica_and_its_actions_write_the_primary(self, cluster, replica_cluster, nodes):
        pytest.importorskip('flask')
        from rq_policies.surfaces.dashboard import create_app
        from rq_policies.surfaces.dashboard.web import CSRF_COOKIE

        primary, replica = nodes
        job = some_state(cluster)
        replicated(replica_cluster, primary)
        app = create_app(cluster, allow_actions=True, read_from_replicas=True)
        try:
            c = app.test_client()
            replica_cluster.reset_stats()
            shown = c.get('/state.json')
            assert shown.status_code == 200
            assert c.get(f'/job?id={job.id}').status_code == 200
            on_replica, on_primary = reads_on(replica_cluster, replica), reads_on(replica_cluster, primary)
            assert on_replica.get('scan', 0) >= 1 and on_primary == {}, (on_replica, on_primary)
            plain = create_app(cluster).test_client().get('/state.json')
            assert steady(_without_clock(shown.get_json())) == steady(_without_clock(plain.get_json()))
            assert [row['name'] for row in shown.get_json()['queues']['rows']] == ['emails', 'keys']
            assert any([c['text'] for c in row[:4]] == ['acme', '2', '2', '2']
                       for panel in shown.get_json()['panels'] if panel['policy'] == 'concurrency'
                       for row in panel['rows'])  # the per-key panel, from the replica's SCAN

            # Actions use the connection given: the confirmation page reads the primary, and the setting is
            # written there (a cap: a pipeline; a key's limit: a script), readable on the primary at once.
            c.get('/')
            token = c.get_cookie(CSRF_COOKIE).value
            form = {'csrf': token, 'queue': 'emails', 'policy': 'queue_slot', 'capacity': '5'}
            replica_cluster.reset_stats()
            confirm = c.post('/action/configure', data=form)
            assert confirm.status_code == 200 and 'id="confirm"' in confirm.get_data(as_text=True)
            assert reads_on(replica_cluster, replica) == {} and reads_on(replica_cluster, primary) != {}
            done = c.post('/action/configure', data={**form, 'confirmed': 'yes'})
            assert done.status_code == 200 and 'id="action-done"' in done.get_data(as_text=True)
            assert _on_node(replica_cluster, primary, 'hget', keys.CAPACITY, 'emails') == '5'
            form = {'csrf': token, 'policy': 'concurrency', 'scope': SCOPE, 'key': 'acme', 'limit': '3'}
            replica_cluster.reset_stats()
            done = c.post('/action/override', data={**form, 'confirmed': 'yes'})
            assert done.status_code == 200 and 'id="action-done"' in done.get_data(as_text=True)
            assert scripts_on(replica_cluster, primary) >= 1 and reads_on(replica_cluster, replica) == {}
            assert _on_node(replica_cluster, primary, 'hget', keys.KEY_LIMITS, keys.key_id(SCOPE, 'acme')) == '3'
        finally:
            app.blueprints['rq_policies'].replica_readers.close()

    def test_scripts_and_writes_through_a_reader_go_to_the_primary(self, cluster, replica_cluster, nodes):
        primary, replica = nodes
        reader = replicas.replica_reader(cluster)
        try:
            assert replicas.owned(reader, cluster) and replicas.is_replica_reader(reader)
            assert replicas.replica_reader(reader) is reader  # already reading replicas: used as it is
            replica_cluster.reset_stats()
            Concurrency.set(SCOPE, 'acme', 3, connection=reader)  # a script
            QueueSlot.set('scripted', 3, connection=reader)  # a pipeline
            reader.set(keys.PREFIX + 'test:written', 'yes')  # a plain write
            assert scripts_on(replica_cluster, primary) >= 1
            assert scripts_on(replica_cluster, replica) == 0  # (a script's writes reach a replica as its effects)
            assert _on_node(replica_cluster, primary, 'get', keys.PREFIX + 'test:written') == 'yes'
            replicated(replica_cluster, primary)
            replica_cluster.reset_stats()
            assert reader.get(keys.PREFIX + 'test:written') == b'yes'
            assert QueueSlot.get('scripted', connection=reader).capacity == 3
            assert Concurrency.get(SCOPE, 'acme', connection=reader).limit == 3
            assert reads_on(replica_cluster, replica).get('get', 0) >= 1 and reads_on(replica_cluster, primary) == {}
            # the reader's connections to the replica are READONLY ones (CLIENT LIST flag r)
            c = replica_cluster.node_client(replica.port)
            try:
                assert any('r' in entry['flags'] for entry in c.client_list()), c.client_list()
            finally:
                c.close()
        finally:
            reader.close()


    def test_wait_for_replicas_after_an_admin_write(self, cluster, replica_cluster, nodes):
        primary, replica = nodes
        QueueSlot.set('waited', 4, connection=cluster)
        assert replicas.wait_for_replicas(cluster, 1, 10_000) == 1
        c = replica_cluster.node_client(replica.port)
        try:
            c.execute_command('READONLY')
            assert c.hget(keys.CAPACITY, 'waited') == '4'  # on the replica itself
        finally:
            c.close()
        # A replica that does not answer is not counted: WAIT waits its timeout and says 0.
        os.kill(replica.process.pid, signal.SIGSTOP)
        try:
            QueueSlot.set('waited', 5, connection=cluster)
            started = time.monotonic()
            assert replicas.wait_for_replicas(cluster, 1, 300) == 0
            assert time.monotonic() - started >= 0.25
        finally:
            os.kill(replica.process.pid, signal.SIGCONT)
        assert replicas.wait_for_replicas(cluster, 1, 10_000) == 1


def _without_clock(view: dict[str, Any]) -> dict[str, Any]:
    """The page's data less what names the moment it was read (its clock text)."""
    return {k: v for k, v in view.items() if k not in ('server_time', 'server_time_text', 'local_time_text')}


# -- on a single server: refused, naming the option -----------------------------------------------------------------


def test_replica_reads_are_refused_on_a_single_server_naming_the_option(redis_url, worker_env):
    pytest.importorskip('prometheus_client')
    pytest.importorskip('flask')
    from rq_policies.surfaces.dashboard import create_app
    from rq_policies.surfaces.metrics import PolicyCollector, make_server

    plain = Redis.from_url(redis_url)
    try:
        with pytest.raises(PolicyConfigurationError, match=r'PolicyCollector\(read_from_replicas=True\) needs a Redis '
                                                           r'Cluster connection \(redis\.cluster\.RedisCluster\), '
                                                           r'got Redis'):
            PolicyCollector(plain, read_from_replicas=True)
        with pytest.raises(PolicyConfigurationError, match=r'read_from_replicas=True\) needs a Redis Cluster'):
            make_server(plain, free_port(), '127.0.0.1', read_from_replicas=True)
        with pytest.raises(PolicyConfigurationError, match='read_from_replicas=True needs a Redis Cluster'):
            create_app(plain, read_from_replicas=True)
        with pytest.raises(PolicyConfigurationError, match='read_from_replicas needs a Redis Cluster'):
            replicas.replica_reader(plain)
    finally:
        plain.close()
    # The commands refuse it before reading anything: one line, exit 1, the option and the way to a cluster named.
    for command in (['info'], ['explain', 'some-job'], ['exporter', '--port', str(free_port())],
                    ['dashboard', '--port', str(free_port())]):
        result = subprocess.run([sys.executable, '-m', 'rq_policies', *command, '--read-from-replicas',
                                 '--url', redis_url], env=worker_env, capture_output=True, text=True, timeout=60)
        assert_one_line_error(result, '--read-from-replicas needs a Redis Cluster connection', 'got Redis',
                              '--connection-class redis.cluster.RedisCluster')
        assert result.returncode == 1, result.stderr


@not_on_cluster('a single server with no replica: the session cluster\'s primaries have one each')
def test_wait_for_replicas_on_a_server_without_replicas_waits_its_timeout_and_says_0(connection):
    QueueSlot.set('waited', 2, connection=connection)
    started = time.monotonic()
    assert replicas.wait_for_replicas(connection, 1, 200) == 0
    assert time.monotonic() - started >= 0.15
    assert connection.pttl(keys.REPLICATED) > 0  # its own write, expiring
    for bad, name in (({'replicas': 0}, 'replicas'), ({'replicas': True}, 'replicas'), ({'replicas': '1'}, 'replicas'),
                      ({'timeout_ms': 0}, 'timeout_ms'), ({'timeout_ms': 1.5}, 'timeout_ms')):
        connection.delete(keys.REPLICATED)
        with pytest.raises(ValueError, match=f'{name} must be a positive integer, got {list(bad.values())[0]!r}'):
            replicas.wait_for_replicas(connection, **bad)
        assert not connection.exists(keys.REPLICATED)  # refused before anything is written
