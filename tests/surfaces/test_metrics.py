"""The Prometheus collector, in-process and through the exporter scraped over HTTP."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from redis import Redis

from rq_policies import PolicyQueue, QueueSlot
from rq_policies.engine.ledger import Hold, acquire_call
from rq_policies.surfaces.testing import free_port
from tests.helpers import jobs, lcw_jobs
from tests.helpers.cluster import CLUSTER_CLASS, ON_CLUSTER

prometheus_client = pytest.importorskip('prometheus_client')
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from rq_policies.engine.compat import KEY_PREFIX as RQ  # noqa: E402
from rq_policies.surfaces.metrics import PolicyCollector, registry_for  # noqa: E402


def samples(text):
    """{(name, frozenset(labels)): value} from an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(found, name, **labels):
    return found.get((name, frozenset(labels.items())))


@pytest.fixture
def lcw_env(monkeypatch, redis_url):
    monkeypatch.setenv('REDIS_URL', redis_url)


def test_collector_reads_the_state_when_scraped(connection, lcw_env, redis_url):
    registry = registry_for(connection)
    empty = samples(prometheus_client.generate_latest(registry).decode())
    assert value(empty, 'rq_policies_redis_up') == 1
    assert not [key for key in empty if key[0].startswith('limited_capacity_worker')]

    QueueSlot.set('imports', 4, connection=connection)
    for i in range(3):
        assert QueueSlot.acquire('imports', 4, token=f'h{i}', connection=connection)
    connection.set('test:lcw:max', 3)
    connection.rpush('test:backlog:backlog', *['x'] * 5)
    assert len(lcw_jobs.Backlog.perform_with_capacity(connection=connection)) == 3
    acquire_call(Hold(f'{RQ}:policies:lcw-running:tests.helpers.lcw_jobs.Backlog', 'busy', 60), 3).run(connection)
    q = PolicyQueue('imports', connection=connection)
    q.enqueue(jobs.sweep_cache, 1)
    for _ in range(4):
        assert q.enqueue(jobs.sweep_cache, 1) is None

    found = samples(prometheus_client.generate_latest(registry).decode())
    worker = 'tests.helpers.lcw_jobs.Backlog'
    assert value(found, 'limited_capacity_worker_running_jobs', worker=worker) == 1
    assert value(found, 'limited_capacity_worker_max_running_jobs', worker=worker) == 3
    assert value(found, 'limited_capacity_worker_remaining_work_count', worker=worker) == 5
    assert value(found, 'limited_capacity_worker_queued_jobs', worker=worker) == 3
    assert value(found, 'rq_policies_queue_slots_in_use', queue='imports') == 3
    assert value(found, 'rq_policies_queue_slots_capacity', queue='imports') == 4
    assert value(found, 'rq_policies_dropped_enqueues_total', policy='loner', queue='imports') == 4


def test_drops_count_from_every_producer_process(connection, worker_env, redis_url):
    PolicyQueue('imports', connection=connection).enqueue(jobs.sweep_cache, 9)
    code = (
        'import os; import tests.helpers.jobs; from tests.helpers.cluster import connect\n'
        'from rq_policies import PolicyQueue\n'
        'q = PolicyQueue("imports", connection=connect(os.environ["REDIS_URL"]))\n'
        'assert all(q.enqueue(tests.helpers.jobs.sweep_cache, 9) is None for _ in range(5))\n'
    )
    procs = [subprocess.Popen([sys.executable, '-c', code], env=worker_env) for _ in range(3)]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    found = samples(prometheus_client.generate_latest(registry_for(connection)).decode())
    assert value(found, 'rq_policies_dropped_enqueues_total', policy='loner', queue='imports') == 15


def test_hold_lapses_are_exported_per_queue(connection):
    from rq_policies.engine import keys
    from rq_policies.engine.ledger import Hold, Ledger

    hold = Hold(keys.holds('lapsing:q'), 'gone', 30)
    Ledger([hold]).refresh(connection)  # found absent under its (running) job: re-added and counted
    Ledger([Hold(keys.lcw_running('mod.Cls'), 'gone', 30)]).refresh(connection)  # a LimitedCapacityWorker's
    found = samples(prometheus_client.generate_latest(registry_for(connection)).decode())
    assert value(found, 'rq_policies_hold_lapses_total', queue='lapsing:q') == 1
    assert [k for k in found if k[0] == 'rq_policies_hold_lapses_total'] == [
        ('rq_policies_hold_lapses_total', frozenset({('queue', 'lapsing:q')}))
    ]


def test_unreachable_redis_reports_down_instead_of_failing(caplog):
    dead = Redis(host='127.0.0.1', port=1, socket_connect_timeout=1)
    text = prometheus_client.generate_latest(registry_for(dead)).decode()
    found = samples(text)
    assert value(found, 'rq_policies_redis_up') == 0
    assert len(found) == 1
    assert 'could not read Redis' in caplog.text


def test_registering_does_not_touch_redis():
    registry = prometheus_client.CollectorRegistry()
    registry.register(PolicyCollector(Redis(host='127.0.0.1', port=1)))  # would raise if it read Redis
    with pytest.raises(TypeError, match='connection is required'):
        PolicyCollector(None)


def start_exporter(worker_env, redis_url):
    """An exporter subprocess on a free port, once it answers; returns (proc, port, first body)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'rq_policies', 'exporter', '--port', str(port), '--addr', '127.0.0.1',
         '--url', redis_url, *(CLUSTER_CLASS if ON_CLUSTER else [])],
        env=worker_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            return proc, port, scrape(port)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if proc.poll() is not None:
                pytest.fail(f'exporter exited: {proc.communicate()[1]}')
            time.sleep(0.1)
    stop_exporter(proc)
    pytest.fail('exporter never answered')


def scrape(port):
    with urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=5) as response:
        assert response.status == 200
        assert response.headers['Content-Type'].startswith('text/plain')
        return response.read().decode()


def stop_exporter(proc):
    """SIGTERM, then its stderr; a stop that takes over 10 s kills it and fails."""
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f'exporter did not stop on SIGTERM: {err}')
    return err


def test_exporter_serves_metrics_over_http(connection, worker_env, redis_url):
    QueueSlot.set('imports', 2, connection=connection)
    assert QueueSlot.acquire('imports', 2, token='web-1', connection=connection)
    proc, port, body = start_exporter(worker_env, redis_url)
    try:
        found = samples(body)
        assert value(found, 'rq_policies_redis_up') == 1
        assert value(found, 'rq_policies_queue_slots_in_use', queue='imports') == 1
        assert value(found, 'rq_policies_queue_slots_capacity', queue='imports') == 2
        # The values are read at scrape time, not at start.
        assert QueueSlot.acquire('imports', 2, token='web-2', connection=connection)
        assert value(samples(scrape(port)), 'rq_policies_queue_slots_in_use', queue='imports') == 2
    finally:
        err = stop_exporter(proc)
    assert proc.returncode == 0
    assert 'Traceback' not in err
    assert f'http://127.0.0.1:{port}/metrics' in err


def test_exporter_stops_and_scrapes_with_a_client_stalled_mid_request(worker_env, redis_url):
    # CI once saw SIGTERM land while the server was inside a request: the request handler swallowed it and the
    # exporter served on. A client that sends half a request holds a request open on purpose.
    import socket

    proc, port, _ = start_exporter(worker_env, redis_url)
    try:
        with socket.create_connection(('127.0.0.1', port), timeout=5) as stalled:
            stalled.sendall(b'GET /metrics HTTP/1.1\r\nHost: x\r\n')  # no blank line: the request never ends
            time.sleep(0.2)
            assert 'rq_policies_redis_up' in scrape(port)  # the stalled client does not block others
            started = time.monotonic()
            err = stop_exporter(proc)
            assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            stop_exporter(proc)
    assert proc.returncode == 0
    assert 'Traceback' not in err


def test_exporter_port_in_use_is_one_line(worker_env, redis_url):
    import socket

    with socket.socket() as taken:
        taken.bind(('127.0.0.1', 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, '-m', 'rq_policies', 'exporter', '--port', str(port), '--addr', '127.0.0.1',
             '--url', redis_url],
            env=worker_env, capture_output=True, text=True, timeout=30,
        )
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f'Error: cannot serve on 127.0.0.1:{port}')
    assert 'Traceback' not in result.stderr


def test_importing_rq_policies_does_not_need_prometheus_client(worker_env):
    # Block the module and import the package: the extra stays optional.
    code = (
        'import sys; sys.modules["prometheus_client"] = None\n'
        'import rq_policies, rq_policies.surfaces.cli, rq_policies.surfaces.state\n'
        'try:\n    import rq_policies.surfaces.metrics\nexcept ImportError as exc:\n    print(exc)\n'
    )
    result = subprocess.run([sys.executable, '-c', code], env=worker_env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "pip install 'rq-policies[metrics]'" in result.stdout
