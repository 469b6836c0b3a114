"""Shared benchmark plumbing: a server, interleaved rounds, medians and ratios against stock rq."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager

from redis import Redis

from rq_policies.surfaces.testing import RedisServer

#: bench/, put on worker subprocesses' path beside the project so they import the benches' job modules.
HERE = os.path.dirname(os.path.abspath(__file__))


@contextmanager
def server_url():
    """REDIS_URL if set, else a throwaway server on a free port."""
    if os.environ.get('REDIS_URL'):
        yield os.environ['REDIS_URL']
        return
    with RedisServer() as server:
        yield server.url


def interleaved(variants: dict[str, Callable[[int], object]], rounds: int, calls: int,
                before_round: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Time every call of every variant; rounds interleave the variants so machine noise hits them alike.

    Returns per-call seconds for each variant.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    counter = 0
    for r in range(rounds):
        order = list(variants.items())
        if r % 2:
            order.reverse()  # alternate which variant goes first
        for name, call in order:
            if before_round:
                before_round()
            for _ in range(calls):
                counter += 1
                start = time.perf_counter()
                call(counter)
                samples[name].append(time.perf_counter() - start)
    return samples


def report(samples: dict[str, list[float]], baseline: str, targets: dict[str, float] | None = None) -> dict[str, float]:
    """Print median per-call time and the ratio to `baseline` for every variant; return the ratios."""
    base = statistics.median(samples[baseline])
    ratios = {}
    print(f'{"variant":44} {"median us":>10} {"ratio":>7}  target')
    for name, values in samples.items():
        med = statistics.median(values)
        ratio = med / base
        ratios[name] = ratio
        target = (targets or {}).get(name)
        mark = '' if target is None else (f'<= {target}  ' + ('ok' if ratio <= target else 'MISSED'))
        print(f'{name:44} {med * 1e6:10.1f} {ratio:7.3f}  {mark}')
    return ratios


def connect(url: str) -> Redis:
    return Redis.from_url(url)


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """``--smoke``: a few calls of every case, a few seconds, for CI; the ratio lines still print."""
    parser.add_argument('--smoke', action='store_true',
                        help='a few calls of every case (seconds, for CI): proves the bench runs, not the figures')


def smoke_defaults(opts: argparse.Namespace, **small: int) -> None:
    """Under ``--smoke``, shrink the options named in ``small`` (an option given explicitly is shrunk too)."""
    if getattr(opts, 'smoke', False):
        for name, value in small.items():
            setattr(opts, name, min(getattr(opts, name), value))
        shrunk = ', '.join(f'{name}={getattr(opts, name)}' for name in small)
        print(f'smoke run ({shrunk}): proves the bench runs; its figures mean nothing')


def run_main(main: Callable[[], int | None]) -> None:
    """Exit with ``main()``'s status; an exception prints its traceback and exits 1, so CI sees a broken bench."""
    try:
        status = main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    sys.exit(status or 0)


def start_workers(url: str, worker_class: str, queue: str | list[str], count: int,
                  tree: str | None = None) -> list[subprocess.Popen]:
    """``count`` forking ``rq worker -w <worker_class>`` subprocesses on ``queue`` (or several), quiet.

    ``tree``: a checkout of another revision to run them from (its ``bench/`` and package first on their path), for
    a before-and-after in one run."""
    env = dict(os.environ, REDIS_URL=url)
    if tree:
        env['PYTHONPATH'] = os.pathsep.join([os.path.join(tree, 'bench'), tree])
    else:
        env['PYTHONPATH'] = os.pathsep.join([HERE, os.path.dirname(HERE), env.get('PYTHONPATH', '')])
    queues = [queue] if isinstance(queue, str) else queue
    return [
        subprocess.Popen(
            [sys.executable, '-m', 'rq.cli', 'worker', '-w', worker_class, '--url', url, '--logging_level', 'ERROR',
             *queues],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def stop_workers(procs: list[subprocess.Popen]) -> None:
    """Warm-stop every worker (SIGTERM), killing one that has not left within 15 s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 20 ms; RuntimeError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f'timed out waiting for {what}')
        time.sleep(0.02)


def drain_rate(jobs: list, enqueued: object) -> float:
    """Jobs per second of a batch, from rq's own ``started_at``/``ended_at``, over the part of the run after the
    producer's ``enqueue_many`` returned at ``enqueued`` (rq's ``now()``).

    Workers start on a batch while it is still being enqueued; a producer slower than the workers (an enqueue
    through a policy's admission script) would otherwise starve them for its first part and count its own speed as
    theirs. The window opens at the later of the first start and ``enqueued``, and counts the jobs started in it.
    """
    opened = max(min(job.started_at for job in jobs), enqueued)
    closed = max(job.ended_at for job in jobs)
    counted = sum(1 for job in jobs if job.started_at >= opened)
    return counted / (closed - opened).total_seconds()


def handover_delays(conn: Redis, releases: list[float]) -> list[float]:
    """Seconds from a release to the start it allowed on another worker, from the records of
    ``bench_jobs.record_start`` (``bench:starts``: server time and worker) and the server times of the releases seen:
    for each start on a worker other than the previous start's, the time since the latest release before it."""
    records = (raw.decode().split() for raw in conn.lrange('bench:starts', 0, -1))
    starts = [(float(at), worker) for at, worker in records]
    delays = []
    for (_, previous_worker), (at, worker) in zip(starts, starts[1:]):
        before = [r for r in releases if r <= at]
        if worker != previous_worker and before:
            delays.append(at - before[-1])
    return delays
