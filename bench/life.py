"""A job's whole life on one server: what it costs the server's CPU, BullMQ, stock rq and rq-policies side by side.

    python bench/life.py [--jobs 300] [--rounds 5] [--warm 20] [--no-bullmq] [--only TEXT ...] [--smoke]

One server for the whole run (REDIS_URL if set: it is flushed between variants, point it at a scratch database;
otherwise the bundled Valkey, rq_policies.surfaces.testing.RedisServer, on a free port). For every variant, on a
flushed database: ``--jobs`` jobs enqueued one by one, then one worker runs them (a no-op) until all are done; the
server's process CPU (INFO cpu, ``used_cpu_user`` + ``used_cpu_sys``: every thread, reading requests and writing
replies included) read before the first enqueue and after the worker is done, divided by the jobs. Jobs per server
core is 1e6 / that (how many such lives one core of the server carries per second, were it saturated by them).

Variants:

* **BullMQ** (``bench/bullmq_driver.js``'s "life", installed from npm by ``bench/bullmq.py``'s ``install()``):
  ``queue.add('work', {i})`` of each job, one by one and awaited (rq enqueues one by one too), then a ``Worker``
  with a no-op processor (``async () => {}``), ``concurrency: 1``, run until it has completed all of them (its
  'completed' events counted), then closed. Job and worker options otherwise BullMQ's defaults: removeOnComplete
  and removeOnFail unset (completed jobs and their return values are kept, as rq keeps results), lockDuration 30 s,
  stalledInterval 30 s, drainDelay 5 s; the worker created with ``autorun: false`` before the measurement and run
  after the adds (as rq's burst worker starts after the enqueues). The same with ``concurrency: 10`` is a second row.
* **stock rq**: ``Queue.enqueue`` of each job, then ``SimpleWorker(...).work(burst=True)`` in this process; and the
  same with rq's forking ``Worker`` (a work horse forked per job).
* **rq-policies**: ``PolicyQueue.enqueue`` of each job, then ``PolicySimpleWorker(...).work(burst=True)`` in this
  process: without a policy; with ``policy=Loner()``; on a capped queue (``QueueSlot.set(queue, 10**6)``, a cap that
  never binds: every job takes and releases a hold); under ``Fair(key=i % 100)`` (100 keys, every job parked in its
  key's line and started by the turns); under ``Concurrency(1, key=i % 100)`` (100 keys, a hold per running job;
  one worker, so the limit never binds). And ``PolicyWorker`` (forking) without a policy; and the same with each
  work horse opening a connection of its own, as rq's horses do (``ConnectingPolicyWorker``: what the connection
  the horses share saves). And both worker classes without a policy ending each job as before the guarded end,
  through rq's WATCH and SMEMBERS of the job's dependents (``WatchingPolicySimpleWorker``, ``WatchingPolicyWorker``:
  ``lean_end = False``), what the guarded end saves.

The stock workers are rq's classes with one change: their command-channel thread looks at its stop flag every 0.2 s
instead of every 60 s (``StockSimpleWorker``, ``StockWorker``; as PolicyWorker does), because with redis-py 8.2 rq
3.0's burst exit can wait the whole 60 s joining it, and the server's idle CPU over that wait would be counted as
the jobs'. Each look is a wait on the socket: no command.

Rounds interleave the variants (the order reversed every other round) so a shared machine's drifting load hits them
alike; one unmeasured warm-up life of ``--warm`` jobs each first (scripts loaded, imports done). Reported per
variant: the median over the rounds and the range (min-max) of CPU per job and of jobs per core; the ratio to
BullMQ (concurrency 1) and to stock rq (the SimpleWorker rows against stock's SimpleWorker, the forking rows
against stock's Worker), each the median of the per-round ratios with their range (x1.00 = the same server CPU per
job; above 1 costs the server more); round trips per job as the client counts them (``bench/commands.py``'s
Counting: a command or a pipeline's execute is one, the doors' leased sends included; its counts live in memory
shared with the work horses, so the forking rows count the horse's sends too); and the wall rate for reference.

Checks (the bench fails otherwise): BullMQ's worker completed every job (its 'completed' events, none failed, and
the queue's completed count); every rq job is in the queue's FinishedJobRegistry; and the client counted every
EVALSHA and EVAL the server ran (INFO commandstats), so no send went uncounted. The server's own background work
(its cron, 10 times a second) over a variant's wall time counts too: a slower life pays for more of it.

``--smoke`` (CI): 20 jobs, 1 round, a warm-up of 5; well inside 60 s. Without node or npm (or when the install
fails), or with ``--no-bullmq``, the BullMQ rows are skipped, saying so, and the ratios to BullMQ are left out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import redis  # noqa: E402
import rq  # noqa: E402
from bench_jobs import work  # noqa: E402
from bullmq import Driver, install  # noqa: E402
from commands import Counting, server_cpu  # noqa: E402  (importing it counts the doors' leased sends)
from common import add_smoke, run_main, server_url, smoke_defaults  # noqa: E402
from rq import Queue, SimpleWorker, Worker  # noqa: E402
from rq.registry import FinishedJobRegistry  # noqa: E402

from rq_policies import (  # noqa: E402
    Concurrency,
    Fair,
    Loner,
    PolicyQueue,
    PolicySimpleWorker,
    PolicyWorker,
    QueueSlot,
)

QUEUE = 'life'
KEYS = 100
#: Seconds a life may take before the bench calls it hung (BullMQ's side; rq's burst ends by itself).
LIFE_TIMEOUT = 300
BULLMQ = 'BullMQ add + Worker, concurrency 1'
STOCK_SIMPLE = 'stock rq: enqueue + SimpleWorker'
STOCK_FORKING = 'stock rq: enqueue + Worker (forking)'


# -- stock rq, without the 60 s exit ------------------------------------------------------------------------------


def _subscribe(worker: Any) -> None:
    """rq's ``Worker.subscribe`` with its thread looking every 0.2 s instead of 60 (see the module's docstring)."""
    worker.pubsub = worker.connection.pubsub()
    worker.pubsub.subscribe(**{worker.pubsub_channel_name: worker.handle_payload})
    worker.pubsub_thread = worker.pubsub.run_in_thread(
        sleep_time=0.2, daemon=True, exception_handler=worker._pubsub_exception_handler)


class StockSimpleWorker(SimpleWorker):
    """rq's SimpleWorker, its burst exit not waiting up to 60 s on its command-channel thread."""

    subscribe = _subscribe


class StockWorker(Worker):
    """rq's Worker (forking), its burst exit not waiting up to 60 s on its command-channel thread."""

    subscribe = _subscribe


class ConnectingPolicyWorker(PolicyWorker):
    """PolicyWorker whose work horses each open a connection, as rq's do (and PolicyWorker's did before they shared
    one the worker keeps for them): the saving measured in the same run."""

    def _pass_horse_connection(self) -> None:
        pass


class WatchingPolicySimpleWorker(PolicySimpleWorker):
    """PolicySimpleWorker ending each job as before the guarded end: rq's WATCH and SMEMBERS of the job's dependents,
    two round trips of their own (``lean_end = False``): what the guarded end saves, measured in the same run."""

    lean_end = False


class WatchingPolicyWorker(PolicyWorker):
    """PolicyWorker ending each job through rq's WATCH and SMEMBERS, as before the guarded end (``lean_end``)."""

    lean_end = False


# -- round trips counted across the fork --------------------------------------------------------------------------


class _Slot:
    """``round_trips[0]`` kept in shared memory."""

    def __init__(self, tally: Any, index: int) -> None:
        self.tally, self.index = tally, index

    def __getitem__(self, _: int) -> int:
        return self.tally[self.index]

    def __setitem__(self, _: int, value: int) -> None:
        self.tally[self.index] = value


class _ScriptCounts(Counter):
    """A Counter of commands sent whose EVALSHA and EVAL counts live in shared memory (the others stay in this
    process: only the scripts are checked against the server)."""

    def __init__(self, tally: Any, first: int) -> None:
        self.tally = tally
        self.at = {'evalsha': first, 'eval': first + 1}
        super().__init__()

    def __getitem__(self, key: str) -> int:
        if key in self.at:
            return self.tally[self.at[key]]
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.at:
            return self.tally[self.at[key]]
        return super().get(key, default)

    def __setitem__(self, key: str, value: int) -> None:
        if key in self.at:
            self.tally[self.at[key]] = value
        else:
            super().__setitem__(key, value)

    def clear(self) -> None:
        super().clear()
        for index in self.at.values():
            self.tally[index] = 0


class SharedCounting(Counting):
    """bench/commands.py's Counting client with its round trips and script counts in memory shared with forked
    children (``multiprocessing.RawArray``: an anonymous shared mapping a fork keeps): a work horse's sends count
    too. While a no-op horse runs its parent sends nothing, so the unlocked increments do not race."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tally = multiprocessing.RawArray('q', 5)
        self.round_trips = _Slot(self.tally, 0)
        self.sent = _ScriptCounts(self.tally, 1)
        self.queued = _ScriptCounts(self.tally, 3)


# -- the variants -------------------------------------------------------------------------------------------------


def _tenant(args: tuple, kwargs: dict) -> int:
    return args[0] % KEYS


@dataclass(frozen=True)
class Life:
    """A Python variant: the queue and worker classes, the policy of every enqueue, a cap on the queue."""

    label: str
    worker_class: type
    queue_class: type
    policy: Callable[[], Any] | None = None
    capped: bool = False
    forking: bool = False

    @property
    def baseline(self) -> str:
        return STOCK_FORKING if self.forking else STOCK_SIMPLE


LIVES = (
    Life(STOCK_SIMPLE, StockSimpleWorker, Queue),
    Life('ours: PolicySimpleWorker, no policy', PolicySimpleWorker, PolicyQueue),
    Life("ours: PolicySimpleWorker, no policy, rq's WATCH at the end", WatchingPolicySimpleWorker, PolicyQueue),
    Life('ours: PolicySimpleWorker, Loner()', PolicySimpleWorker, PolicyQueue, Loner),
    Life('ours: PolicySimpleWorker, capped queue', PolicySimpleWorker, PolicyQueue, capped=True),
    Life(f'ours: PolicySimpleWorker, Fair ({KEYS} keys)', PolicySimpleWorker, PolicyQueue,
         lambda: Fair(key=_tenant, scope='life')),
    Life(f'ours: PolicySimpleWorker, Concurrency(1) ({KEYS} keys)', PolicySimpleWorker, PolicyQueue,
         lambda: Concurrency(1, key=_tenant, scope='life')),
    Life(STOCK_FORKING, StockWorker, Queue, forking=True),
    Life('ours: PolicyWorker (forking), no policy', PolicyWorker, PolicyQueue, forking=True),
    Life("ours: PolicyWorker (forking), no policy, rq's WATCH at the end", WatchingPolicyWorker, PolicyQueue,
         forking=True),
    Life('ours: PolicyWorker (forking), a connection per horse', ConnectingPolicyWorker, PolicyQueue, forking=True),
)


def scripts_ran(conn: Counting) -> int:
    stats = conn.info('commandstats')
    return sum(int(stats.get(f'cmdstat_{name}', {}).get('calls', 0)) for name in ('evalsha', 'eval'))


def python_life(conn: SharedCounting, life: Life, jobs: int) -> dict[str, float]:
    """One life of ``jobs`` jobs through ``life``'s queue and worker, in this process (a forking worker's horses
    forked from it); per job: server CPU (us) and round trips, and the wall rate."""
    conn.flushdb()
    if life.capped:
        QueueSlot.set(QUEUE, 10**6, connection=conn)
    queue = life.queue_class(QUEUE, connection=conn)
    worker = life.worker_class([queue], connection=conn)
    policy = life.policy() if life.policy else None
    conn.reset_counts()  # CONFIG RESETSTAT: the scripts' check below counts this life's only
    before = server_cpu(conn)
    trips_before = conn.round_trips[0]
    started = time.perf_counter()
    for i in range(jobs):
        if policy is None:
            queue.enqueue(work, i)
        else:
            queue.enqueue(work, i, policy=policy)
    worker.work(burst=True, logging_level='WARNING')
    wall = time.perf_counter() - started
    trips = conn.round_trips[0] - trips_before
    cpu = server_cpu(conn) - before
    server_scripts = scripts_ran(conn)
    client_scripts = sum(counts.get(name, 0) for counts in (conn.sent, conn.queued) for name in ('evalsha', 'eval'))
    if server_scripts != client_scripts:
        raise RuntimeError(f'{life.label}: the server ran {server_scripts} EVALSHA/EVAL and the client counted '
                           f'{client_scripts}: a send this bench does not see')
    finished = FinishedJobRegistry(QUEUE, connection=conn).count
    if finished != jobs:
        raise RuntimeError(f'{life.label}: {finished} of {jobs} jobs in the finished registry')
    return {'cpu_us': cpu * 1e6 / jobs, 'trips': trips / jobs, 'rate': jobs / wall}


def bullmq_life(conn: Counting, driver: Driver, jobs: int, r: int, concurrency: int) -> dict[str, float]:
    """One life of ``jobs`` jobs through BullMQ's add and Worker (see the module's docstring), per job."""
    conn.flushdb()
    driver.ask(op='life', n=jobs, round=r, concurrency=concurrency, timeout_s=LIFE_TIMEOUT)
    before = server_cpu(conn)
    got = driver.ask(go=True)
    cpu = server_cpu(conn) - before
    counts = driver.ask(counts=True)
    if got['completed'] != jobs or got['failed'] or counts.get('completed') != jobs:
        raise RuntimeError(f'BullMQ, concurrency {concurrency}: {got["completed"]} completed and {got["failed"]} '
                           f'failed of {jobs} (the queue counts {counts})')
    return {'cpu_us': cpu * 1e6 / jobs, 'trips': float('nan'), 'rate': jobs / got['wall_s']}


# -- the report ---------------------------------------------------------------------------------------------------


def _range(values: list[float], fmt: str) -> str:
    return f'{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]'


def _ratio(samples: list[dict], base: list[dict] | None) -> str:
    if not base:
        return '-'
    ratios = [s['cpu_us'] / b['cpu_us'] for s, b in zip(samples, base)]
    return f'x{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]'


def report(results: dict[str, list[dict]], lives: dict[str, Life]) -> None:
    header = ('variant', 'server CPU us/job', 'jobs per server core', 'x BullMQ', 'x stock', 'round trips/job',
              'wall jobs/s')
    rows = []
    for label, samples in results.items():
        life = lives.get(label)
        base = results.get(life.baseline) if life else None
        trips = statistics.median(s['trips'] for s in samples)
        rows.append((
            label,
            _range([s['cpu_us'] for s in samples], ',.0f'),
            _range([1e6 / s['cpu_us'] for s in samples], ',.0f'),
            _ratio(samples, results.get(BULLMQ)),
            _ratio(samples, base) if life and life.label != life.baseline else '-',
            '-' if trips != trips else f'{trips:.2f}',
            f'{statistics.median(s["rate"] for s in samples):,.0f}',
        ))
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header))]
    line = lambda row: '| ' + ' | '.join(f'{cell:{"<" if i == 0 else ">"}{widths[i]}}'  # noqa: E731
                                         for i, cell in enumerate(row)) + ' |'
    print(line(header))
    print('|' + '|'.join('-' * (w + 1) + ':' if i else '-' * (w + 2) for i, w in enumerate(widths)) + '|')
    for row in rows:
        print(line(row))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--jobs', type=int, default=300, help='jobs per life (per variant and round)')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds')
    parser.add_argument('--warm', type=int, default=20, help='jobs of the unmeasured warm-up life of each variant')
    parser.add_argument('--no-bullmq', action='store_true', help='leave BullMQ out')
    parser.add_argument('--only', action='append', default=[], metavar='TEXT',
                        help="run only the rq variants whose label contains TEXT (repeatable; each row's stock "
                             'baseline is kept)')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, jobs=20, rounds=1, warm=5)
    folder, how = (None, '--no-bullmq') if opts.no_bullmq else install(timeout=45 if opts.smoke else 300)
    print(how if folder else f'BullMQ rows SKIPPED, BullMQ cannot run here: {how}')
    lives = {life.label: life for life in LIVES}
    with server_url() as url:
        conn = SharedCounting.from_url(url)
        info = conn.info('server')
        print(f'server {info.get("valkey_version") or info.get("redis_version")}, rq {rq.__version__}, redis-py '
              f'{redis.__version__}; {opts.jobs} jobs a life, {opts.rounds} rounds interleaved (the order reversed '
              f'every other round); load average {os.getloadavg()[0]:.2f}')
        driver = Driver(folder, url) if folder else None
        variants: list[tuple[str, Callable[[int, int], dict]]] = []
        if driver:
            for concurrency in (1, 10):
                variants.append((f'BullMQ add + Worker, concurrency {concurrency}',
                                 lambda n, r, c=concurrency: bullmq_life(conn, driver, n, r, c)))
        chosen = [life for life in LIVES if not opts.only or any(text in life.label for text in opts.only)]
        chosen = [life for life in LIVES if life in chosen or any(c.baseline == life.label for c in chosen)]
        variants += [(life.label, lambda n, r, life=life: python_life(conn, life, n)) for life in chosen]
        results: dict[str, list[dict]] = {label: [] for label, _ in variants}
        try:
            for _label, run in variants:
                run(opts.warm, -1)
            for r in range(opts.rounds):
                for label, run in (variants if r % 2 == 0 else variants[::-1]):
                    results[label].append(run(opts.jobs, r))
        finally:
            if driver:
                driver.close()
            conn.flushdb()
        print(f'load average after {os.getloadavg()[0]:.2f}\n')
    report(results, lives)
    for lean, watching in (('ours: PolicySimpleWorker, no policy', "ours: PolicySimpleWorker, no policy, rq's WATCH at "
                                                                   'the end'),
                           ('ours: PolicyWorker (forking), no policy', "ours: PolicyWorker (forking), no policy, rq's "
                                                                       'WATCH at the end')):
        if results.get(lean) and results.get(watching):
            print(f'\n{lean}: server CPU x its twin ending through rq\'s WATCH and SMEMBERS (median of the per-round '
                  f'ratios [min-max]): {_ratio(results[lean], results[watching])}')
    print('\nserver CPU: INFO cpu of the server process over a life, per job; jobs per server core: 1e6 / that; '
          'medians over the rounds [min-max]. x BullMQ (concurrency 1) and x stock (SimpleWorker rows against stock '
          "SimpleWorker, forking rows against stock Worker): medians of the per-round ratios of server CPU "
          '[min-max]. Round trips: the Python client\'s, work horses included.')
    return 0


if __name__ == '__main__':
    run_main(main)
