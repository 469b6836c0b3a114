"""The rq-policies command, run as a subprocess against the real server."""

from __future__ import annotations

import json
import os
import re

import pytest
from rq.job import Job

from rq_policies import Cap, PolicyQueue, QueueSlot, Throttle
from rq_policies.engine import identity, keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs
from tests.helpers.cli import assert_one_line_error, run


@pytest.fixture
def env(worker_env):
    # the repository's root on the path (for -P-less imports of tests.helpers.jobs), and no inherited rq settings but
    # the key prefix (the suite's own, as rq 3 reads it: see conftest.py).
    clean = {k: v for k, v in worker_env.items() if not k.startswith('RQ_') or k == 'RQ_KEY_PREFIX'}
    return clean


def test_cap_set_show_and_clear(connection, env, redis_url):
    PolicyQueue('imports', connection=connection).enqueue(jobs.plain, 1)
    result = run('cap', 'imports', '3', env=env, url=redis_url)
    assert result.returncode == 0, result.stderr
    assert "capped at 3 (was uncapped)" in result.stdout
    assert QueueSlot.get('imports', connection=connection) == Cap(3)
    result = run('cap', 'imports', '5', env=env, url=redis_url)
    assert 'capped at 5 (was 3)' in result.stdout
    result = run('cap', 'imports', '--clear', env=env, url=redis_url)
    assert result.returncode == 0 and 'uncapped (was 5)' in result.stdout
    assert QueueSlot.get('imports', connection=connection) is None


def test_wait_replicas_after_a_write_names_how_many_had_it(connection, env, redis_url):
    # The session's server has no replica: the write is made, then the command says that none had it (exit 1).
    PolicyQueue('imports', connection=connection).enqueue(jobs.plain, 1)
    result = run('cap', 'imports', '3', '--wait-replicas', '1', '--wait-timeout', '50', env=env, url=redis_url)
    assert result.returncode == 1 and 'capped at 3' in result.stdout, (result.stdout, result.stderr)
    assert_one_line_error(result, '0 of 1 replica(s)')
    assert QueueSlot.get('imports', connection=connection) == Cap(3)  # the write stays
    result = run('reset', 'imports', 'tests.helpers.jobs.plain', '1', '--wait-replicas', '1', '--wait-timeout', '50',
                 env=env, url=redis_url)
    assert result.returncode == 1 and 'Identity ' in result.stdout, (result.stdout, result.stderr)
    assert_one_line_error(result, '0 of 1 replica(s)')
    # Reading a setting writes nothing to wait for: refused before anything is read.
    result = run('cap', 'imports', '--wait-replicas', '1', env=env, url=redis_url)
    assert result.returncode == 2
    assert_one_line_error(result, '--wait-replicas')


def test_connection_from_rq_env_vars_and_config_module(connection, env, redis_url, tmp_path):
    PolicyQueue('imports', connection=connection).enqueue(jobs.plain, 1)
    with_env = dict(env, RQ_REDIS_URL=redis_url)
    assert run('cap', 'imports', '2', env=with_env).returncode == 0
    assert QueueSlot.get('imports', connection=connection) == Cap(2)
    # rq's --config: a settings module with REDIS_URL (or REDIS_HOST/PORT, or SENTINEL).
    (tmp_path / 'opsettings.py').write_text(f'REDIS_URL = {redis_url!r}\n')
    with_config = dict(env, PYTHONPATH=f'{tmp_path}{os.pathsep}{env["PYTHONPATH"]}')
    assert run('cap', 'imports', '4', '--config', 'opsettings', env=with_config).returncode == 0
    assert QueueSlot.get('imports', connection=connection) == Cap(4)


@pytest.mark.long
def test_bad_input_is_one_line_and_non_zero(connection, env, redis_url):
    PolicyQueue('imports', connection=connection).enqueue(jobs.plain, 1)
    assert_one_line_error(run('cap', 'nosuch', '3', env=env, url=redis_url), "unknown queue 'nosuch'", '--force')
    assert_one_line_error(
        run('cap', 'imports', 'three', env=env, url=redis_url), "positive integer up to 2147483647, got 'three'"
    )
    assert_one_line_error(run('cap', 'imports', '0', env=env, url=redis_url), "got '0'")
    assert_one_line_error(run('cap', 'imports', '3', '--clear', env=env, url=redis_url), 'either N or --clear')
    assert_one_line_error(run('info', 'nosuch', env=env, url=redis_url), "unknown queue 'nosuch'", 'check the name')
    assert_one_line_error(run('reset', 'nosuch', 'tests.helpers.jobs.plain', '1', env=env, url=redis_url),
                          "unknown queue")
    assert_one_line_error(run('reset', 'imports', 'plain', env=env, url=redis_url), 'import path')
    assert_one_line_error(run('frobnicate', env=env), 'No such command')
    assert QueueSlot.get('imports', connection=connection) is None  # nothing was written
    unreachable = 'redis://127.0.0.1:1/0'
    for args in (('info',), ('cap', 'imports', '3'), ('reset', 'imports', 'tests.helpers.jobs.plain'), ('exporter',)):
        assert_one_line_error(run(*args, env=env, url=unreachable), 'cannot reach Redis', '127.0.0.1:1')
    # --force caps a queue nobody uses yet (a new deployment).
    assert run('cap', 'fresh', '2', '--force', env=env, url=redis_url).returncode == 0


def test_info_text_and_json(connection, env, redis_url, monkeypatch):
    q = PolicyQueue('imports', connection=connection)
    held = q.enqueue(jobs.sweep_cache, 1)
    assert q.enqueue(jobs.sweep_cache, 1) is None  # one drop
    QueueSlot.set('imports', 3, connection=connection)
    assert QueueSlot.acquire('imports', 3, ttl=40, token='web-1:4242:7:1', connection=connection)
    digest = identity.digest('tests.helpers.jobs.sweep_cache', 'imports', (2,), {})
    connection.set(keys.throttle_prefix('imports', digest) + '1234', 'job-t', ex=30)
    connection.set(keys.trailing('imports', digest), 'job-tr', ex=30)
    connection.hset(keys.debounce('imports', digest), mapping={'job_id': 'job-d'})
    monkeypatch.setenv('REDIS_URL', redis_url)
    from tests.helpers import lcw_jobs

    connection.rpush('test:backlog:backlog', 'x', 'x', 'x')
    lcw_jobs.Backlog.perform_with_capacity(connection=connection)

    window = q.enqueue(jobs.plain, 5, policy=Throttle(3600))  # an hour: no window boundary mid-test

    result = run('info', env=env, url=redis_url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert 'queue imports  (cap 3, 1 in use)' in out
    assert re.search(r'web-1:4242:7:1 +expires \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \(in [0-9.]+ s\)', out), out
    # an identity reads as its holder job's description; its job, its status
    assert f'tests.helpers.jobs.sweep_cache(1)  job {held.id} (queued)' in out
    assert 'window 1234 (ends in ' in out and 'job job-t' in out  # a window whose winner is gone: its number
    # a live window: its start and end in local time (the winner job carries the width); the end shows its date only
    # when it falls on another day (an hour's window started after 23:00 ends at midnight: this failed between 23:00
    # and 00:00)
    assert re.search(r'jobs\.plain\(5\)  job ' + window.id
                     + r'  window \S+T\d\d:\d\d:00\S* to (\d\d:\d\d:00|\S+T\d\d:\d\d:00\S*) \(ends in ', out), out
    assert digest not in out  # digests only with --digests
    assert digest in run('info', '--digests', env=env, url=redis_url).stdout
    assert 'trailing  1 pending' in out and 'debounce  1 pending' in out
    assert 'dropped   loner 1' in out
    assert 'tests.helpers.lcw_jobs.Backlog  queue lcw  running 0/2  queued 2  remaining 3' in out

    data = json.loads(run('info', 'imports', '--json', env=env, url=redis_url).stdout)
    imports = data['queues']['imports']
    assert list(data['queues']) == ['imports']
    assert imports['capacity'] == 3 and imports['holds_in_use'] == 1
    assert imports['holds'][0]['holder'] == 'web-1:4242:7:1' and 0 < imports['holds'][0]['expires_in'] <= 40
    assert imports['loner']['waiting'] == 1 and imports['loner']['entries'][0]['job_id'] == held.id
    (gone,) = [row for row in imports['throttle']['entries'] if row['job_id'] == 'job-t']
    assert gone == {
        'digest': digest, 'slot': '1234', 'job_id': 'job-t', 'job_status': None, 'job_description': None,
        'expires_in': gone['expires_in'],
    }
    lives = [row for row in imports['throttle']['entries'] if row['job_id'] == window.id]
    assert len(lives) == 1, imports['throttle']
    live = lives[0]
    assert live['job_description'] == 'tests.helpers.jobs.plain(5)' \
        and live['window_end'] - live['window_start'] == 3600
    assert imports['debounce']['entries'][0]['fields'] == {'job_id': 'job-d'}
    assert imports['drops'] == {'loner': 1}
    assert data['limited_capacity_workers'] == []  # info QUEUE shows only that queue's (Backlog serves 'lcw')
    (lcw,) = json.loads(run('info', '--json', env=env, url=redis_url).stdout)['limited_capacity_workers']
    assert lcw['class'] == 'tests.helpers.lcw_jobs.Backlog' and lcw['queued_jobs'] == 2 and lcw['max_running_jobs'] == 2


def test_reset_clears_one_identity_only(connection, env, redis_url):
    q = PolicyQueue('imports', connection=connection)
    first = q.enqueue(jobs.sync_account, 7, 'signup')
    other = q.enqueue(jobs.sync_account, 8, 'signup')
    assert q.enqueue(jobs.sync_account, 7, 'other reason') is None  # unique_context: args[0] only
    digest = identity.digest('tests.helpers.jobs.sync_account', 'imports', (7,), {},
                             jobs.sync_account.__rq_policies__.unique_context)
    for slot in ('100', '101'):
        connection.set(keys.throttle_prefix('imports', digest) + slot, first.id, ex=60)
    connection.set(keys.trailing('imports', digest), 'job-tr', ex=60)
    connection.hset(keys.debounce('imports', digest), 'job_id', 'job-d')

    result = run('reset', 'imports', 'tests.helpers.jobs.sync_account', '7', 'any reason', env=env, url=redis_url)
    assert result.returncode == 0, result.stderr
    assert 'removed 5 key(s)' in result.stdout  # the loner marker, two slots, the trailing and debounce keys
    assert 'queued jobs are left alone' in result.stdout
    assert connection.keys(f'{RQ}:policies:*:imports:{digest}*') == []
    assert Job.fetch(first.id, connection=connection).get_status() == 'queued'
    assert q.enqueue(jobs.sync_account, 7, 'again') is not None  # the identity is free
    assert q.enqueue(jobs.sync_account, 8, 'again') is None  # the other one is untouched
    assert q.holder(jobs.sync_account, 8) == other.id
    again = run('reset', 'imports', 'tests.helpers.jobs.sync_account', '1234', env=env, url=redis_url)
    assert again.returncode == 0 and 'nothing to clear' in again.stdout


def test_reset_args_are_json_literals_or_strings(connection, env, redis_url):
    q = PolicyQueue('imports', connection=connection)
    q.enqueue(jobs.record, 'tag', 3, [1, 'a'], None, flag=True)
    q.enqueue(jobs.record, 'tag', '3')
    result = run(
        'reset', 'imports', 'tests.helpers.jobs.record', 'tag', '3', '[1, "a"]', 'null', '--kwarg', 'flag=true',
        env=env, url=redis_url,
    )
    assert 'removed 1 key(s)' in result.stdout, result.stdout + result.stderr
    result = run('reset', 'imports', 'tests.helpers.jobs.record', 'tag', '"3"', env=env, url=redis_url)
    assert 'removed 1 key(s)' in result.stdout, result.stdout + result.stderr
    assert connection.keys(f'{RQ}:policies:loner:*') == []


@pytest.mark.parametrize('typed, why', [
    (' 3', 'leading or trailing whitespace'),
    ('3\n', 'leading or trailing whitespace'),
    ('1_000', 'underscores'),
    ('٣', 'only ASCII digits'),
    ('0x10', 'only decimal digits'),
    ('+3', 'no sign'),
    ('', 'empty'),
])
def test_cap_takes_plain_ascii_digits_only_and_changes_nothing_else(connection, env, redis_url, typed, why):
    PolicyQueue('imports', connection=connection).enqueue(jobs.plain, 1)
    QueueSlot.set('imports', 2, connection=connection)
    before = {key: connection.type(key) for key in connection.keys('*')}
    result = run('cap', 'imports', typed, env=env, url=redis_url)
    assert_one_line_error(result, "'[N]'", f'got {typed!r}', why)
    assert QueueSlot.get('imports', connection=connection) == Cap(2)  # nothing was written
    assert {key: connection.type(key) for key in connection.keys('*')} == before


def test_every_integer_option_takes_plain_digits_only(connection, env, redis_url):
    PolicyQueue('imports', connection=connection).enqueue(jobs.plain, 1)
    assert_one_line_error(run('info', '--limit', ' 5', env=env, url=redis_url), "'--limit'", "got ' 5'", 'whitespace')
    assert_one_line_error(run('info', '--limit', '-1', env=env, url=redis_url), "'--limit'", "got '-1'", 'no sign')
    assert_one_line_error(run('exporter', '--port', '9_121', env=env, url=redis_url), "'--port'", 'underscores')
    assert_one_line_error(run('exporter', '--port', '70000', env=env, url=redis_url), "'--port'", "got '70000'")
    assert run('info', '--limit', '0', env=env, url=redis_url).returncode == 0
    result = run('cap', 'imports', '007', env=env, url=redis_url)  # leading zeros are still plain digits
    assert result.returncode == 0 and QueueSlot.get('imports', connection=connection) == Cap(7)
