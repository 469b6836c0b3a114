"""Debounce: the last payload of a burst runs once the burst goes quiet, or at the latest max_wait after it began."""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from rq_policies import Debounce, PolicyConfigurationError, PolicyQueue, PolicySet, PolicySimpleWorker, Throttle
from rq_policies.engine import identity, keys
from rq_policies.engine.admission import JobWrite, Verdict, admit_call
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs
from tests.helpers import throttle_jobs as tj
from tests.helpers.throttle_helpers import WorkerProcess, ran, server_now, wait_for_phase, wait_for_runs
from tests.helpers.workers import output, race, start_worker


def pending(conn, q) -> list[tuple[str, float]]:
    return [(m.decode(), s) for m, s in conn.zrange(ScheduledJobRegistry(queue=q).key, 0, -1, withscores=True)]


def state_key(queue: str, doc_id) -> str:
    return keys.debounce(queue, identity.digest('tests.helpers.throttle_jobs.reindex_slow', queue, (), {},
                                                lambda a, k: doc_id))


@pytest.mark.parametrize('bad', [0, -5, 1.5, '5', True, None])
def test_wait_must_be_whole_seconds(bad):
    with pytest.raises(ValueError, match='wait'):
        Debounce(bad)


@pytest.mark.parametrize('bad', [0, 2.5, '10', True, 3])
def test_max_wait_must_be_whole_seconds_not_below_wait(bad):
    with pytest.raises(ValueError, match=r'max_wait.*' + repr(bad)):
        Debounce(5, max_wait=bad)


def test_value_object():
    assert Debounce(5) == Debounce(5)
    assert Debounce(5) != Debounce(5, max_wait=10)
    assert repr(Debounce(5, max_wait=10)) == 'Debounce(5, max_wait=10)'
    assert Debounce(5, max_wait=5).max_wait == 5


def test_replace_rewrites_the_pending_job_in_place_and_moves_its_run_time(connection, caplog):
    q = PolicyQueue('index', connection=connection)
    t0 = server_now(connection)
    a = q.enqueue(tj.reindex_slow, 1, 'a')
    assert isinstance(a, Job) and a.get_status(refresh=False) == JobStatus.SCHEDULED
    [(member, score_a)] = pending(connection, q)
    assert member == a.id and t0 + 30 <= score_a <= math.ceil(server_now(connection) + 30)
    assert score_a == int(score_a)  # whole seconds, as rq's scheduler reads them
    stored = Job.fetch(a.id, connection=connection)
    assert stored.get_status() == JobStatus.SCHEDULED and stored.enqueued_at is None
    first = connection.hget(state_key('index', 1), 'first')
    time.sleep(1.1)
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        b = q.enqueue(tj.reindex_slow, 1, 'b')
    assert a.id in caplog.text and 'replaced the payload of pending job' in caplog.text
    # the pending job took the new payload in place: same id, so the handle the app kept stays valid
    assert b.id == a.id and b.args == (1, 'b') and b.get_status(refresh=False) == JobStatus.SCHEDULED
    assert a.get_status() == JobStatus.SCHEDULED
    [(member, score_b)] = pending(connection, q)
    assert member == a.id and score_b > score_a  # the quiet period starts again
    assert Job.fetch(a.id, connection=connection).args == (1, 'b')
    assert Job.fetch(a.id, connection=connection).description == b.description
    assert connection.hget(state_key('index', 1), 'first') == first
    assert connection.hget(state_key('index', 1), 'job') == a.id.encode()
    now = server_now(connection)
    # Gone once the job's time comes. Up to 2 ms over: the script rounds its TTL up to a whole millisecond, and the
    # server counts expiry from its millisecond clock, which can lag the microsecond TIME the script read by one more.
    assert 0 < connection.pttl(state_key('index', 1)) <= (score_b - now) * 1000 + 2
    # an enqueue reusing the pending job's id replaces it in place: one pending job, the latest payload
    again = q.enqueue(tj.reindex_slow, 1, 'b2', job_id=b.id)
    [(member, score_again)] = pending(connection, q)
    assert again.id == b.id == member and score_again >= score_b
    assert Job.fetch(b.id, connection=connection).args == (1, 'b2')
    assert connection.hget(state_key('index', 1), 'first') == first
    # other identities have their own pending job
    c = q.enqueue(tj.reindex_slow, 2, 'c')
    assert len(pending(connection, q)) == 2 and c is not None
    assert q.count == 0  # nothing is queued before its time


def test_max_wait_caps_the_delay_since_the_first_pending_enqueue(connection):
    q = PolicyQueue('index', connection=connection)
    capped = Debounce(30, max_wait=31)
    q.enqueue(jobs.plain, 1, policy=capped)
    [(_, s1)] = pending(connection, q)
    [state] = connection.keys(f'{RQ}:policies:debounce:*')
    first = float(connection.hget(state, 'first'))
    assert s1 == math.ceil(first + 30)
    time.sleep(1.2)
    q.enqueue(jobs.plain, 1, policy=capped)
    [(_, s2)] = pending(connection, q)
    assert s2 == math.ceil(first + 31)  # now + 30 would be later than the cap
    time.sleep(0.5)
    last = q.enqueue(jobs.plain, 1, policy=capped)
    assert pending(connection, q) == [(last.id, s2)]
    assert float(connection.hget(state, 'first')) == first


def test_debounce_script_direct(connection):
    digest = 'c' * 64
    q = PolicyQueue('q', connection=connection)

    def debounce(jid, not_before=0):
        job = SimpleNamespace(id=jid, key=f'{RQ}:job:{jid}', result_ttl=None)
        write = JobWrite(job, 'S', not_before, f'{RQ}:scheduled:q', -1, ['status', 'scheduled', 'origin', 'q'])
        verdict = Verdict.read(admit_call(q, PolicySet((Debounce(30),)), digest, write).run(connection))
        return verdict.job_id.encode(), verdict.number, verdict.server_now, verdict.superseded.encode()

    jid, at, now, superseded = debounce('a')
    assert (jid, superseded) == (b'a', b'') and at == math.ceil(float(now) + 30)
    assert connection.hgetall(f'{RQ}:job:a') == {b'status': b'scheduled', b'origin': b'q'}
    jid, at_b, _, superseded = debounce('b', not_before=int(float(now)) + 100)
    # b's payload went into pending job a in place (the reply names it), a's run time moved to b's
    assert (jid, superseded) == (b'a', b'') and at_b == int(float(now)) + 100
    assert connection.exists(f'{RQ}:job:b') == 0 and connection.hget(f'{RQ}:job:a', 'policies_replaced_by') == b'b'
    assert connection.zrange(f'{RQ}:scheduled:q', 0, -1, withscores=True) == [(b'a', at_b)]
    assert connection.get(keys.superseded('b')) == b'debounce a merged '  # (no created_at in these fields)
    assert connection.sismember(f'{RQ}:queues', f'{RQ}:queue:q')


def test_due_job_run_by_an_in_process_simple_worker(connection):
    q = PolicyQueue('index', connection=connection)
    job = q.enqueue(jobs.plain, 'payload', policy=Debounce(1))
    [(_, score)] = pending(connection, q)
    while server_now(connection) < score + 0.05:  # rq's scheduler compares whole seconds of the clock
        time.sleep(0.05)
    PolicySimpleWorker([q], connection=connection).work(burst=True, with_scheduler=True)
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert pending(connection, q) == [] and connection.keys(f'{RQ}:policies:debounce:*') == []


def test_every_door(connection):
    q = PolicyQueue('index', connection=connection)
    a = q.enqueue_call(tj.reindex_slow, args=(1, 'a'))
    b = q.enqueue_in(timedelta(seconds=120), tj.reindex_slow, 1, 'b')
    [(member, score)] = pending(connection, q)
    assert member == b.id == a.id and score >= server_now(connection) + 119  # the later of the debounce and the asked
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    c = q.enqueue_at(at, tj.reindex_slow, 1, 'c')
    assert c.id == a.id and pending(connection, q) == [(a.id, float(int(at.timestamp())))]
    many = q.enqueue_many([Queue.prepare_data(tj.reindex_slow, (1, v)) for v in ('d', 'e')])
    assert [m.get_status(refresh=False) for m in many] == [JobStatus.SCHEDULED] * 2
    assert [m.id for m in many] == [a.id, a.id] and [m for m, _ in pending(connection, q)] == [a.id]
    assert Job.fetch(a.id, connection=connection).args == (1, 'e')
    assert q.enqueue('tests.helpers.throttle_jobs.reindex_slow', 1, 'f') is not None
    assert len(pending(connection, q)) == 1


def test_processes_racing_leave_one_pending_job(connection, redis_url):
    outcomes = race(redis_url, 'index', lambda q: q.enqueue(tj.reindex_slow, 1, 'v'))
    assert all(outcomes), outcomes  # a debounced enqueue is never dropped: it replaces
    q = PolicyQueue('index', connection=connection)
    [(member, _)] = pending(connection, q)
    assert set(outcomes) == {member}  # every racer got the one pending job's handle
    assert connection.exists(f'{RQ}:job:{member}')
    assert connection.exists(state_key('index', 1)) == 1


def test_refusals_write_nothing(connection):
    q = PolicyQueue('index', connection=connection)
    parent = q.enqueue(jobs.plain, 1)
    before = sorted(connection.keys('*'))
    with pytest.raises(PolicyConfigurationError, match='depends_on'):
        q.enqueue(tj.reindex_slow, 1, 'a', depends_on=parent)
    with pytest.raises(TypeError, match=r'args\[1\]|value unique_context returned'):
        q.enqueue(tj.reindex_slow, object(), 'a')
    with pytest.raises(ValueError, match='wait'):
        q.enqueue(jobs.plain, 1, policy=Debounce(0))
    assert sorted(connection.keys('*')) == before


def test_force_and_reset_drop_the_pending_job(connection):
    q = PolicyQueue('index', connection=connection)
    waiting = q.enqueue(tj.reindex_slow, 1, 'a')
    forced = q.force(tj.reindex_slow, 1, 'now')
    assert forced.get_status() == JobStatus.QUEUED and q.job_ids == [forced.id]
    assert connection.exists(waiting.key) == 0 and pending(connection, q) == []
    assert connection.keys(f'{RQ}:policies:debounce:*') == []
    waiting = q.enqueue(tj.reindex_slow, 1, 'b')
    assert q.reset(tj.reindex_slow, 1, 'any') == 2  # the pending job's hash and the debounce state
    assert connection.exists(waiting.key) == 0 and pending(connection, q) == []
    assert q.reset(tj.reindex_slow, 1, 'any') == 0


def test_sync_queue_runs_at_once(connection):
    q = PolicyQueue('sync', connection=connection, is_async=False)
    assert q.enqueue(tj.reindex_slow, 1, 'a').return_value() == 'a'
    assert connection.keys(f'{RQ}:policies:debounce:*') == []


# -- run by a real worker with rq's scheduler ------------------------------------------------------------------------


@pytest.mark.long
def test_burst_runs_once_with_the_last_payload(connection, redis_url, worker_env):
    q = PolicyQueue('index', connection=connection)
    with WorkerProcess(redis_url, worker_env, 'index') as worker:
        returned = []
        for i in range(5):
            returned.append(q.enqueue(tj.reindex, 1, f'v{i}'))
            last_at = server_now(connection)
            time.sleep(0.3)
        assert all(isinstance(j, Job) for j in returned)
        rows = wait_for_runs(connection, 'reindex', 1, timeout=20)
        assert [(job_id, value) for job_id, value, _ in rows] == [(returned[0].id, 'v4')], worker.output()
        assert rows[0][2] >= last_at + 1  # not before a full quiet period after the last enqueue
        time.sleep(1.5)
        assert len(ran(connection, 'reindex')) == 1  # and only once
        assert {job.id for job in returned} == {returned[0].id}  # one job, rewritten in place: every handle is it
        assert returned[0].get_status() == JobStatus.FINISHED


@pytest.mark.long
def test_max_wait_runs_a_stream_that_never_pauses(connection, redis_url, worker_env):
    q = PolicyQueue('index', connection=connection)
    with WorkerProcess(redis_url, worker_env, 'index') as worker:
        first_at = server_now(connection)
        versions = [f'v{i}' for i in range(14)]
        for version in versions:  # 0.5 s apart for 6.5 s: never quiet for the 1 s wait
            q.enqueue(tj.reindex_capped, 1, version)
            last_at = server_now(connection)
            time.sleep(0.5)
        rows = wait_for_runs(connection, 'capped', 1, timeout=20)
        assert rows, worker.output()
        first_run = rows[0]
        assert first_run[2] >= first_at + 2  # the cap, measured from the first pending enqueue
        assert first_run[2] < last_at and first_run[1] != versions[-1]  # it ran while the stream went on
        # and the last payload of the stream still runs once it stops
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and ran(connection, 'capped')[-1][1] != versions[-1]:
            time.sleep(0.1)
        rows = ran(connection, 'capped')
        assert rows[-1][1] == versions[-1], worker.output()
        values = [value for _, value, _ in rows]
        assert len(values) == len(set(values))  # no payload ran twice
        assert [versions.index(v) for v in values] == sorted(versions.index(v) for v in values)


@pytest.mark.parametrize('policy', [Debounce(30), Throttle(3600, trailing=True)], ids=['debounce', 'trailing'])
def test_a_scheduler_clock_ahead_never_runs_a_superseded_payload(connection, redis_url, worker_env, monkeypatch,
                                                                  policy):
    """rq's scheduler reads due jobs by its own host's clock, then writes them back to the queue in a second step. A
    host 10 s ahead of the server sees a pending job due while the server does not; a replacing enqueue in between
    rewrites it in place (payload v2, a later run time), and the scheduler's write puts the payload it read (v1) back
    and queues the job early. A PolicyWorker must then restore v2 and put the job back to wait for its time, never
    run v1."""
    from rq import scheduler as rq_scheduler

    q = PolicyQueue('skew', connection=connection)
    policy = PolicySet((policy,), unique_context=lambda args, kwargs: args[0])  # one identity, payloads v1 and v2
    if policy.policies[0].name == 'throttle':  # the window's winner, then the extra: the pending trailing job
        # The trailing job is due at the slot's end (epoch-aligned): with Throttle(30) that came during the test
        # once (CI under load), and the worker rightly ran v2. An hour's slot, and never its last minute.
        left = 3600 - server_now(connection) % 3600
        if left < 60:
            time.sleep(left + 0.1)
        assert q.enqueue(jobs.record_plain, 'skew', 'winner', policy=policy) is not None
        assert q.remove(q.job_ids[0]) == 1  # the winner is not what this test is about
    v1 = q.enqueue(jobs.record_plain, 'skew', 'v1', policy=policy)
    [(pending_id, due)] = [(j, s) for j, s in pending(connection, q)]
    assert pending_id == v1.id
    ahead = due - server_now(connection) + 10  # far enough ahead that the job is due by the scheduler's clock
    monkeypatch.setattr(rq_scheduler, 'current_timestamp', lambda: int(time.time() + ahead))
    real_fetch_many = rq_scheduler.Job.fetch_many
    replaced: list = []

    def fetch_then_replace(job_ids, *args, **kwargs):
        found = real_fetch_many(job_ids, *args, **kwargs)  # the scheduler has read v1 ...
        replaced.append(q.enqueue(jobs.record_plain, 'skew', 'v2', policy=policy))  # ... the server supersedes it
        return found

    monkeypatch.setattr(rq_scheduler.Job, 'fetch_many', fetch_then_replace)
    scheduler = rq_scheduler.RQScheduler([q], connection=connection)
    scheduler.acquire_locks()
    scheduler.enqueue_scheduled_jobs()  # ... and writes v1 back to the queue
    monkeypatch.undo()
    scheduler.release_locks()
    [v2] = replaced
    assert v2.id == v1.id and v1.id in q.job_ids  # the stale write landed: the job is queued again
    assert Job.fetch(v1.id, connection=connection).args == ('skew', 'v1')  # with the payload the scheduler read
    worker = start_worker(redis_url, ['skew'], worker_env, burst=True)
    assert worker.wait(timeout=60) == 0, output(worker)
    ran = connection.lrange('test:ran:skew', 0, -1)
    assert ran == [], (Job.fetch(v1.id, connection=connection).args, pending(connection, q), output(worker))  # v1 never
    # ran; v2 waits for its own time
    assert [j for j, _ in pending(connection, q)] == [v1.id] and q.job_ids == []
    back = Job.fetch(v1.id, connection=connection)
    assert back.args == ('skew', 'v2') and back.get_status() == JobStatus.SCHEDULED and back.enqueued_at is None


def test_a_kept_handle_after_five_replacements_reads_scheduled_with_the_last_payload(connection):
    """Issue 22: each replacement used to delete the job the app held (get_status() then raised NoSuchJobError)."""
    q = PolicyQueue('index', connection=connection)
    kept = q.enqueue(tj.reindex_slow, 1, 'v0')
    created = connection.hget(kept.key, 'created_at')
    returned = [q.enqueue(tj.reindex_slow, 1, f'v{i}', meta={'n': i}) for i in range(1, 6)]
    assert [job.id for job in returned] == [kept.id] * 5
    assert kept.get_status() == JobStatus.SCHEDULED
    kept.refresh()
    assert kept.args == (1, 'v5') and kept.meta == {'n': 5} and kept.description == returned[-1].description
    assert [m for m, _ in pending(connection, q)] == [kept.id]
    assert connection.hget(kept.key, 'created_at') == created  # the job's creation stays (a replay of it is known)


def test_a_chosen_id_reused_by_a_later_call_is_not_taken_for_a_resend(connection):
    """A merge record answers only a resend of its own call (the same created_at): a later call given the same
    job_id is a call of its own, rewriting the pending job again, or admitted as a new job once none is pending."""
    q = PolicyQueue('index', connection=connection)
    kept = q.enqueue(tj.reindex_slow, 1, 'v1')
    assert q.enqueue(tj.reindex_slow, 1, 'v2', job_id='reused').id == kept.id
    assert q.enqueue(tj.reindex_slow, 1, 'v3', job_id='reused').id == kept.id
    assert Job.fetch(kept.id, connection=connection).args == (1, 'v3')  # applied, not answered as a replay of v2
    # with nothing pending (the job deleted), the id is a new job's, and its merge record goes
    kept.delete()
    fresh = q.enqueue(tj.reindex_slow, 1, 'v4', job_id='reused')
    assert fresh.id == 'reused' and Job.fetch('reused', connection=connection).args == (1, 'v4')
    assert not connection.exists(keys.superseded('reused'))
    assert [m for m, _ in pending(connection, q)] == ['reused']


@pytest.mark.parametrize('kind', ['debounce', 'trailing'])
def test_a_due_pending_job_is_never_rewritten_a_new_job_is_admitted(connection, kind):
    """A pending job whose run time has come may be in rq's scheduler's hands at that moment: the next enqueue leaves
    it (payload, id, place) alone and is admitted as a job of its own, as before the in-place rewrite."""
    q = PolicyQueue('due', connection=connection)
    if kind == 'debounce':
        func = tj.reindex_slow
    else:
        func = tj.publish_minute
        wait_for_phase(connection, 60, 0.5, 50)
        assert q.enqueue(func, 1, 'lead') is not None
    first = q.enqueue(func, 1, 'v1')
    registry = ScheduledJobRegistry(queue=q).key
    connection.zadd(registry, {first.id: int(server_now(connection)) - 1})  # its time has come
    second = q.enqueue(func, 1, 'v2')
    assert second.id != first.id and connection.hget(first.key, 'policies_replaced_by') is None
    assert Job.fetch(first.id, connection=connection).args == (1, 'v1')
    assert {m for m, _ in pending(connection, q)} == {first.id, second.id}
