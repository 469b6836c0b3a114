"""A job a PolicyWorker took and never started is handed back to its queue (issue 31).

A fetch moves the id onto the queue's intermediate list and notes its take (``rq:policies:taken:<queue>``: the claim
token, the job's enqueued_at), live while the fetch's claim record lives (the worker's ``hold_ttl``) and removed by
the work horse's start. A worker killed, stopped or starved between its fetch and the start leaves the id there;
rq's own cleanup fails such a job, unrun, once a maintenance pass has seen it for a minute (about 406 s with rq's
defaults). Now any PolicyWorker of the queue hands a lapsed take's job back to the head of its queue
(``lua/hand_back.lua``, every ``hold_ttl / 3`` seconds, 1 to 10, and before its fetches), and a taker that resumes
after its take was handed back does not start the job (``lua/claim_start.lua``, asked once rq wrote the job's
execution, which the hand-back never crosses).

The scripts are called directly first (what each case leaves), then with a lost reply through the fault proxy, then
real forking workers: one SIGKILLed between its fetch and the start, one SIGSTOPped there past its hold ttl.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry
from rq.executions import ExecutionRegistry
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry

from rq_policies import Loner, PolicyQueue
from rq_policies.engine import keys, scripts
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import Claim, hand_back
from rq_policies.engine.worker import HOLD_TTL_ENV
from tests.helpers import jobs
from tests.helpers.fetches import fetch
from tests.helpers.records import server_now, spans
from tests.helpers.workers import output, start_worker, stop, wait_for

#: The hold ttl of the workers here (rq's monitoring interval 1 s): a take lapses 3 s after its fetch, and a worker
#: hands lapsed takes back every second (``Fetcher.hand_back_seconds``: a third of the ttl, at least 1 s).
TTL = 3
FAST = ['--job-monitoring-interval', '1']
#: Slack for a loaded machine on each timing bound below (seconds): a worker's start-up, a fork, a busy CPU.
SLACK = 4.0


def intermediate(connection, name):
    return [raw.decode() for raw in connection.lrange(f'{RQ}:queue:{name}:intermediate', 0, -1)]


def waiting(connection, name):
    return [raw.decode() for raw in connection.lrange(f'{RQ}:queue:{name}', 0, -1)]


def taken(connection, name):
    return {k.decode(): v.decode() for k, v in connection.hgetall(keys.taken(name)).items()}


def lapse(connection, claim: Claim) -> None:
    """The claim record of ``claim`` expires, as it does ``hold_ttl`` after the fetch (its take lapses with it)."""
    connection.delete(claim.record or keys.claim(claim.fetch_token))


def take_one(connection, name='hb', token='taker:1', ttl=90) -> Claim:
    got = fetch(connection, token, [name], ttl=ttl)
    assert isinstance(got, Claim), got
    got.fetch_token, got.record = token, keys.claim(token)
    return got


# -- the scripts, called directly ----------------------------------------------------------------------------------


def test_a_fetch_notes_its_take_until_the_start_and_a_live_take_is_not_handed_back(connection):
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    claim = take_one(connection)
    enqueued_at = connection.hget(job.key, 'enqueued_at').decode()
    assert taken(connection, 'hb') == {job.id: f'taker:1 {enqueued_at}'}
    assert 85 <= connection.ttl(keys.claim('taker:1')) <= 90  # the take lives as long as its record: the hold ttl
    assert hand_back(connection, [q]) == []  # its record lives: the taker may still start it
    assert intermediate(connection, 'hb') == [job.id] and taken(connection, 'hb') == {job.id: f'taker:1 {enqueued_at}'}
    assert claim.job_id == job.id


@pytest.mark.parametrize('kind', ['plain', 'loner'])
def test_a_lapsed_take_is_handed_back_to_the_head_of_its_queue_once(connection, kind):
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1, policy=Loner() if kind == 'loner' else None)
    behind = q.enqueue(jobs.plain, 2)
    claim = take_one(connection)
    assert claim.job_id == job.id
    lapse(connection, claim)
    assert hand_back(connection, [q]) == [(job.id, 'hb')]
    assert waiting(connection, 'hb') == [job.id, behind.id]  # first in line again, as it was
    assert intermediate(connection, 'hb') == [] and taken(connection, 'hb') == {}
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.QUEUED
    assert hand_back(connection, [q]) == []  # done: nothing is handed back twice
    again = take_one(connection, token='taker:2')
    assert again.job_id == job.id  # the next fetch takes it, under a take of its own


def test_a_take_made_stale_by_a_later_enqueue_of_the_id_is_dropped_not_handed_back(connection):
    """rq's cleanup failed the job and a retry or a requeue enqueued it again (a new enqueued_at): the id a worker
    took since is another take's (perhaps a stock worker about to start it), not this one's."""
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    claim = take_one(connection)
    lapse(connection, claim)
    connection.hset(job.key, 'enqueued_at', '2030-01-01T00:00:00.000000Z')  # enqueued again since
    assert hand_back(connection, [q]) == []
    assert intermediate(connection, 'hb') == [job.id] and waiting(connection, 'hb') == []  # rq's, as it was
    assert taken(connection, 'hb') == {}


def test_a_job_whose_execution_rq_wrote_is_not_handed_back(connection):
    """rq's prepare_execution wrote the job's execution (the worker is about to fork the horse that starts it): the
    take stays, and its job stays, until that execution expires (a worker that died there)."""
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    claim = take_one(connection)
    lapse(connection, claim)
    executions = ExecutionRegistry.key_template.format(job.id)
    connection.zadd(executions, {'e1': server_now(connection) + 60})
    assert hand_back(connection, [q]) == []
    assert intermediate(connection, 'hb') == [job.id] and job.id in taken(connection, 'hb')
    connection.zadd(executions, {'e1': server_now(connection) - 1})  # it expired: its worker is gone
    assert hand_back(connection, [q]) == [(job.id, 'hb')]


def test_an_id_without_a_take_is_left_to_rq_and_a_dangling_one_is_dropped(connection):
    """An id on the intermediate list with no take (a stock rq worker's dequeue, a take lost with the data) may be
    about to start on a worker we know nothing of: it is rq's cleanup's. A take whose job hash is gone goes with its
    id, as rq's dequeue drops a dangling id."""
    q = PolicyQueue('hb', connection=connection)
    stock = q.enqueue(jobs.plain, 1)
    assert Queue.dequeue_any([Queue('hb', connection=connection)], None, connection=connection)[0].id == stock.id
    gone = q.enqueue(jobs.plain, 2)
    claim = take_one(connection)
    assert claim.job_id == gone.id
    lapse(connection, claim)
    connection.delete(gone.key)
    assert hand_back(connection, [q]) == []
    assert intermediate(connection, 'hb') == [stock.id] and taken(connection, 'hb') == {}


def test_the_start_check_answers_whether_the_take_is_still_the_workers(connection):
    q = PolicyQueue('hb', connection=connection)
    q.enqueue(jobs.plain, 1)
    claim = take_one(connection)

    def check(token):
        return scripts.run('claim_start', connection, [keys.taken('hb'), keys.claim(token)], [claim.job_id, token])

    assert check('taker:1') == 1 and check('taker:1') == 1  # reads only: the same answer twice
    assert check('someone-else') == 0
    connection.delete(keys.taken('hb'))  # the takes' hash expired (no take on the queue for an hour)
    assert check('taker:1') == 1  # its claim record lives: never handed back (a hand-back needs it gone)
    enqueued_at = connection.hget(Job.key_for(claim.job_id), 'enqueued_at').decode()
    connection.hset(keys.taken('hb'), claim.job_id, f'taker:1 {enqueued_at}')  # noted again, as it was
    lapse(connection, claim)
    hand_back(connection, [q])
    assert check('taker:1') == 0  # handed back: this worker must not start it


def _start(client, claim, token, at='2026-12-07T10:00:00.000000Z'):
    q = PolicyQueue('hb', connection=client)
    return scripts.run('start', client, [keys.taken('hb'), keys.claim(token), Job.key_for(claim.job_id),
                                          q.intermediate_queue_key], [claim.job_id, token, at, 'w1', '1'])


def _started_fields(connection, job_id):
    return {k.decode(): v.decode() for k, v in connection.hgetall(Job.key_for(job_id)).items()
            if k.decode() in ('status', 'started_at', 'last_heartbeat', 'worker_name')}


def test_the_start_writes_rqs_start_only_while_the_take_is_the_workers(connection):
    """lua/start.lua: the start check and the start it guards in one step (issue 34: rq's own start pipeline is not
    sent again). A take handed back is not started; a take that is the worker's is started as rq starts a job."""
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1, ttl=600)
    claim = take_one(connection)
    assert _start(connection, claim, 'someone-else') == 0
    assert _started_fields(connection, job.id)['status'] == 'queued' and intermediate(connection, 'hb') == [job.id]
    assert _start(connection, claim, 'taker:1') == 1
    assert _started_fields(connection, job.id) == {
        'status': 'started', 'started_at': '2026-12-07T10:00:00.000000Z',
        'last_heartbeat': '2026-12-07T10:00:00.000000Z', 'worker_name': 'w1'}
    assert connection.ttl(job.key) == -1  # persisted, as rq 3's start does
    assert intermediate(connection, 'hb') == [] and taken(connection, 'hb') == {}
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.STARTED  # rq reads it as its own
    lapse(connection, claim)  # a replay after a long outage: the record lapsed, the job started by this worker
    assert _start(connection, claim, 'taker:1', at='2026-12-07T10:00:09.000000Z') == 1
    assert _started_fields(connection, job.id)['started_at'] == '2026-12-07T10:00:09.000000Z'
    connection.hset(job.key, 'worker_name', 'w2')  # ... but started by another worker since: not this one's
    assert _start(connection, claim, 'taker:1') == 0

    other = q.enqueue(jobs.plain, 2)
    claim = take_one(connection, token='taker:2')
    assert claim.job_id == other.id
    lapse(connection, claim)
    hand_back(connection, [q])
    assert _start(connection, claim, 'taker:2') == 0  # handed back: not started here
    assert _started_fields(connection, other.id)['status'] == 'queued' and waiting(connection, 'hb') == [other.id]


@pytest.mark.parametrize('fault', ['drop', 'delay', 'stall'])
def test_a_start_whose_reply_is_lost_is_written_once_and_answers_the_same(connection, fault_proxy, fault):
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    behind = q.enqueue(jobs.plain, 2)
    claim = take_one(connection)
    connection.script_load(scripts.script('start').script)  # the first attempt runs it (not a NOSCRIPT answer)
    client = Redis.from_url(fault_proxy.url, socket_timeout=0.2, socket_connect_timeout=1,
                            retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                            retry_on_error=[ConnectionError, TimeoutError])
    client.ping()
    try:
        match = (b'EVALSHA', scripts.script('start').sha.encode())
        if fault == 'drop':
            fault_proxy.drop_reply(match=match)
        elif fault == 'delay':
            fault_proxy.delay_reply(0.4, match=match)
        else:
            fault_proxy.stall(0.4, match=match)
        answer = _start(client, claim, 'taker:1')
        assert fault_proxy.seen(match) >= 2  # the call was sent again
    finally:
        client.close()
    assert answer == 1  # the replay answers what the first run did
    assert _started_fields(connection, job.id)['status'] == 'started'
    assert intermediate(connection, 'hb') == [] and taken(connection, 'hb') == {}
    assert waiting(connection, 'hb') == [behind.id]  # nothing else moved


def test_a_worker_reads_the_start_check_at_its_own_place_in_rqs_start_pipeline(connection):
    """The start check rides rq's start pipeline, after commands of rq's own; its answer is read by its index in the
    replies. On a Redis Cluster the pipeline keeps its commands in its execution strategy's queue, not in
    ``command_stack`` (always empty there): the index was 0, the check's answer was read from rq's HSET's reply
    (5, not 1), and every job a worker took was given up as handed back and never ran (the cluster cell)."""
    from rq_policies import PolicySimpleWorker

    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    worker = PolicySimpleWorker([q], connection=connection)
    worker.work(burst=True, max_jobs=1)
    assert job.get_status(refresh=True) == JobStatus.FINISHED
    assert not taken(connection, 'hb') and not waiting(connection, 'hb')


def test_a_worker_hands_its_own_take_back_at_once(connection):
    """A stop between the fetch and the start: the taker gives its own take back without waiting for the lapse."""
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    claim = take_one(connection)
    assert hand_back(connection, [q], own=claim) == [(job.id, 'hb')]
    assert waiting(connection, 'hb') == [job.id] and not connection.exists(claim.record)
    assert hand_back(connection, [q], own=claim) == []


@pytest.mark.parametrize('fault', ['drop', 'delay', 'stall'])
def test_a_hand_back_whose_reply_is_lost_hands_the_job_back_once_and_answers_the_same(connection, fault_proxy, fault):
    q = PolicyQueue('hb', connection=connection)
    job = q.enqueue(jobs.plain, 1)
    behind = q.enqueue(jobs.plain, 2)
    claim = take_one(connection)
    lapse(connection, claim)
    connection.script_load(scripts.script('hand_back').script)  # the first attempt runs it (not a NOSCRIPT answer)
    client = Redis.from_url(fault_proxy.url, socket_timeout=0.2, socket_connect_timeout=1,
                            retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                            retry_on_error=[ConnectionError, TimeoutError])
    client.ping()
    try:
        match = (b'EVALSHA', scripts.script('hand_back').sha.encode())
        if fault == 'drop':
            fault_proxy.drop_reply(match=match)
        elif fault == 'delay':
            fault_proxy.delay_reply(0.4, match=match)
        else:
            fault_proxy.stall(0.4, match=match)
        handed = hand_back(client, [PolicyQueue('hb', connection=client)])
        assert fault_proxy.seen(match) >= 2  # the call was sent again
    finally:
        client.close()
    assert handed == [(job.id, 'hb')]  # the replay answers what the first run did
    assert waiting(connection, 'hb') == [job.id, behind.id]  # pushed once
    assert intermediate(connection, 'hb') == [] and taken(connection, 'hb') == {}


# -- real workers ---------------------------------------------------------------------------------------------------


def _enqueue(q, kind, tag):
    if kind == 'loner':
        return q.enqueue(jobs.span_on_worker, tag, 0, policy=Loner())
    return q.enqueue(jobs.span_on_worker, tag, 0)


def _state(pid: int) -> str:
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(') ', 1)[1].split()[0]
    except (OSError, IndexError):
        return ''


@pytest.mark.long
@pytest.mark.parametrize('queues', [['lost'], ['spare', 'lost']], ids=['single-queue', 'multi-queue'])
@pytest.mark.parametrize('kind', ['plain', 'loner'])
def test_a_worker_sigkilled_between_its_fetch_and_the_start_has_its_job_run_once_within_the_hold_ttl(
        connection, redis_url, worker_env, queues, kind):
    """A forking PolicyWorker SIGKILLed between its fetch and the job's start (in ``execute_job``: the job is on the
    intermediate list, its take noted, nothing started): another PolicyWorker of the queue, idle, hands the job back
    once the take lapses (``hold_ttl`` after the fetch) and runs it, once. Before, it waited for rq's cleanup, which
    fails it unrun after about 406 s."""
    q = PolicyQueue('lost', connection=connection)
    job = _enqueue(q, kind, 'killed')
    env = dict(worker_env, **{HOLD_TTL_ENV: str(TTL)})
    dying = start_worker(redis_url, queues, env, worker_class='tests.helpers.workers.DiesAfterPop', extra=FAST)
    assert dying.wait(30) == -signal.SIGKILL, output(dying)
    died_at = server_now(connection)
    assert intermediate(connection, 'lost') == [job.id] and job.id in taken(connection, 'lost')
    survivor = start_worker(redis_url, ['lost'], env, extra=FAST)
    try:
        assert wait_for(lambda: spans(connection, 'killed').get(job.id, [None, None])[1] is not None,
                        timeout=TTL + 1 + SLACK + 10), output(survivor)
        started = spans(connection, 'killed')[job.id][0]
        # not before its take lapsed (the fetch came a moment before the kill), and within the hold ttl, plus one
        # hand-back period (1 s here), plus the slack of a loaded machine
        assert died_at + TTL - 1 < started <= died_at + TTL + 1 + SLACK, (started - died_at, output(survivor))
        time.sleep(1.5)  # one more hand-back period: nothing more runs
        assert len(connection.lrange('test:span:killed', 0, -1)) == 2  # one start, one end: it ran once
        assert 'handed back to its queue' in output(survivor)
    finally:
        stop(survivor)
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert job.id not in FailedJobRegistry('lost', connection=connection)
    assert intermediate(connection, 'lost') == [] and taken(connection, 'lost') == {}


@pytest.mark.long
def test_a_worker_stopped_past_its_hold_ttl_between_its_fetch_and_the_start_does_not_run_the_job_handed_back(
        connection, redis_url, worker_env):
    """SIGSTOP between the fetch and the job's start, for longer than the hold ttl (a paused VM): another worker
    hands the job back and runs it; the stopped worker, resumed, finds at its start check that the take is no longer
    its own, deletes the execution it wrote and does not run the job. It runs once."""
    q = PolicyQueue('stopped', connection=connection)
    job = _enqueue(q, 'plain', 'stopped')
    env = dict(worker_env, **{HOLD_TTL_ENV: str(TTL)})
    paused = start_worker(redis_url, ['stopped'], env, worker_class='tests.helpers.workers.StopsAfterPop',
                          burst=True, extra=FAST)
    survivor = None
    try:
        assert wait_for(lambda: _state(paused.pid) == 'T', timeout=30), output(paused)
        assert intermediate(connection, 'stopped') == [job.id]
        survivor = start_worker(redis_url, ['stopped'], env, extra=FAST + ['--name', 'survivor'])
        assert wait_for(lambda: spans(connection, 'stopped').get(job.id, [None, None])[1] is not None,
                        timeout=TTL + 1 + SLACK + 10), output(survivor)
        os.kill(paused.pid, signal.SIGCONT)
        # (not waiting for the burst worker to quit: rq 3's unsubscribe on redis-py 8.2 can wait 60 s for its pubsub
        # thread at teardown, which has nothing to do with this)
        assert wait_for(lambda: 'was handed back to' in output(paused), timeout=30), output(paused)
        time.sleep(1.5)
        records = spans(connection, 'stopped')
        assert list(records) == [job.id] and records[job.id][2] == 'survivor'
        assert len(connection.lrange('test:span:stopped', 0, -1)) == 2  # one start, one end: once
    finally:
        if _state(paused.pid) == 'T':
            os.kill(paused.pid, signal.SIGCONT)
        stop(paused, *([survivor] if survivor else []))
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert job.id not in FailedJobRegistry('stopped', connection=connection)
    assert connection.zcard(ExecutionRegistry.key_template.format(job.id)) == 0  # the paused worker's went
