"""The server goes away and comes back under running PolicyWorkers (no --with-scheduler, no worker restart): every
job that came due meanwhile runs once, within 2 s of the server answering again; after a restart that lost the data,
nothing of ours blocks the jobs enqueued afterwards."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from redis import Redis
from rq.job import Job

from rq_policies import PolicyQueue
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.surfaces.testing import RedisServer
from tests.helpers import with_root
from tests.helpers.records import ran, server_now
from tests.helpers.workers import output, start_worker, stop, wait_for, wait_idle

pytestmark = pytest.mark.long

EXPECTED = ['backoff', 'debounce:2', 'lone', 'trailing:1', 'trailing:2']


@pytest.fixture
def server():
    srv = RedisServer(appendonly=True, extra_args=['--appendfsync', 'always']).start()
    try:
        yield srv
    finally:
        srv.close()


def _env(url: str) -> dict:
    return with_root(dict(os.environ, REDIS_URL=url))


def _pending(connection: Redis, later: bool = False) -> float:
    """Debounce, trailing Throttle, a key BackOff and a Loner's enqueue_in, all due 3 s from now (server clock), or 6 s
    with ``later``; returns the latest due time.

    With ``later``, the enqueues wait for the start of a 6 s throttle window (epoch-aligned), so the trailing job is
    due about 6 s out too, not at whatever end the current window had."""
    q = PolicyQueue('outage', connection=connection)
    delay, suffix = (6, '_later') if later else (3, '')
    if later:
        left = delay - server_now(connection) % delay
        if left < delay - 0.5:
            time.sleep(left + 0.05)
    start = server_now(connection)
    jobs = 'tests.helpers.promote_jobs'
    q.enqueue(f'{jobs}.backs_off{suffix}', 'outage', 'acme')  # runs now, backs its key off for `delay` s
    q.enqueue(f'{jobs}.trailing{suffix}', 'outage', 'task', 1)  # the leading run, now
    q.enqueue(f'{jobs}.trailing{suffix}', 'outage', 'task', 2)  # trailing: due at the window's end
    for version in range(3):
        q.enqueue(f'{jobs}.debounced{suffix}', 'outage', 'doc', version)  # due at start + delay
    assert q.enqueue_in(timedelta(seconds=delay), f'{jobs}.lone', 'outage', 'lone') is not None
    return start + delay + 0.5


def _kill(server: RedisServer) -> None:
    server.process.kill()
    server.process.wait()
    server.process = None


def _check(connection: Redis, back: float, workers) -> None:
    if not wait_for(lambda: len(ran(connection, 'outage')) >= len(EXPECTED), 10):
        rows = ran(connection, 'outage')
        logs = '\n'.join(output(worker) for worker in workers)
        pytest.fail(f'ran only {[value for _, value, _ in rows]}; pending: {connection.keys(f"{RQ}:*")}\n{logs}')
    time.sleep(1.5)  # a second run would land by now
    rows = ran(connection, 'outage')
    assert sorted(value for _, value, _ in rows) == EXPECTED, rows
    late = {value: round(at - back, 2) for _, value, at in rows if value != 'trailing:1'}
    assert all(delay <= 2.0 for delay in late.values()), late
    print(f'runs after the server answered again (s): {late}')


def _outage(server: RedisServer, seconds: float) -> None:
    connection = server.client()
    workers = [start_worker(server.url, ['outage'], _env(server.url)) for _ in range(2)]
    try:
        wait_idle(connection, 2)
        due = _pending(connection, later=True)
        assert wait_for(lambda: _all_pending(connection), 20), ran(connection, 'outage')  # a loaded machine is slow
        # The backed-off key is due `delay` s after its first run, which a loaded machine starts late: the outage
        # lasts until every job is due, and at least `seconds`.
        due = max([due] + [score + 0.5 for _, score in connection.zrange(f'{RQ}:policies:keydue', 0, -1,
                                                                            withscores=True)])
        away = max(seconds, due - server_now(connection))
        _kill(server)  # SIGKILL: appendfsync always kept every write
        time.sleep(away)
        server.start()
        connection = server.client()
        back = server_now(connection)
        assert back > due  # every job came due while the server was away
        _check(connection, back, workers)
        assert all(worker.poll() is None for worker in workers)  # the same workers, never restarted
    finally:
        stop(*workers)


def _all_pending(connection: Redis) -> bool:
    """The leading trailing run is over, the backed-off job is parked on its key, and no job runs: only timers are
    pending (a job running when the server goes away is another matter: its horse cannot record its end)."""
    return (len(ran(connection, 'outage')) == 1 and connection.exists(f'{RQ}:policies:keydue')
            and connection.zcard(f'{RQ}:wip:outage') == 0)


def test_restart_with_persistence_runs_every_due_job_once_within_2s(server):
    _outage(server, 4.0)


@pytest.mark.slow
def test_a_30s_outage_runs_every_due_job_once_within_2s(server):
    _outage(server, 30.0)


def test_a_restart_without_persistence_leaves_nothing_blocking(server):
    server.appendonly = False
    server.extra_args = []
    server.stop()
    server.start()
    connection = server.client()
    worker = start_worker(server.url, ['outage'], _env(server.url))
    try:
        wait_idle(connection)
        _pending(connection)
        assert wait_for(lambda: _all_pending(connection), 5)
        _kill(server)
        time.sleep(1.0)
        server.start()  # empty: every job, marker, hold, lock and back-off is gone
        connection = server.client()
        back = server_now(connection)
        connection.delete('test:ran:outage')
        _pending(connection)
        assert wait_for(lambda: len(ran(connection, 'outage')) >= len(EXPECTED), 10), (ran(connection, 'outage'),
                                                                                         output(worker))
        time.sleep(1.0)
        rows = ran(connection, 'outage')
        assert sorted(value for _, value, _ in rows) == EXPECTED, rows
        assert max(at for _, _, at in rows) - back <= 3.5 + 2.0 + 2.0  # due 3.5 s after the enqueues, which follow
    finally:
        stop(worker)


def test_a_worker_watching_its_running_job_rides_through_an_outage(server):
    """rq's monitor sends the worker's heartbeat every job_monitoring_interval while the work horse runs; with the
    server away, rq's worker quits there and leaves its horse running. A PolicyWorker keeps watching its horse, and
    the job's end lands once the server is back: the same worker, the job finished, nothing left started."""
    connection = server.client()
    worker = start_worker(server.url, ['outage'], _env(server.url), extra=['--job-monitoring-interval', '1'])
    try:
        job = PolicyQueue('outage', connection=connection).enqueue('tests.helpers.jobs.sleep_and_record',
                                                                   'outage-beat', 6)
        assert wait_for(lambda: connection.llen('test:span:outage-beat') == 1, 20), output(worker)  # in its horse
        _kill(server)
        time.sleep(3)  # three monitoring ticks without a server
        server.start()
        connection = server.client()
        job = Job.fetch(job.id, connection=connection)
        assert wait_for(lambda: job.get_status(refresh=True) == 'finished', 20), output(worker)
        assert worker.poll() is None, output(worker)
        assert connection.zcard(f'{RQ}:wip:outage') == 0
    finally:
        stop(worker)
