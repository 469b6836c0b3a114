"""Fair with real forking PolicyWorkers (``rq worker -w rq_policies.PolicyWorker``) in subprocesses, killed with real
signals. Each job records its start ordinal (one INCR on the server as it starts, tests/helpers/fair_jobs.py), so the
tests read the order jobs actually started in. Two workers can record two starts in the other order than their
fetches took them (each INCRs from its own horse): the bounds below allow that one swap per worker and no more."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from rq_policies import Fair, PolicyQueue
from tests.helpers import fair_jobs
from tests.helpers.workers import descendants as _descendants
from tests.helpers.workers import output, start_worker, stop, wait_for

SCOPE = fair_jobs.SCOPE


def _workers(redis_url, env, count, extra=None):
    return [start_worker(redis_url, ['fair'], env, extra=extra) for _ in range(count)]


def _stop_all(procs):
    for proc in procs:
        stop(proc)


def _bulk(q, n, tag, tenant, seconds=0.0, plan='free'):
    data = PolicyQueue.prepare_data(fair_jobs.work, (tag, seconds), {'tenant': tenant, 'plan': plan})
    q.enqueue_many([data] * n)


@pytest.mark.long
def test_weights_3_and_1_every_200_consecutive_starts_within_3_plus_or_minus_0_4(connection, redis_url, worker_env):
    q = PolicyQueue('fair', connection=connection)
    _bulk(q, 450, 'ratio', 'pro', plan='pro')
    _bulk(q, 150, 'ratio', 'free')
    procs = _workers(redis_url, worker_env, 2)
    try:
        assert wait_for(lambda: len(fair_jobs.starts(connection, 'ratio')) == 600, 240), output(procs[0])
    finally:
        _stop_all(procs)
    order = [tenant for _, tenant, _ in fair_jobs.starts(connection, 'ratio')]
    # Both keys stay backlogged until one's last start: every window of 200 up to there.
    end = min(max(i for i, t in enumerate(order) if t == 'pro'), max(i for i, t in enumerate(order) if t == 'free'))
    windows = 0
    for start in range(0, end - 200 + 2):
        window = order[start:start + 200]
        pro, free = window.count('pro'), window.count('free')
        assert 2.6 <= pro / free <= 3.4, (start, pro, free)
        windows += 1
    assert windows >= 350, windows


@pytest.mark.long
def test_a_newcomer_behind_5000_waiting_starts_within_one_round_of_its_enqueue(connection, redis_url, worker_env):
    q = PolicyQueue('fair', connection=connection)
    _bulk(q, 5000, 'newcomer', 'big', seconds=0.01)
    workers = 2
    procs = _workers(redis_url, worker_env, workers)
    try:
        assert wait_for(lambda: len(fair_jobs.starts(connection, 'newcomer')) >= 20, 60), output(procs[0])
        for i in range(20):
            job = q.enqueue(fair_jobs.work, 'newcomer', 0.01, tenant='small')
            # Counted from the enqueue's return (the starts during its own round trip are not the turns' doing);
            # tests/fair/test_fair.py checks the bound exactly, fetch by fetch.
            before = int(connection.get('test:fair:newcomer:n'))

            def started(wanted=job.id):
                return any(job_id == wanted for _, _, job_id in fair_jobs.starts(connection, 'newcomer')[-50:])

            assert wait_for(started, 30), output(procs[0])
            at = next(n for n, _, job_id in fair_jobs.starts(connection, 'newcomer') if job_id == job.id)
            # 2 keys take turns: the newcomer is at most the 2nd start after its enqueue, plus what the recording
            # skews (a start is recorded by its horse, after a fork): the jobs the workers had taken before the
            # enqueue and record after it (one each), and those the other worker records while the newcomer's horse
            # starts (one each), and under CI's load a few more forks recorded late (10 against 6 once). Behind the
            # backlog it would be the 5,000th: 20 keeps the test a liveness bound; test_fair.py holds the exact one.
            assert at - before <= 20, (i, at - before)
    finally:
        _stop_all(procs)
    assert Fair.status(SCOPE, 'big', 'fair', connection=connection).waiting > 3000  # 'big' was backlogged throughout


@pytest.mark.long
def test_a_paused_key_starts_nothing_until_resumed_across_a_worker_restart_and_others_flow(connection, redis_url,
                                                                                          worker_env):
    q = PolicyQueue('fair', connection=connection)
    _bulk(q, 150, 'pause', 'a', seconds=0.02)
    _bulk(q, 150, 'pause', 'b', seconds=0.02)
    procs = _workers(redis_url, worker_env, 2)
    try:
        assert wait_for(lambda: len(fair_jobs.starts(connection, 'pause')) >= 40, 60), output(procs[0])
        Fair.pause(SCOPE, 'a', connection=connection)
        time.sleep(0.5)  # the jobs the workers had taken before the pause start now
        a_started = [j for _, t, j in fair_jobs.starts(connection, 'pause') if t == 'a']
        a_waiting = Fair.status(SCOPE, 'a', 'fair', connection=connection).waiting
        # b alone gets every start: every b job runs while a waits. That no fetch comes back empty while b waits (b
        # gets the queue's whole rate, not its half share) is test_fair.py's pause test, fetch by fetch: a rate
        # measured here, over a second of a shared machine, was a timing and failed under load.
        assert wait_for(lambda: sum(1 for _, t, _ in fair_jobs.starts(connection, 'pause') if t == 'b') == 150, 60)
        assert [j for _, t, j in fair_jobs.starts(connection, 'pause') if t == 'a'] == a_started
        assert Fair.status(SCOPE, 'a', 'fair', connection=connection).waiting == a_waiting > 0
        # The pause survives the workers: new ones start nothing of a either.
        _stop_all(procs)
        procs = _workers(redis_url, worker_env, 1)
        time.sleep(2.0)
        assert [j for _, t, j in fair_jobs.starts(connection, 'pause') if t == 'a'] == a_started
        Fair.resume(SCOPE, 'a', connection=connection)
        assert wait_for(lambda: sum(1 for _, t, _ in fair_jobs.starts(connection, 'pause') if t == 'a') == 150, 60), \
            output(procs[0])
    finally:
        _stop_all(procs)


@pytest.mark.long
def test_a_worker_sigkilled_mid_job_costs_no_key_its_turns(connection, redis_url, worker_env):
    q = PolicyQueue('fair', connection=connection)
    for tenant in ('a', 'b', 'c'):
        _bulk(q, 12, 'kill', tenant, seconds=0.3)
    victim, other = _workers(redis_url, worker_env, 2)
    procs = [victim, other]
    try:
        assert wait_for(lambda: len(fair_jobs.starts(connection, 'kill')) >= 6, 60), output(victim)
        for pid in {victim.pid} | _descendants(victim.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        victim.wait(10)
        killed_at = len(fair_jobs.starts(connection, 'kill'))
        procs.append(start_worker(redis_url, ['fair'], worker_env))
        # Every job but the one killed mid-run starts (that one is rq's: its abandoned-job handling), and no key is
        # left with a waiting job (35 starts can come while the 36th job still waits its turn).
        assert wait_for(lambda: len(fair_jobs.starts(connection, 'kill')) >= 35 and all(
            Fair.status(SCOPE, tenant, 'fair', connection=connection).waiting == 0 for tenant in ('a', 'b', 'c')
        ), 60), output(other)
    finally:
        _stop_all(procs)
    after = [t for n, t, _ in fair_jobs.starts(connection, 'kill') if n > killed_at]
    # The keys kept taking turns after the kill: each is in every stretch of 3 + 2 starts while all wait.
    for start in range(0, min(len(after), 24) - 5 + 1):
        assert set(after[start:start + 5]) == {'a', 'b', 'c'}, (start, after)
    for tenant in ('a', 'b', 'c'):
        assert Fair.status(SCOPE, tenant, 'fair', connection=connection).waiting == 0


@pytest.mark.long
def test_with_concurrency_10_by_cost_the_running_costs_of_a_tenant_never_exceed_10(connection, redis_url, worker_env):
    q = PolicyQueue('fair', connection=connection)
    cost = {}
    for i in range(24):
        for tenant in ('a', 'b'):
            n = 1 + (i * 3 + len(tenant)) % 5
            cost[q.enqueue(fair_jobs.paged, 'paged', 0.3, tenant=tenant, pages=n).id] = n
    procs = _workers(redis_url, worker_env, 4)
    try:
        assert wait_for(lambda: connection.llen('test:fair:paged') == 96, 180), output(procs[0])
    finally:
        _stop_all(procs)
    events = [raw.decode().split(' ') for raw in connection.lrange('test:fair:paged', 0, -1)]
    for tenant in ('a', 'b'):
        running = best = 0
        mine = sorted(((float(at), what, job_id) for t, job_id, what, at in events if t == tenant),
                      key=lambda e: (e[0], e[1] == 'start'))
        for _, what, job_id in mine:
            running += cost[job_id] if what == 'start' else -cost[job_id]
            best = max(best, running)
        assert best <= 10, (tenant, best)
