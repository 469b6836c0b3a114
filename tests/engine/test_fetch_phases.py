"""lua/fetch.lua's phases: the order its parts' hooks run in (rq_policies.engine.fetch.PHASES), what a fetch of a queue
without any policy state runs, and its named reply (rq_policies.engine.fetch.FetchReply)."""

from __future__ import annotations

import itertools
import pickle
import re

import pytest
from rq.queue import Queue

from rq_policies import PolicyQueue, QueueSlot
from rq_policies.engine import keys, scripts
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import PHASES, FetchReply, fetch_call, read_reply
from tests.helpers import jobs
from tests.helpers.workers import fetch_as_a_worker

PREFIX = f'{RQ}:job:'
_tokens = itertools.count()


def traced(conn, names=('q',), token=None):
    """One fetch of ``names`` with its trace on: (the decoded reply, the token)."""
    token = token or f'phases:{next(_tokens)}'
    call = fetch_call([Queue(name, connection=conn) for name in names], token, 90, PREFIX)
    call.trace = True
    return FetchReply.decode(call.run(conn)), token


def phase_of(step: str) -> str:
    return step.split(':', 1)[0]


def in_phase_order(trace) -> bool:
    """Within one job's handling (from its pop to its record), the phases never go back."""
    ranks = [PHASES.index(phase_of(step)) for step in trace]
    return ranks == sorted(ranks)


def commands(conn) -> dict[str, int]:
    stats = conn.info('commandstats')
    return {name[len('cmdstat_'):]: row['calls'] for name, row in stats.items()
            if name not in ('cmdstat_evalsha', 'cmdstat_info', 'cmdstat_config|resetstat')}


def test_a_plain_queue_without_policy_state_runs_no_part_and_six_commands(connection):
    connection.rpush(f'{RQ}:queue:q', 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', 'origin': 'q'})
    fetch_call([Queue('q', connection=connection)], 'warm', 90, PREFIX).run(connection)  # loads the script
    connection.rpush(f'{RQ}:queue:q', 'j2')
    connection.hset(PREFIX + 'j2', mapping={'status': 'queued', 'origin': 'q'})
    connection.config_resetstat()
    found, _ = traced(connection)
    assert (found.queue, found.job, found.holds) == (1, 'j2', ())
    assert found.trace == ('pop', 'record')  # no state, no part, no clock
    # no tombstone: no GET; the take noted (HSET rq:policies:taken:q, and its hash's expiry), which the work horse
    # removes when the job starts
    assert commands(connection) == {'exists': 1, 'lmove': 1, 'hgetall': 1, 'set': 1, 'hset': 1, 'expire': 1}
    assert 3590 < connection.ttl(keys.taken('q')) <= 3600
    assert [connection.hget(keys.taken('q'), 'j2').startswith(b'phases:')] == [True]  # the claim token, enqueued_at
    assert dict(zip(found.hash[::2], found.hash[1::2])) == {b'status': b'queued', b'origin': b'q'}  # the worker's read


def test_hooks_run_in_the_documented_phase_order(connection):
    QueueSlot.set('q', 5, connection=connection)
    connection.rpush(f'{RQ}:queue:q', 'j1')
    connection.hset(PREFIX + 'j1', mapping={
        'status': 'queued', 'origin': 'q', 'policies_concurrency': '2 s:k', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'j1')
    found, token = traced(connection)
    assert found.job == 'j1'
    assert found.trace == (
        'state', 'gate:queue_rate', 'gate:queue_slot', 'pop', 'admit_job:concurrency', 'taken:loner',
        'take:queue_rate', 'take:queue_slot', 'take_job:concurrency', 'record')
    assert in_phase_order(found.trace)
    assert dict(found.holds) == {'concurrency': f'{RQ}:policies:keyholds:s:k', 'queue_slot': '1'}
    assert not connection.exists('marker')  # loner's taken freed the identity
    # The replay answers the same, named, and runs nothing else.
    again, _ = traced(connection, token=token)
    assert (again.job, again.holds, again.replayed, again.trace) == ('j1', found.holds, True, ('replay',))
    replayed = [b'queue', b'1', b'job', b'j1', b'holds', [b'queue_slot', b'1']]  # a record's strings
    claim = read_reply(replayed, [Queue('q', connection=connection)], token, 90)
    assert claim.holds[0].ledger == keys.holds('q')


def test_a_refused_job_is_parked_before_any_take_and_the_idle_answer_is_named(connection):
    connection.rpush(f'{RQ}:queue:q', 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', 'origin': 'q', 'policies_concurrency': '0 s:k'})
    found, _ = traced(connection)
    assert found.job is None and found.trace[-1] == 'idle'
    assert [phase_of(step) for step in found.trace] == ['pop', 'admit_job', 'idle']
    assert found.until is not None and found.full == () and found.waiting == 1  # a parked job: the burst waits
    assert connection.lrange(f'{RQ}:policies:keyparked:concurrency:s:k', 0, -1) == [b'j1']


def test_the_phase_list_is_the_scripts_own():
    header = scripts.source('fetch').split(']]', 1)[0]
    listed = re.findall(r'^    (\w+) +\S', header.split('The phases, in this order', 1)[1].split('A part (', 1)[0],
                        re.MULTILINE)
    assert tuple(name for name in listed if name in PHASES) == PHASES
    assert set(PHASES) <= set(listed)


def test_every_part_that_reads_the_job_at_fetch_declares_its_fields():
    root = scripts._lua_root()
    declared = scripts.part_fields()
    for path in sorted(root.joinpath('policies').iterdir(), key=lambda p: p.name):
        text = path.read_text()
        name = path.name[:-len('.lua')]
        if re.search(rf'function P\.{name}\.(taken|admit_job)\(', text):
            assert declared.get(name), f'{path.name} defines a fetch hook reading the job but declares no fields'
    fields = [field for row in declared.values() for field in row]
    assert len(fields) == len(set(fields)) and 'status' not in fields


@pytest.mark.parametrize('bad', [[b'queue', 1, b'job', b'j', b'surprise', 1]])
def test_an_unknown_reply_field_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match='surprise'):
        FetchReply.decode(bad)


def test_a_tombstone_keeps_its_marker_alive_and_the_fetch_then_drops_the_superseded_job(connection):
    lib = (scripts._lua_root() / 'lib' / 'pending.lua').read_text()
    tomb_write = connection.register_script('local rcall = redis.call\n' + lib + """
tomb_write(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]))""")
    tomb_write(args=[keys.SUPERSEDED_PREFIX, 'j9', 'debounce j10', 600])
    assert connection.get(keys.superseded('j9')) == b'debounce j10'
    assert 595 <= connection.ttl(keys.SUPERSEDED_PREFIX) <= 600  # the marker: the tombstone of no job
    tomb_write(args=[keys.SUPERSEDED_PREFIX, 'j8', 'debounce j11', 5])
    assert connection.ttl(keys.SUPERSEDED_PREFIX) > 5  # a shorter tombstone never shortens the marker
    connection.rpush(f'{RQ}:queue:q', 'j9', 'j1')
    connection.hset(PREFIX + 'j9', mapping={'status': 'queued', 'origin': 'q'})
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', 'origin': 'q'})
    found, _ = traced(connection)
    assert found.job == 'j1' and not connection.exists(PREFIX + 'j9')  # the superseded id was dropped
    assert connection.lrange(f'{RQ}:queue:q:intermediate', 0, -1) == [b'j1']


def test_a_loner_job_runs_only_loners_hook_and_reads_no_clock(connection):
    connection.rpush(f'{RQ}:queue:q', 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', 'origin': 'q', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'j1')
    connection.config_resetstat()
    found, _ = traced(connection)
    assert found.job == 'j1' and found.trace == ('pop', 'taken:loner', 'record')
    assert not connection.exists('marker')
    assert 'time' not in commands(connection)


def test_a_workers_fetch_builds_the_job_from_the_reply_and_keeps_no_job_data_in_its_claim(connection):
    q = PolicyQueue('q', connection=connection)
    QueueSlot.set('q', 2, connection=connection)
    enqueued = q.enqueue(jobs.plain, 'payload ' * 200)
    connection.config_resetstat()
    job, fetcher = fetch_as_a_worker(q, connection)
    assert job.id == enqueued.id and job.args == enqueued.args and job.origin == 'q'
    # the script's read of the job (the worker does not read the hash again), and the worker's first hand-back
    # reading its queue's takes (rq_policies.engine.fetch.hand_back)
    assert commands(connection)['hgetall'] == 2
    assert fetcher.claim.raw is None and len(fetcher.claim.holds) == 1
    # what the hold guard's slot carries (tests/worker/test_kill_shapes.py)
    assert len(pickle.dumps(fetcher.claim)) < 1000


def test_a_worker_builds_its_fetch_call_once_per_queue_list(connection):
    from rq_policies.engine.fetch import Fetcher, _worker_call

    fetcher = Fetcher()
    queues = [Queue('a', connection=connection), Queue('b', connection=connection)]
    first = _worker_call(fetcher, queues, PREFIX, True)
    assert _worker_call(fetcher, list(queues), PREFIX, True) is first  # the same queues: the same call, re-tokened
    assert _worker_call(fetcher, queues[:1], PREFIX, True) is not first
    assert _worker_call(fetcher, queues, PREFIX, False) is not first  # burst or not is part of the call


def test_the_plain_pop_drops_gone_ids_walks_the_queues_and_hands_a_policy_job_to_its_parts(connection):
    # No policy state: the plain pop. Queue a is empty, b holds an id whose job hash is gone, then a Loner's job.
    connection.rpush(f'{RQ}:queue:b', 'ghost', 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', 'origin': 'b', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'j1')
    connection.config_resetstat()
    found, token = traced(connection, names=('a', 'b'))
    assert (found.queue, found.job) == (2, 'j1')
    assert found.trace == ('pop', 'pop', 'taken:loner', 'record')  # each pop once, though the full pop took j1
    assert connection.lrange(f'{RQ}:queue:b:intermediate', 0, -1) == [b'j1']  # the gone id dropped
    assert not connection.exists('marker') and 'time' not in commands(connection)
    again, _ = traced(connection, names=('a', 'b'), token=token)
    assert (again.queue, again.job, again.replayed) == (2, 'j1', True)
    # Nothing left: the idle answer, nothing skipped, no time to look again at.
    idle, _ = traced(connection, names=('a', 'b'))
    assert (idle.job, idle.waiting, idle.full, idle.until, idle.trace) == (None, 0, (), None, ('idle',))


def test_an_expired_hold_never_counts_and_goes_when_the_ledger_reaches_its_cap(connection):
    # A crashed holder's hold outlives its expiry in the ledger until the count could matter: at the cap it is not
    # counted (the live holds are) and the take purges it; below the cap it may stay, counted by nobody.
    now = float(connection.time()[0])
    ledger = keys.holds('q')
    connection.zadd(ledger, {'dead': now - 5, 'live': now + 30})
    for jid in ('j1', 'j2', 'j3'):
        connection.rpush(f'{RQ}:queue:q', jid)
        connection.hset(PREFIX + jid, mapping={'status': 'queued', 'origin': 'q'})
    QueueSlot.set('q', 3, connection=connection)
    first, token = traced(connection)  # 2 members, cap 3: taken, nothing purged
    assert first.job == 'j1' and dict(first.holds) == {'queue_slot': '1'}
    assert {m.decode() for m in connection.zrange(ledger, 0, -1)} == {'dead', 'live', token}
    second, token2 = traced(connection)  # 3 members at cap 3, 2 live: taken, and the dead hold purged
    assert second.job == 'j2'
    assert {m.decode() for m in connection.zrange(ledger, 0, -1)} == {'live', token, token2}
    third, _ = traced(connection)  # 3 live at cap 3: full
    assert third.job is None and third.full == (1,)
