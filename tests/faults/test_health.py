"""The eviction check: a real server's maxmemory-policy, as the worker's log, ``info`` and the metrics report it."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from redis import Redis

from rq_policies import PolicyQueue, PolicySimpleWorker
from rq_policies.engine import health
from rq_policies.engine.compat import KEY_PREFIX as RQ


@pytest.fixture
def policy_of(connection):
    """Set the test server's maxmemory-policy (real CONFIG SET); the original comes back after the test."""
    original = connection.config_get('maxmemory-policy')['maxmemory-policy']

    def set_policy(value: str) -> None:
        connection.config_set('maxmemory-policy', value)

    yield set_policy
    connection.config_set('maxmemory-policy', original)


def test_the_check_says_what_each_policy_breaks(connection, policy_of):
    policy_of('noeviction')
    assert health.eviction_check(connection) == health.EvictionCheck('noeviction', False, None, 0)
    policy_of('allkeys-lru')
    check = health.eviction_check(connection)
    assert check.maxmemory_policy == 'allkeys-lru' and check.unsafe is True
    assert f'{RQ}:policies:capacity' in check.warning and 'Set maxmemory-policy noeviction' in check.warning
    policy_of('volatile-ttl')
    check = health.eviction_check(connection)
    assert check.unsafe is True and 'keys with a TTL' in check.warning and f'{RQ}:policies:slots' in check.warning


def test_a_server_that_denies_config_is_unknown(connection, redis_url):
    """The ACL in docs/acl.md denies @dangerous, CONFIG included: the check says unknown, and raises nothing."""
    connection.acl_setuser('no-config', enabled=True, passwords=['+pw'], keys=['*'], channels=['*'],
                           commands=['+@all', '-config'])
    limited = Redis.from_url(redis_url, username='no-config', password='pw')
    try:
        check = health.eviction_check(limited)
        assert check.maxmemory_policy == 'unknown' and check.unsafe is None
        assert 'could not read maxmemory-policy' in check.warning
    finally:
        limited.close()
        connection.acl_deluser('no-config')


def test_a_worker_warns_at_start_under_an_evicting_policy(connection, policy_of, caplog):
    q = PolicyQueue('health', connection=connection)
    caplog.set_level(logging.INFO)
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert not [r for r in caplog.records if 'maxmemory-policy' in r.getMessage()]  # noeviction: silent
    caplog.clear()
    policy_of('allkeys-lru')
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    (record,) = [r for r in caplog.records if 'maxmemory-policy' in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert 'maxmemory-policy is allkeys-lru' in record.getMessage() and 'caps' in record.getMessage()


def test_info_reports_the_policy_and_its_warning(connection, policy_of, worker_env, redis_url):
    def info(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, '-m', 'rq_policies', 'info', *args, '--url', redis_url],
                              env=worker_env, capture_output=True, text=True, timeout=60)

    data = json.loads(info('--json').stdout)
    assert data['server'] == {'maxmemory_policy': 'noeviction', 'eviction_unsafe': False, 'evicted_keys': 0,
                              'warning': None}
    assert 'warning' not in info().stdout
    policy_of('allkeys-lru')
    data = json.loads(info('--json').stdout)
    assert data['server']['maxmemory_policy'] == 'allkeys-lru' and data['server']['eviction_unsafe'] is True
    assert f'{RQ}:policies:capacity' in data['server']['warning']
    text = info().stdout
    assert text.splitlines()[0].startswith('warning: Redis maxmemory-policy is allkeys-lru'), text


def test_the_metric_is_1_under_an_evicting_policy(connection, policy_of):
    prometheus_client = pytest.importorskip('prometheus_client')
    from prometheus_client.parser import text_string_to_metric_families

    from rq_policies.surfaces.metrics import registry_for

    def gauge() -> dict:
        text = prometheus_client.generate_latest(registry_for(connection)).decode()
        return {tuple(sorted(s.labels.items())): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == 'rq_policies_eviction_unsafe'}

    assert gauge() == {(('policy', 'noeviction'),): 0}
    policy_of('allkeys-lru')
    assert gauge() == {(('policy', 'allkeys-lru'),): 1}
