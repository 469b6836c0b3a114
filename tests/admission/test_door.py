"""The door core (rq_policies.engine.admission: plan, read, settle) and its observers (rq_policies.engine.events): a
plan is made without I/O and is what the door sends; the observers hear of every door call, planned then decided or
failed, in the engine alone (no OpenTelemetry here); run observers wrap a job's run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from rq.job import Job

from rq_policies import Debounce, DuplicateJob, Loner, PolicyConfigurationError, PolicyQueue
from rq_policies.engine import admission, events, scripts
from rq_policies.engine.queue import planning
from tests.helpers import jobs


def test_a_planned_door_sends_nothing_and_its_plan_is_what_the_door_sends(connection, monkeypatch):
    sent: list[tuple[str, list]] = []
    real = scripts.run_leased

    def spy(name, client, call_keys, argv, *rest):
        sent.append((name, list(call_keys)))
        return real(name, client, call_keys, argv, *rest)

    monkeypatch.setattr(scripts, 'run_leased', spy)
    q = PolicyQueue('door', connection=connection)
    with planning() as plans:
        built = [q.enqueue(jobs.record, 'a', job_id='planned'), q.enqueue(jobs.plain, 1, job_id='plain'),
                 q.enqueue(jobs.record, 'b', policy=Loner(on_conflict='replace'), job_id='replacing')]
    assert sent == [] and connection.keys('*') == []  # nothing sent, nothing written
    assert [plan.kind for plan in plans] == [admission.ADMIT, admission.PLAIN, admission.ADMIT]
    assert [plan.call.script for plan in plans] == ['admit_narrow', 'admit_narrow', 'admit']
    assert [plan.write.job for plan in plans] == built
    assert [job.id for job in built] == ['planned', 'plain', 'replacing']
    for plan in plans:  # sent by the synchronous driver, each is the door's one call, and writes the job it built
        assert q._send(plan) is plan.write.job
    assert [name for name, _ in sent] == ['admit_narrow', 'admit_narrow', 'admit']
    assert [call_keys for _, call_keys in sent] == [plan.call.keys for plan in plans]
    assert sorted(q.job_ids) == ['plain', 'planned', 'replacing']
    assert Job.fetch('planned', connection=connection).args == ('a',)
    assert q.enqueue(jobs.record, 'a') is None  # the planned Loner holds its identity like any other


class Recorder:
    """A door observer and a run observer that record what they were told."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def door(self, event, plan, detail, state):
        if event == 'planned':
            self.events.append(('planned', plan.kind, plan.call is None))
            if plan.write is not None:  # into the job's meta and the fields it is written from: rides the round trip
                job, fields = plan.write.job, plan.write.fields
                job.meta['seen'] = 'yes'
                packed = job.serializer.dumps(job.meta)
                if 'meta' in fields[::2]:
                    fields[fields.index('meta') + 1] = packed
                else:
                    fields += ['meta', packed]
            return len(self.events)
        self.events.append((event, plan.kind, state, getattr(detail, 'code', type(detail).__name__)))
        return None

    def run(self, run, job, queue, *args):
        self.events.append(('run', job.id))
        return run(job, queue, *args)


@pytest.fixture
def recorder():
    found = Recorder()
    events.observe(door=found.door, run=found.run)
    events.observe(door=found.door, run=found.run)  # once only
    try:
        yield found
    finally:
        events.unobserve(door=found.door, run=found.run)
    assert events.DOORS == [] and events.RUNS == []


def test_observers_hear_each_door_planned_then_decided_or_failed(connection, recorder):
    q = PolicyQueue('door', connection=connection)
    first = q.enqueue(jobs.record, 'x')
    assert q.enqueue(jobs.record, 'x') is None  # the full path's drop: it leaves an identity hint
    assert q.enqueue(jobs.record, 'x') is None  # the hinted probe's drop
    plain = q.enqueue(jobs.plain, 1)
    with pytest.raises(DuplicateJob):
        q.enqueue(jobs.plain, 2, policy=Loner(on_conflict='raise'), job_id='r1')
        q.enqueue(jobs.plain, 2, policy=Loner(on_conflict='raise'))
    with pytest.raises(PolicyConfigurationError):  # refused by a policy before anything is sent: no verdict
        q.enqueue(jobs.plain, 3, policy=Debounce(30), depends_on=first)
    assert recorder.events[:8] == [
        ('planned', 'admit', True), ('decided', 'admit', 1, 1),
        ('planned', 'admit', True), ('decided', 'admit', 3, 0),
        ('planned', 'probe', False), ('decided', 'probe', 5, 0),
        ('planned', 'plain', True), ('decided', 'plain', 7, 'NoneType'),
    ]
    assert recorder.events[8:] == [('planned', 'admit', True), ('decided', 'admit', 9, 1),
                                   ('planned', 'admit', True), ('failed', 'admit', 11, 'DuplicateJob'),
                                   ('planned', 'admit', True), ('failed', 'admit', 13, 'PolicyConfigurationError')]
    # what the observer wrote into the job's meta when it was planned was written with the job
    assert Job.fetch(first.id, connection=connection).meta == {'seen': 'yes'}
    assert Job.fetch(plain.id, connection=connection).meta == {'seen': 'yes'}


def test_run_observers_wrap_a_job_run_the_first_registered_outermost():
    seen = []

    def outer(run, job, queue, *args):
        seen.append(('outer in', job))
        try:
            return run(job, queue, *args)
        finally:
            seen.append(('outer out', job))

    def inner(run, job, queue, *args):
        seen.append(('inner', job, queue, args))
        return run(job, queue, *args)

    events.observe(run=outer)
    events.observe(run=inner)
    try:
        ran = events.perform(lambda job, queue, *args: ('ran', job, queue, args), 'j', 'q', 1)
    finally:
        events.unobserve(run=outer)
        events.unobserve(run=inner)
    assert ran == ('ran', 'j', 'q', (1,))
    assert seen == [('outer in', 'j'), ('inner', 'j', 'q', (1,)), ('outer out', 'j')]
    assert events.RUNS == []


def test_the_engine_imports_no_surface(redis_url, worker_env):
    """A producer and a worker load the engine only: no surface module (tracing, asyncio, the CLI's views) is
    imported by a door call or by the worker's module."""
    script = textwrap.dedent('''
        import sys
        from tests.helpers import jobs
        from tests.helpers.cluster import connect
        import rq_policies, rq_policies.engine.worker
        q = rq_policies.PolicyQueue('noview', connection=connect(sys.argv[1]))
        assert q.enqueue(jobs.record, 'n') is not None and q.enqueue(jobs.record, 'n') is None
        assert q.enqueue(jobs.plain, 1) is not None
        print(sorted(m for m in sys.modules if m.startswith('rq_policies.surfaces')))
    ''')
    done = subprocess.run([sys.executable, '-c', script, redis_url], env=worker_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert 'rq_policies.surfaces.otel' not in done.stdout and 'rq_policies.surfaces.aio' not in done.stdout, done.stdout
