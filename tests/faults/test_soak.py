"""The soak (tests/helpers/soak.py) as a test: a bounded run; RQ_POLICIES_SOAK_SECONDS sets its length (default 30).

It restarts Redis twice (with and without its data) and loses replies through the fault proxy; every invariant,
double runs and stranded jobs included, must hold."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from rq_policies import PolicyQueue, QueueSlot
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from tests.helpers import jobs, soak
from tests.helpers.workers import fetch_as_a_worker


@pytest.mark.slow
def test_soak_keeps_every_invariant():
    seconds = float(os.environ.get('RQ_POLICIES_SOAK_SECONDS', '30'))
    results = soak.run(seconds)
    print('\n' + json.dumps(results, indent=2), file=sys.stderr)
    assert [kind for kind, _, _ in results['run']['restarts']] == ['aof', 'empty']
    assert sum(results['run']['kills'].values()) > 0
    assert sum(results['run']['lost_replies_fired'].values()) > 0  # replies were lost, and the clients resent
    for invariant in ('cap', 'lost', 'double_runs', 'stranded', 'loner', 'throttle', 'keyed', 'leaks'):
        assert results[invariant]['ok'], (invariant, results[invariant])
    assert results['cap']['runs'] > 0 and results['loner']['jobs'] > 0 and results['throttle']['slots'] > 0
    assert results['run']['drained'], results['run']['backlog_left']
    # A second SIGTERM sent to a worker still busy 1.3 s after the first is a cold shutdown, seen in its log.
    if results['run']['kills'].get('cold_second_signal'):
        assert results['run']['cold_shutdowns'] > 0, results['run']
    assert results['ok']


# -- the checks themselves, on records written here: each one fails on what it is meant to catch --------------------


def records(run_dir: Path, produced=(), runs=()) -> Path:
    """Write soak records: producer lines, and runs as (job id, queue, start, end or None, pid)."""
    run_dir.mkdir(exist_ok=True)
    (run_dir / 'producer-0.log').write_text(''.join(json.dumps(p) + '\n' for p in produced))
    horses = {}
    for job_id, queue, start, end, pid in runs:
        horse = f'{pid}-1'
        with open(run_dir / f'jobs-{horse}.log', 'a') as f:
            f.write(json.dumps(['start', job_id, queue, 'plain', 'id0', pid, start, horse]) + '\n')
            if end is not None:
                f.write(json.dumps(['end', job_id, end, pid]) + '\n')
        horses[horse] = end if end is not None else start + 1
    (run_dir / 'horses.json').write_text(json.dumps(horses))
    return run_dir


EMPTY_RESTART = [{'kind': 'empty', 'began': 104.0, 'ended': 105.0}]


def test_a_job_id_run_twice_is_a_double_run_unless_the_data_loss_lies_between(connection, tmp_path):
    run_dir = records(tmp_path / 'r', runs=[('a', 'soak_open', 100, 101, 1), ('a', 'soak_open', 102, 103, 2)])
    found = soak.check_double_runs(soak.Run(connection, run_dir, []))
    assert not found['ok'] and found['ids_run_twice'] == 1
    run_dir = records(tmp_path / 's', runs=[('a', 'soak_open', 100, 101, 1), ('a', 'soak_open', 106, 107, 2)])
    found = soak.check_double_runs(soak.Run(connection, run_dir, EMPTY_RESTART))
    assert found['ok'] and found['across_the_data_loss'] == 1


def test_an_id_left_on_an_intermediate_list_is_stranded_unless_a_dead_worker_took_it(connection, tmp_path):
    connection.rpush(f'{RQ}:queue:soak_capped:intermediate', 'x')
    run = soak.Run(connection, records(tmp_path / 'r'), [])
    found = soak.check_stranded(run)
    assert not found['ok'] and found['stranded'] == 1
    run.takers, run.died = {'x': 4242}, {4242}
    found = soak.check_stranded(run)
    assert found['ok'] and found['taken_by_a_worker_that_died'] == 1
    connection.hset(f'{RQ}:job:y', 'status', 'failed')  # its run ended (a horse killed right after the fork)
    connection.hset(f'{RQ}:job:z', 'status', 'queued')  # waits for nothing
    connection.rpush(f'{RQ}:queue:soak_open:intermediate', 'y', 'z')
    found = soak.check_stranded(run)
    assert not found['ok'] and found['stranded'] == 1 and found['ended_but_still_listed'] == 1
    assert found['examples'] == [['soak_open', 'z', 'queued', None]]


def test_the_taker_of_a_job_is_read_from_the_claim_record_a_real_fetch_wrote(connection):
    """The stranded check excuses an id taken by a worker that died before starting it, knowing the taker from the
    fetch's claim record. Its format (length-prefixed reply items, with a hold flag per fetch policy) once changed
    under the soak's parser, which then never knew a taker: a worker SIGKILLed between its fetch and the job's start
    left a "stranded" id (a 10-minute run, seed 16)."""
    q = PolicyQueue('soak_capped', connection=connection)
    QueueSlot.set('soak_capped', 2, connection=connection)
    waiting = q.enqueue(jobs.sweep_cache, 7)
    job, fetcher = fetch_as_a_worker(q, connection)
    assert job.id == waiting.id
    records = [raw.decode() for raw in connection.mget(list(connection.scan_iter(keys.claim('*'))))]
    assert [soak.claimed_job(record) for record in records] == [waiting.id]


def test_a_cap_overlap_is_excused_only_in_the_recount_window_beside_a_job_that_ran_across_the_restart(
        connection, tmp_path):
    runs = [('a', 'soak_capped', 100, 110, 1), ('b', 'soak_capped', 105.5, 108, 2), ('c', 'soak_capped', 106, 107, 3)]
    found = soak.check_cap(soak.Run(connection, records(tmp_path / 'r', runs=runs), EMPTY_RESTART))
    assert found['ok'] and found['overlaps_in_restart_window'] == 1 and found['peak'] == 3
    assert found['peak_outside_windows'] == 2
    found = soak.check_cap(soak.Run(connection, records(tmp_path / 's', runs=runs), []))
    assert not found['ok'] and found['overlaps_real'] == 1
    late = [('a', 'soak_capped', 100, 120, 1), ('b', 'soak_capped', 115, 118, 2), ('c', 'soak_capped', 116, 117, 3)]
    found = soak.check_cap(soak.Run(connection, records(tmp_path / 't', runs=late), EMPTY_RESTART))
    assert not found['ok'] and found['overlaps_real'] == 1  # long after the window: the recount is overdue


def test_a_job_that_never_ran_is_lost_unless_it_was_admitted_before_the_data_loss(connection, tmp_path):
    produced = [['admit', 'gone-1', 'soak_open', 'plain', 'id0', 103.5, 103.4]]
    found = soak.check_lost(soak.Run(connection, records(tmp_path / 'r', produced=produced), EMPTY_RESTART))
    assert found['ok'] and found['lost_with_the_data'] == 1
    later = [['admit', 'gone-2', 'soak_open', 'plain', 'id0', 106.5, 106.4]]
    found = soak.check_lost(soak.Run(connection, records(tmp_path / 's', produced=later), EMPTY_RESTART))
    assert not found['ok'] and found['lost'] == ['gone-2']
