"""Loner(until='finished', on_conflict='keep_last'): at most one running and one waiting job per identity, the
waiting one holding the latest payload (BullMQ's keepLastIfActive), with real forking PolicyWorkers."""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
import time

import pytest
from rq.job import Job, JobStatus
from rq.worker import Worker

from rq_policies import InvalidArgument, Loner, PolicyConfigurationError, PolicyQueue, Throttle, explain, policy
from rq_policies.engine import keys, ops
from rq_policies.engine.fetch import FetchReply, fetch_call
from tests.helpers import lock_jobs
from tests.helpers.cluster import connect
from tests.helpers.faults import ADMIT_WRITE, FAULTS, lose_reply, producer
from tests.helpers.workers import output, start_worker, stop, wait_for

records = lock_jobs.kl_records  # (kind, job id, payload, server time) of an account's runs


def overlaps(found):
    """Sweep over start/end records in server time order: the most runs of one identity at once."""
    events = sorted((at, 0 if kind == 'end' else 1) for kind, _, _, at in found)
    running = most = 0
    for _, starting in events:
        running += 1 if starting else -1
        most = max(most, running)
    return most


def status(connection, jid):
    return Job.fetch(jid, connection=connection).get_status()


# -- bad input --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(('kwargs', 'argument', 'value'), [
    ({'on_conflict': 'keep_last'}, 'until', "'started'"),
    ({'until': 'started', 'on_conflict': 'keep_last'}, 'until', "'started'"),
    ({'until': 'finished', 'on_conflict': 'keep_last', 'ttl': 60}, 'ttl', '60'),
])
def test_keep_last_with_an_option_it_cannot_work_with_is_refused_naming_it(kwargs, argument, value):
    with pytest.raises(InvalidArgument) as caught:
        Loner(**kwargs)
    assert caught.value.argument == argument and value in str(caught.value)


def test_keep_last_and_a_throttle_are_refused_naming_why():
    with pytest.raises(PolicyConfigurationError, match='keep_last'):
        policy(Throttle(60), Loner(until='finished', on_conflict='keep_last'))


def test_repr_names_the_mode():
    assert repr(Loner(until='finished', on_conflict='keep_last')) == "Loner(until='finished', on_conflict='keep_last')"


# -- admission without a worker ---------------------------------------------------------------------------------------


def test_a_duplicate_of_a_waiting_holder_replaces_its_payload_in_place(connection):
    q = PolicyQueue('kl-wait', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'acme', 'p1')
    again = q.enqueue(lock_jobs.kept_last, 'acme', 'p2')
    other = q.enqueue(lock_jobs.kept_last, 'other', 'x')
    assert again.id == first.id and other.id != first.id
    assert q.job_ids == [first.id, other.id]
    assert Job.fetch(first.id, connection=connection).args == ('acme', 'p2')
    assert connection.hget(first.key, 'policies_loner_next') is None  # nothing runs: it waits behind no one



_tokens = itertools.count()


def fetch_once(connection, q):
    """One run of the fetch script on ``q`` (no worker; it never waits): its reply, with the trace of its phases."""
    call = fetch_call([q], f'kl-unit:{next(_tokens)}', 90, Job.redis_job_namespace_prefix)
    call.trace = True
    return FetchReply.decode(call.run(connection))


def _runs(connection, job, worker='kl-unit-worker'):
    """Mark ``job`` started on a worker whose key lives, as rq writes it when a worker starts the job."""
    connection.set(Worker.redis_worker_namespace_prefix + worker, 1, ex=60)
    connection.hset(job.key, mapping={'status': 'started', 'worker_name': worker})


def test_the_fetch_parks_the_waiting_job_until_the_running_one_ends(connection):
    """The fetch script alone (no worker process): the job behind a running one is parked on its key, not taken;
    the running one's end makes the key due at once, and the next fetch gives it back and takes it."""
    q = PolicyQueue('kl-unit', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'unit', 'p1')
    assert fetch_once(connection, q).job == first.id
    _runs(connection, first)
    second = q.enqueue(lock_jobs.kept_last, 'unit', 'p2')
    raw = connection.hget(second.key, 'policies_loner_next').decode()
    member = 'loner_next:' + raw.split(' ', 1)[1]
    assert raw.split()[0] == first.id and raw.split(' ', 1)[1].startswith('kl-unit:')
    found = fetch_once(connection, q)
    assert found.job is None and 'admit_job:loner_next' in found.trace  # parked, not started beside the running one
    assert [(event, detail['job_id']) for event, _, detail in found.events([q])] == [('park', second.id)]
    assert status(connection, second.id) == JobStatus.DEFERRED
    assert connection.lrange(keys.KEY_PARKED_PREFIX('loner_next', raw.split(' ', 1)[1]), 0, -1) == [
        second.id.encode()]
    assert connection.zscore(keys.KEY_DUE, member) is not None
    # still waiting: a third enqueue replaces its payload in place
    assert q.enqueue(lock_jobs.kept_last, 'unit', 'p3').id == second.id
    assert status(connection, second.id) == JobStatus.DEFERRED
    found = fetch_once(connection, q)
    assert found.job is None and found.until is not None  # due within 5 s, and its holder still runs
    connection.hset(first.key, 'status', 'finished')
    Loner.release(connection, Job.redis_job_namespace_prefix, [first.id], ended=True)
    found = fetch_once(connection, q)
    assert found.job == second.id and f'due:{member}' in found.trace  # given back by the due phase, then taken
    assert Job.fetch(second.id, connection=connection).args == ('unit', 'p3')
    assert connection.zscore(keys.KEY_DUE, member) is None


def test_a_waiting_job_whose_holder_died_is_taken_once_the_holder_no_longer_holds(connection):
    """A running holder whose worker key is gone (its worker died, heartbeat bound passed) stops blocking: the
    parked job is given back by the due index (no end of run ever came)."""
    q = PolicyQueue('kl-unit-dead', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'unit-dead', 'p1')
    assert fetch_once(connection, q).job == first.id
    _runs(connection, first, worker='kl-unit-dead-worker')
    second = q.enqueue(lock_jobs.kept_last, 'unit-dead', 'p2')
    assert fetch_once(connection, q).job is None
    member = 'loner_next:' + connection.hget(second.key, 'policies_loner_next').decode().split(' ', 1)[1]
    connection.delete(Worker.redis_worker_namespace_prefix + 'kl-unit-dead-worker')  # its heartbeat key lapsed
    assert fetch_once(connection, q).job is None  # not due yet: looked at again within 5 s
    assert 0 < connection.zscore(keys.KEY_DUE, member) - float(connection.time()[0]) <= 6
    connection.zadd(keys.KEY_DUE, {member: 0})  # the poll's time has come
    assert fetch_once(connection, q).job == second.id


# -- with real workers ------------------------------------------------------------------------------------------------


def test_one_runs_one_waits_with_the_latest_payload_and_it_runs_after(connection, redis_url, worker_env):
    q = PolicyQueue('kl-basic', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'basic', 'p1', seconds=2)
    workers = [start_worker(redis_url, ['kl-basic'], worker_env) for _ in range(2)]
    try:
        assert wait_for(lambda: len(records(connection, 'basic')) >= 1), output(workers[0])
        second = q.enqueue(lock_jobs.kept_last, 'basic', 'p2', seconds=0.2)
        assert second is not None and second.id != first.id  # admitted as the waiting one, not dropped
        third = q.enqueue(lock_jobs.kept_last, 'basic', 'p3', seconds=0.2)
        fourth = q.enqueue(lock_jobs.kept_last, 'basic', 'p4', seconds=0.2)
        assert third.id == second.id and fourth.id == second.id  # the waiting one's payload, in place
        # a free worker fetches it meanwhile and parks it: it never starts beside the running one
        assert wait_for(lambda: status(connection, second.id) == JobStatus.DEFERRED, timeout=10)
        assert status(connection, first.id) == JobStatus.STARTED
        assert f'waits behind job {first.id} (running on worker' in explain(
            second.id, connection=connection)['policies'][0]['verdict']
        assert f'job {second.id} waits behind it' in explain(first.id, connection=connection)['policies'][0]['verdict']
        assert wait_for(lambda: status(connection, second.id) == JobStatus.FINISHED, timeout=20), output(workers[0])
        found = records(connection, 'basic')
        assert [(kind, payload) for kind, _, payload, _ in found] == [
            ('start', 'p1'), ('end', 'p1'), ('start', 'p4'), ('end', 'p4')]
        end_first = next(at for kind, jid, _, at in found if kind == 'end' and jid == first.id)
        start_second = next(at for kind, jid, _, at in found if kind == 'start' and jid == second.id)
        assert start_second >= end_first
        # the end of the first gave the waiting one back at once, not at the next poll
        assert start_second - end_first < 2.5
        # nothing left: the next enqueue is a plain admission
        assert wait_for(lambda: connection.get(connection.hget(second.key, keys.LONER_FIELD)) is None)
    finally:
        stop(*workers)


def test_a_waiting_job_deleted_gives_the_identity_back_to_the_running_one(connection, redis_url, worker_env):
    q = PolicyQueue('kl-delete', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'del', 'p1', seconds=3)
    worker = start_worker(redis_url, ['kl-delete'], worker_env)
    try:
        assert wait_for(lambda: len(records(connection, 'del')) >= 1), output(worker)
        second = q.enqueue(lock_jobs.kept_last, 'del', 'p2')
        second.delete()  # a PolicyJob: its delete frees what it holds (rq's plain Job.delete leaves a stale marker)
        third = q.enqueue(lock_jobs.kept_last, 'del', 'p3')
        # waits behind the running first again, not beside it
        assert third.id not in (first.id, second.id)
        assert connection.hget(third.key, 'policies_loner_next').decode().split()[0] == first.id
        assert wait_for(lambda: status(connection, third.id) == JobStatus.FINISHED, timeout=20), output(worker)
        assert overlaps(records(connection, 'del')) == 1
    finally:
        stop(worker)


@pytest.mark.slow
def test_a_running_holder_whose_worker_died_stops_blocking_within_the_liveness_bound(
        connection, redis_url, worker_env):
    q = PolicyQueue('kl-dead', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'dead', 'p1', seconds=300)
    worker = start_worker(redis_url, ['kl-dead'], worker_env, extra=['--job-monitoring-interval', '1'])
    try:
        assert wait_for(lambda: len(records(connection, 'dead')) >= 1), output(worker)
        os.killpg(worker.pid, signal.SIGKILL)
        os.kill(int(connection.lindex('test:pid:dead', 0)), signal.SIGKILL)
        worker.wait()
        second = q.enqueue(lock_jobs.kept_last, 'dead', 'p2')
        assert second.id != first.id
        assert status(connection, first.id) == JobStatus.STARTED  # rq still says so
        other = start_worker(redis_url, ['kl-dead'], worker_env)
        try:
            started = time.monotonic()
            # job_monitoring_interval + 60 s after the last heartbeat, plus the fetch's poll of a parked job (5 s)
            assert wait_for(lambda: status(connection, second.id) == JobStatus.FINISHED, timeout=1 + 60 + 5 + 10,
                            interval=0.5), output(other)
            assert time.monotonic() - started <= 1 + 60 + 5 + 10
        finally:
            stop(other)
    finally:
        stop(worker)


def test_a_lost_reply_replayed_admits_the_waiting_job_once(connection, redis_url, worker_env, monkeypatch):
    q = PolicyQueue('kl-replay', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'replay', 'p1', seconds=3)
    worker = start_worker(redis_url, ['kl-replay'], worker_env)
    try:
        assert wait_for(lambda: len(records(connection, 'replay')) >= 1), output(worker)
        real_run = ops.Call.run

        def lost_reply(self, client):
            real_run(self, client)
            return real_run(self, client)

        monkeypatch.setattr(ops.Call, 'run', lost_reply)
        second = q.enqueue(lock_jobs.kept_last, 'replay', 'p2')
        again = q.enqueue(lock_jobs.kept_last, 'replay', 'p3')
        monkeypatch.undo()
        assert second.id != first.id and again.id == second.id
        assert connection.hget(second.key, 'policies_loner_next').decode().split()[0] == first.id
        assert wait_for(lambda: status(connection, second.id) == JobStatus.FINISHED, timeout=20), output(worker)
        assert [(k, p) for k, _, p, _ in records(connection, 'replay')] == [
            ('start', 'p1'), ('end', 'p1'), ('start', 'p3'), ('end', 'p3')]
    finally:
        stop(worker)



@pytest.mark.parametrize('fault', FAULTS)
def test_admissions_behind_a_running_job_with_lost_replies_are_applied_once(
        connection, redis_url, worker_env, fault_proxy, fault):
    """Through the fault proxy (a late reply, a dropped one, a stall): the admission behind the running job and the
    replace of the waiting one are each sent again by the retrying client, and each writes once: one waiting job,
    naming the running one, with the last payload, run once after it."""
    q = PolicyQueue('kl-faults', connection=producer(fault_proxy))
    first = q.enqueue(lock_jobs.kept_last, 'faults', 'p1', seconds=3)
    worker = start_worker(redis_url, ['kl-faults'], worker_env)
    try:
        assert wait_for(lambda: len(records(connection, 'faults')) >= 1), output(worker)
        seen = fault_proxy.seen(ADMIT_WRITE)
        lose_reply(fault_proxy, fault, ADMIT_WRITE)
        second = q.enqueue(lock_jobs.kept_last, 'faults', 'p2')
        assert fault_proxy.seen(ADMIT_WRITE) >= seen + 2  # the reply was lost, the call was sent again
        lose_reply(fault_proxy, fault, ADMIT_WRITE)
        third = q.enqueue(lock_jobs.kept_last, 'faults', 'p3')
        assert fault_proxy.seen(ADMIT_WRITE) >= seen + 4
        assert second.id != first.id and third.id == second.id
        assert connection.hget(second.key, 'policies_loner_next').decode().split()[0] == first.id
        assert Job.fetch(second.id, connection=connection).args == ('faults', 'p3')
        assert status(connection, first.id) == JobStatus.STARTED
        assert wait_for(lambda: status(connection, second.id) == JobStatus.FINISHED, timeout=20), output(worker)
        assert [(k, p) for k, _, p, _ in records(connection, 'faults')] == [
            ('start', 'p1'), ('end', 'p1'), ('start', 'p3'), ('end', 'p3')]
    finally:
        stop(worker)


def test_the_end_of_run_release_run_twice_makes_the_waiting_job_due_once(connection):
    """lua/release_markers.lua with ended, sent twice (a lost reply on the worker's end-of-run pipeline): the marker
    of the waiting job stays, its key is due, and a second run changes nothing."""
    q = PolicyQueue('kl-release', connection=connection)
    first = q.enqueue(lock_jobs.kept_last, 'rel', 'p1')
    connection.hset(first.key, mapping={'status': 'started', 'policies_loner_taken': '1'})
    connection.set(keys.alive(first.id), '1', ex=60)  # its horse lives
    second = q.enqueue(lock_jobs.kept_last, 'rel', 'p2')
    marker_key = connection.hget(second.key, keys.LONER_FIELD).decode()
    assert second.id != first.id and connection.get(marker_key).decode() == second.id
    connection.hset(first.key, 'status', 'finished')
    before = connection.zscore(keys.KEY_DUE, f'loner_next:kl-release:{marker_key.rsplit(":", 1)[1]}')
    assert before is None
    for _ in range(2):
        assert Loner.release(connection, Job.redis_job_namespace_prefix, [first.id], ended=True) is None
        assert connection.get(marker_key).decode() == second.id  # the waiting job keeps the identity
        due = connection.zscore(keys.KEY_DUE, f'loner_next:kl-release:{marker_key.rsplit(":", 1)[1]}')
        assert due is not None


# -- the figure: 500 random enqueues per identity over 8 identities while jobs run -------------------------------------

IDENTITIES, ENQUEUES = 8, 500


def _produce(url, account, seed, waited, ids, errors):
    """500 enqueues of ``account`` in random bursts (1-20 at random gaps of 0-5 ms); after about half of the
    bursts, wait for the burst's last payload to start (it must: no trigger is lost), noting each in ``waited``."""
    rng = random.Random(seed)
    conn = connect(url)
    q = PolicyQueue('kl-figure', connection=conn)
    seq = 0
    try:
        while seq < ENQUEUES:
            for _ in range(min(rng.randint(1, 20), ENQUEUES - seq)):
                job = q.enqueue(lock_jobs.kept_last, account, str(seq), seconds=rng.uniform(0, 0.04))
                if job is None:
                    errors.append(f'{account}: enqueue {seq} was dropped')
                else:
                    ids.add(job.id)  # the watcher follows it
                seq += 1
                time.sleep(rng.uniform(0, 0.005))
            if rng.random() < 0.5:
                last = str(seq - 1)
                if not wait_for(lambda last=last: any(kind == 'start' and payload == last
                                                      for kind, _, payload, _ in records(conn, account)), timeout=30):
                    errors.append(f'{account}: the last payload {last} of a burst never started')
                waited.append(last)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(f'{account}: {exc!r}')


def _watch(url, ids, stop_at, seen, errors):
    """Snapshots (MULTI/EXEC, so one instant) of every admitted job's status per identity: never 2 running, never 2
    waiting. A job taken by a worker but not yet marked started (policies_loner_taken, status still queued) runs."""
    conn = connect(url)
    while not stop_at:
        with conn.pipeline(transaction=True) as pipe:
            listed = [(account, jid) for account, known in ids.items() for jid in list(known)]
            for _, jid in listed:
                pipe.hmget(Job.key_for(jid), 'status', 'policies_loner_taken')
            states = pipe.execute()
        running, waiting = {}, {}
        for (account, _), (state, taken) in zip(listed, states):
            state = state.decode() if state else ''
            if state == 'started' or (state == 'queued' and taken):
                running[account] = running.get(account, 0) + 1
            elif state in ('queued', 'deferred', 'scheduled'):
                waiting[account] = waiting.get(account, 0) + 1
        for account in ids:
            r, w = running.get(account, 0), waiting.get(account, 0)
            if r > 1 or w > 1:
                errors.append(f'{account}: {r} running and {w} waiting at once')
            seen[(r, w)] = seen.get((r, w), 0) + 1
        time.sleep(0.01)


@pytest.mark.slow
def test_the_figure_never_two_running_never_two_waiting_and_the_last_payload_runs(connection, redis_url, worker_env):
    accounts = [f'fig{n}' for n in range(IDENTITIES)]
    workers = [start_worker(redis_url, ['kl-figure'], worker_env) for _ in range(4)]
    errors, seen, stop_at = [], {}, []
    waited = {account: [] for account in accounts}
    ids = {account: set() for account in accounts}
    try:
        producers = [threading.Thread(target=_produce, args=(redis_url, account, n, waited[account],
                                                                     ids[account], errors))
                     for n, account in enumerate(accounts)]
        watcher = threading.Thread(target=_watch, args=(redis_url, ids, stop_at, seen, errors))
        watcher.start()
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in producers)
        q = PolicyQueue('kl-figure', connection=connection)

        def drained():
            return all(status(connection, jid) == JobStatus.FINISHED for known in ids.values() for jid in known)

        assert wait_for(drained, timeout=60, interval=0.5), output(workers[0])
        stop_at.append(True)
        watcher.join(timeout=10)
    finally:
        stop_at.append(True)
        stop(*workers)
    assert not errors, errors[:10]
    assert q.count == 0
    for account in accounts:
        found = records(connection, account)
        assert overlaps(found) == 1, account  # never two running: the sweep over start and end records
        starts = [(jid, int(payload)) for kind, jid, payload, _ in found if kind == 'start']
        assert len({jid for jid, _ in starts}) == len(starts), account  # each job ran once
        payloads = [payload for _, payload in starts]
        assert payloads == sorted(set(payloads)), account  # never an older payload after a newer one
        assert payloads[-1] == ENQUEUES - 1, account  # the last enqueue is reflected in the last run
        assert set(int(p) for p in waited[account]) <= set(payloads), account  # each waited burst's last ran
        assert len(starts) == len(ids[account]), account  # every admitted job ran (none left waiting)
    print(f'figure: {sum(len(k) for k in ids.values())} jobs admitted of {IDENTITIES * ENQUEUES} enqueues, '
          f'{sum(len(w) for w in waited.values())} bursts waited for, snapshots (running, waiting): {seen}')
    # not vacuous: the watcher saw a job waiting behind a running one, and enqueues replaced waiting payloads
    assert seen.get((1, 1), 0) > 0, seen
    assert sum(len(known) for known in ids.values()) < IDENTITIES * ENQUEUES
    assert sum(len(w) for w in waited.values()) > IDENTITIES * 5
