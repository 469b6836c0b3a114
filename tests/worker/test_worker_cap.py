"""QueueSlot caps end to end: real forking PolicyWorkers (`rq worker -w rq_policies.PolicyWorker`) in subprocesses,
stopped and killed with real signals.

Every job here records its start and end under the server's clock, so the tests check what actually ran at once,
not what the ledger claims.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from redis import Redis
from rq.command import send_stop_job_command
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus, Retry
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.worker import Worker

from rq_policies import PolicyQueue, PolicyWorker, QueueSlot
from rq_policies.engine import compat, keys, ledger
from rq_policies.engine.worker import HOLD_TTL_ENV
from rq_policies.surfaces.testing import RedisServer
from tests.helpers import jobs
from tests.helpers.cluster import ON_CLUSTER, ValkeyCluster, connect, not_on_cluster
from tests.helpers.records import spans
from tests.helpers.workers import assert_given_up, output, run_pool, start_worker, stop, wait_for


def concurrency(records: dict[str, list]) -> list[tuple[float, int]]:
    """(time, jobs running from then on) at every start and end."""
    events = sorted((at, delta) for start, end, _ in records.values() for at, delta in ((start, 1), (end, -1)))
    level, steps = 0, []
    for at, delta in events:
        level += delta
        steps.append((at, level))
    return steps


def peak(records: dict[str, list]) -> int:
    return max(level for _, level in concurrency(records))


def share_at_least(records: dict[str, list], level: int, until: float) -> float:
    """The share of the time from the first start to ``until`` during which at least ``level`` jobs ran."""
    steps = concurrency(records)
    first = steps[0][0]
    covered = 0.0
    for (at, running), (nxt, _) in zip(steps, steps[1:]):
        if at >= until:
            break
        if running >= level:
            covered += min(nxt, until) - at
    return covered / (until - first)


def statuses(conn: Redis, ids) -> list[str]:
    return [Job.fetch(job_id, connection=conn).get_status() for job_id in ids]


def horse_pid(conn: Redis, tag: str, timeout: float = 20) -> int:
    assert wait_for(lambda: conn.llen(f'test:pid:{tag}') > 0, timeout=timeout)
    return int(conn.lindex(f'test:pid:{tag}', -1))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.long
def test_six_workers_cap_two_never_overlap_more_than_two(connection, redis_url, worker_env):
    QueueSlot.set('reports', 2, connection=connection)
    q = PolicyQueue('reports', connection=connection)
    workers = [start_worker(redis_url, ['reports'], worker_env) for _ in range(6)]
    try:
        # All six are up and idle first, so the backlog meets the whole cluster at once (woken by the pushes).
        assert wait_for(lambda: Worker.count(queue=q) == 6, timeout=30), output(workers[0])
        batch = q.enqueue_many([PolicyQueue.prepare_data(jobs.sleep_and_record, ('reports', 0.2)) for _ in range(40)])
        assert wait_for(lambda: connection.llen('test:span:reports') == 80, timeout=60), output(workers[0])
    finally:
        for worker in workers:
            stop(worker)
    records = spans(connection, 'reports')
    assert len(records) == 40
    assert peak(records) == 2
    last_start = max(start for start, _, _ in records.values())
    # While a backlog waits, both slots are used: a queue run as if capped at 1 scores 0 here. (On a quiet machine
    # the share is about 0.75, the gaps being one release-and-wake each; on two cores also running a soak it fell to
    # 0.48, so the bar is a liveness bar, not a speed one: speed is bench/worker.py's.)
    assert share_at_least(records, 2, until=last_start) > 0.25
    assert set(statuses(connection, [job.id for job in batch])) == {JobStatus.FINISHED}
    assert QueueSlot.status('reports', connection=connection).in_use == 0
    assert connection.llen(q.intermediate_queue_key) == 0
    assert len({worker for _, _, worker in records.values()}) >= 1


def test_every_ending_of_a_job_gives_its_slot_back(connection, redis_url, worker_env):
    # One slot, default hold_ttl (90 s): a hold left behind by any ending would stall the rest past the wait below.
    QueueSlot.set('endings', 1, connection=connection)
    q = PolicyQueue('endings', connection=connection)
    ok = q.enqueue(jobs.plain, 1)
    failed = q.enqueue(jobs.fail, 2)
    retried = q.enqueue(jobs.fail, 3, retry=Retry(max=1))
    timed_out = q.enqueue(jobs.pid_and_sleep, 'endings', 10, job_timeout=1)
    crashed = q.enqueue(jobs.exit_horse, 3)
    last = q.enqueue(jobs.plain, 4)
    worker = start_worker(redis_url, ['endings'], worker_env, burst=True)
    try:
        assert worker.wait(60) == 0, output(worker)
    finally:
        stop(worker)
    assert statuses(connection, [ok.id, failed.id, retried.id, timed_out.id, crashed.id, last.id]) == [
        JobStatus.FINISHED, JobStatus.FAILED, JobStatus.FAILED, JobStatus.FAILED, JobStatus.FAILED, JobStatus.FINISHED,
    ]
    assert Job.fetch(retried.id, connection=connection).retries_left == 0  # ran twice, under the cap both times
    assert connection.exists(keys.holds('endings')) == 0
    assert connection.llen(q.intermediate_queue_key) == 0


def test_stop_command_and_a_killed_work_horse_give_the_slot_back_at_once(connection, redis_url, worker_env):
    QueueSlot.set('signals', 1, connection=connection)
    q = PolicyQueue('signals', connection=connection)
    worker = start_worker(redis_url, ['signals'], worker_env)
    try:
        stopped = q.enqueue(jobs.pid_and_sleep, 'stopped', 60)
        horse_pid(connection, 'stopped')
        assert QueueSlot.status('signals', connection=connection).in_use == 1
        send_stop_job_command(connection, stopped.id)
        assert wait_for(lambda: QueueSlot.status('signals', connection=connection).in_use == 0,
                        timeout=5), output(worker)
        assert wait_for(lambda: statuses(connection, [stopped.id]) == [JobStatus.STOPPED], timeout=5)

        killed = q.enqueue(jobs.pid_and_sleep, 'killed', 60)
        pid = horse_pid(connection, 'killed')
        assert QueueSlot.status('signals', connection=connection).in_use == 1
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: QueueSlot.status('signals', connection=connection).in_use == 0,
                        timeout=5), output(worker)
        assert wait_for(lambda: statuses(connection, [killed.id]) == [JobStatus.FAILED], timeout=5)

        after = q.enqueue(jobs.plain, 5)  # the freed slot is usable at once
        assert wait_for(lambda: statuses(connection, [after.id]) == [JobStatus.FINISHED], timeout=10)
        assert worker.poll() is None
    finally:
        stop(worker)
    assert connection.exists(keys.holds('signals')) == 0


def test_warm_shutdown_keeps_the_hold_until_the_job_ends_cold_shutdown_frees_it(connection, redis_url, worker_env):
    QueueSlot.set('shutdown', 1, connection=connection)
    q = PolicyQueue('shutdown', connection=connection)

    warm = start_worker(redis_url, ['shutdown'], worker_env)
    job = q.enqueue(jobs.pid_and_sleep, 'warm', 2)
    horse_pid(connection, 'warm')
    warm.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert warm.poll() is None
    assert QueueSlot.status('shutdown', connection=connection).in_use == 1  # the job still runs: so does its hold
    assert warm.wait(20) == 0, output(warm)
    assert statuses(connection, [job.id]) == [JobStatus.FINISHED]
    assert connection.exists(keys.holds('shutdown')) == 0

    cold = start_worker(redis_url, ['shutdown'], worker_env)
    q.enqueue(jobs.pid_and_sleep, 'cold', 60)
    pid = horse_pid(connection, 'cold')
    cold.send_signal(signal.SIGTERM)
    time.sleep(1.3)  # rq ignores a second signal within one second of the first
    cold.send_signal(signal.SIGTERM)
    cold.wait(20)
    assert not pid_alive(pid)
    assert QueueSlot.status('shutdown', connection=connection).in_use == 0
    assert connection.exists(keys.holds('shutdown')) == 0


def test_a_sigkilled_worker_holds_until_its_short_ttl_runs_out(connection, redis_url, worker_env):
    QueueSlot.set('crash', 1, connection=connection)
    q = PolicyQueue('crash', connection=connection)
    env = dict(worker_env, **{HOLD_TTL_ENV: '3'})
    # BeatsBareMidJob also sends rq's bare heartbeat on every tick: those must not carry the release either.
    worker = start_worker(redis_url, ['crash'], env, worker_class='tests.helpers.workers.BeatsBareMidJob',
                          extra=['--job-monitoring-interval', '1'])
    try:
        q.enqueue(jobs.pid_and_sleep, 'crash', 60)
        pid = horse_pid(connection, 'crash')
        # Alive, the worker refreshes its hold on every beat: it outlives its 3 s TTL while the job runs.
        time.sleep(4)
        assert QueueSlot.status('crash', connection=connection).in_use == 1
        ((_, left),) = QueueSlot.status('crash', connection=connection).holders
        assert 0 < left <= 3.1
        # The whole worker dies: the parent and its work horse (rq puts the horse in a process group of its own).
        worker.send_signal(signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        worker.wait(10)
        assert wait_for(lambda: QueueSlot.status('crash', connection=connection).in_use == 0, timeout=6)
        assert time.monotonic() - killed_at <= 4.5  # within the TTL (and a poll), no operator action
        assert QueueSlot.acquire('crash', capacity=1, token='next', connection=connection)
    finally:
        stop(worker)


@pytest.mark.long
def test_the_horse_of_a_worker_sigkilled_alone_keeps_its_hold_until_the_job_ends(connection, redis_url, worker_env):
    # kill -9 of the worker's pid alone (an OOM kill of the parent): rq's horse, in a process group of its own,
    # runs on. Its hold must outlive the TTL the dead worker can no longer refresh, and come back when the job ends.
    QueueSlot.set('orphans', 1, connection=connection)
    q = PolicyQueue('orphans', connection=connection)
    env = dict(worker_env, **{HOLD_TTL_ENV: '3'})
    first = start_worker(redis_url, ['orphans'], env, extra=['--job-monitoring-interval', '1'])
    second = None
    try:
        orphan = q.enqueue(jobs.span_on_worker, 'orphans', 12)
        assert wait_for(lambda: len(spans(connection, 'orphans')) == 1)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = time.monotonic()
        # A second worker and a second job: it may only start once the orphan's job has ended.
        second = start_worker(redis_url, ['orphans'], env, extra=['--job-monitoring-interval', '1'])
        q.enqueue(jobs.span_on_worker, 'orphans', 0.5)
        time.sleep(max(0.0, 6 - (time.monotonic() - killed_at)))  # twice the TTL the dead worker can no longer refresh
        assert spans(connection, 'orphans')[orphan.id][1] is None  # the orphan's job still runs...
        assert QueueSlot.status('orphans', connection=connection).in_use == 1, output(second)  # ...and holds the slot
        assert wait_for(lambda: len([s for s in spans(connection, 'orphans').values() if s[1]]) == 2, timeout=20)
        records = spans(connection, 'orphans')
        assert peak(records) == 1, records
        ended = records[orphan.id][1]
        (other,) = [r for job_id, r in records.items() if job_id != orphan.id]
        assert other[0] >= ended  # started after the orphan ended...
        assert other[0] - ended < 2  # ...and promptly: the horse gave its hold back, nobody waited for the TTL
        assert Job.fetch(orphan.id, connection=connection).get_status() == JobStatus.FINISHED
    finally:
        stop(first)
        if second is not None:
            stop(second)


@pytest.mark.long
def test_the_hold_guard_waits_for_a_horse_forked_just_before_its_worker_died(connection, redis_url):
    # The worker armed the guard's slot with the claim and forked the horse, then died before the horse wrote its pid
    # there: the guard waits for the pid, keeps the hold past its ttl while that horse runs, and releases it once the
    # horse has ended. (A real guard, a real forked "worker" SIGKILLed, a real horse; only the job is a sleep.)
    import logging

    from rq_policies.engine.fetch import Claim
    from rq_policies.engine.ledger import Hold
    from rq_policies.engine.worker import _HorseGuard

    assert QueueSlot.acquire('guarded', capacity=1, token='guard-test:1', ttl=2, connection=connection)
    claim = Claim('guarded-job', 'guarded', (Hold(keys.holds('guarded'), 'guard-test:1', 2),))
    worker = os.fork()
    if worker == 0:  # the worker
        code = 1
        try:
            guard = _HorseGuard(connect(redis_url), 2, 0.2, logging.getLogger('rq_policies'))
            guard.ensure()
            assert guard.arm(claim)
            if os.fork() == 0:  # its horse
                time.sleep(0.5)  # its worker is dead before it writes its pid
                guard.announce()
                time.sleep(4.5)  # the job: more than twice the hold's ttl
                os._exit(0)
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(code)
    _, status = os.waitpid(worker, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    died_at = time.monotonic()
    time.sleep(4)  # twice the ttl nobody but the guard can refresh
    assert QueueSlot.status('guarded', connection=connection).in_use == 1
    assert wait_for(lambda: QueueSlot.status('guarded', connection=connection).in_use == 0, timeout=5)
    assert 4.5 < time.monotonic() - died_at < 6.5  # released once the horse ended (at about 5 s), not aged out


def test_rolling_restart_never_runs_the_queue_over_its_cap(connection, redis_url, worker_env):
    QueueSlot.set('rolling', 2, connection=connection)
    q = PolicyQueue('rolling', connection=connection)
    old = [start_worker(redis_url, ['rolling'], worker_env, extra=['--name', f'old-{i}']) for i in range(2)]
    new: list[subprocess.Popen] = []
    try:
        for _ in range(12):
            q.enqueue(jobs.span_on_worker, 'rolling', 0.5)
        assert wait_for(lambda: len(spans(connection, 'rolling')) >= 2, timeout=30)
        # The replacements boot while the old generation still works: four workers, one cap of two.
        new = [start_worker(redis_url, ['rolling'], worker_env, extra=['--name', f'new-{i}']) for i in range(2)]
        assert wait_for(lambda: Worker.count(queue=q) == 4, timeout=30)
        for worker in old:
            worker.send_signal(signal.SIGTERM)
        for worker in old:
            assert worker.wait(30) == 0, output(worker)

        # Every job ends: SIGTERM reaching an idle worker right after its fetch raises rq's StopRequested before the
        # job starts, and the worker hands its take back to the queue (rq_policies.engine.fetch.hand_back), where a new
        # worker runs it; nothing is left on the intermediate list for rq's cleanup to fail unrun.
        def settled():
            ended = sum(1 for r in spans(connection, 'rolling').values() if r[1] is not None)
            started = len(spans(connection, 'rolling'))
            return started == ended == 12

        assert wait_for(settled, timeout=60), (spans(connection, 'rolling'), output(new[0]))
        assert connection.llen(q.intermediate_queue_key) == 0
    finally:
        for worker in old + new:
            stop(worker)
    records = spans(connection, 'rolling')
    assert peak(records) == 2
    ran_on = {worker.split('-')[0] for _, _, worker in records.values()}
    assert ran_on == {'old', 'new'}
    assert QueueSlot.status('rolling', connection=connection).in_use == 0


def test_a_stop_between_the_fetch_and_the_start_gives_the_holds_back_and_names_the_job(connection, redis_url,
                                                                                      worker_env):
    QueueSlot.set('stopped', 1, connection=connection)
    q = PolicyQueue('stopped', connection=connection)
    job = q.enqueue(jobs.plain, 0)
    worker = start_worker(redis_url, ['stopped'], worker_env,
                          extra=['--queue-class', 'tests.helpers.workers.StopAfterFetchQueue'])
    try:
        assert worker.wait(30) == 0, output(worker)
    finally:
        stop(worker)
    # Not run, not lost in silence: the hold is back, the job back on its queue, and the log names the job.
    assert_given_up(connection, worker, q, job)
    assert statuses(connection, [job.id]) == [JobStatus.QUEUED]


def test_multi_queue_worker_serves_the_other_queue_while_one_is_full(connection, redis_url, worker_env):
    QueueSlot.set('busy', 1, connection=connection)
    busy = PolicyQueue('busy', connection=connection)
    other = PolicyQueue('other', connection=connection)
    assert QueueSlot.acquire('busy', capacity=1, ttl=60, token='elsewhere', connection=connection)
    waiting = busy.enqueue(jobs.plain, 0)
    served = [other.enqueue(jobs.plain, i) for i in range(3)]
    worker = start_worker(redis_url, ['busy', 'other'], worker_env)  # 'busy' first in rq's order
    try:
        assert wait_for(lambda: set(statuses(connection, [j.id for j in served])) == {JobStatus.FINISHED}), output(
            worker
        )
        time.sleep(0.3)
        assert statuses(connection, [waiting.id]) == [JobStatus.QUEUED]
        assert busy.job_ids == [waiting.id]
        released_at = time.monotonic()
        assert QueueSlot.release('busy', token='elsewhere', connection=connection)
        assert wait_for(lambda: statuses(connection, [waiting.id]) == [JobStatus.FINISHED], timeout=10)
        assert time.monotonic() - released_at < 3
    finally:
        stop(worker)
    assert connection.llen(busy.intermediate_queue_key) == connection.llen(other.intermediate_queue_key) == 0


@pytest.mark.parametrize('queues', [['lost'], ['spare', 'lost']], ids=['single-queue', 'multi-queue'])
def test_a_worker_dying_between_pop_and_start_loses_no_job(connection, redis_url, worker_env, queues):
    QueueSlot.set('lost', 1, connection=connection)
    q = PolicyQueue('lost', connection=connection)
    job = q.enqueue(jobs.plain, 7, retry=Retry(max=1))
    env = dict(worker_env, **{HOLD_TTL_ENV: '2'})
    dying = start_worker(redis_url, queues, env, worker_class='tests.helpers.workers.DiesAfterPop',
                         extra=['--job-monitoring-interval', '1'])
    assert dying.wait(30) == -signal.SIGKILL, output(dying)
    # Popped and held, never started: the id waits on the intermediate list, not in the started registry.
    assert connection.lrange(q.intermediate_queue_key, 0, -1) == [job.id.encode()]
    assert job.id not in StartedJobRegistry('lost', connection=connection)
    assert q.count == 0
    # Nobody refreshes the dead worker's hold: it ages out by itself.
    assert wait_for(lambda: QueueSlot.status('lost', connection=connection).in_use == 0, timeout=5)

    # rq's own maintenance finds it: a first pass notes it, a pass a minute later hands it to rq's failure
    # handling, which retries it (the minute is aged in Redis rather than waited for).
    maintainer = PolicyWorker(queues, connection=connection)
    maintainer.clean_registries()
    intermediate = IntermediateQueue(q.key, connection=connection)
    assert intermediate.get_first_seen(job.id) is not None
    connection.set(intermediate.get_first_seen_key(job.id), time.time() - 120)
    maintainer.clean_registries()
    assert connection.llen(q.intermediate_queue_key) == 0
    assert q.job_ids == [job.id]  # requeued by its Retry
    worker = start_worker(redis_url, ['lost'], worker_env, burst=True)
    assert worker.wait(30) == 0, output(worker)
    assert statuses(connection, [job.id]) == [JobStatus.FINISHED]
    assert job.id not in FailedJobRegistry('lost', connection=connection)


@not_on_cluster("rq's worker-pool builds its workers' connections from connection_pool (docs/cluster.md)")
def test_worker_pool_runs_policy_workers_under_the_cap(connection, redis_url, worker_env):
    QueueSlot.set('pooled', 1, connection=connection)
    q = PolicyQueue('pooled', connection=connection)
    for _ in range(6):
        q.enqueue(jobs.sleep_and_record, 'pooled', 0.2)
    pool, out = run_pool(redis_url, 'pooled', worker_env, 'rq_policies.PolicyWorker', timeout=60)
    assert pool.returncode == 0, out.decode(errors='replace')[-3000:]
    records = spans(connection, 'pooled')
    assert len(records) == 6 and all(end for _, end, _ in records.values())
    assert peak(records) == 1
    assert connection.exists(keys.holds('pooled')) == 0


@pytest.mark.skipif(not compat.RQ3, reason='RateLimit arrived in rq 3.0')
def test_rq_rate_limited_jobs_keep_working_on_policy_workers(connection, redis_url, worker_env):
    from rq import RateLimit

    # rq's RateLimit holds jobs back at enqueue and admits them into the queue; QueueSlot caps the fetch. Both hold.
    QueueSlot.set('limited', 2, connection=connection)
    q = PolicyQueue('limited', connection=connection)
    batch = [q.enqueue(jobs.sleep_and_record, 'limited', 0.2, rate_limit=RateLimit('limited-key', 1)) for _ in range(4)]
    assert [j.get_status() for j in batch].count(JobStatus.QUEUED) == 1
    workers = [start_worker(redis_url, ['limited'], worker_env) for _ in range(2)]
    try:
        assert wait_for(lambda: connection.llen('test:span:limited') == 8, timeout=40), output(workers[0])
    finally:
        for worker in workers:
            stop(worker)
    assert set(statuses(connection, [j.id for j in batch])) == {JobStatus.FINISHED}
    assert peak(spans(connection, 'limited')) == 1  # rq's limit of 1 rules, under our cap of 2
    assert QueueSlot.status('limited', connection=connection).in_use == 0


def _node(conn) -> Redis:
    """The one server the counts are read on (a cluster of one primary: its node)."""
    return conn.get_primaries()[0].redis_connection if keys.is_cluster(conn) else conn


def _commands(conn) -> int:
    return int(_node(conn).info('stats')['total_commands_processed'])


@pytest.fixture
def own_server(worker_env):
    """A server of this test's own: the session server's command count includes every other test's leftovers. On
    the session's cluster (``RQ_POLICIES_CLUSTER=1``), a cluster of one primary of its own, for the same reason."""
    if ON_CLUSTER:
        with ValkeyCluster(primaries=1, replicas=0) as own:
            conn = own.client()
            yield conn, own.url, dict(worker_env, REDIS_URL=own.url)
            conn.close()
        return
    server = RedisServer().start()
    conn = server.client()
    yield conn, server.url, dict(worker_env, REDIS_URL=server.url)
    conn.close()
    server.close()


@pytest.mark.long
def test_an_idle_worker_waiting_on_a_full_queue_does_not_spin(own_server):
    connection, redis_url, worker_env = own_server
    QueueSlot.set('full', 1, connection=connection)
    q = PolicyQueue('full', connection=connection)
    assert QueueSlot.acquire('full', capacity=1, ttl=120, token='elsewhere', connection=connection)
    q.enqueue(jobs.plain, 0)
    worker = start_worker(redis_url, ['full'], worker_env)
    try:
        assert wait_for(lambda: Worker.count(queue=q) == 1, timeout=30)
        time.sleep(1.5)  # past the worker's start-up bookkeeping
        # Quiet: only the worker talks to this server now (each INFO counts as one command).
        before, started = _commands(connection), time.monotonic()
        time.sleep(2)
        quiet_rate = (_commands(connection) - before - 1) / (time.monotonic() - started)
        # A producer pushing 50 jobs a second to the full queue: each push publishes, and the worker ignores them.
        pushes_before = _node(connection).info('commandstats')['cmdstat_evalsha']['calls']
        started = time.monotonic()
        pushed = 0
        while time.monotonic() - started < 2:
            q.enqueue(jobs.plain, 1)
            pushed += 1
            time.sleep(0.02)
        # Each plain enqueue is one EVALSHA of its own (the admission script): the worker's looks are the rest.
        looks = _node(connection).info('commandstats')['cmdstat_evalsha']['calls'] - pushes_before - pushed
        storm_rate = looks / (time.monotonic() - started)
        assert pushed > 10 and q.count == pushed + 1, (pushed, q.count)  # all still waiting: the queue is full
        assert worker.poll() is None
    finally:
        stop(worker)
    print(f'idle worker on a full queue: {quiet_rate:.1f} commands/s quiet, {storm_rate:.1f} looks/s under pushes')
    assert quiet_rate <= 10, quiet_rate
    assert storm_rate <= 10, storm_rate


def _many_full(connection, names: list[str], ttl: int = 600, waiting: int = 0, seconds: float = 0.05) -> dict:
    """Cap each of ``names`` at 1 and fill it with a hold of another worker's (``ttl`` seconds, never refreshed), with
    ``waiting`` jobs (sleep_and_record, tag = the queue's name) behind the cap; the job ids by queue."""
    behind = {}
    for name in names:
        QueueSlot.set(name, 1, connection=connection)
        assert QueueSlot.acquire(name, capacity=1, ttl=ttl, token=f'elsewhere:{name}', connection=connection)
        ledger.PROCESS.discard(f'elsewhere:{name}')  # another worker's: not this process's to refresh
        q = PolicyQueue(name, connection=connection)
        behind[name] = [q.enqueue(jobs.sleep_and_record, name, seconds).id for _ in range(waiting)]
    return behind


def test_a_worker_over_many_full_queues_leaves_them_out_of_its_fetches(connection):
    # Issue 34: every fetch ran the gates of every full queue (a ZCARD, a ZCOUNT and more each), whichever queue the
    # job came from. Now a queue found full is left out of the fetches while the worker hears of its releases. The
    # fetch's `skip` events count the gates that skipped a queue: one per full queue per fetch before (10 x 31 here,
    # seen failing), a few per full queue now (the fetch that finds it, the one after the subscription, the last
    # looks over every queue before the burst worker quits).
    from rq_policies import PolicySimpleWorker
    from rq_policies.engine import events

    full = [f'full{i}' for i in range(10)]
    _many_full(connection, full)
    plain = PolicyQueue('plain', connection=connection)
    done = [plain.enqueue(jobs.plain, i).id for i in range(30)]
    skips: list[str] = []

    def observer(event: str, queue: str, detail: dict) -> None:
        if event == 'skip':
            skips.append(queue)

    events.observe(fetch=observer)
    try:
        worker = PolicySimpleWorker([*(PolicyQueue(n, connection=connection) for n in full), plain],
                                    connection=connection)
        worker.work(burst=True, logging_level='WARNING')
    finally:
        events.unobserve(fetch=observer)
    assert set(statuses(connection, done)) == {JobStatus.FINISHED}
    assert set(skips) == set(full)
    assert len(skips) <= 4 * len(full), f'{len(skips)} skips of full queues over {len(done)} jobs'
    for name in full:  # nothing was taken from a full queue: each cap holds the other worker's hold only
        assert [token for token, _ in QueueSlot.status(name, connection=connection).holders] == [f'elsewhere:{name}']


@pytest.mark.long
def test_a_busy_worker_over_many_full_queues_takes_a_released_queue_at_once_and_never_runs_over_a_cap(
        connection, redis_url, worker_env):
    # Two busy workers over 12 queues capped at 1 and full (left out of their fetches), then a plain queue with a
    # long backlog. Releasing 4 of the holds lets each of those queues' jobs run, promptly (the release's wake-up
    # puts the queue back into the next fetch; the relook without it is up to 10 s away), one at a time.
    full = [f'full{i}' for i in range(12)]
    behind = _many_full(connection, full, waiting=2)
    plain = PolicyQueue('plain', connection=connection)
    plain.enqueue_many([PolicyQueue.prepare_data(jobs.plain, (i,)) for i in range(1500)])
    workers = [start_worker(redis_url, [*full, 'plain'], worker_env) for _ in range(2)]
    try:
        # Busy on the plain queue, past the fetches that find the full queues full and subscribe their wake-ups.
        assert wait_for(lambda: plain.finished_job_registry.count >= 20, timeout=60), output(workers[0])
        assert plain.count > 100, 'the backlog ran low: the workers are to be busy while the holds go'
        freed = full[:4]
        seconds, micros = connection.time()
        released_at = seconds + micros / 1e6
        for name in freed:
            assert QueueSlot.release(name, token=f'elsewhere:{name}', connection=connection)
        ids = [job_id for name in freed for job_id in behind[name]]
        assert wait_for(lambda: set(statuses(connection, ids)) == {JobStatus.FINISHED}, timeout=30), (
            statuses(connection, ids), plain.count, output(workers[0]))
        assert plain.count > 0, 'the plain backlog ran dry: the workers were not kept busy'
    finally:
        stop(*workers)
    for name in freed:
        records = spans(connection, name)
        assert len(records) == 2 and peak(records) == 1
        # Prompt: each worker's next fetch after the release looks at the queue (8 jobs of two workers; measured
        # under 1.5 s on a loaded machine, where a missed wake-up would wait for the relook, up to 10 s).
        assert min(start for start, _, _ in records.values()) - released_at < 5
    for name in full[4:]:  # still full: nothing of theirs ran, and only the other worker's hold is there
        assert statuses(connection, behind[name]) == [JobStatus.QUEUED] * 2
        assert [token for token, _ in QueueSlot.status(name, connection=connection).holders] == [f'elsewhere:{name}']


@pytest.mark.long
def test_a_busy_worker_over_many_full_queues_takes_one_freed_by_an_aged_out_hold_within_its_relook(
        connection, redis_url, worker_env):
    # A hold that ages out (its worker SIGKILLed) publishes nothing: a queue left out of the fetches comes back at
    # the relook, a third of the worker's hold ttl (6 s here: 2 s), at the latest.
    full = [f'full{i}' for i in range(8)]
    behind = _many_full(connection, full, waiting=1)
    behind.update(_many_full(connection, ['aging'], ttl=20, waiting=1))
    ((_, left),) = QueueSlot.status('aging', connection=connection).holders
    seconds, micros = connection.time()
    lapses_at = seconds + micros / 1e6 + left
    plain = PolicyQueue('plain', connection=connection)
    # A backlog the worker is still busy with when the hold lapses (a fast worker ran 600 in 12 s).
    plain.enqueue_many([PolicyQueue.prepare_data(jobs.plain, (i,)) for i in range(3000)])
    env = dict(worker_env, **{HOLD_TTL_ENV: '6'})
    worker = start_worker(redis_url, ['aging', *full, 'plain'], env, extra=['--job-monitoring-interval', '1'])
    try:
        assert wait_for(lambda: plain.finished_job_registry.count >= 10, timeout=60), output(worker)
        assert statuses(connection, behind['aging']) == [JobStatus.QUEUED]
        assert wait_for(lambda: statuses(connection, behind['aging']) == [JobStatus.FINISHED], timeout=30), (
            plain.count, output(worker))
        assert plain.count > 0, 'the plain backlog ran dry: the worker was not kept busy'
    finally:
        stop(worker)
    # The hold lapsed 20 s after it was taken; the worker looked again at most 2 s after it last found the queue
    # full (a busy worker's fetch comes every job; measured 0.5 s, room for a loaded machine).
    ((start, _, _),) = spans(connection, 'aging').values()
    assert 0 < start - lapses_at <= 4.5
    for name in full:
        assert statuses(connection, behind[name]) == [JobStatus.QUEUED]
