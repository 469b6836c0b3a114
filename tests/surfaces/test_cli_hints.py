"""The rq-policies command reads well: every hint names an option that exists, read commands answer a bare QUEUE,
``info QUEUE`` shows only that queue, and every read command's --json parses.

The hint walk runs the commands in this process (click's CliRunner) against the session's real server: each command's
error paths, and the success output of the read commands, and checks every ``--option`` a message names against the
command the message is about (the one running, or the one it names: ``rq-policies keys SCOPE --limit 0``).
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from rq_policies import Concurrency, PolicyQueue, QueueRate, QueueSlot, Throttle
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.surfaces.cli import main
from tests.helpers import jobs, key_jobs

UNREACHABLE = 'redis://127.0.0.1:1/0'

#: Each command's error paths: arguments that must fail (with a message). A command missing here fails the walk, so a
#: new command comes with its own.
ERROR_PATHS: dict[str, list[list[str]]] = {
    'info': [['nosuch'], ['--limit', 'x'], ['--width', '-1']],
    'reset': [['nosuch', 'tests.helpers.jobs.plain'], ['known', 'plain'],
              ['known', 'tests.helpers.jobs.plain', '--kwarg', 'novalue'], [],
              ['known', 'tests.helpers.jobs.plain', '--wait-replicas', '0']],
    'explain': [['no-such-job'], []],
    'exporter': [['--port', '0'], ['--port', '70000']],
    'dashboard': [['--port', 'x'], ['--refresh', '-1']],
    'cap': [['nosuch', '3'], ['known', '0'], ['known', '3', '--clear'], ['', '3'], [],
            ['known', '3', '--wait-replicas', '0'], ['known', '3', '--wait-replicas', '1', '--wait-timeout', '0'],
            ['known', '--wait-replicas', '1']],
    'rate': [['nosuch', '5/1'], ['known', '5'], ['known', '5/1', '--burst', '9'], ['known', '--burst', '2'],
             ['known', '5/1', '--clear'], ['known', '0/1'], [], ['known', '5/1', '--wait-replicas', 'x']],
    'keys': [['a:b'], ['scope', '--limit', 'x'], []],
    'override': [['a:b', 'k', '3'], ['scope', 'k', '0'], ['scope', 'k', '3', '--clear'], ['scope']],
    'fair': [['nosuch'], ['pause'], ['pause', 'a:b', 'k'], ['resume', 'scope'], ['weight', 'scope', 'k', '0'],
             ['weight', 'scope', 'k', 'x'], ['weight', 'scope', 'k', '3', '--clear'], ['keys']],
}

#: Valid arguments, for the walk's run against an unreachable server.
UNREACHABLE_ARGS: dict[str, list[str]] = {
    'info': [], 'reset': ['known', 'tests.helpers.jobs.plain'], 'explain': ['some-job'], 'cap': ['known', '3'],
    'rate': ['known', '5/1'], 'keys': ['scope'], 'override': ['scope', 'k', '3'],
}

#: Read commands and the arguments that make them print a hint-bearing answer (lists cut by --limit and the like).
READS: dict[str, list[list[str]]] = {
    'info': [[], ['known'], ['--limit', '1'], ['known', '--limit', '1', '--digests']],
    'cap': [['known']],
    'rate': [['known']],
    'keys': [['tests.helpers.key_jobs.per_customer'], ['tests.helpers.key_jobs.per_customer', '--limit', '1']],
    'override': [['tests.helpers.key_jobs.per_customer', 'c1']],
    'explain': [],
}


def options(command_name: str) -> set[str]:
    """The ``--options`` of a command; of a group (``fair``), every option of its subcommands too."""
    command = main.commands[command_name]
    found = {'--help'}
    for each in [command, *getattr(command, 'commands', {}).values()]:
        for param in each.params:
            found.update(getattr(param, 'opts', []))
            found.update(getattr(param, 'secondary_opts', []))
    return {name for name in found if name.startswith('--')}


def named_options(command_name: str, text: str) -> list[tuple[str, str]]:
    """``(command, option)`` for every ``--option`` the text names: the option belongs to the command named just
    before it in the same sentence (``rq-policies keys SCOPE --limit 0``), else to the command that printed it."""
    out = []
    for sentence in re.split(r'[.;()\n]', text):
        for match in re.finditer(r'(?<![\w-])--[a-z][a-z0-9-]*', sentence):
            before = re.findall(r'rq-policies (\w+)', sentence[:match.start()])
            owner = before[-1] if before and before[-1] in main.commands else command_name
            out.append((owner, match.group(0)))
    return out


@pytest.fixture
def state(connection):
    """A known queue with a cap, a rate, loner markers and a throttle window; a per-key scope with parked jobs."""
    q = PolicyQueue('known', connection=connection)
    for n in range(3):
        q.enqueue(jobs.sweep_cache, n)
        q.enqueue(jobs.plain, n, policy=Throttle(3600))
    QueueSlot.set('known', 2, connection=connection)
    QueueRate.set('known', 5, 60, connection=connection)
    keyed = PolicyQueue('keyed', connection=connection)
    for customer in ('c1', 'c2', 'c3'):
        keyed.enqueue(key_jobs.per_customer, 't', 0, customer=customer)
    Concurrency.set('tests.helpers.key_jobs.per_customer', 'c1', 1, connection=connection)
    for n in range(3):  # holds on three keys, so `keys --limit 1` has more to list
        assert QueueSlot.acquire('known', 10, ttl=60, token=f'h:{n}:0:0', connection=connection)
        connection.zadd(f'{RQ}:policies:keyholds:tests.helpers.key_jobs.per_customer:c{n + 1}',
                        {f'h:{n}:0:0': 4_000_000_000})


def invoke(args: list[str], url: str):
    return CliRunner().invoke(main, [*args, '--url', url], catch_exceptions=False)


def test_every_command_has_its_error_paths_walked():
    assert set(ERROR_PATHS) == set(main.commands)


@pytest.mark.parametrize('command_name', sorted(ERROR_PATHS))
def test_every_option_an_error_names_exists_on_that_command(connection, redis_url, state, command_name):
    before = {k: connection.dump(k) for k in connection.keys('*')}
    messages = []
    for args in ERROR_PATHS[command_name]:
        if command_name in ('exporter', 'dashboard') and args and args[0] == '--port' and args[1].isdigit() \
                and 1 <= int(args[1]) <= 65535:
            continue  # a valid port would serve until stopped
        result = invoke([command_name, *args], redis_url)
        assert result.exit_code != 0, (command_name, args, result.output)
        assert 'Traceback' not in result.output
        messages.append((args, result.output))
    if command_name in UNREACHABLE_ARGS:  # and with Redis out of reach
        args = UNREACHABLE_ARGS[command_name]
        result = invoke([command_name, *args], UNREACHABLE)
        assert result.exit_code != 0 and 'cannot reach Redis' in result.output, (args, result.output)
        messages.append((args, result.output))
    for args, output in messages:
        for owner, option in named_options(command_name, output):
            assert option in options(owner), f'{command_name} {args}: {output!r} names {option}, which ' \
                                             f'`rq-policies {owner}` does not have ({sorted(options(owner))})'
    assert {k: connection.dump(k) for k in connection.keys('*')} == before  # no refused call wrote anything


def test_unknown_queue_hints_follow_the_command(connection, redis_url, state):
    """The 0.2 bug: info and reset on an unknown queue suggested --force, which neither has."""
    cases = ((['info', 'nosuch'], 'check the name'),
             (['reset', 'nosuch', 'tests.helpers.jobs.plain'], 'check the name'),
             (['cap', 'nosuch', '3'], '--force to cap it'), (['rate', 'nosuch', '5/1'], '--force to limit it'))
    for args, hint in cases:
        output = invoke(args, redis_url).output
        assert "unknown queue 'nosuch'" in output and hint in output, (args, output)
        assert ('--force' in output) == ('--force' in options(args[0])), (args, output)


@pytest.mark.parametrize('command_name', sorted(READS))
def test_every_option_a_read_command_mentions_exists(connection, redis_url, state, command_name):
    for args in READS[command_name]:
        result = invoke([command_name, *args], redis_url)
        assert result.exit_code == 0, (args, result.output)
        for owner, option in named_options(command_name, result.output):
            assert option in options(owner), (args, result.output, option)


def test_every_read_command_takes_json_and_it_parses(connection, redis_url, state):
    reads = {
        'info': ['known'], 'cap': ['known'], 'rate': ['known'], 'keys': ['tests.helpers.key_jobs.per_customer'],
        'override': ['tests.helpers.key_jobs.per_customer', 'c1'],
    }
    job_id = connection.lindex(f'{RQ}:queue:known', 0).decode()
    reads['explain'] = [job_id]
    for command_name, args in reads.items():
        assert '--json' in options(command_name), command_name
        result = invoke([command_name, *args, '--json'], redis_url)
        assert result.exit_code == 0, (command_name, result.output)
        json.loads(result.output)
    assert json.loads(invoke(['cap', 'known', '--json'], redis_url).output) == {
        'queue': 'known', 'capacity': 2, 'in_use': 3}
    rate = json.loads(invoke(['rate', 'known', '--json'], redis_url).output)
    assert rate['rate'] == {'limit': 5, 'per': 60, 'burst': 1} and rate['available'] == 1
    key = json.loads(invoke(['override', 'tests.helpers.key_jobs.per_customer', 'c1', '--json'], redis_url).output)
    assert key['limit'] == 1 and key['overridden'] is True and key['in_use'] == 1


def test_cap_rate_and_override_without_a_value_show_it(connection, redis_url, state):
    assert invoke(['cap', 'known'], redis_url).output == "Queue 'known' is capped at 2, 3 in use.\n"
    assert invoke(['cap', 'keyed'], redis_url).output == "Queue 'keyed' is uncapped (0 hold(s) in use).\n"
    out = invoke(['rate', 'known'], redis_url).output
    assert out.startswith("Queue 'known' is limited to 5 starts every 60s, burst 1: 1 available, next start now")
    assert invoke(['rate', 'keyed'], redis_url).output == "Queue 'keyed' has no rate.\n"
    out = invoke(['override', 'tests.helpers.key_jobs.per_customer', 'c1'], redis_url).output
    assert out == "Key 'c1' of scope 'tests.helpers.key_jobs.per_customer': limit 1 (override), 1 in use, 0 parked.\n"
    assert QueueSlot.get('known', connection=connection).capacity == 2  # showing wrote nothing


def test_info_queue_shows_only_that_queue(connection, redis_url, state):
    out = invoke(['info', 'known'], redis_url).output
    assert 'queue known' in out and 'queue keyed' not in out
    assert 'Concurrency per key' not in out  # per-key scopes span queues: `rq-policies info` or `keys` show them
    everything = invoke(['info'], redis_url).output
    assert 'queue known' in everything and 'Concurrency per key' in everything
    data = json.loads(invoke(['info', 'known', '--json'], redis_url).output)
    assert list(data['queues']) == ['known'] and data['policies'] == {}
    # readable: times as local ISO with how far from now, identities as job descriptions, no raw window numbers
    assert re.search(r'expires \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \(in [0-9.]+ s\)', out), out
    assert 'tests.helpers.jobs.sweep_cache(0)' in out and 'tests.helpers.jobs.plain(0)' in out
    # no epoch numbers, no window numbers like 359239479; a job id's last group can be all digits by chance
    # (one CI run drew ...-666154173639), so the ids go first
    without_ids = re.sub(r'\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b', 'JOB', out)
    assert not re.search(r'\b\d{9,}\b', without_ids), out
    assert not re.search(r'\b[0-9a-f]{64}\b', out)  # digests only with --digests
    assert re.search(r'\b[0-9a-f]{64}\b', invoke(['info', 'known', '--digests'], redis_url).output)
