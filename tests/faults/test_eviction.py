"""Keys actually evicted (the server's evicted_keys), reported by every surface: ``rq-policies info``, the dashboard
page, the metrics and a PolicyWorker's log. Each test runs on a server of its own module (real evictions under a
real maxmemory), never on the session's, and starts from CONFIG RESETSTAT."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from redis import Redis

from rq_policies import PolicyQueue
from rq_policies.engine import health
from rq_policies.surfaces.cli import main
from rq_policies.surfaces.testing import RedisServer
from tests.helpers import with_root
from tests.helpers.eviction_jobs import evict


@pytest.fixture(scope='module')
def server():
    srv = RedisServer().start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def conn(server):
    c = server.client()
    c.flushall()
    c.config_resetstat()
    yield c
    c.config_set('maxmemory', 0)
    c.config_set('maxmemory-policy', 'noeviction')
    c.close()


def test_evict_helper_evicts_for_real(conn):
    assert conn.config_get('maxmemory-policy')['maxmemory-policy'] == 'noeviction'
    conn.set('mine', 'recent')
    count = evict(conn)
    assert count >= 5 and int(conn.info('stats')['evicted_keys']) == count
    assert conn.config_get('maxmemory')['maxmemory'] == '0'
    assert conn.config_get('maxmemory-policy')['maxmemory-policy'] == 'noeviction'


def test_the_check_reports_keys_evicted_under_a_safe_policy_now(conn):
    assert health.eviction_check(conn) == health.EvictionCheck('noeviction', False, None, 0)
    count = evict(conn)
    check = health.eviction_check(conn)
    assert (check.maxmemory_policy, check.unsafe, check.evicted_keys) == ('noeviction', False, count)
    assert check.warning.startswith(f'Redis has evicted {count} keys') and 'CONFIG RESETSTAT' in check.warning
    conn.config_set('maxmemory-policy', 'allkeys-lru')  # both: the setting's warning first, then the count
    check = health.eviction_check(conn)
    assert check.warning.startswith('Redis maxmemory-policy is allkeys-lru')
    assert f'Redis has evicted {count} keys' in check.warning
    conn.config_resetstat()
    assert health.eviction_check(conn).evicted_keys == 0


def test_info_shows_the_keys_evicted(conn, server):
    runner = CliRunner()

    def info(*args):
        result = runner.invoke(main, ['info', *args, '--url', server.url])
        assert result.exit_code == 0, result.output
        return result.output

    assert json.loads(info('--json'))['server'] == {
        'maxmemory_policy': 'noeviction', 'eviction_unsafe': False, 'evicted_keys': 0, 'warning': None}
    assert 'warning' not in info()
    count = evict(conn)
    server_part = json.loads(info('--json'))['server']
    assert server_part['evicted_keys'] == count and server_part['eviction_unsafe'] is False
    assert server_part['warning'].startswith(f'Redis has evicted {count} keys')
    assert info().splitlines()[0].startswith(f'warning: Redis has evicted {count} keys')


def test_the_page_shows_the_keys_evicted(conn):
    pytest.importorskip('flask')
    from rq_policies.surfaces.dashboard import create_app

    client = create_app(conn).test_client()
    state = client.get('/state.json').get_json()
    assert state['evicted_keys'] == 0 and state['warning'] is None
    assert 'eviction-warning' not in client.get('/').get_data(as_text=True)
    count = evict(conn)
    state = client.get('/state.json').get_json()
    assert state['evicted_keys'] == count and state['warning'].startswith(f'Redis has evicted {count} keys')
    html = client.get('/').get_data(as_text=True)
    assert 'id="eviction-warning"' in html and f'Redis has evicted {count} keys' in html


def test_the_metrics_count_the_keys_evicted_and_say_whether_they_rose(conn):
    prometheus_client = pytest.importorskip('prometheus_client')
    from prometheus_client.parser import text_string_to_metric_families

    from rq_policies.surfaces.metrics import registry_for

    registry = registry_for(conn)  # one collector: its first scrape is the baseline

    def samples():
        text = prometheus_client.generate_latest(registry).decode()
        return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
                if s.name.startswith('rq_policies_redis_evicted_keys')}

    assert samples() == {'rq_policies_redis_evicted_keys_total': 0, 'rq_policies_redis_evicted_keys_rose': 0}
    count = evict(conn)
    assert samples() == {'rq_policies_redis_evicted_keys_total': count, 'rq_policies_redis_evicted_keys_rose': 1}
    # A second collector started now (another process) takes today's count as its baseline.
    fresh = registry_for(conn)
    text = prometheus_client.generate_latest(fresh).decode()
    assert 'rq_policies_redis_evicted_keys_rose 0.0' in text
    conn.config_resetstat()  # the count fell: the new baseline
    assert samples() == {'rq_policies_redis_evicted_keys_total': 0, 'rq_policies_redis_evicted_keys_rose': 0}


def test_a_server_denying_info_and_config_reports_nothing_and_breaks_nothing(conn, server):
    conn.acl_setuser('no-info', enabled=True, passwords=['+pw'], keys=['*'], channels=['*'],
                     commands=['+@all', '-info', '-config'])
    limited = Redis(host='127.0.0.1', port=server.port, username='no-info', password='pw')
    try:
        assert health.evicted_keys(limited) is None
        check = health.eviction_check(limited)
        assert check.evicted_keys is None and check.unsafe is None
        watch = health.EvictionWatch(logging.getLogger('test'), 0)
        watch.start(check)
        with limited.pipeline(transaction=False) as pipe:
            pipe.ping()
            watch.ride(pipe)  # off: sends nothing a denying server would refuse
            assert pipe.execute() == [True]
    finally:
        limited.close()
        conn.acl_deluser('no-info')


def test_the_watch_warns_once_and_takes_a_reset_as_its_baseline(conn, caplog):
    log = logging.getLogger('test.eviction')
    caplog.set_level(logging.WARNING, logger='test.eviction')
    watch = health.EvictionWatch(log, 0)
    watch.start(health.eviction_check(conn))

    def heartbeat():
        with conn.pipeline(transaction=False) as pipe:
            pipe.ping()
            watch.ride(pipe)
            pipe.execute()

    heartbeat()
    assert not caplog.records and watch.baseline == 0
    count = evict(conn)
    heartbeat()
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and f'Redis evicted {count} key(s) since this worker started' in (
        record.getMessage())
    evict(conn)
    heartbeat()
    assert len(caplog.records) == 1 and watch.count > count  # read again, not logged again
    conn.config_resetstat()
    heartbeat()
    assert watch.baseline == 0

    slow = health.EvictionWatch(log, 3600)  # due once an hour: a heartbeat carries no INFO before then
    slow.start(health.eviction_check(conn))
    with conn.pipeline(transaction=False) as pipe:
        pipe.ping()
        slow.ride(pipe)
        assert len(pipe.command_stack) == 1


@pytest.mark.long
def test_a_forking_worker_logs_evictions_once_while_it_runs(conn, server):
    """A real `rq worker` (forking PolicyWorker, subprocess): the first job makes the server evict keys and runs on
    for 3 s; the warning comes from the worker's heartbeat during that job (job_monitoring_interval 1, its monitor
    pipeline); the second job evicts more, and nothing more is logged. The work horse never reads."""
    q = PolicyQueue('evicting', connection=conn)
    first = q.enqueue('tests.helpers.eviction_jobs.evict_in_job', 3.0)
    q.enqueue('tests.helpers.eviction_jobs.evict_in_job')
    env = with_root(dict(os.environ))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'tests.helpers.eviction_jobs.QuickWatchWorker',
         '--url', server.url, '--burst', '--logging_level', 'INFO', 'evicting'],
        env=env, capture_output=True, text=True, timeout=120,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert time.monotonic() - started >= 3
    assert len(conn.lrange('test:evicted', 0, -1)) == 2, log
    warnings = [line for line in log.splitlines() if 'since this worker started' in line]
    assert len(warnings) == 1, log
    lines = log.splitlines()
    at = lines.index(warnings[0])
    done = [i for i, line in enumerate(lines) if first.id in line and ('Job OK' in line or 'Successfully' in line)]
    assert done and at < done[0], log  # logged while the first job still ran, by the monitor loop's heartbeat


def test_a_worker_warns_at_start_when_keys_were_evicted(conn, caplog):
    from rq_policies import PolicySimpleWorker

    q = PolicyQueue('evicting', connection=conn)
    caplog.set_level(logging.INFO)
    PolicySimpleWorker([q], connection=conn).work(burst=True)
    assert not [r for r in caplog.records if 'evicted' in r.getMessage()]
    count = evict(conn)
    caplog.clear()
    PolicySimpleWorker([q], connection=conn).work(burst=True)
    (record,) = [r for r in caplog.records if 'evicted' in r.getMessage()]
    assert record.levelno == logging.WARNING and f'Redis has evicted {count} keys' in record.getMessage()
