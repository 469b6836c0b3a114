"""Batch with real forking PolicyWorkers (``rq worker -w rq_policies.PolicyWorker``) in subprocesses, SIGKILLed (the
worker, its group and its horse) while batches run. Members come while the workers run, over many keys; at the end
every member is in exactly one batch, every batch succeeded (a killed run is rq's abandoned job, retried by its
``Retry``), and each batch formed within ``max_wait`` plus the fetch delay of its due time.

``BATCH_MEMBERS`` sets the number of members (default 2,000 over 50 keys; the issue's 10,000 is
``BATCH_MEMBERS=10000``, about a minute on a quiet 2-core machine)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

import pytest
from rq import Retry
from rq.job import Job
from rq.registry import StartedJobRegistry

from rq_policies import Batch, PolicyQueue, batch_of
from tests.helpers import batch_jobs
from tests.helpers.workers import descendants, output, start_worker, stop, wait_for

MEMBERS = int(os.environ.get('BATCH_MEMBERS', '2000'))
KEYS = 50
SIZE = 10
MAX_WAIT = 0.5
#: The p99 of a batch's formation after its due time the test accepts: a loaded 2-core machine (the workers, this
#: process enqueueing, the other suites) measured up to ~1 s; the design's bound is a fetch's delay, not a timing.
P99_BOUND = 5.0


def _kill_group(proc) -> None:
    for pid in {proc.pid} | descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(10)


def _p(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.long
def test_every_member_runs_in_exactly_one_successful_batch_under_sigkilled_workers(connection, redis_url,
                                                                                   worker_env):
    q = PolicyQueue('bw', connection=connection)
    policy = Batch(key=batch_jobs.shop_of, size=SIZE, max_wait=MAX_WAIT)
    rng = random.Random(35)
    procs = [start_worker(redis_url, ['bw'], worker_env) for _ in range(3)]
    members: dict[int, Job] = {}
    kills = 0

    def kill_one_running() -> bool:
        """SIGKILL a worker whose horse runs a batch (the worker, its group, its horse), and start another."""
        running = [proc for proc in procs if descendants(proc.pid)]
        if not running:
            return False
        victim = rng.choice(running)
        procs.remove(victim)
        _kill_group(victim)
        procs.append(start_worker(redis_url, ['bw'], worker_env))
        return True

    try:
        next_kill = time.monotonic() + 1.0
        for i in range(MEMBERS):
            shop = f's{rng.randrange(KEYS)}'
            members[i] = q.enqueue(batch_jobs.collect_slowly, {'shop': shop, 'id': i, 'sleep': 0.05}, policy=policy,
                                   retry=Retry(max=5))
            if i % 10 == 9:
                time.sleep(0.01)  # members keep coming for a few seconds: keys fill to size and wait out max_wait
            if time.monotonic() >= next_kill and kill_one_running():
                kills += 1
                next_kill = time.monotonic() + 1.0

        def formed_all() -> bool:
            return all(connection.hexists(m.key, 'batch_id') for m in members.values())

        deadline = time.monotonic() + 120
        while not formed_all() and time.monotonic() < deadline:
            if kills < 3 and kill_one_running():
                kills += 1
            time.sleep(0.3)
        assert formed_all(), output(procs[0])

        def settled() -> bool:
            batches = {connection.hget(m.key, 'batch_id') for m in members.values()}
            states = [connection.hget(Job.redis_job_namespace_prefix.encode() + b, 'status') for b in batches]
            return all(s in (b'finished', b'started', b'failed') for s in states) and connection.llen(q.key) == 0

        assert wait_for(settled, 120), output(procs[0])
    finally:
        for proc in procs:
            stop(proc)
    # The batches the killed workers ran are rq's abandoned jobs: its maintenance retries them (every 10 minutes by
    # default); with every worker stopped, it is asked at once, and a burst worker runs the retries.
    StartedJobRegistry('bw', connection=connection).cleanup(timestamp=time.time() + 10**6)
    last = start_worker(redis_url, ['bw'], worker_env, burst=True)
    try:
        last.wait(120)
    finally:
        stop(last)
    assert kills >= 1

    # Each member is in exactly one batch: the batches' member lists partition the members, and each member's
    # batch_id names the batch that lists it.
    by_batch: dict[str, list[str]] = {}
    for m in members.values():
        by_batch.setdefault(batch_of(m).id, []).append(m.id)
    listed: dict[str, str] = {}
    index = {m.id: i for i, m in members.items()}
    for batch_id in by_batch:
        batch = Job.fetch(batch_id, connection=connection)
        assert batch.get_status() == 'finished', (batch_id, batch.get_status(), output(last))
        names = connection.hget(batch.key, 'policies_batch_members').decode().split(' ')
        assert sorted(names) == sorted(by_batch[batch_id])
        assert 1 <= len(names) <= SIZE
        assert [item['id'] for item in batch.args[0]] == [index[n] for n in names]  # in admission order
        for name in names:
            assert name not in listed
            listed[name] = batch_id
        assert len({item['shop'] for item in batch.args[0]}) == 1
    assert set(listed) == set(index)
    # Each member's payload ran in a run that ended (a killed run records no end; rq's retry ran it again).
    ended: dict[str, int] = {}
    ran = set()
    for line in connection.lrange('test:batch:runs', 0, -1):
        jid, _, items = line.decode().split(' ')
        ended[jid] = ended.get(jid, 0) + 1
        ran.update(int(i) for i in items.split(','))
    assert set(ended) == set(by_batch) and ran == set(members)
    twice = sum(n - 1 for n in ended.values())
    assert twice <= kills  # a horse killed after its run's end record and before rq's: the one at-least-once case

    # Formation delay: a batch is due when its size-th member came, or max_wait after its first; it forms at a
    # fetch after that (server clock on both sides).
    delays = []
    for batch_id in by_batch:
        batch = Job.fetch(batch_id, connection=connection)
        ordered = connection.hget(batch.key, 'policies_batch_members').decode().split(' ')
        came = [float(connection.hget(Job.redis_job_namespace_prefix + n, 'batch_at')) for n in ordered]
        due = came[SIZE - 1] if len(came) == SIZE else came[0] + MAX_WAIT
        formed = float(connection.hget(batch.key, 'batch_formed_at'))  # enqueued_at moves on a retry
        assert formed >= due - 1e-3 or len(came) == SIZE, (batch_id, formed, due)
        delays.append(formed - due)
    p50, p99, worst = _p(delays, 0.5), _p(delays, 0.99), max(delays)
    print(f'\nbatch: {MEMBERS} members over {KEYS} keys, size {SIZE}, max_wait {MAX_WAIT} s, {len(by_batch)} '
          f'batches, {kills} workers SIGKILLed, {twice} run(s) ended twice; formed after due: p50 {p50 * 1000:.0f} '
          f'ms, p99 {p99 * 1000:.0f} ms, max {worst * 1000:.0f} ms')
    assert p99 <= P99_BOUND
