"""The rq-policies command takes its connection options where a user puts them (before the subcommand or after it),
says which setting chose a server it cannot reach, refuses a negative number by the argument it was given for, and
docs/cli.md lists every command. Run as a subprocess against the session's server, as a user does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rq.cli.helpers import CliConfig

from rq_policies import Cap, PolicyQueue, QueueSlot
from rq_policies.surfaces import cli
from tests.helpers import jobs
from tests.helpers.cli import assert_one_line_error, run
from tests.helpers.cluster import CLUSTER_CLASS, ON_CLUSTER

UNREACHABLE = 'redis://127.0.0.1:1/0'
DOCS = Path(__file__).resolve().parents[2] / 'docs' / 'cli.md'


@pytest.fixture
def env(worker_env):
    """No inherited rq or Redis settings but the key prefix (the suite's own)."""
    return {k: v for k, v in worker_env.items()
            if not (k.startswith('RQ_') or k.startswith('REDIS_')) or k == 'RQ_KEY_PREFIX'}


@pytest.fixture
def known(connection):
    PolicyQueue('usage', connection=connection).enqueue(jobs.plain, 1)
    return 'usage'


def test_connection_options_before_the_subcommand(connection, env, redis_url, known):
    cluster = list(CLUSTER_CLASS) if ON_CLUSTER else []
    result = run('--url', redis_url, *cluster, 'cap', known, '3', env=env)
    assert result.returncode == 0, result.stderr
    assert QueueSlot.get(known, connection=connection) == Cap(3)
    result = run('-u', redis_url, *cluster, 'info', known, env=env)
    assert result.returncode == 0 and f'queue {known}' in result.stdout, result.stderr
    result = run('--url', redis_url, *cluster, 'fair', 'keys', known, env=env)  # a group's subcommand too
    assert result.returncode == 0, result.stderr
    # after the subcommand, as rq takes them, still works; given in both places, the one after wins
    result = run('--url', UNREACHABLE, 'cap', known, '--url', redis_url, *cluster, env=env)
    assert result.returncode == 0 and 'capped at 3' in result.stdout, result.stderr
    result = run('--url', redis_url, *cluster, 'cap', known, '--url', UNREACHABLE, env=env)
    assert_one_line_error(result, '127.0.0.1:1/0', '--url')


def test_config_module_before_the_subcommand(connection, env, redis_url, known, tmp_path):
    if ON_CLUSTER:
        pytest.skip('the settings module names one node; a cluster needs --connection-class as well')
    (tmp_path / 'usagesettings.py').write_text(f'REDIS_URL = {redis_url!r}\n')
    result = run('--config', 'usagesettings', '-P', str(tmp_path), 'cap', known, '4', env=env)
    assert result.returncode == 0, result.stderr
    assert QueueSlot.get(known, connection=connection) == Cap(4)


def test_an_unreachable_server_names_the_setting_that_chose_it(env):
    result = run('--url', UNREACHABLE, 'info', env=env)
    assert_one_line_error(result, 'cannot reach Redis at 127.0.0.1:1/0', 'from --url')
    result = run('info', '--url', UNREACHABLE, env=env)
    assert_one_line_error(result, 'cannot reach Redis at 127.0.0.1:1/0', 'from --url')
    result = run('info', env=dict(env, RQ_REDIS_URL=UNREACHABLE))
    assert_one_line_error(result, '127.0.0.1:1/0', 'from RQ_REDIS_URL')
    result = run('info', env=dict(env, REDIS_URL=UNREACHABLE))  # rq reads REDIS_URL when neither option is given
    assert_one_line_error(result, '127.0.0.1:1/0', 'from REDIS_URL', '--url')
    result = run('info', env=dict(env, REDIS_PORT='1'))
    assert_one_line_error(result, 'localhost:1/0', 'REDIS_PORT', '--url')
    assert 'password' not in run('info', '--url', 'redis://:password@127.0.0.1:1/0', env=env).stderr


def test_nothing_given_says_to_pass_url(monkeypatch):
    """With no --url, RQ_REDIS_URL, --config or REDIS_* variable rq connects to localhost:6379, and the error says how
    to choose another (in this process: a machine may serve Redis on 6379, which a subprocess would reach)."""
    for name in ('REDIS_URL', 'REDIS_HOST', 'REDIS_PORT', 'REDIS_DB', 'RQ_REDIS_URL', 'RQ_CONFIG'):
        monkeypatch.delenv(name, raising=False)
    said = cli._source(CliConfig())
    assert '--url' in said and 'REDIS_URL' in said, said
    assert cli._source(CliConfig(url=UNREACHABLE), 'RQ_REDIS_URL') == 'from RQ_REDIS_URL'


@pytest.mark.parametrize('args, needles', [
    (['cap', '{q}', '-3'], ["'[N]'", "got '-3'"]),
    (['cap', '{q}', '-0'], ["'[N]'", "got '-0'"]),
    (['rate', '{q}', '-3/60s'], ['LIMIT/PER', "got '-3/60s'"]),
    (['override', 'tests.helpers.key_jobs.per_customer', 'c1', '-2'], ["'[N]'", "got '-2'"]),
    (['info', '--limit', '-1'], ["'--limit'", "got '-1'"]),
    (['fair', 'weight', 'scope', 'k', '-2'], ['weight', '-2']),
    (['cap', '{q}', '--', '-3'], ["'[N]'", "got '-3'"]),
])
def test_a_negative_number_is_refused_by_its_argument(connection, env, redis_url, known, args, needles):
    """Not click's ``No such option: -3``: the argument's own refusal, naming it and the value, exit 2, nothing
    written."""
    before = sorted(connection.keys('*'))
    result = run(*[arg.format(q=known) for arg in args], env=env, url=redis_url)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert_one_line_error(result, *needles)
    assert 'No such option' not in result.stderr
    assert sorted(connection.keys('*')) == before
    assert QueueSlot.get(known, connection=connection) is None


def test_an_unknown_option_is_still_one(env, redis_url, known):
    assert_one_line_error(run('cap', known, '--bogus', env=env, url=redis_url), "No such option '--bogus'")
    assert_one_line_error(run('cap', known, '-x', env=env, url=redis_url), "No such option '-x'")
    # beside a negative number, the unknown option is the one named (not the number)
    assert_one_line_error(run('cap', known, '-3', '--froce', env=env, url=redis_url), "No such option '--froce'",
                          '--force')


def _names(group, prefix=()):
    for name, command in sorted(group.commands.items()):
        yield (*prefix, name)
        if hasattr(command, 'commands'):
            yield from _names(command, (*prefix, name))


def test_docs_list_every_command():
    text = DOCS.read_text()
    missing = [' '.join(name) for name in _names(cli.main)
               if not re.search(r'rq-policies (\[[^\]]*\] )?' + re.escape(' '.join(name)) + r'\b', text)]
    assert not missing, f'docs/cli.md does not show: {missing}'
