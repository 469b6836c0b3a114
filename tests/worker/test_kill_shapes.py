"""Every way a forking PolicyWorker can be killed or stopped while it runs a job, and what the job's limits do then.

One job holds all three limits at once: it runs on a queue capped at 1, under a ``Concurrency(1)`` key, admitted with
``Loner(until='finished')`` (``key_jobs.held_everywhere``). A real worker runs it in a subprocess; the test signals
the worker, its process group, the whole tree (worker, hold guard, work horse), the horse alone, or SIGSTOPs the
worker alone or the whole tree, while a second worker waits with a capped job and a forced job of the same key, and
an identical enqueue probes the loner identity. docs/reliability.md has the table of shapes and bounds these check:

* worker, group, stop-worker: the horse runs on and everything stays held until it ends (no overrun at all), then
  comes back at once; nothing is counted as a lapse;
* horse, tree: nothing runs any more; everything comes back at once (horse) or within ``hold_ttl`` (tree);
* stop-tree (a paused VM): nothing refreshes while stopped, so the holds lapse after ``hold_ttl``; at most one job
  per limit starts meanwhile, every lapse is written back, counted in ``rq:policies:lapses`` and logged within a
  moment of SIGCONT, and nothing else starts until the job ends.

hold_ttl is 3 s and rq's monitoring interval 1 s. rq gives a worker's key ``job_monitoring_interval + 60`` seconds
while a job runs; a dead or stopped worker's key is deleted here as its expiry would (61 s later), so the tests
stay short and the identity must be held by the horse's own liveness key.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from rq.job import Job
from rq.worker import Worker

from rq_policies import Concurrency, PolicyQueue, QueueSlot
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.worker import HOLD_TTL_ENV
from tests.helpers import jobs, key_jobs
from tests.helpers.records import server_now, spans
from tests.helpers.workers import output, start_worker, stop, wait_for

FAST = ['--job-monitoring-interval', '1']
TTL = 3
#: The capped job's length: long enough to outlive twice the hold ttl after any shape.
LONG = 10
#: Slack for a loaded machine on each timing bound below (seconds).
SLACK = 1.5
SCOPE = 'tests.helpers.key_jobs.held_everywhere'


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f'/proc/{pid}/task/{pid}/children').read_text().split()]
    except OSError:
        return []


def started_at(pid: int) -> str | None:
    """The process's start time (/proc/PID/stat, field 22): with the pid, it names one process (pids are reused)."""
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(') ', 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def signal_all(procs, sig) -> None:
    """Signal each (pid, start time) that is still that process."""
    for pid, start in procs:
        if started_at(pid) == start:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def key_holds(connection) -> int:
    return sum(connection.zcard(k) for k in connection.keys(keys.KEY_HOLDS_PREFIX + '*'))


def first_start(events, job_id):
    return next((at for jid, what, at in events if jid == job_id and what == 'start'), None)


def first_end(events, job_id):
    return next((at for jid, what, at in events if jid == job_id and what == 'end'), None)


def lapses(connection) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in connection.hgetall(keys.LAPSES).items()}


@pytest.mark.long
@pytest.mark.parametrize('shape', ['worker', 'group', 'tree', 'horse', 'stop-worker', 'stop-tree'])
def test_a_kill_or_stop_of_any_shape_keeps_cap_key_and_identity_or_lapses_within_the_bound(
        shape, connection, redis_url, worker_env):
    QueueSlot.set('ks', 1, connection=connection)
    capped_q = PolicyQueue('ks', connection=connection)
    other_q = PolicyQueue('ks_b', connection=connection)
    env = dict(worker_env, **{HOLD_TTL_ENV: str(TTL)})
    victim = start_worker(redis_url, ['ks'], env, extra=FAST)
    survivor = None
    tree: list[tuple[int, str | None]] = [(victim.pid, started_at(victim.pid))]
    try:
        first = capped_q.enqueue(key_jobs.held_everywhere, 'ks', LONG, payload='p')
        assert first is not None
        assert wait_for(lambda: connection.llen('test:pid:ks') == 1), output(victim)
        horse = int(connection.lindex('test:pid:ks', 0))
        # The guard keeps the horse's liveness key (its first keep comes within a third of the hold ttl).
        assert wait_for(lambda: connection.exists(keys.alive(first.id)), timeout=5), output(victim)
        (guard,) = [pid for pid in children(victim.pid) if pid != horse]
        tree += [(guard, started_at(guard)), (horse, started_at(horse))]
        assert os.getpgid(guard) != os.getpgid(victim.pid) != os.getpgid(horse)  # three process groups
        worker_key = f'{RQ}:worker:' + Job.fetch(first.id, connection=connection).worker_name
        survivor = start_worker(redis_url, ['ks', 'ks_b'], env, extra=FAST)
        assert wait_for(lambda: Worker.count(queue=other_q) == 1, timeout=30), output(survivor)  # booted

        shaped = server_now(connection)
        if shape == 'worker':
            os.kill(victim.pid, signal.SIGKILL)
        elif shape == 'group':
            os.killpg(victim.pid, signal.SIGKILL)  # kill -9 -PGID: what supervisord's killasgroup sends
        elif shape == 'tree':
            signal_all(tree, signal.SIGKILL)
        elif shape == 'horse':
            signal_all(tree[2:], signal.SIGKILL)
        elif shape == 'stop-worker':
            signal_all(tree[:1], signal.SIGSTOP)
        else:
            signal_all(tree, signal.SIGSTOP)  # a paused VM, a frozen cgroup
        if shape in ('worker', 'group', 'tree'):
            victim.wait(10)
        if shape in ('worker', 'group', 'tree', 'stop-worker'):
            connection.delete(worker_key)  # its expiry (rq's 61 s here) brought forward: only the horse holds now

        capped = capped_q.enqueue(jobs.span_on_worker, 'ks', 0.3)
        forced = other_q.force(key_jobs.held_everywhere, 'ks', 0.3, payload='p')

        def started(job):  # a plain job records under its id, a keyed one under its key
            plain = spans(connection, 'ks').get(job.id, [None])[0]
            return plain if plain is not None else first_start(key_jobs.spans(connection, 'ks').get('p', []), job.id)

        if shape in ('horse', 'tree'):
            # Nothing runs any more: everything comes back, at once for a killed horse (its worker gives it back),
            # within the hold ttl for a dead tree (nothing gives it back; it ages out).
            bound = (0 if shape == 'horse' else TTL) + SLACK + 1  # + the survivor's relook at a full queue (1 s)
            assert wait_for(lambda: started(capped) and started(forced), timeout=bound + 5), output(survivor)
            assert started(capped) - shaped < bound and started(forced) - shaped < bound, \
                (started(capped) - shaped, started(forced) - shaped, output(victim), output(survivor))
            assert wait_for(lambda: capped_q.enqueue(key_jobs.held_everywhere, 'ks', LONG, payload='p') is not None,
                            timeout=TTL + SLACK)
            assert server_now(connection) - shaped < bound + SLACK
            assert lapses(connection) == {}
            return

        if shape == 'stop-tree':
            time.sleep(TTL + 2)  # longer than the hold ttl: nothing refreshes, everything lapses
            signal_all(tree, signal.SIGCONT)
            resumed = server_now(connection)
            # The guard's first keep after SIGCONT finds each lapse under a horse that still runs: written back,
            # counted and logged at once.
            want = {'queue:ks', f'key:{SCOPE}:p', 'loner:ks'}
            assert wait_for(lambda: set(lapses(connection)) >= want, timeout=SLACK + 1), \
                (lapses(connection), output(victim))
            found = server_now(connection) - resumed
            assert found < SLACK + 1, found
            assert wait_for(lambda: 'lapsed while job' in output(victim) and 'liveness of job' in output(victim),
                            timeout=2), output(victim)
            assert all(v == 1 for v in lapses(connection).values()), lapses(connection)
            assert QueueSlot.status('ks', connection=connection).in_use >= 1  # the running job is counted again
            assert capped_q.enqueue(key_jobs.held_everywhere, 'ks', LONG, payload='p') is None  # identity held again
            late = capped_q.enqueue(jobs.span_on_worker, 'ks', 0.3)
            late_forced = other_q.force(key_jobs.held_everywhere, 'ks', 0.3, payload='p')
        else:
            # The horse runs on: for twice the hold ttl nobody but its guard keeps what it holds.
            deadline = time.monotonic() + 2 * TTL + 1
            while time.monotonic() < deadline:
                assert capped_q.enqueue(key_jobs.held_everywhere, 'ks', LONG, payload='p') is None  # identity held
                assert started(capped) is None and started(forced) is None, output(survivor)
                time.sleep(0.25)
            assert QueueSlot.status('ks', connection=connection).in_use == 1
            assert key_holds(connection) == 1
            assert Concurrency.status(SCOPE, 'p', connection=connection).in_use == 1
            if shape == 'stop-worker':
                signal_all(tree[:1], signal.SIGCONT)
            late = late_forced = None

        events = lambda: key_jobs.spans(connection, 'ks').get('p', [])  # noqa: E731
        waited = [j for j in (capped, forced, late, late_forced) if j is not None]
        assert wait_for(lambda: first_end(events(), first.id) and all(started(j) for j in waited),
                        timeout=LONG + 15), (events(), [(started(j), j.get_status(refresh=True)) for j in waited],
                                             output(victim), output(survivor))
        ended = first_end(events(), first.id)
        if shape == 'stop-tree':
            # The bound: what started while the holds were lapsed started before the guard's keep after SIGCONT;
            # nothing started beside the job after that.
            for job in (capped, forced):
                assert started(job) >= ended or started(job) < resumed + SLACK, (shape, started(job), resumed)
            for job in (late, late_forced):
                assert started(job) >= ended, (started(job), ended)
        else:
            for job in (capped, forced):
                assert started(job) >= ended, (shape, started(job), ended)
                assert started(job) - ended < 2 + SLACK, (shape, started(job), ended)  # given back promptly
            assert lapses(connection) == {}, (lapses(connection), output(victim))
    finally:
        signal_all(tree, signal.SIGCONT)
        stop(victim)
        if survivor is not None:
            stop(survivor)
        signal_all(tree[1:], signal.SIGKILL)  # a guard or horse left running by a test that failed early


def test_the_guards_keep_and_recount_are_safe_to_run_twice(connection, fault_proxy):
    """lua/keep_horse.lua with lost replies (the fault proxy drops each reply once; redis-py sends the call again):
    a keep extends what is live and never writes back what is gone, so its replay answers alike; a recount writes
    back and counts a lapse once however often it runs."""
    from redis import Redis
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError
    from redis.retry import Retry

    from rq_policies.engine.fetch import Claim
    from rq_policies.engine.ledger import Hold
    from rq_policies.engine.worker import keep_call

    proxied = Redis.from_url(fault_proxy.url, socket_timeout=1, retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3),
                             retry_on_error=[ConnectionError, TimeoutError])
    proxied.ping()
    assert QueueSlot.acquire('kq', capacity=1, token='guarded:1', ttl=3, connection=connection)
    claim = Claim('kept-job', 'kq', (Hold(keys.holds('kq'), 'guarded:1', 3),))
    connection.hset(f'{RQ}:job:kept-job', mapping={'status': 'started', 'policies_loner_until': 'finished'})

    def lost_reply(mode, first=False):
        fault_proxy.drop_reply(match=b'EVAL')
        seen = fault_proxy.seen(b'EVAL')
        reply = keep_call(claim, 30, f'{RQ}:job:', mode, first=first).run(proxied)
        assert fault_proxy.seen(b"EVAL") >= seen + 2  # sent again after the lost reply
        return reply

    assert lost_reply('keep', first=True) == [[], 1]
    assert 25 < connection.zscore(keys.holds('kq'), 'guarded:1') - server_now(connection) <= 30  # extended
    assert 25 < connection.ttl(keys.alive('kept-job')) <= 30  # the liveness key written on the first keep
    assert lapses(connection) == {}

    connection.delete(keys.holds('kq'), keys.alive('kept-job'))  # both lapse (a stop of the whole tree)
    assert lost_reply('keep') == [[1], 2]  # reported, written back by nobody
    assert connection.exists(keys.holds('kq'), keys.alive('kept-job')) == 0

    lost_reply('recount')
    assert connection.zscore(keys.holds('kq'), 'guarded:1') is not None and connection.exists(keys.alive('kept-job'))
    assert lapses(connection) == {'queue:kq': 1, 'loner:kq': 1}  # counted once, though it ran twice
    assert QueueSlot.status('kq', connection=connection).in_use == 1

    connection.hset(f'{RQ}:job:kept-job', 'status', 'finished')  # the job ended, the worker released its hold
    connection.delete(keys.holds('kq'), keys.alive('kept-job'))
    assert lost_reply('keep') == [[1], 0]  # a keep that lands after the release writes nothing back
    assert connection.exists(keys.holds('kq'), keys.alive('kept-job')) == 0


@pytest.mark.long
def test_a_guard_killed_mid_job_is_replaced_and_keeps_the_horse(connection, redis_url, worker_env):
    """The guard SIGKILLed alone while a job runs: the worker's next heartbeat forks another, which finds the running
    horse in the memory they share; the worker SIGKILLed after that leaves the horse kept as with the first guard."""
    QueueSlot.set('ks', 1, connection=connection)
    capped_q = PolicyQueue('ks', connection=connection)
    env = dict(worker_env, **{HOLD_TTL_ENV: str(TTL)})
    victim = start_worker(redis_url, ['ks'], env, extra=FAST)
    procs: list[tuple[int, str | None]] = []
    try:
        first = capped_q.enqueue(key_jobs.held_everywhere, 'ks', LONG, payload='p')
        assert wait_for(lambda: connection.llen('test:pid:ks') == 1), output(victim)
        horse = int(connection.lindex('test:pid:ks', 0))
        assert wait_for(lambda: len(children(victim.pid)) == 2), output(victim)
        (guard,) = [pid for pid in children(victim.pid) if pid != horse]
        procs += [(horse, started_at(horse)), (guard, started_at(guard))]
        signal_all(procs[1:], signal.SIGKILL)
        connection.delete(keys.alive(first.id))  # whatever the dead guard wrote: the new one must write it again
        assert wait_for(lambda: [p for p in children(victim.pid) if p not in (horse, guard)], timeout=3), \
            output(victim)
        (again,) = [p for p in children(victim.pid) if p not in (horse, guard)]
        procs.append((again, started_at(again)))
        worker_key = f'{RQ}:worker:' + Job.fetch(first.id, connection=connection).worker_name
        victim.kill()
        victim.wait(10)
        assert wait_for(lambda: connection.exists(keys.alive(first.id)), timeout=2)  # kept at once by the new guard
        connection.delete(worker_key)  # its expiry (61 s on) brought forward
        killed = time.monotonic()
        other = capped_q.enqueue(jobs.span_on_worker, 'ks', 0)
        survivor = start_worker(redis_url, ['ks'], env, extra=FAST)
        assert wait_for(lambda: Worker.count(queue=capped_q) == 1, timeout=30), output(survivor)  # booted
        try:
            while time.monotonic() - killed < 2 * TTL + 1:
                assert capped_q.enqueue(key_jobs.held_everywhere, 'ks', LONG, payload='p') is None
                assert other.id not in spans(connection, 'ks'), output(survivor)
                time.sleep(0.25)
            assert QueueSlot.status('ks', connection=connection).in_use == 1
            assert wait_for(lambda: other.id in spans(connection, 'ks'), timeout=LONG), output(survivor)
        finally:
            stop(survivor)
        ended = first_end(key_jobs.spans(connection, 'ks')['p'], first.id)
        assert ended is not None and spans(connection, 'ks')[other.id][0] >= ended
        assert 'died; starting another' in output(victim)
    finally:
        stop(victim)
        signal_all(procs, signal.SIGKILL)
