"""The narrow admission (lua/admit_narrow.lua) decides and writes exactly what lua/admit.lua does for the calls it
serves: a job without a policy, or with a Loner alone that drops or raises.

Each case builds one call (its job, its write), puts the server in a given state, and runs the call through each
script from that same state, twice (the second run is a resend of the same call, as after a lost reply): the
verdicts and every key the server then holds (values, and whether each expires) must be the same.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from rq.job import Job

from rq_policies import Loner, PolicyQueue
from rq_policies.engine import admission, identity, keys, scripts
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.ops import FlatCall
from rq_policies.engine.policy import make_set
from tests.helpers import jobs


def _dump(connection) -> dict[bytes, tuple[bytes, int]]:
    return {key: (connection.dump(key), connection.pttl(key)) for key in connection.keys('*')}


def _restore(connection, dumped: dict[bytes, tuple[bytes, int]]) -> None:
    connection.flushdb()
    for key, (value, pttl) in dumped.items():
        connection.restore(key, max(pttl, 0), value)


def _state(connection) -> dict[str, tuple]:
    """Every key with its value and whether it expires (the drop counters' minute key by its prefix: both scripts
    count in the server's current minute)."""
    found = {}
    for raw in connection.keys('*'):
        key = raw.decode()
        kind = connection.type(raw).decode()
        read = {'hash': connection.hgetall, 'list': lambda k: connection.lrange(k, 0, -1),
                'set': connection.smembers, 'zset': lambda k: connection.zrange(k, 0, -1, withscores=True),
                'string': connection.get}[kind]
        name = keys.DROPS_MINUTE_PREFIX if key.startswith(keys.DROPS_MINUTE_PREFIX) else key
        found[name] = (kind, read(raw), connection.ttl(raw) > 0)
    return found


def _holder(q: PolicyQueue, policy, status: str | None = None, worker: str | None = None,
            job_id: str | None = None) -> None:
    """The identity held by a job of the same call, left in ``status``."""
    job = q.enqueue(jobs.record_plain, 'same', policy=policy, job_id=job_id)
    assert job is not None
    if status is not None:
        q.connection.hset(job.key, mapping={'status': status, 'worker_name': worker or ''})
    if worker is not None:
        q.connection.set(f'{RQ}:worker:{worker}', 'alive')


CASES = {
    'plain': (None, {}, None),
    'plain, at front': (None, {'at_front': True}, None),
    'plain, scheduled': (None, {'when': 60}, None),
    'plain, chosen id': (None, {'job_id': 'mine'}, None),
    'plain, short result_ttl': (None, {'result_ttl': 0}, None),
    'plain, job ttl': (None, {'ttl': 500}, None),
    'loner, free': (Loner(), {}, None),
    'loner, held': (Loner(), {}, lambda q: _holder(q, Loner())),
    'loner, held, chosen id': (Loner(), {'job_id': 'mine'}, lambda q: _holder(q, Loner())),
    'loner, stale marker (holder started)': (Loner(), {}, lambda q: _holder(q, Loner(), 'started')),
    'loner, chosen id, its tombstone': (Loner(), {'job_id': 'mine'},
                                        lambda q: q.connection.set(keys.SUPERSEDED_PREFIX + 'mine', 'loner other')),
    'plain, chosen id, its tombstone': (None, {'job_id': 'mine'},
                                        lambda q: q.connection.set(keys.SUPERSEDED_PREFIX + 'mine', 'loner other')),
    'loner, chosen id held by an earlier call of that id': (Loner(), {'job_id': 'mine'},
                                                            lambda q: _holder(q, Loner(), job_id='mine')),
    'loner raise, held': (Loner(on_conflict='raise'), {}, lambda q: _holder(q, Loner())),
    'loner finished, holder running': (Loner(until='finished'), {},
                                       lambda q: _holder(q, Loner(until='finished'), 'started', 'w1')),
    'loner finished, holder (until started) running': (Loner(until='finished'), {},
                                                       lambda q: _holder(q, Loner(), 'started', 'w1')),
    'loner, holder finished-declared and running': (Loner(), {},
                                                    lambda q: _holder(q, Loner(until='finished'), 'started', 'w1')),
    'loner finished, holder finished': (Loner(until='finished'), {},
                                        lambda q: _holder(q, Loner(until='finished'), 'finished')),
    'loner ttl': (Loner(ttl=30), {}, None),
    'loner ttl, job ttl shorter': (Loner(ttl=30), {'ttl': 10}, None),
    'loner, job ttl': (Loner(), {'ttl': 500}, None),
    'loner, scheduled': (Loner(), {'when': 60}, None),
    'loner, at front, short result_ttl': (Loner(), {'at_front': True, 'result_ttl': 0}, None),
}


@pytest.mark.parametrize('case', list(CASES))
def test_the_narrow_script_decides_and_writes_what_admit_lua_does(connection, case):
    policy, options, setup = CASES[case]
    q = PolicyQueue('narrow', connection=connection)
    if setup is not None:
        setup(q)
    before = _dump(connection)
    spec = make_set(policy) if policy is not None else None
    when = datetime.now(timezone.utc) + timedelta(seconds=options['when']) if 'when' in options else None
    job = q.create_job(jobs.record_plain, args=('same',), job_id=options.get('job_id'),
                       result_ttl=options.get('result_ttl'), ttl=options.get('ttl'))
    if spec is None:
        write = q._plain_write(job, options.get('at_front', False), when)
        digest = ''
    else:
        digest = identity.digest(identity.func_path(job), q.name, job.args, job.kwargs, spec.unique_context,
                                 spec.policies)
        write = q.job_write(job, spec, digest, options.get('at_front', False), when)
    narrow = admission.narrow_call(q, spec, digest, write)
    assert isinstance(narrow, FlatCall)
    if spec is None:
        full = admission.Call('admit', order=[], p={}, **admission._write_args(q, write))
        admission._write_keys(full, q, write)
        if admission.chose_id(job):
            full.key('dropped', keys.dropped(job.id))
            full.arg('tombstone', keys.SUPERSEDED_PREFIX)
    else:
        full = admission._policy_call(q, spec, digest, force=False, **admission._write_args(q, write))
        admission._write_keys(full, q, write)
        if admission.chose_id(job):
            admission._record_drops(full, job.id)
    assert full.script == 'admit'
    outcomes = []
    for call in (full, narrow):
        _restore(connection, before)
        replies = [admission.Verdict.read(call.run(connection)) for _ in range(2)]
        outcomes.append((replies, _state(connection)))
    assert outcomes[0] == outcomes[1]
    (first, _), state = outcomes[1]
    assert first.code in (0, 1)
    if first.code == 1:
        assert Job.fetch(job.id, connection=connection).origin == 'narrow'  # an ordinary rq job


def test_the_doors_send_the_calls_the_narrow_script_serves_there_and_the_rest_to_admit_lua(connection, monkeypatch):
    sent: list[str] = []
    real = scripts.run_leased

    def spy(name, *args, **kwargs):
        sent.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(scripts, 'run_leased', spy)
    q = PolicyQueue('narrow', connection=connection)
    q.enqueue(jobs.record_plain, 'a')
    q.enqueue(jobs.record_plain, 'b', policy=Loner())
    q.enqueue(jobs.record_plain, 'f', policy=Loner(on_conflict='raise', until='finished', ttl=5))
    assert sent == ['admit_narrow'] * 3
    sent.clear()
    q.enqueue(jobs.record_plain, 'c', policy=Loner(on_conflict='replace'))
    q.force(jobs.record_plain, 'b', policy=Loner())
    q.enqueue(jobs.record_plain, 'd', policy=Loner(), depends_on=q.enqueue(jobs.record_plain, 'e'))
    assert sent == ['admit', 'admit', 'admit_narrow', 'admit']


PROBES = {
    'free': (Loner(), '', None),
    'held': (Loner(), '', lambda q: _holder(q, Loner())),
    'held, chosen id': (Loner(), 'mine', lambda q: _holder(q, Loner())),
    'held by this very id': (Loner(), 'mine', lambda q: _holder(q, Loner(), job_id='mine')),
    'stale marker': (Loner(), '', lambda q: _holder(q, Loner(), 'started')),
    'finished, holder running': (Loner(until='finished'), '', lambda q: _holder(q, Loner(), 'started', 'w1')),
    'raise, held': (Loner(on_conflict='raise'), '', lambda q: _holder(q, Loner())),
}


@pytest.mark.parametrize('case', list(PROBES))
def test_the_narrow_probe_decides_what_admit_lua_s_probe_does(connection, case):
    """The probe (an enqueue expected to be dropped: the checks only) of a Loner alone goes to the narrow script too:
    the same verdict and the same writes (a drop's counters and record, nothing else) as admit.lua's probe."""
    policy, job_id, setup = PROBES[case]
    q = PolicyQueue('narrow', connection=connection)
    if setup is not None:
        setup(q)
    before = _dump(connection)
    spec = make_set(policy)
    digest = identity.digest('tests.helpers.jobs.record_plain', q.name, ('same',), {}, None, spec.policies)
    narrow = admission.probe_call(q, spec, digest, job_id)
    assert isinstance(narrow, FlatCall)
    full = admission._policy_call(q, spec, digest, jid=job_id, mode='N', score=0, ttl=-1, queue_key=q.key, probe=True)
    if job_id:
        admission._record_drops(full, job_id)
    outcomes = []
    for call in (full, narrow):
        _restore(connection, before)
        replies = [admission.Verdict.read(call.run(connection)) for _ in range(2)]
        outcomes.append((replies, _state(connection)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][0][0].code in (0, -1)
