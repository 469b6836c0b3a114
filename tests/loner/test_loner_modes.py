"""Loner's lock modes (until='started' / 'finished') and conflict strategies (drop / raise / replace)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from rq import Retry
from rq.command import send_stop_job_command
from rq.job import Job, JobStatus

from rq_policies import (
    DuplicateJob,
    Loner,
    PolicyConfigurationError,
    PolicyJob,
    PolicyQueue,
    PolicySet,
    PolicySimpleWorker,
    Throttle,
    explain,
    policy,
)
from rq_policies.engine import keys, ops
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.surfaces import state
from tests.helpers import jobs, lock_jobs
from tests.helpers.workers import output, race, start_worker, stop, wait_for


def marker(conn, queue, job):
    """The loner marker a job's hash names, and the job id it holds."""
    key = conn.hget(job.key, keys.LONER_FIELD).decode()
    value = conn.get(key)
    return key, value.decode() if value else None


# -- raise ------------------------------------------------------------------------------------------------------------


def test_raise_carries_the_holder_and_counts_as_a_drop(connection):
    q = PolicyQueue('raise', connection=connection)
    first = q.enqueue(lock_jobs.raising, 1)
    for _ in range(2):  # the second raise comes through the hinted fast path (the probe)
        with pytest.raises(DuplicateJob) as caught:
            q.enqueue(lock_jobs.raising, 1)
        assert caught.value.holder == first.id and caught.value.queue == 'raise'
        key, _ = marker(connection, q, first)
        assert keys.LONER_KEYS.parse(key)[1] == caught.value.identity
    assert q.count == 1
    assert state.snapshot(connection, ['raise'])['queues']['raise']['drops'] == {'loner': 2}
    assert q.enqueue(lock_jobs.raising, 2) is not None  # another identity


# -- replace ----------------------------------------------------------------------------------------------------------


def test_replace_rewrites_the_waiting_job_in_place(connection):
    q = PolicyQueue('replace', connection=connection)
    first = q.enqueue(lock_jobs.replaced, 'acme', 'first', check='first', meta={'v': 1}, description='one')
    other = q.enqueue(lock_jobs.replaced, 'other', 'x', check='x')
    again = q.enqueue(lock_jobs.replaced, 'acme', 'second', check='second', description='two')
    assert again is not None and again.id == first.id
    assert q.job_ids == [first.id, other.id]  # same id, same place in the queue
    stored = Job.fetch(first.id, connection=connection)
    assert stored.args == ('acme', 'second') and stored.kwargs == {'check': 'second'}
    assert stored.description == 'two' and stored.meta == {}
    assert stored.get_status() == JobStatus.QUEUED
    assert connection.hget(first.key, 'policies_replaced_by').decode() not in ('', first.id)


def test_replace_never_touches_a_job_that_was_taken(connection, redis_url, worker_env):
    q = PolicyQueue('replace-run', connection=connection)
    first = q.enqueue(lock_jobs.replaced_held, 'acme', 'first', check='first', seconds=3)
    worker = start_worker(redis_url, ['replace-run'], worker_env)
    try:
        assert wait_for(lambda: connection.llen('test:ran:acme') == 1)
        # until='finished': the running holder is never replaced, and holds: the duplicate is dropped.
        assert q.enqueue(lock_jobs.replaced_held, 'acme', 'second', check='second') is None
        assert Job.fetch(first.id, connection=connection).args == ('acme', 'first')
        assert wait_for(lambda: Job.fetch(first.id, connection=connection).get_status() == JobStatus.FINISHED)
        assert q.enqueue(lock_jobs.replaced_held, 'acme', 'third', check='third') is not None
    finally:
        stop(worker)


def test_replace_with_until_started_admits_a_new_job_while_the_holder_runs(connection, redis_url, worker_env):
    q = PolicyQueue('replace-started', connection=connection)
    first = q.enqueue(lock_jobs.replaced_slow, 'acme', 'first', check='first', seconds=3)
    worker = start_worker(redis_url, ['replace-started'], worker_env)
    try:
        assert wait_for(lambda: connection.llen('test:ran:acme') == 1)
        second = q.enqueue(lock_jobs.replaced_slow, 'acme', 'second', check='second')
        assert second is not None and second.id != first.id
    finally:
        stop(worker)


def test_replace_racing_a_worker_runs_each_job_once_with_one_complete_payload(connection, redis_url, worker_env):
    worker = start_worker(redis_url, ['race'], worker_env)
    try:
        returned = []
        for _ in range(3):
            returned += race(redis_url, 'race', lambda q: q.enqueue(
                lock_jobs.replaced, 'acme', f'{os.getpid()}', check=f'{os.getpid()}'))
        assert all(returned)
        ids = set(returned)
        assert wait_for(lambda: connection.llen('test:ran:acme') >= len(ids) and PolicyQueue(
            'race', connection=connection).count == 0, timeout=30)
        assert wait_for(lambda: all(Job.fetch(i, connection=connection).get_status() == JobStatus.FINISHED
                                    for i in ids), timeout=30)
        ran = [line.decode().split() for line in connection.lrange('test:ran:acme', 0, -1)]
        assert sorted(r[0] for r in ran) == sorted(ids)  # every job ran, exactly once
        assert all(reason == check for _, reason, check in ran)  # never a mix of two payloads
    finally:
        stop(worker)


def test_a_replacing_loner_and_a_throttle_are_refused_naming_why():
    with pytest.raises(PolicyConfigurationError, match='replace'):
        policy(Throttle(60), Loner(on_conflict='replace'))
    policy(Throttle(60), Loner(until='finished'))  # one per slot, and never while one waits or runs


def test_a_replayed_replace_writes_the_same_payload(connection, monkeypatch):
    q = PolicyQueue('replace-replay', connection=connection)
    first = q.enqueue(lock_jobs.replaced, 'acme', 'first', check='first')
    real_run = ops.Call.run

    def lost_reply(self, client):
        real_run(self, client)
        return real_run(self, client)

    monkeypatch.setattr(ops.Call, 'run', lost_reply)
    again = q.enqueue(lock_jobs.replaced, 'acme', 'second', check='second')
    monkeypatch.undo()
    assert again.id == first.id and q.job_ids == [first.id]
    assert Job.fetch(first.id, connection=connection).args == ('acme', 'second')
    assert connection.hget(keys.DROPS, 'loner:replace-replay') is None


# -- until='finished' -------------------------------------------------------------------------------------------------


def _run_held(connection, redis_url, worker_env, queue, extra=None, **kwargs):
    q = PolicyQueue(queue, connection=connection)
    job = q.enqueue(lock_jobs.held, queue, **kwargs)
    worker = start_worker(redis_url, [queue], worker_env, extra=extra)
    assert wait_for(lambda: connection.llen(f'test:ran:{queue}') == 1), output(worker)
    assert q.enqueue(lock_jobs.held, queue, **kwargs) is None  # held across the run
    return q, job, worker


def _freed(connection, q, job, status, **kwargs):
    assert wait_for(lambda: Job.fetch(job.id, connection=connection).get_status() == status, timeout=30)
    key, holder = marker(connection, q, job)
    assert holder is None, f'{key} still names {holder}'  # deleted with the ending, not just stale
    assert q.enqueue(lock_jobs.held, q.name, **kwargs) is not None


def test_until_finished_holds_across_the_run_and_frees_on_success(connection, redis_url, worker_env):
    q, job, worker = _run_held(connection, redis_url, worker_env, 'fin-ok', seconds=2)
    try:
        assert q.holder(lock_jobs.held, 'fin-ok', seconds=2) == job.id  # enqueued()/holder() see the running holder
        # A call declaring until='started' still sees the holder's own until='finished': mixed declarations agree.
        assert q.enqueue(lock_jobs.held, 'fin-ok', seconds=2, policy=Loner()) is None
        _freed(connection, q, job, JobStatus.FINISHED, seconds=2)
    finally:
        stop(worker)


def test_until_finished_frees_on_failure_and_keeps_it_through_a_retry(connection, redis_url, worker_env):
    q = PolicyQueue('fin-fail', connection=connection)
    job = q.enqueue(lock_jobs.held, 'fin-fail', 2, True, retry=Retry(max=1))
    worker = start_worker(redis_url, ['fin-fail'], worker_env)
    try:
        assert wait_for(lambda: connection.llen('test:ran:fin-fail') == 2, timeout=30), output(worker)
        assert q.enqueue(lock_jobs.held, 'fin-fail', 2, True) is None  # the retry still holds
        _freed(connection, q, job, JobStatus.FAILED, seconds=0)
    finally:
        stop(worker)


def test_until_finished_frees_on_stop_job(connection, redis_url, worker_env):
    q, job, worker = _run_held(connection, redis_url, worker_env, 'fin-stop', seconds=30)
    try:
        send_stop_job_command(connection, job.id)
        _freed(connection, q, job, JobStatus.STOPPED, seconds=0)
    finally:
        stop(worker)


def test_until_finished_frees_on_timeout(connection, redis_url, worker_env):
    q = PolicyQueue('fin-timeout', connection=connection)
    job = q.enqueue(lock_jobs.held, 'fin-timeout', 30, job_timeout=1)
    worker = start_worker(redis_url, ['fin-timeout'], worker_env)
    try:
        assert wait_for(lambda: connection.llen('test:ran:fin-timeout') == 1), output(worker)
        _freed(connection, q, job, JobStatus.FAILED, seconds=0)
    finally:
        stop(worker)


def test_until_finished_frees_when_the_horse_is_sigkilled(connection, redis_url, worker_env):
    q, job, worker = _run_held(connection, redis_url, worker_env, 'fin-kill', seconds=30)
    try:
        os.kill(int(connection.lindex('test:pid:fin-kill', 0)), signal.SIGKILL)
        _freed(connection, q, job, JobStatus.FAILED, seconds=0)
    finally:
        stop(worker)


def test_until_finished_frees_on_cancel_and_delete_of_a_waiting_job(connection):
    q = PolicyQueue('fin-cancel', connection=connection)
    job = q.enqueue(lock_jobs.held, 'a')
    assert q.enqueue(lock_jobs.held, 'a') is None
    job.cancel()
    assert marker(connection, q, job)[1] is None
    again = q.enqueue(lock_jobs.held, 'a')
    assert again is not None
    key = marker(connection, q, again)[0]
    again.delete()
    assert connection.get(key) is None
    assert q.enqueue(lock_jobs.held, 'a') is not None


@pytest.mark.long
def test_until_finished_frees_when_a_running_job_is_deleted(connection, redis_url, worker_env):
    q, job, worker = _run_held(connection, redis_url, worker_env, 'fin-delete', seconds=30)
    try:
        key = marker(connection, q, job)[0]
        PolicyJob.fetch(job.id, connection=connection).delete()
        assert connection.get(key) is None
        assert q.enqueue(lock_jobs.held, 'fin-delete', seconds=30) is not None
    finally:
        stop(worker)


@pytest.mark.slow
def test_until_finished_frees_within_the_heartbeat_bound_when_the_worker_is_sigkilled(
        connection, redis_url, worker_env):
    """The worker and its horse SIGKILLed: the job stays 'started' in rq, but its worker's key lapses within
    job_monitoring_interval + 60 s, and from then on the marker is free (no reaper, no maintenance needed)."""
    q, job, worker = _run_held(connection, redis_url, worker_env, 'fin-sigkill', extra=['--job-monitoring-interval',
                                                                                         '1'], seconds=300)
    os.killpg(worker.pid, signal.SIGKILL)
    os.kill(int(connection.lindex('test:pid:fin-sigkill', 0)), signal.SIGKILL)
    worker.wait()
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.STARTED
    assert q.enqueue(lock_jobs.held, 'fin-sigkill', seconds=300) is None  # the worker's key still lives
    assert 'holds identity' in explain(job.id, connection=connection)['policies'][0]['verdict']
    started = time.monotonic()
    assert wait_for(lambda: 'is gone (no heartbeat)' in explain(job.id, connection=connection)['policies'][0][
        'verdict'], timeout=1 + 60 + 5, interval=0.5)
    assert time.monotonic() - started <= 1 + 60 + 5  # the bound: job_monitoring_interval + 60 s after the last beat
    assert q.enqueue(lock_jobs.held, 'fin-sigkill', seconds=300) is not None


def test_replace_never_rewrites_a_job_popped_but_not_yet_started(connection, redis_url, worker_env):
    """Between the fetch script and rq marking the job started, the job is still 'queued' in its hash: the fetch's
    mark (until='finished') is what keeps a replace off it. The worker dies in exactly that window here."""
    q = PolicyQueue('replace-popped', connection=connection)
    first = q.enqueue(lock_jobs.replaced_held, 'acme', 'first', check='first')
    worker = start_worker(redis_url, ['replace-popped'], worker_env, worker_class='tests.helpers.workers.DiesAfterPop',
                          burst=True)
    worker.wait(30)
    assert connection.lrange(q.intermediate_queue_key, 0, -1) == [first.id.encode()]
    assert Job.fetch(first.id, connection=connection).get_status() == JobStatus.QUEUED
    assert q.enqueue(lock_jobs.replaced_held, 'acme', 'second', check='second') is None
    assert Job.fetch(first.id, connection=connection).args == ('acme', 'first')


@pytest.mark.long
def test_the_end_of_run_release_adds_no_round_trip(connection, redis_url, worker_env):
    """The release rides rq's end-of-run transaction as an EVAL: redis-py's Script would make every such pipeline
    send SCRIPT EXISTS first, a round trip per job."""
    q = PolicyQueue('fin-trips', connection=connection)
    for i in range(5):
        q.enqueue(lock_jobs.held, 'fin-trips', i)
    connection.config_resetstat()
    worker = start_worker(redis_url, ['fin-trips'], worker_env, burst=True)
    assert worker.wait(60) == 0, output(worker)
    assert connection.llen('test:ran:fin-trips') == 5
    stats = connection.info('commandstats')
    assert stats.get('cmdstat_script|exists', {}).get('calls', 0) == 0, stats.get('cmdstat_script|exists')
    assert connection.keys(f'{RQ}:policies:loner:*') == []


@pytest.mark.parametrize('mode', [Loner(), Loner(until='finished'), Loner(on_conflict='raise'),
                                  Loner(until='finished', on_conflict='raise')], ids=repr)
def test_every_dropping_mode_takes_the_hinted_fast_path_and_counts(connection, monkeypatch, mode):
    from rq_policies.engine import admission

    q = PolicyQueue('hinted', connection=connection)
    first = q.enqueue(lock_jobs.raising, 7, policy=mode)
    probes = []
    real_probe = admission.probed
    monkeypatch.setattr(admission, 'probed', lambda *a, **k: probes.append(1) or real_probe(*a, **k))
    for _ in range(3):
        try:
            assert q.enqueue(lock_jobs.raising, 7, policy=mode) is None
        except DuplicateJob as exc:
            assert mode.on_conflict == 'raise' and exc.holder == first.id
    assert len(probes) == 2  # the first duplicate takes the full path and leaves the hint; the next two probe
    assert connection.hget(keys.DROPS, 'loner:hinted') == b'3'
    assert q.count == 1


def test_info_counts_a_running_until_finished_holder_as_holding(connection):
    q = PolicyQueue('modes-info', connection=connection)
    job = q.enqueue(lock_jobs.held, 'info')
    connection.hset(job.key, 'status', 'started')  # what a worker's start writes; the identity stays held
    block = state.snapshot(connection, ['modes-info'])['queues']['modes-info']['loner']
    assert (block['count'], block['waiting']) == (1, 1)
    connection.hset(job.key, 'status', 'finished')  # ended without its release (a stock worker): free, stale
    block = state.snapshot(connection, ['modes-info'])['queues']['modes-info']['loner']
    assert (block['count'], block['waiting']) == (1, 0)


# -- ttl: the identity held at most N seconds, whatever the holder does ------------------------------------------------


@pytest.mark.parametrize('bad', [0, -1, 0.0, '60', True, float('nan'), float('inf'), 0.0001, [5]])
def test_ttl_is_checked_naming_the_argument_and_the_value(bad):
    with pytest.raises(ValueError) as raised:
        Loner(ttl=bad)
    assert 'ttl' in str(raised.value) and repr(bad) in str(raised.value)


def test_ttl_value_object():
    assert Loner(ttl=5) == Loner(ttl=5) != Loner(ttl=6)
    assert Loner(ttl=5) != Loner()
    assert repr(Loner(until='finished', ttl=2.5)) == "Loner(until='finished', ttl=2.5)"


@pytest.mark.parametrize('until', ['started', 'finished'])
def test_ttl_frees_the_identity_of_a_waiting_holder(connection, until):
    q = PolicyQueue(f'ttl-wait-{until}', connection=connection)
    capped = Loner(until=until, ttl=1)
    first = q.enqueue(lock_jobs.held, 'ttl', policy=capped)
    assert q.enqueue(lock_jobs.held, 'ttl', policy=capped) is None  # held within the cap
    key, holder = marker(connection, q, first)
    assert holder == first.id and 0 < connection.pttl(key) <= 1000
    assert wait_for(lambda: not connection.exists(key), timeout=5)
    second = q.enqueue(lock_jobs.held, 'ttl', policy=capped)
    assert second is not None and second.id != first.id  # admitted although the holder still waits
    assert first.get_status() == JobStatus.QUEUED and q.job_ids == [first.id, second.id]
    assert marker(connection, q, second)[1] == second.id
    assert q.enqueue(lock_jobs.held, 'ttl', policy=capped) is None  # and the new holder holds, for its own cap


def test_ttl_caps_a_deferred_holder_too(connection):
    q = PolicyQueue('ttl-deferred', connection=connection)
    parent = q.enqueue(lock_jobs.held, 'parent', policy=None)
    child = q.enqueue(lock_jobs.held, 'child', policy=Loner(ttl=5), depends_on=parent)
    assert child.get_status() == JobStatus.DEFERRED
    key, holder = marker(connection, q, child)
    assert holder == child.id and 0 < connection.pttl(key) <= 5000  # not persisted with the deferred setup
    assert connection.ttl(child.key) == -1  # the job itself is kept as rq keeps it


def test_ttl_frees_the_identity_of_a_running_holder(connection, redis_url, worker_env):
    """Loner(until='finished', ttl=4) on a real forking worker: held while the job runs, until 4 s after its enqueue;
    then an identical enqueue is admitted while the holder still runs."""
    q = PolicyQueue('ttl-run', connection=connection)
    worker = start_worker(redis_url, ['ttl-run'], worker_env)
    try:
        # up, so it takes the job at once
        assert wait_for(lambda: connection.scard(f'{RQ}:workers') >= 1), output(worker)
        job = q.enqueue(lock_jobs.held_capped, 'ttl-run', seconds=10)
        enqueued_at = time.monotonic()
        assert wait_for(lambda: connection.llen('test:ran:ttl-run') == 1), output(worker)
        assert wait_for(lambda: job.get_status() == JobStatus.STARTED), output(worker)
        key, holder = marker(connection, q, job)
        assert time.monotonic() - enqueued_at < 3.5, 'the worker took too long to start the job (load?)'
        assert holder == job.id and 0 < connection.pttl(key) <= 4000  # taken: kept with its cap, not persisted
        assert q.enqueue(lock_jobs.held_capped, 'ttl-run', seconds=10) is None  # held across the run
        assert wait_for(lambda: not connection.exists(key), timeout=6)
        assert job.get_status() == JobStatus.STARTED  # the holder still runs
        again = q.enqueue(lock_jobs.held_capped, 'ttl-run', seconds=10)
        assert again is not None and again.id != job.id
    finally:
        stop(worker)


def test_replace_rewrites_the_per_key_policy_key_derived_from_the_call(connection):
    """A Loner 'replace' whose function also has a per-key Concurrency keyed on another argument: the waiting job
    takes the new call's key with its payload (it used to keep the first call's key and run under it)."""
    from rq_policies import Concurrency

    spec = PolicySet((Loner(on_conflict='replace'), Concurrency(1, key=lambda args, kwargs: args[1])),
                     unique_context=lambda args, kwargs: args[0])
    q = PolicyQueue('replace-key', connection=connection)
    first = q.enqueue(lock_jobs.replaced, 'acme', 'tenant-1', policy=spec)
    field = Concurrency.field
    assert connection.hget(first.key, field).decode().endswith(':tenant-1')
    again = q.enqueue(lock_jobs.replaced, 'acme', 'tenant-2', policy=spec)
    assert again.id == first.id and Job.fetch(first.id, connection=connection).args == ('acme', 'tenant-2')
    assert connection.hget(first.key, field).decode().endswith(':tenant-2')


def test_the_end_of_a_run_releases_only_what_the_job_could_hold_until_then(connection, monkeypatch):
    """The end-of-run pipeline asks an admission policy to free what the job held only when the hash the fetch read
    says it may hold something until then: a job with no policy, or held until it started, ends with no script of
    ours; one held until it finished frees its identity in that pipeline (the forking tests above, on every ending)."""
    released = []
    real = Loner.release.__func__

    def spy(cls, pipeline, job_prefix, job_ids, ended=False):
        if ended:  # the end of a run (release(..., ended=True) replaced Loner.ended)
            released.extend(job_ids)
        return real(cls, pipeline, job_prefix, job_ids, ended)

    monkeypatch.setattr(Loner, 'release', classmethod(spy))
    q = PolicyQueue('ends', connection=connection)
    plain = q.enqueue(jobs.plain, 0)
    started = q.enqueue(jobs.plain, 1, policy=Loner())
    finished = q.enqueue(jobs.plain, 2, policy=Loner(until='finished'))
    connection.config_resetstat()
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert [Job.fetch(job.id, connection=connection).get_status() for job in (plain, started, finished)] == \
        [JobStatus.FINISHED] * 3
    assert released == [finished.id]
    assert connection.info('commandstats')['cmdstat_hmget']['calls'] == 1  # release_markers' read of that job only
    assert q.enqueue(jobs.plain, 1, policy=Loner()) is not None  # both identities are free again
    assert q.enqueue(jobs.plain, 2, policy=Loner(until='finished')) is not None
