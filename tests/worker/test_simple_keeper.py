"""PolicySimpleWorker's one long-lived hold keeper (rq_policies.engine.ledger.WorkerKeeper).

Real workers in subprocesses and real signals for the worker's life (one keeper for many jobs, gone with the worker
whether it stops or is SIGKILLed, the hold then lapsing within hold_ttl); the keeper itself driven directly for the
ordering of a refresh and a release, and for a keeper that died between jobs. A job holding the GIL is
tests/faults/test_hold_faults.py's test_a_job_holding_the_gil_keeps_its_hold[simple-worker].
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import pytest

from rq_policies import PolicyQueue, QueueSlot
from rq_policies.engine import keys
from rq_policies.engine.ledger import Hold, WorkerKeeper, acquire_call
from rq_policies.engine.worker import HOLD_TTL_ENV
from tests.helpers.keeper_jobs import record_process
from tests.helpers.workers import output, start_worker, stop, wait_for

SIMPLE = 'rq_policies.PolicySimpleWorker'


def alive(pid: int) -> bool:
    """Is ``pid`` a live process (a zombie, exited but not reaped, is not)?"""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def records(connection) -> list[dict]:
    return [json.loads(raw) for raw in connection.lrange('test:keeper', 0, -1)]


def test_a_capped_simple_worker_runs_its_jobs_with_one_keeper_for_its_life_and_none_after(
        connection, redis_url, worker_env):
    QueueSlot.set('kept', 2, connection=connection)
    q = PolicyQueue('kept', connection=connection)
    worker = start_worker(redis_url, ['kept'], worker_env, worker_class=SIMPLE)
    try:
        for _ in range(40):
            q.enqueue(record_process, 'kept')
        assert wait_for(lambda: connection.llen('test:keeper') == 40, timeout=60), output(worker)
        assert wait_for(lambda: QueueSlot.status('kept', connection=connection).in_use == 0, timeout=5)
        seen = records(connection)
        assert {r['pid'] for r in seen} == {worker.pid}
        keepers = {pid for r in seen for pid in r['children']}
        assert len(keepers) == 1, seen  # one process for 40 capped jobs, not one per job
        (keeper,) = keepers
        assert all(r['children'] == [keeper] for r in seen), seen  # started before the first job, alive throughout
        # each job held exactly its own hold: the one before it was released before it started
        assert [r['in_use'] for r in seen] == [1] * 40
        assert alive(keeper)
        worker.send_signal(signal.SIGTERM)
        worker.wait(15)
    finally:
        stop(worker)
    assert wait_for(lambda: not alive(keeper), timeout=5), 'the keeper outlived its worker'
    assert connection.exists(keys.holds('kept')) == 0


def test_an_uncapped_simple_worker_starts_no_keeper(connection, redis_url, worker_env):
    q = PolicyQueue('free', connection=connection)
    worker = start_worker(redis_url, ['free'], worker_env, worker_class=SIMPLE)
    try:
        for _ in range(5):
            q.enqueue(record_process, 'free')
        assert wait_for(lambda: connection.llen('test:keeper') == 5, timeout=30), output(worker)
    finally:
        stop(worker)
    assert all(r['children'] == [] for r in records(connection))


@pytest.mark.long
def test_a_simple_worker_sigkilled_mid_job_takes_its_keeper_along_and_the_hold_lapses_within_hold_ttl(
        connection, redis_url, worker_env):
    QueueSlot.set('killed', 1, connection=connection)
    q = PolicyQueue('killed', connection=connection)
    env = dict(worker_env, **{HOLD_TTL_ENV: '3'})  # refreshed every second while the job runs
    worker = start_worker(redis_url, ['killed'], env, worker_class=SIMPLE)
    try:
        q.enqueue(record_process, 'killed', 60)
        assert wait_for(lambda: connection.llen('test:keeper') == 1, timeout=30), output(worker)
        (keeper,) = records(connection)[0]['children']
        time.sleep(4)  # longer than hold_ttl: the keeper's refreshes keep the hold
        assert QueueSlot.status('killed', connection=connection).in_use == 1, output(worker)
        os.kill(worker.pid, signal.SIGKILL)  # the worker alone, not its group
        killed_at = time.monotonic()
        worker.wait(10)
        assert wait_for(lambda: not alive(keeper), timeout=3, interval=0.02), 'the keeper outlived its SIGKILLed worker'
        assert time.monotonic() - killed_at < 2
        assert wait_for(lambda: QueueSlot.status('killed', connection=connection).in_use == 0, timeout=5, interval=0.05)
        # the hold was last refreshed at most a second before the kill: it lapsed within hold_ttl of it, not later
        assert time.monotonic() - killed_at < 3 + 0.5
    finally:
        stop(worker)


# -- the keeper itself ----------------------------------------------------------------------------------------------


def _hold(connection, token: str, ttl: int = 30) -> Hold:
    hold = Hold(keys.holds('race'), token, ttl, 'job')
    assert acquire_call(hold, 1000).run(connection) == 1
    return hold


def test_a_release_after_disarm_is_never_undone_by_a_refresh(connection):
    # A keeper refreshing as often as it can (every 1 ms) and a worker releasing each hold right after disarm: a
    # refresh landing after a release would write the hold back (refresh_holds.lua re-adds a hold it finds gone).
    keeper = WorkerKeeper(connection, every=0.001, ttl=30, tick=0.001)
    try:
        for i in range(150):
            hold = _hold(connection, f't{i}')
            assert keeper.arm([hold])
            time.sleep(0.002 + (i % 5) * 0.001)  # a refresh or two, and the next one mid-flight at the disarm
            keeper.disarm()
            connection.zrem(hold.ledger, hold.token)
        time.sleep(0.05)  # a refresh in flight past the disarm would have landed by now
        assert connection.zcard(keys.holds('race')) == 0
        assert connection.hgetall(keys.LAPSES) == {}
    finally:
        keeper.stop()


def test_the_keeper_refreshes_while_armed_only(connection):
    keeper = WorkerKeeper(connection, every=0.3, ttl=1, tick=0.05)
    hold = _hold(connection, 'armed', ttl=1)
    try:
        keeper.arm([hold])
        time.sleep(2.5)  # 2.5 times the hold's ttl
        assert connection.zscore(hold.ledger, hold.token) is not None
        keeper.disarm()
        time.sleep(1.5)
        assert QueueSlot.status('race', connection=connection).in_use == 0  # no refresh after the disarm: it lapsed
        assert alive(keeper.pid)
    finally:
        keeper.stop()
    assert not alive(keeper.pid or 0)


def test_a_keeper_that_died_is_replaced_at_the_next_job(connection, caplog):
    log = logging.getLogger('test-keeper')
    keeper = WorkerKeeper(connection, every=0.2, ttl=1, tick=0.05, log=log)
    try:
        keeper.arm([_hold(connection, 'first', ttl=1)])
        first = keeper.pid
        keeper.disarm()
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: not alive(first), timeout=5)
        second_hold = _hold(connection, 'second', ttl=1)
        with caplog.at_level(logging.WARNING, logger='test-keeper'):
            keeper.arm([second_hold])
        second = keeper.pid
        assert second not in (0, first)
        assert 'died; starting another' in caplog.text
        time.sleep(2)  # twice the ttl: the new keeper refreshes
        assert connection.zscore(second_hold.ledger, second_hold.token) is not None
        keeper.disarm()
    finally:
        keeper.stop()
    assert not alive(second)


@pytest.mark.long
def test_a_per_key_hold_is_kept_through_a_job_longer_than_hold_ttl(connection, redis_url, worker_env):
    # Concurrency(1) on a key: the simple worker's keeper refreshes the per-key hold too (hold_ttl 2 s, a 6 s job),
    # so a second worker cannot start the key's next job beside it.
    from tests.helpers import key_jobs

    env = dict(worker_env, **{HOLD_TTL_ENV: '2'})
    q = PolicyQueue('keyed', connection=connection)
    first = q.enqueue(key_jobs.one_per_customer, 'kept', 6, customer='k')
    worker = start_worker(redis_url, ['keyed'], env, worker_class=SIMPLE)
    other = None
    try:
        assert wait_for(lambda: connection.llen('test:keyspan:kept') == 1, timeout=30), output(worker)
        other = start_worker(redis_url, ['keyed'], env, extra=['--job-monitoring-interval', '1'])
        second = q.enqueue(key_jobs.one_per_customer, 'kept', 0.1, customer='k')
        assert wait_for(lambda: connection.llen('test:keyspan:kept') == 4, timeout=60), output(other)
    finally:
        stop(worker)
        if other is not None:
            stop(other)
    spans = key_jobs_spans(connection)
    assert spans[second.id][0] >= spans[first.id][1], spans  # one at a time on the key
    assert connection.hgetall(keys.LAPSES) == {}


def key_jobs_spans(connection) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for raw in connection.lrange('test:keyspan:kept', 0, -1):
        _, job_id, kind, at = raw.decode().split()
        found.setdefault(job_id, [0.0, 0.0])[0 if kind == 'start' else 1] = float(at)
    return found
