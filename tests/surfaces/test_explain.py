"""``rq_policies.explain`` and ``rq-policies explain JOB_ID``: each policy's named reason, from Redis alone."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest
from rq import Queue

from rq_policies import (
    Debounce,
    DuplicateJob,
    Loner,
    PolicyQueue,
    PolicySimpleWorker,
    QueueSlot,
    Throttle,
    UnknownJob,
    explain,
)
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.surfaces.explainer import lines
from tests.helpers import jobs, lock_jobs
from tests.helpers.workers import start_worker, stop, wait_for


def verdicts(answer):
    return {part['policy']: part['verdict'] for part in answer['policies']}


def test_an_unknown_or_malformed_id_is_a_clear_error(connection):
    with pytest.raises(UnknownJob, match="no job 'nope' in Redis"):
        explain('nope', connection=connection)
    with pytest.raises(ValueError, match='job_id'):
        explain('', connection=connection)


def test_a_job_without_policies_says_so(connection):
    job = Queue('plain', connection=connection).enqueue(jobs.plain, 1)
    answer = explain(job.id, connection=connection)
    assert answer['status'] == 'queued' and answer['queue'] == 'plain' and answer['position'] == 0
    assert answer['policies'] == []


def test_a_waiting_loner_holds_its_identity_and_a_replaced_one_says_by_whom(connection):
    q = PolicyQueue('ex-loner', connection=connection)
    q.enqueue(jobs.plain, 0)
    job = q.enqueue(lock_jobs.replaced, 'acme', 'one', check='one')
    answer = explain(job.id, connection=connection)
    assert answer['position'] == 1
    assert verdicts(answer)['loner'].startswith('holds identity ')
    assert '(Loner until started)' in verdicts(answer)['loner']
    again = q.enqueue(lock_jobs.replaced, 'acme', 'two', check='two')
    assert 'payload was replaced in place by the enqueue of job' in verdicts(explain(again.id, connection=connection))[
        'loner']
    forced = q.force(lock_jobs.replaced, 'acme', 'three', check='three')
    assert f'is held by job {job.id}' in verdicts(explain(forced.id, connection=connection))['loner']


def test_until_finished_holds_while_it_runs_and_frees_when_it_ends(connection, redis_url, worker_env):
    q = PolicyQueue('ex-fin', connection=connection)
    job = q.enqueue(lock_jobs.held, 'ex-fin', 2)
    worker = start_worker(redis_url, ['ex-fin'], worker_env)
    try:
        assert wait_for(lambda: connection.llen('test:ran:ex-fin') == 1)
        answer = explain(job.id, connection=connection)
        assert answer['status'] == 'started' and answer['worker']
        assert '(Loner until finished)' in verdicts(answer)['loner']
        assert wait_for(lambda: explain(job.id, connection=connection)['status'] == 'finished')
        assert verdicts(explain(job.id, connection=connection))['loner'].startswith('holds nothing')
    finally:
        stop(worker)


def test_throttle_slot_owner_and_pending_trailing_job(connection):
    q = PolicyQueue('ex-throttle', connection=connection)
    first = q.enqueue(jobs.plain, 1, policy=Throttle(3600, trailing=True))
    trailing = q.enqueue(jobs.plain, 1, policy=Throttle(3600, trailing=True))
    assert 'owns the current 3600 s slot' in verdicts(explain(first.id, connection=connection))['throttle']
    assert 'pending trailing job of the window ending at' in verdicts(
        explain(trailing.id, connection=connection))['throttle']


def test_debounce_pending_job(connection):
    q = PolicyQueue('ex-debounce', connection=connection)
    job = q.enqueue(jobs.plain, 1, policy=Debounce(60))
    assert verdicts(explain(job.id, connection=connection))['debounce'].startswith('pending debounced job, runs at')


def test_a_queue_at_its_cap_names_its_holders(connection):
    QueueSlot.set('ex-cap', 1, connection=connection)
    assert QueueSlot.acquire('ex-cap', 1, token='host:1:1:1', connection=connection)
    job = PolicyQueue('ex-cap', connection=connection).enqueue(jobs.plain, 1)
    verdict = verdicts(explain(job.id, connection=connection))['queue_slot']
    assert verdict.startswith('queue at cap 1/1, holders: host:1:1:1 (expires in')


def test_the_command_prints_lines_or_json_and_one_line_errors(connection, redis_url, worker_env):
    job = PolicyQueue('ex-cli', connection=connection).enqueue(jobs.sweep_cache, 1)
    base = [sys.executable, '-m', 'rq_policies', 'explain']
    out = subprocess.run(base + [job.id, '--url', redis_url], env=worker_env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"job {job.id}: queued, queue 'ex-cli', position 0"
    assert 'holds identity' in out.stdout
    out = subprocess.run(base + [job.id, '--json', '--url', redis_url], env=worker_env, capture_output=True,
                         text=True)
    assert json.loads(out.stdout)['policies'][0]['holds'] is True
    out = subprocess.run(base + ['nope', '--url', redis_url], env=worker_env, capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.startswith("Error: no job 'nope'") and len(out.stderr.splitlines()) == 1


def test_explain_answers_in_50_ms_beside_100000_live_identities(connection):
    with connection.pipeline(transaction=False) as pipe:
        for i in range(100_000):
            pipe.set(f'{RQ}:policies:loner:ex-scale:{i:064x}', f'filler-{i}')
            if i % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()
    q = PolicyQueue('ex-scale', connection=connection)
    job = q.enqueue(jobs.plain, 1, policy=(Loner(until='finished'), Throttle(60)))
    times = []
    for _ in range(20):
        start = time.perf_counter()
        answer = explain(job.id, connection=connection)
        times.append(time.perf_counter() - start)
    assert set(verdicts(answer)) == {'loner', 'throttle'}
    assert statistics.median(times) <= 0.050, times


# -- ids with no job hash: superseded pending jobs, dropped enqueues ------------------------------------------------


def test_a_kept_debounce_handle_and_explain_on_the_first_id_name_the_pending_job(connection):
    """Five replacements rewrite the first job in place: the handle the app kept reads it scheduled with the last
    payload, and explain on its id (the first id) names the pending job, which is itself."""
    q = PolicyQueue('ex-gone', connection=connection)
    first = q.enqueue(jobs.plain, 1, policy=Debounce(60))
    handles = [q.enqueue(jobs.plain, 1, policy=Debounce(60), meta={'v': i}) for i in range(5)]
    assert {h.id for h in handles} == {first.id}
    assert first.get_status() == 'scheduled'
    first.refresh()
    assert first.meta == {'v': 4} and first.args == (1,)
    answer = explain(first.id, connection=connection)
    assert answer['exists'] is True and answer['status'] == 'scheduled'
    assert verdicts(answer)['debounce'].startswith('pending debounced job, runs at')
    forced = q.force(jobs.plain, 1, policy=Debounce(60))  # a force drops the pending job, and says so
    assert verdicts(explain(first.id, connection=connection))['debounce'].startswith(f'superseded by job {forced.id}')


def test_explain_on_a_merged_call_names_the_pending_job(connection):
    """An enqueue given job_id= whose payload went into the pending job: its own id was never a job, and explain on
    it names the job its payload went into."""
    q = PolicyQueue('ex-gone', connection=connection)
    pending = q.enqueue(jobs.plain, 3, policy=Debounce(60))
    merged = q.enqueue(jobs.plain, 3, policy=Debounce(60), job_id='ex-merged-call')
    assert merged.id == pending.id and not connection.exists(f'{RQ}:job:ex-merged-call')
    answer = explain('ex-merged-call', connection=connection)
    assert answer['exists'] is False and answer['queue'] == 'ex-gone'
    assert lines(answer)[0] == "job ex-merged-call: not in Redis, queue 'ex-gone'"
    assert lines(answer)[1].split(None, 1)[1].startswith(f'merged into pending job {pending.id}')
    [part] = answer['policies']
    assert part['runs_as'] == pending.id and part['merged'] is True
    assert part['verdict'].startswith(f'merged into pending job {pending.id} (scheduled now)')
    # the same for a trailing throttle
    throttled = Throttle(3600, trailing=True)
    q.enqueue(jobs.plain, 4, policy=throttled)
    trailing = q.enqueue(jobs.plain, 4, policy=throttled)
    q.enqueue(jobs.plain, 4, policy=throttled, job_id='ex-merged-extra')
    part = explain('ex-merged-extra', connection=connection)['policies'][0]
    assert part['policy'] == 'throttle' and part['runs_as'] == trailing.id
    assert part['verdict'].startswith(f'merged into pending job {trailing.id}')


@pytest.mark.parametrize('policy, name', [(Debounce(60), 'debounce'), (Throttle(3600, trailing=True), 'throttle')])
def test_explain_follows_a_chain_of_ids_superseded_before_the_upgrade(connection, policy, name):
    """Ids superseded one by another before pending jobs were rewritten in place (each deleted, its tombstone naming
    the next): explain on the earliest follows the chain to the job that will run."""
    q = PolicyQueue('ex-chain', connection=connection)
    if name == 'throttle':
        q.enqueue(jobs.plain, 5, policy=policy)  # the window's winner
    pending = q.enqueue(jobs.plain, 5, policy=policy)
    # what 0.2 left: a superseded b, b superseded by c, c superseded by the pending job
    connection.set(keys.superseded('old-a'), f'{name} old-b', ex=60)
    connection.set(keys.superseded('old-b'), f'{name} old-c', ex=60)
    connection.set(keys.superseded('old-c'), f'{name} {pending.id}', ex=60)
    answer = explain('old-a', connection=connection)
    [part] = answer['policies']
    assert part['superseded_by'] == 'old-b' and part['runs_as'] == pending.id
    assert part['chain'] == ['old-b', 'old-c', pending.id] and answer['queue'] == 'ex-chain'
    assert f'the job that runs is {pending.id} (scheduled now)' in part['verdict']
    assert pending.id in part['change']
    # one replacement: named as it was
    single = explain('old-c', connection=connection)['policies'][0]
    assert single['verdict'].startswith(f'superseded by job {pending.id} (scheduled now)')
    # a chain that loops or ends in nothing stops
    connection.set(keys.superseded('loop-a'), f'{name} loop-b', ex=60)
    connection.set(keys.superseded('loop-b'), f'{name} loop-a', ex=60)
    assert explain('loop-a', connection=connection)['policies'][0]['chain'] == ['loop-b', 'loop-a']


def test_a_pending_job_enqueued_again_under_its_own_id_is_not_superseded_by_itself(connection, redis_url, monkeypatch):
    """A debounced enqueue reusing the pending job's id rewrites it in place. It used to leave a tombstone on its own
    id, so the fetch dropped the job as a superseded one: it never ran. Its rewrite guard (lib/rewrite_guard.lua)
    does not drop it."""
    monkeypatch.setenv('REDIS_URL', redis_url)  # tests/helpers/jobs.py records what ran through it
    q = PolicyQueue('ex-self', connection=connection)
    q.enqueue(jobs.record, 'ex-self', policy=Debounce(1), job_id='ex-self-job')
    again = q.enqueue(jobs.record, 'ex-self', policy=Debounce(1), job_id='ex-self-job')  # the same identity
    assert again.id == 'ex-self-job'
    assert connection.get(keys.superseded('ex-self-job')).startswith(b'rewrite ')  # a guard, not a tombstone
    assert verdicts(explain('ex-self-job', connection=connection))['debounce'].startswith('pending debounced job')
    time.sleep(2.2)  # due a second (whole seconds) after the call
    PolicySimpleWorker([q], connection=connection).work(burst=True, with_scheduler=True)
    assert connection.lrange('test:ran:ex-self', 0, -1) == [b'ex-self-job']
    assert not connection.exists(keys.superseded('ex-self-job'))  # the guard went with the job's move


def test_a_merged_id_chosen_again_runs(connection, redis_url, monkeypatch):
    """A pending job x, an enqueue given id y merged into it (y's merge record), then x chosen again: one job, x, runs
    once with the last payload."""
    monkeypatch.setenv('REDIS_URL', redis_url)  # tests/helpers/jobs.py records what ran through it
    q = PolicyQueue('ex-again', connection=connection)
    q.enqueue(jobs.record, 'ex-again', policy=Debounce(1), job_id='ex-again-x')
    assert q.enqueue(jobs.record, 'ex-again', policy=Debounce(1), job_id='ex-again-y').id == 'ex-again-x'
    assert connection.get(keys.superseded('ex-again-y')).startswith(b'debounce ex-again-x merged ')
    assert q.enqueue(jobs.record, 'ex-again', policy=Debounce(1), job_id='ex-again-x').id == 'ex-again-x'
    time.sleep(2.2)  # due a second (whole seconds) after the call
    PolicySimpleWorker([q], connection=connection).work(burst=True, with_scheduler=True)
    assert connection.lrange('test:ran:ex-again', 0, -1) == [b'ex-again-x']


def test_an_enqueue_dropped_under_a_chosen_id_says_who_held_it(connection):
    q = PolicyQueue('ex-drop', connection=connection)
    holder = q.enqueue(jobs.plain, 3, policy=Loner())
    assert q.enqueue(jobs.plain, 3, policy=Loner(), job_id='ex-drop-1') is None
    answer = explain('ex-drop-1', connection=connection)
    assert answer['exists'] is False and answer['queue'] == 'ex-drop'
    assert verdicts(answer)['loner'].startswith('dropped at enqueue (0 s ago): held by job ' + holder.id)
    assert 0 < connection.ttl(keys.dropped('ex-drop-1')) <= keys.DROPPED_SECONDS
    # The hinted fast path (a probe: this process just saw the identity held) records its drop the same way.
    assert q.enqueue(jobs.plain, 3, policy=Loner(), job_id='ex-drop-2') is None
    assert f'held by job {holder.id}' in verdicts(explain('ex-drop-2', connection=connection))['loner']
    with pytest.raises(DuplicateJob):
        q.enqueue(jobs.plain, 3, policy=Loner(on_conflict='raise'), job_id='ex-drop-3')
    assert f'held by job {holder.id}' in verdicts(explain('ex-drop-3', connection=connection))['loner']
    slot = q.enqueue(jobs.plain, 4, policy=Throttle(3600))
    assert q.enqueue(jobs.plain, 4, policy=Throttle(3600), job_id='ex-drop-4') is None
    verdict = verdicts(explain('ex-drop-4', connection=connection))['throttle']
    assert verdict.startswith(f'dropped at enqueue: held by job {slot.id}, which owned the slot ending at ')
    # Without job_id= nobody knows the dropped call's id: the common path writes no record.
    before = sorted(connection.scan_iter(f'{RQ}:policies:*'))
    assert q.enqueue(jobs.plain, 3, policy=Loner()) is None
    assert q.enqueue(jobs.plain, 4, policy=Throttle(3600)) is None
    assert sorted(connection.scan_iter(f'{RQ}:policies:*')) == before
    # An id that was never seen is still a clear error.
    with pytest.raises(UnknownJob):
        explain('ex-drop-never', connection=connection)


def test_a_dropped_enqueue_whose_reply_is_lost_records_the_same_drop(connection, fault_proxy):
    """The drop record rides the admission's drop path: a replayed (lost-reply) drop writes the same record again
    and nothing else (no job hash, no queue entry)."""
    from tests.helpers.faults import ADMIT_WRITE, load, lose_reply, producer

    load(connection, 'admit')
    holder = PolicyQueue('ex-drop', connection=connection).enqueue(jobs.plain, 5, policy=Loner())
    q = PolicyQueue('ex-drop', connection=producer(fault_proxy))
    lose_reply(fault_proxy, 'drop', ADMIT_WRITE)
    assert q.enqueue(jobs.plain, 5, policy=Loner(), job_id='ex-lost') is None
    assert fault_proxy.seen(ADMIT_WRITE) >= 2
    assert f'held by job {holder.id}' in verdicts(explain('ex-lost', connection=connection))['loner']
    assert not connection.exists(f'{RQ}:job:ex-lost')
    assert connection.lrange(f'{RQ}:queue:ex-drop', 0, -1) == [holder.id.encode()]
