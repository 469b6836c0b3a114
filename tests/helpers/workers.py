"""Starting real rq workers in subprocesses, the way users run them (one worker, rq's worker-pool, a fork race),
stopping them, and waiting for what they do (``wait_for``, ``wait_idle``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from rq import SimpleWorker, Worker

from rq_policies import PolicyQueue, PolicyWorker
from rq_policies.engine import compat
from rq_policies.engine.compat import KEY_PREFIX
from rq_policies.engine.fetch import current_fetcher
from rq_policies.engine.worker import _WorkerFetcher
from tests.helpers import with_root
from tests.helpers.cluster import CLUSTER_CLASS, ON_CLUSTER, connect


class StockWorker(Worker):
    """rq's own ``Worker`` but for one thing: its command-channel thread looks at its stop flag every second, as a
    PolicyWorker's does (``compat.subscribe``). rq starts that thread with a 60 s wait, and since redis-py 8.2 its
    shutdown joins it, so a stock burst worker could take a minute to exit (rq's own behaviour, which a test of ours
    waiting on a stock worker's exit would time out on). Its fetch, run and ending are rq's."""

    def subscribe(self) -> None:
        compat.subscribe(self)


class StockSimpleWorker(SimpleWorker):
    """rq's own ``SimpleWorker`` with the same 1 s command-channel wait as :class:`StockWorker`, for the same reason."""

    def subscribe(self) -> None:
        compat.subscribe(self)


def start_worker(url: str, queues: list[str], env: dict, worker_class: str = 'rq_policies.PolicyWorker',
                 burst: bool = False, extra: list[str] | None = None) -> subprocess.Popen:
    """``rq worker -w <worker_class> --url <url> QUEUES`` as a subprocess (its own process group, killable), with the
    repository's root on its ``PYTHONPATH`` whatever ``env`` says (job and worker classes are named
    ``tests.helpers...``)."""
    env = with_root(env)
    args = [sys.executable, '-m', 'rq.cli', 'worker', '-w', worker_class, '--url', url, '--logging_level', 'WARNING']
    if ON_CLUSTER:  # the session's cluster (tests/conftest.py): rq's own option
        args += CLUSTER_CLASS
    if burst:
        args.append('--burst')
    args += list(extra or []) + list(queues)
    with tempfile.NamedTemporaryFile('wb', prefix='rq-worker-', suffix='.log', delete=False) as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log.name  # type: ignore[attr-defined]
    return proc


def run_pool(url: str, queue: str, env: dict, worker_class: str = 'rq_policies.PolicyWorker',
             timeout: float = 60) -> tuple[subprocess.Popen, bytes]:
    """``rq worker-pool -w <worker_class> -n 3 --burst QUEUE`` (rq's own pool of forking workers) run to its end, its
    process group SIGKILLed past ``timeout``; returns the finished process and what it printed."""
    pool = subprocess.Popen(
        [sys.executable, '-m', 'rq.cli', 'worker-pool', '-w', worker_class, '--url', url,
         '-n', '3', '--burst', '--logging-level', 'WARNING', queue],
        env=with_root(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    out = b''
    try:
        out, _ = pool.communicate(timeout=timeout)
    finally:
        if pool.poll() is None:
            os.killpg(pool.pid, signal.SIGKILL)
            pool.wait()
    return pool, out


def output(proc: subprocess.Popen) -> str:
    """What the worker printed (for assertion messages)."""
    with open(proc.log_path, errors='replace') as f:  # type: ignore[attr-defined]
        return f.read()[-4000:]


def _race_one(url, queue, call, barrier, results):
    from rq_policies import PolicyQueue

    q = PolicyQueue(queue, connection=connect(url))
    barrier.wait()
    job = call(q)
    results.put(job.id if job else None)


def race(url: str, queue: str, call: Callable, processes: int = 16) -> list[str | None]:
    """``processes`` forked processes each run ``call(PolicyQueue(queue))`` at once (a barrier releases them
    together; ``call`` may be a lambda, as the processes are forked); returns each one's job id, or None where its
    enqueue was dropped."""
    ctx = multiprocessing.get_context('fork')
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [ctx.Process(target=_race_one, args=(url, queue, call, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    return outcomes


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def stop(*procs: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM (a warm shutdown) to each of ``procs`` still running, then wait for each, SIGKILL past ``timeout``."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_idle(connection, count=1):
    """Wait until ``count`` workers have registered (and so are past their start-up)."""
    assert wait_for(lambda: connection.scard(f'{KEY_PREFIX}:workers') >= count, 30)
    time.sleep(0.3)


def descendants(pid: int) -> set[int]:
    """The process's children (a worker's work horse heads a process group of its own) and theirs."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        listed = subprocess.run(['pgrep', '-P', str(parent)], capture_output=True, text=True).stdout.split()
        for child in map(int, listed):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class DiesAfterPop(PolicyWorker):
    """A PolicyWorker SIGKILLed between its fetch and the job's start: the window rq's intermediate list covers."""

    def execute_job(self, job, queue):
        os.kill(os.getpid(), signal.SIGKILL)


class StopsAfterPop(PolicyWorker):
    """A PolicyWorker that SIGSTOPs itself between its fetch and the job's start (a paused VM, a frozen cgroup, a
    starved process): it carries on into the job's start when SIGCONT comes."""

    def execute_job(self, job, queue):
        os.kill(os.getpid(), signal.SIGSTOP)
        return super().execute_job(job, queue)


class BeatsBareMidJob(PolicyWorker):
    """Sends a bare heartbeat on every monitoring tick of a job, as rq's own monitor does on its kill and EINTR
    paths: a heartbeat during the job must never carry the job's release."""

    def maintain_heartbeats(self, *args, **kwargs):
        super().maintain_heartbeats(*args, **kwargs)
        self.heartbeat()


def fetch_as_a_worker(queue, connection, hold_ttl: int = 30):
    """One ``dequeue_any`` of ``queue`` as a PolicyWorker's fetch makes it (its fetcher current, closed after):
    ``(job, fetcher)``, the fetcher holding the claim it made."""
    fetcher = _WorkerFetcher(hold_ttl)
    token = current_fetcher.set(fetcher)
    try:
        job, _ = queue.dequeue_any([queue], None, connection=connection)
    finally:
        current_fetcher.reset(token)
        fetcher.close()
    return job, fetcher


class StopAfterFetchQueue(PolicyQueue):
    """A PolicyQueue whose worker is sent SIGTERM the moment its fetch has taken a job: rq's handler raises
    StopRequested there (the worker is not busy yet), between the fetch and the job's start, the window a warm
    shutdown can hit by chance (``--queue-class tests.helpers.workers.StopAfterFetchQueue``)."""

    @classmethod
    def dequeue_any(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        found = super().dequeue_any(*args, **kwargs)
        if found is not None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode; this never ends unless it failed to
        return found


def assert_given_up(connection, worker: subprocess.Popen, queue, job) -> None:
    """``worker`` quit with ``job`` taken and not started: its log names the job, the queue's holds are back (the
    queue is capped at 1 in these tests), and the job is back at the head of its queue (its worker handed its own
    take back: rq_policies.engine.fetch.hand_back), not left on the intermediate list for rq's cleanup to fail unrun."""
    from rq_policies import QueueSlot
    from rq_policies.engine import keys

    assert f"job {job.id} was taken from '{queue.name}' but not started (StopRequested); its holds are given " \
           'back, and it is back on its queue' in output(worker)
    assert QueueSlot.status(queue.name, connection=connection).in_use == 0
    assert connection.lrange(queue.intermediate_queue_key, 0, -1) == []
    assert connection.lrange(queue.key, 0, 0) == [job.id.encode()]
    assert connection.hget(keys.taken(queue.name), job.id) is None
