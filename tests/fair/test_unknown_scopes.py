"""A typo in a scope is refused (issue 33): an admin call that writes a setting of a scope no policy is known to use
(Fair's pause and weight, Concurrency's and Rate's per-key settings) raises InvalidSetting naming the scope with a
hint, as ``rq-policies cap`` refuses a queue nothing has seen, and writes nothing; ``force=True`` (``--force``) writes
anyway. A scope is known when this process declares it, when it is the import path of a function declaring the
policy, or when Redis holds state of it. ``Fair.status`` shows the weight in force."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rq_policies import Concurrency, Fair, InvalidArgument, InvalidSetting, PolicyQueue, Rate
from rq_policies.engine import policy as policy_module
from tests.helpers import bad_input_jobs, fair_jobs


def snapshot(conn):
    return {key: (conn.type(key), conn.dump(key)) for key in conn.scan_iter(count=1000)}


def _cli(*args, env):
    return subprocess.run([sys.executable, '-m', 'rq_policies', *args], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize('call', [
    lambda c, **kw: Fair.pause('no.such.scope', 'zzz', connection=c, **kw),
    lambda c, **kw: Fair.set('no.such.scope', 'zzz', 3, connection=c, **kw),
    lambda c, **kw: Concurrency.set('no.such.scope', 'zzz', 3, connection=c, **kw),
    lambda c, **kw: Rate.set('no.such.scope', 'zzz', 3, per=60, connection=c, **kw),
], ids=['Fair.pause', 'Fair.set', 'Concurrency.set', 'Rate.set'])
def test_a_write_to_a_scope_no_policy_uses_is_refused_naming_it_and_force_writes(connection, call):
    PolicyQueue('fair', connection=connection).enqueue(fair_jobs.work, 't', tenant='acme')
    before = snapshot(connection)
    with pytest.raises(InvalidSetting) as caught:
        call(connection)
    assert isinstance(caught.value, InvalidArgument) and caught.value.argument == 'scope'
    assert "'no.such.scope'" in str(caught.value) and 'force=True' in str(caught.value), str(caught.value)
    assert snapshot(connection) == before
    call(connection, force=True)
    assert snapshot(connection) != before


def test_a_declared_scope_an_importable_function_s_path_and_one_redis_knows_are_accepted(connection, monkeypatch):
    assert Fair.pause(fair_jobs.SCOPE, 'acme', connection=connection)  # declared here (tests.helpers.fair_jobs)
    # Concurrency on its default scope, the function's path: known by importing it, as a command line would.
    path = 'tests.helpers.bad_input_jobs.per_customer'
    monkeypatch.setattr(policy_module, 'DECLARED_SCOPES', {})
    assert bad_input_jobs.per_customer
    Concurrency.set(path, 'c1', 2, connection=connection)
    # Declared nowhere here, not a function: known only from Redis (a weight set with force earlier).
    with pytest.raises(InvalidSetting):
        Fair.set('elsewhere', 'k', 2, connection=connection)
    Fair.set('elsewhere', 'k', 2, connection=connection, force=True)
    assert Fair.pause('elsewhere', 'other', connection=connection)
    # ... and Concurrency knows a scope a Rate setting names only when Concurrency state does: refused.
    Rate.set('rated', 'k', 1, connection=connection, force=True)
    Rate.set('rated', 'k2', 1, connection=connection)
    with pytest.raises(InvalidSetting):
        Concurrency.set('rated', 'k', 1, connection=connection)


def test_removals_and_reads_of_an_unknown_scope_are_not_refused(connection):
    assert Fair.resume('no.such.scope', 'zzz', connection=connection) is False
    assert Fair.clear('no.such.scope', 'zzz', connection=connection) is False
    assert Concurrency.clear('no.such.scope', 'zzz', connection=connection) is False
    assert Fair.get('no.such.scope', 'zzz', connection=connection) is None


def test_the_commands_refuse_an_unknown_scope_with_a_hint_and_force_writes(connection, worker_env):
    before = snapshot(connection)
    for args in (('fair', 'pause', 'tasks.rendr', 'acme'), ('fair', 'weight', 'tasks.rendr', 'acme', '3'),
                 ('override', 'tasks.rendr', 'acme', '3')):
        refused = _cli(*args, env=worker_env)
        assert refused.returncode != 0, refused.stdout
        assert "'tasks.rendr'" in refused.stderr and '--force' in refused.stderr, refused.stderr
        assert snapshot(connection) == before, args
    paused = _cli('fair', 'pause', 'tasks.rendr', 'acme', '--force', env=worker_env)
    assert paused.returncode == 0 and 'paused' in paused.stdout, paused.stderr
    assert Fair.status('tasks.rendr', 'acme', connection=connection).paused
    overridden = _cli('override', 'tasks.rendr', 'acme', '3', '--force', env=worker_env)
    assert overridden.returncode == 0, overridden.stderr
    assert Concurrency.get('tasks.rendr', 'acme', connection=connection).limit == 3


def test_status_shows_the_weight_in_force(connection):
    q = PolicyQueue('fair', connection=connection)
    fair_jobs.work  # noqa: B018 - declares SCOPE
    q.enqueue(fair_jobs.work, 't', tenant='free-one')  # declared weight 1
    q.enqueue(fair_jobs.work, 't', tenant='pro-one', plan='pro')  # declared weight 3
    free = Fair.status(fair_jobs.SCOPE, 'free-one', 'fair', connection=connection)
    assert (free.weight, free.set_at_run_time) == (1, False)
    assert Fair.status(fair_jobs.SCOPE, 'pro-one', 'fair', connection=connection).weight == 3
    Fair.set(fair_jobs.SCOPE, 'free-one', 5, connection=connection)
    set_now = Fair.status(fair_jobs.SCOPE, 'free-one', 'fair', connection=connection)
    assert (set_now.weight, set_now.set_at_run_time) == (5, True)
    assert Fair.status(fair_jobs.SCOPE, 'nobody', 'fair', connection=connection).weight is None
