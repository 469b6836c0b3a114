"""Throttle: one job per identity per epoch-aligned slot; the trailing edge; force and reset."""

from __future__ import annotations

import logging
import multiprocessing
import time
from datetime import datetime, timedelta, timezone

import pytest
from rq import Queue
from rq.decorators import job as job_decorator
from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry

from rq_policies import (
    Debounce,
    Loner,
    Outcome,
    PipelineNotSupported,
    PolicyConfigurationError,
    PolicyQueue,
    PolicySet,
    PolicySimpleWorker,
    Throttle,
    policy,
)
from rq_policies.engine import admission, identity, keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs
from tests.helpers import throttle_jobs as tj
from tests.helpers.throttle_helpers import (
    WorkerProcess,
    clear_of_a_slot_edge,
    ran,
    server_now,
    wait_for_phase,
    wait_for_runs,
)
from tests.helpers.workers import race


@pytest.fixture
def clear_of_a_minute_edge(connection):
    """The tests of ``tj.poll_minute`` (Throttle(60)) expect one slot from their first enqueue to their last."""
    clear_of_a_slot_edge(connection, 60)


def slot_keys(conn) -> list[str]:
    return sorted(k.decode() for k in conn.keys(f'{RQ}:policies:throttle:*'))


def digest_of(func, queue: str, *args, **kwargs) -> str:
    return identity.digest(f'{func.__module__}.{func.__qualname__}', queue, args, kwargs)


# -- the policy object ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize('bad', [0, -1, 1.5, 60.0, '60', True, False, None, [60]])
def test_slot_must_be_whole_seconds(bad):
    with pytest.raises(ValueError, match=r'slot.*' + repr(bad).replace('[', r'\[').replace(']', r'\]')):
        Throttle(bad)


def test_trailing_must_be_bool():
    with pytest.raises(TypeError, match="trailing.*'yes'"):
        Throttle(60, trailing='yes')


def test_value_object():
    assert Throttle(60) == Throttle(60)
    assert Throttle(60) != Throttle(60, trailing=True)
    assert repr(Throttle(60, trailing=True)) == 'Throttle(60, trailing=True)'
    assert len({Throttle(5), Throttle(5)}) == 1


def test_combinations():
    def local(x):  # never a shared job function: @policy marks the function object itself
        return x

    policy(Throttle(60), Loner())(local)  # meaningful: at most one per slot, never piling up behind slow workers
    with pytest.raises(PolicyConfigurationError, match='Throttle and Debounce'):
        policy(Throttle(60), Debounce(5))
    with pytest.raises(PolicyConfigurationError, match='Debounce and Loner'):
        policy(Debounce(5), Loner())
    with pytest.raises(PolicyConfigurationError, match='given twice'):
        policy(Throttle(60), Throttle(30))


# -- the script and the low-level door -------------------------------------------------------------------------------


def test_slot_script_direct(connection):
    digest = 'a' * 64
    prefix = keys.throttle_prefix('q', digest)
    q = PolicyQueue('q', connection=connection)

    def claim(jid):
        verdict = admission.claim(q, PolicySet((Throttle(3600),)), digest, q.create_job(jobs.plain, job_id=jid))
        return [verdict.code, verdict.job_id.encode(), verdict.number, verdict.server_now]

    code, owner, ends, now = claim('j1')
    now = float(now)
    assert (code, owner) == (1, b'j1')
    assert ends % 3600 == 0 and now < ends <= now + 3600  # the epoch-aligned slot the server clock is in
    key = f'{prefix}{int(ends) // 3600 - 1}'
    assert connection.get(key) == b'j1'
    assert 0 < connection.pttl(key) <= (ends - now) * 1000 + 2  # expires when the slot ends (2 ms: see test_debounce)
    assert claim('j2')[:3] == [0, b'j1', ends]
    assert claim('j1')[:3] == [1, b'j1', ends]  # replay
    assert connection.hget(keys.DROPS, 'throttle:q') == b'1'
    assert connection.keys(f'{RQ}:job:*') == []  # mode N writes no job


def test_check_and_reset_scripts_direct(connection):
    digest = 'b' * 64
    prefix = keys.throttle_prefix('q', digest)
    q = PolicyQueue('q', connection=connection)
    spec = PolicySet((Throttle(3600),))

    def check(jid):
        return admission.Verdict.read(admission.probe_call(q, spec, digest, jid).run(connection), digest)

    verdict = check('')
    assert (verdict.code, verdict.job_id) == (-1, '')  # a free slot decides nothing and counts nothing
    assert connection.exists(keys.DROPS) == 0
    index = int(verdict.number) // 3600 - 1
    connection.set(f'{prefix}{index}', 'owner')
    connection.set(f'{prefix}{index + 1}', 'trailing-owner')
    dropped = check('')
    assert (dropped.code, dropped.job_id) == (0, 'owner')
    assert check('owner').code == -1  # the owner itself (a replay) goes on to the full path
    assert connection.hget(keys.DROPS, 'throttle:q') == b'1'
    connection.set(keys.loner('q', digest), 'x')
    removed = admission.reset(q, spec, digest)
    left = [k.decode() for k in connection.keys('*')]
    # the drop counters stay, and the reset's answer, kept a minute for a replay (lua/lib/answer.lua)
    assert removed == 3 and all(keys.is_drop_counter(k) or keys.is_answer(k) for k in left)
    assert [connection.get(k) for k in left if keys.is_answer(k)] == [b'3']


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_admit_warns_once_when_the_job_s_function_cannot_be_imported(connection, caplog):
    """Throttle.admit reads the declared unique_context; an unimportable path used to be swallowed in silence."""
    from rq_policies.engine import queue as queue_module

    path = 'tests.helpers.throttle_jobs.poll_minuet'  # sic
    queue_module._UNIMPORTABLE_WARNED.discard(path)
    job = PolicyQueue('accounts', connection=connection).create_job(path, args=(7,))
    with caplog.at_level(logging.WARNING, logger='rq_policies'):
        assert Throttle.admit(job, slot=60, connection=connection).admitted
        assert Throttle.admit(job, slot=60, connection=connection).admitted  # a replay: warned once only
    assert [r.levelno for r in caplog.records if path in r.getMessage()] == [logging.WARNING]


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_admit_outcome_and_replay(connection):
    q = PolicyQueue('accounts', connection=connection)
    first = q.create_job(tj.poll_minute, args=(7,))
    outcome = Throttle.admit(first, slot=60, connection=connection)
    now = server_now(connection)
    assert isinstance(outcome, Outcome)
    assert outcome.admitted and outcome.jid == first.id
    assert outcome.slot_ends_at % 60 == 0 and now < outcome.slot_ends_at <= now + 60
    # a retried call whose reply was lost: admitted again, not a drop
    assert Throttle.admit(first, slot=60, connection=connection) == outcome
    other = q.create_job(tj.poll_minute, args=(7,))
    lost = Throttle.admit(other, slot=60, connection=connection)
    assert not lost.admitted and lost.jid == first.id and lost.slot_ends_at == outcome.slot_ends_at
    assert Throttle.admit(q.create_job(tj.poll_minute, args=(8,)), slot=60, connection=connection).admitted
    assert connection.keys(f'{RQ}:job:*') == [] and q.count == 0  # the low-level door writes only the slot key
    # the same slot the enqueue door uses
    assert q.enqueue(tj.poll_minute, 7) is None


def test_admit_bad_arguments_write_nothing(connection):
    q = PolicyQueue('accounts', connection=connection)
    job = q.create_job(tj.poll_minute, args=(7,))
    for bad in (0, 1.5, '60', True, None):
        with pytest.raises(ValueError, match='slot'):
            Throttle.admit(job, slot=bad, connection=connection)
    with pytest.raises(TypeError, match='job'):
        Throttle.admit('not a job', slot=60, connection=connection)
    orphan = Job.create(tj.poll_minute, args=(7,), connection=connection)
    with pytest.raises(ValueError, match='origin'):
        Throttle.admit(orphan, slot=60, connection=connection)
    assert connection.dbsize() == 0


# -- the leading edge through the queue ------------------------------------------------------------------------------


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_extra_dropped_logged_and_counted(connection, caplog):
    q = PolicyQueue('accounts', connection=connection)
    first = q.enqueue(tj.poll_minute, 7)
    assert isinstance(first, Job) and first.get_status() == JobStatus.QUEUED
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        assert q.enqueue(tj.poll_minute, 7) is None
        assert q.enqueue(tj.poll_minute, 7) is None  # this process has seen the slot: the fast path drops it
    drops = [r.getMessage() for r in caplog.records if 'dropped' in r.getMessage()]
    assert len(drops) == 2
    for message in drops:
        assert first.id in message and '(throttle)' in message and 'slot ends at' in message
    assert q.enqueue(tj.poll_minute, 8) is not None  # another identity
    assert q.count == 2
    assert connection.hget(keys.DROPS, 'throttle:accounts') == b'2'
    assert Queue('accounts', connection=connection).job_ids == q.job_ids  # ordinary rq jobs


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_replay_with_same_job_id_is_admitted(connection):
    q = PolicyQueue('accounts', connection=connection)
    first = q.enqueue(tj.poll_minute, 7, job_id='poll-7')
    again = q.enqueue(tj.poll_minute, 7, job_id='poll-7')
    assert first is not None and again is not None and again.id == 'poll-7'
    assert q.job_ids == ['poll-7']
    assert q.enqueue(tj.poll_minute, 7, job_id='poll-7-other') is None
    assert connection.hget(keys.DROPS, 'throttle:accounts') == b'1'


def _reset_elsewhere(url):
    from redis import Redis

    PolicyQueue('accounts', connection=Redis.from_url(url)).reset(tj.poll_minute, 7)


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_fast_path_never_decides_on_memory_alone(connection, redis_url):
    q = PolicyQueue('accounts', connection=connection)
    assert q.enqueue(tj.poll_minute, 7) is not None
    assert q.enqueue(tj.poll_minute, 7) is None  # this process now remembers the slot as held
    # another process resets the identity; what this process remembers must not drop the next enqueue
    other = multiprocessing.get_context('fork').Process(target=_reset_elsewhere, args=(redis_url,))
    other.start()
    other.join(30)
    assert other.exitcode == 0 and slot_keys(connection) == []
    again = q.enqueue(tj.poll_minute, 7)
    assert again is not None and connection.get(slot_keys(connection)[0]) == again.id.encode()
    assert q.enqueue(tj.poll_minute, 7, job_id=again.id) is not None  # a replay passes the fast path too


def test_slots_are_epoch_aligned_not_cooldowns(connection):
    q = PolicyQueue('poll', connection=connection)
    width = 3
    # late in a slot: the winner holds it only until the epoch-aligned boundary, not for `width` seconds
    t_a = wait_for_phase(connection, width, 2.0, 2.3)
    index = int(t_a // width)
    a = q.enqueue(jobs.plain, 7, policy=Throttle(width))
    b = q.enqueue(jobs.plain, 7, policy=Throttle(width))
    assert server_now(connection) < (index + 1) * width  # both were inside the first slot
    assert a is not None and b is None
    assert connection.get(keys.throttle_prefix('poll', digest_of(jobs.plain, 'poll', 7)) + str(index)) == a.id.encode()
    # just after the boundary: a new slot, although far less than `width` seconds have passed
    t_c = wait_for_phase(connection, width, 0.05, 0.6, later_than=t_a)
    c = q.enqueue(jobs.plain, 7, policy=Throttle(width))
    d = q.enqueue(jobs.plain, 7, policy=Throttle(width))
    assert int(t_c // width) == index + 1 and t_c - t_a < width
    assert c is not None and d is None
    key = keys.throttle_prefix('poll', digest_of(jobs.plain, 'poll', 7)) + str(index + 1)
    assert connection.get(key) == c.id.encode()
    assert slot_keys(connection) == [key]  # the first slot's key expired at the boundary
    assert q.job_ids == [a.id, c.id]


def test_slot_key_expires_when_slot_ends(connection):
    q = PolicyQueue('burst', connection=connection)
    start = wait_for_phase(connection, 1, 0.05, 0.3)
    q.enqueue(tj.burst, 1)
    [key] = slot_keys(connection)
    assert 0 < connection.pttl(key) <= 1000
    wait_for_phase(connection, 1, 0.05, 0.3, later_than=start)
    assert connection.exists(key) == 0
    assert q.enqueue(tj.burst, 1) is not None


def test_no_throttle_key_left_after_a_burst(connection):
    q = PolicyQueue('burst', connection=connection)
    wait_for_phase(connection, 1, 0.02, 0.2)
    admitted = [q.enqueue(tj.burst, i) for i in range(2000)]
    assert all(a is not None for a in admitted[:50])
    # every identity got its own key; they all end with their slots, with no reaper
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        expiring = connection.info('keyspace').get('db0', {}).get('expires', 0)
        if expiring == 0 and not connection.keys(f'{RQ}:policies:throttle:*'):
            break
        time.sleep(0.2)
    assert connection.keys(f'{RQ}:policies:throttle:*') == []
    assert connection.info('keyspace').get('db0', {}).get('expires', 0) == 0  # gone from memory, not just hidden


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_processes_racing_on_one_slot_make_one_winner(connection, redis_url):
    outcomes = race(redis_url, 'race', lambda q: q.enqueue(tj.poll_minute, 42))
    winners = [o for o in outcomes if o]
    assert len(winners) == 1
    assert PolicyQueue('race', connection=connection).job_ids == winners
    assert connection.hget(keys.DROPS, 'throttle:race') == b'15'


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_every_door(connection):
    q = PolicyQueue('doors', connection=connection)
    assert q.enqueue_call(tj.poll_minute, args=(1,)) is not None
    assert q.enqueue_call(tj.poll_minute, args=(1,)) is None
    # enqueue_at is a submission too: it claims the slot current at the call and runs at the time it asked for
    at = datetime.now(timezone.utc) + timedelta(hours=1)
    scheduled = q.enqueue_at(at, tj.poll_minute, 2)
    assert scheduled is not None and scheduled.id in ScheduledJobRegistry(queue=q)
    assert Job.fetch(scheduled.id, connection=connection).get_status() == JobStatus.SCHEDULED
    assert q.enqueue(tj.poll_minute, 2) is None
    assert q.enqueue_in(timedelta(minutes=5), tj.poll_minute, 2) is None
    assert q.enqueue_in(timedelta(minutes=5), tj.poll_minute, 3) is not None
    many = q.enqueue_many(
        [
            Queue.prepare_data(tj.poll_minute, (1,)),
            Queue.prepare_data(tj.poll_minute, (4,)),
            Queue.prepare_data(tj.poll_minute, (4,)),
            Queue.prepare_data(jobs.plain, (4,)),
        ]
    )
    assert many[0] is None and many[2] is None
    assert isinstance(many[1], Job) and isinstance(many[3], Job)
    delayed = job_decorator(q, connection=connection)(tj.poll_minute)
    assert delayed.delay(5) is not None
    assert delayed.delay(5) is None
    # by import path: the declared policy applies
    assert q.enqueue('tests.helpers.throttle_jobs.poll_minute', 5) is None
    assert q.enqueue(jobs.plain, 9, policy=Throttle(60)) is not None
    assert q.enqueue(jobs.plain, 9, policy=Throttle(60)) is None
    assert q.enqueue(tj.poll_minute, 5, policy=None) is not None  # switched off


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_depends_on_winner_is_deferred(connection):
    q = PolicyQueue('deps', connection=connection)
    parent = q.enqueue(jobs.plain, 1)
    child = q.enqueue(tj.poll_minute, 1, depends_on=parent)
    assert child is not None
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.DEFERRED
    assert q.enqueue(tj.poll_minute, 1, depends_on=parent) is None
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.FINISHED


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_pipeline_and_bad_calls_write_nothing(connection):
    q = PolicyQueue('q', connection=connection)
    with connection.pipeline() as pipe:
        with pytest.raises(PipelineNotSupported):
            q.enqueue(tj.poll_minute, 1, pipeline=pipe)
    with pytest.raises(TypeError, match=r'args\[0\]'):
        q.enqueue(tj.poll_minute, object())
    with pytest.raises(TypeError, match=r'args\[0\]'):
        q.reset(tj.poll_minute, object())
    with pytest.raises(ValueError, match='slot'):
        q.enqueue(jobs.plain, 1, policy=Throttle(0))
    assert connection.dbsize() == 0


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_sync_queue_runs_at_once(connection):
    q = PolicyQueue('sync', connection=connection, is_async=False)
    assert q.enqueue(tj.poll_minute, 1).return_value() == 1
    assert slot_keys(connection) == []


# -- Throttle with Loner ---------------------------------------------------------------------------------------------


def test_throttle_with_loner_drops_while_a_job_waits(connection, caplog):
    q = PolicyQueue('loner', connection=connection)
    start = wait_for_phase(connection, 1, 0.05, 0.4)
    first = q.enqueue(tj.poll_loner, 1)
    assert first is not None and q.holder(tj.poll_loner, 1) == first.id
    wait_for_phase(connection, 1, 0.05, 0.4, later_than=start)  # a new slot; the first job still waits (no worker)
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        assert q.enqueue(tj.poll_loner, 1) is None
    assert '(loner)' in caplog.text and first.id in caplog.text
    assert connection.hget(keys.DROPS, 'loner:loner') == b'1'
    assert slot_keys(connection) == []  # a loner drop does not take the slot
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    second = q.enqueue(tj.poll_loner, 1)  # taken by the worker, and the slot is free: admitted
    assert second is not None
    assert q.enqueue(tj.poll_loner, 1) is None


# -- the trailing edge -----------------------------------------------------------------------------------------------


def test_trailing_extras_replace_each_other(connection, caplog):
    q = PolicyQueue('progress', connection=connection)
    registry = ScheduledJobRegistry(queue=q)
    wait_for_phase(connection, 60, 0.5, 55)
    winner = q.enqueue(tj.publish_minute, 1, 'a')
    assert winner.get_status() == JobStatus.QUEUED
    b = q.enqueue(tj.publish_minute, 1, 'b')
    assert isinstance(b, Job) and b.get_status() == JobStatus.SCHEDULED
    [(member, score)] = connection.zrange(registry.key, 0, -1, withscores=True)
    assert member == b.id.encode() and score % 60 == 0 and score > server_now(connection)
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        c = q.enqueue(tj.publish_minute, 1, 'c')
    assert b.id in caplog.text and 'replaced the payload of pending trailing job' in caplog.text
    # the pending trailing job took c's payload in place: c is b, and the handle b stays valid
    assert c.id == b.id and c.args == (1, 'c') and b.get_status() == JobStatus.SCHEDULED
    assert connection.zrange(registry.key, 0, -1, withscores=True) == [(c.id.encode(), score)]
    fetched = Job.fetch(c.id, connection=connection)
    assert fetched.get_status() == JobStatus.SCHEDULED and fetched.args == (1, 'c') and fetched.enqueued_at is None
    assert connection.get(keys.trailing('progress', digest_of_context(1))) == c.id.encode()
    # the trailing job counts as the next slot's run
    index = int(score) // 60
    prefix = keys.throttle_prefix('progress', digest_of_context(1))
    assert connection.get(f'{prefix}{index - 1}') == winner.id.encode()
    assert connection.get(f'{prefix}{index}') == c.id.encode()
    # a call reusing the pending job's id (a retry) leaves one pending job, at the same time
    again = q.enqueue(tj.publish_minute, 1, 'c', job_id=c.id)
    assert again is not None and again.id == c.id
    assert connection.zrange(registry.key, 0, -1, withscores=True) == [(c.id.encode(), score)]
    assert Job.fetch(c.id, connection=connection).args == (1, 'c')
    # a replay of the winner is answered "admitted" and writes nothing
    assert q.enqueue(tj.publish_minute, 1, 'a', job_id=winner.id).id == winner.id
    assert q.job_ids == [winner.id]
    assert q.job_ids == [winner.id]
    assert connection.hget(keys.DROPS, 'throttle:progress') is None  # nothing was dropped


def test_processes_racing_as_extras_leave_one_pending_trailing_job(connection, redis_url):
    q = PolicyQueue('progress', connection=connection)
    wait_for_phase(connection, 60, 0.5, 50)
    winner = q.enqueue(tj.publish_minute, 1, 'lead')
    outcomes = race(redis_url, 'progress', lambda q: q.enqueue(tj.publish_minute, 1, 'extra'))
    assert all(outcomes), outcomes  # an extra of a trailing throttle is never dropped: it becomes the pending one
    registry = ScheduledJobRegistry(queue=q)
    [pending] = registry.get_job_ids()
    assert set(outcomes) == {pending}  # the first extra became the pending one; the others rewrote it in place
    assert connection.get(keys.trailing('progress', digest_of_context(1))) == pending.encode()
    assert connection.exists(f'{RQ}:job:{pending}')
    assert q.job_ids == [winner.id]


def digest_of_context(task_id) -> str:
    return identity.digest('tests.helpers.throttle_jobs.publish_minute', 'progress', (), {}, lambda a, k: task_id)


def test_trailing_with_loner(connection):
    q = PolicyQueue('loner', connection=connection)
    wait_for_phase(connection, 60, 0.5, 55)
    winner = q.enqueue(tj.publish_loner, 1, 'a')
    assert q.enqueue(tj.publish_loner, 1, 'b') is None  # the winner still waits: Loner drops the extra
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    assert Job.fetch(winner.id, connection=connection).get_status() == JobStatus.FINISHED
    c = q.enqueue(tj.publish_loner, 1, 'c')
    assert c.get_status() == JobStatus.SCHEDULED and q.holder(tj.publish_loner, 1, 'x') == c.id
    d = q.enqueue(tj.publish_loner, 1, 'd')  # the pending trailing job itself is rewritten in place; it still holds
    assert d.get_status() == JobStatus.SCHEDULED and d.id == c.id and q.holder(tj.publish_loner, 1, 'x') == c.id
    assert Job.fetch(c.id, connection=connection).args == (1, 'd')


def test_trailing_refuses_depends_on_and_writes_nothing(connection):
    q = PolicyQueue('progress', connection=connection)
    parent = q.enqueue(jobs.plain, 1)
    before = sorted(connection.keys('*'))
    with pytest.raises(PolicyConfigurationError, match='depends_on'):
        q.enqueue(tj.publish_minute, 1, 'a', depends_on=parent)
    assert sorted(connection.keys('*')) == before


@pytest.mark.long
def test_trailing_latest_wins_run_by_a_scheduler_worker(connection, redis_url, worker_env):
    q = PolicyQueue('progress', connection=connection)
    with WorkerProcess(redis_url, worker_env, 'progress') as worker:
        start = wait_for_phase(connection, 2, 0.05, 0.4)
        slot_end = (int(start // 2) + 1) * 2
        burst = [q.enqueue(tj.publish_progress, 1, f'v{i}') for i in range(5)]
        assert server_now(connection) < slot_end  # one slot: the first wins, the others trail
        assert all(isinstance(j, Job) for j in burst)
        assert burst[0].get_status(refresh=False) == JobStatus.QUEUED
        assert [j.get_status(refresh=False) for j in burst[1:]] == [JobStatus.SCHEDULED] * 4
        # the next slot: its run is the trailing job, so an extra now waits for this slot's end in turn
        wait_for_phase(connection, 2, 0.05, 0.5, later_than=start)
        late = q.enqueue(tj.publish_progress, 1, 'v5')
        next_end = slot_end + 2
        assert server_now(connection) < next_end
        assert late.get_status(refresh=False) == JobStatus.SCHEDULED
        rows = wait_for_runs(connection, 'progress', 3, timeout=20)
        assert [value for _, value, _ in rows] == ['v0', 'v4', 'v5'], worker.output()
        assert rows[1][0] == burst[4].id and rows[1][2] >= slot_end  # the slot's latest extra, once the slot ended
        assert rows[2][0] == late.id and rows[2][2] >= next_end
        assert {j.id for j in burst[1:]} == {burst[1].id}  # the extras are one job, rewritten in place
        assert burst[1].get_status() == JobStatus.FINISHED
        time.sleep(1.5)
        assert len(ran(connection, 'progress')) == 3  # nothing ran twice, nothing else ran


# -- force and reset -------------------------------------------------------------------------------------------------


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_force_takes_the_slot(connection):
    q = PolicyQueue('accounts', connection=connection)
    first = q.enqueue(tj.poll_minute, 7)
    forced = q.force(tj.poll_minute, 7)
    assert isinstance(forced, Job) and forced.get_status() == JobStatus.QUEUED
    assert q.job_ids == [first.id, forced.id]
    [key] = slot_keys(connection)
    assert connection.get(key) == forced.id.encode()
    outcome = Throttle.admit(q.create_job(tj.poll_minute, args=(7,)), slot=60, connection=connection)
    assert outcome.jid == forced.id
    assert q.enqueue(tj.poll_minute, 7) is None
    assert q.force(jobs.plain, 1) is not None  # no policy at all: an ordinary enqueue
    assert q.force(tj.poll_minute, 7, job_timeout=30).timeout == 30  # rq's enqueue options are accepted


def test_force_drops_pending_trailing_job(connection):
    q = PolicyQueue('progress', connection=connection)
    registry = ScheduledJobRegistry(queue=q)
    wait_for_phase(connection, 60, 0.5, 55)
    q.enqueue(tj.publish_minute, 1, 'a')
    pending = q.enqueue(tj.publish_minute, 1, 'b')
    forced = q.force(tj.publish_minute, 1, 'now')
    assert connection.exists(pending.key) == 0 and registry.count == 0
    prefix = keys.throttle_prefix('progress', digest_of_context(1))
    assert [connection.get(k) for k in slot_keys(connection)] == [forced.id.encode()]  # the next slot is free again
    assert connection.exists(keys.trailing('progress', digest_of_context(1))) == 0
    assert slot_keys(connection)[0].startswith(prefix)
    later = q.enqueue(tj.publish_minute, 1, 'c')  # the slot is the forced job's: a new extra trails it
    assert later.get_status() == JobStatus.SCHEDULED


def test_force_with_loner_takes_a_free_marker_only(connection):
    q = PolicyQueue('loner', connection=connection)
    waiting = q.enqueue(tj.poll_loner, 1)
    forced = q.force(tj.poll_loner, 1)
    assert q.holder(tj.poll_loner, 1) == waiting.id  # the waiting holder keeps it
    PolicySimpleWorker([q], connection=connection).work(burst=True)
    again = q.force(tj.poll_loner, 1)
    assert q.holder(tj.poll_loner, 1) == again.id
    assert forced.id != again.id


@pytest.mark.usefixtures('clear_of_a_minute_edge')
def test_reset_clears_every_policy_state(connection):
    q = PolicyQueue('accounts', connection=connection)
    assert q.reset(tj.poll_minute, 7) == 0
    q.enqueue(tj.poll_minute, 7)
    assert q.reset(tj.poll_minute, 7) == 1
    assert slot_keys(connection) == []
    assert q.enqueue(tj.poll_minute, 7) is not None
    assert q.reset(tj.poll_minute, 8) == 0  # other identities are untouched
    assert len(slot_keys(connection)) == 1

    p = PolicyQueue('progress', connection=connection)
    wait_for_phase(connection, 60, 0.5, 55)
    winner = p.enqueue(tj.publish_minute, 1, 'a')
    pending = p.enqueue(tj.publish_minute, 1, 'b')
    # current slot, next slot, the pending job's hash, the trailing pointer
    assert p.reset(tj.publish_minute, 1, 'whatever') == 4
    assert connection.exists(pending.key) == 0 and ScheduledJobRegistry(queue=p).count == 0
    assert p.job_ids == [winner.id]  # a queued job is left alone
    assert p.enqueue(tj.publish_minute, 1, 'c').get_status() == JobStatus.QUEUED  # the window is open again

    lq = PolicyQueue('loner', connection=connection)
    lq.enqueue(tj.poll_loner, 3)
    assert lq.reset(tj.poll_loner, 3) in (1, 2)  # the marker, and the slot key unless its 1 s slot already ended
    assert lq.holder(tj.poll_loner, 3) is None

    assert q.reset(jobs.plain, 1, policy=Throttle(60)) == 0
    q.enqueue(jobs.plain, 1, policy=Throttle(60))
    assert q.reset(jobs.plain, 1, policy=Throttle(60)) == 1


def test_a_kept_trailing_handle_after_five_replacements_reads_scheduled_with_the_last_payload(connection):
    """Issue 22: each extra used to delete the pending trailing job the app held (NoSuchJobError)."""
    q = PolicyQueue('progress', connection=connection)
    wait_for_phase(connection, 60, 0.5, 55)
    winner = q.enqueue(tj.publish_minute, 1, 'lead')
    kept = q.enqueue(tj.publish_minute, 1, 'v0')
    returned = [q.enqueue(tj.publish_minute, 1, f'v{i}', meta={'n': i}) for i in range(1, 6)]
    assert [job.id for job in returned] == [kept.id] * 5 and kept.id != winner.id
    assert all(job.get_status(refresh=False) == JobStatus.SCHEDULED for job in returned)
    assert kept.get_status() == JobStatus.SCHEDULED
    kept.refresh()
    assert kept.args == (1, 'v5') and kept.meta == {'n': 5}
    assert ScheduledJobRegistry(queue=q).get_job_ids() == [kept.id] and q.job_ids == [winner.id]
