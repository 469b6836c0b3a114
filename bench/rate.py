"""QueueRate in one run: the server time its check adds to a fetch, the rate 4 workers achieve, the delay from
eligible to started on a sleeping worker, and what an idle worker on a limited queue costs.

    python bench/rate.py [--rounds 7] [--calls 2000] [--seconds 60] [--gaps 40] [--idle-seconds 5] [--smoke]

Uses REDIS_URL when it is set (the database is flushed between parts: point it at a scratch database), otherwise
starts its own server with rq_policies.surfaces.testing.RedisServer.

* Fetch cost: ``lua/fetch.lua`` run in this process on a queue of ready job ids, the server's own time per call
  (INFO commandstats, usec_per_call of EVALSHA), each call with a fresh claim token (as each worker fetch has; one
  token again is a replay the claim record answers), rounds interleaved: without the rate's part in the gate order (the
  engine as before QueueRate), with it on an unlimited queue, on a limited queue that allows the start, and on one
  that refuses it; the same two with a rate of two windows (``QueueRate.set(queue, windows=...)``); and jobs of a
  per-key Rate of one window and of two (``Rate(windows=...)``, checked and taken by the same fetch). Ratios against
  the first; the difference to "limited, allows" is what the rate check costs (target <= 10 us), and the two-window
  rows are also printed as ratios of their one-window rows (what a second window costs).
* Achieved rate: 4 forking PolicyWorkers on a queue limited to ``--limit`` starts a second, burst 1, for
  ``--seconds``, with more than enough no-op jobs; the start times are taken in the worker right after each fetch.
  Achieved starts a second over the run, as a ratio of the limit (target 0.98 to 1.00).
* Eligible to start: one PolicyWorker on a queue limited to 2 starts a second (burst 1), jobs waiting: with burst 1
  each start is allowed exactly one interval after the fetch before it, so the gap between two starts less the
  interval is how late the sleeping worker took it (target p50 <= 20 ms).
* Idle cost: one PolicyWorker whose only queue is limited and exhausted (jobs waiting): fetch round trips a second
  (target <= 2).

Throughput on an unlimited queue against stock rq is bench/worker.py's (its PolicyWorker runs the rate's gate too).

``--smoke`` runs every part briefly: CI's proof that the bench still works, not a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

from redis import Redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_jobs  # noqa: E402
from common import add_smoke, run_main, server_url, smoke_defaults, start_workers, stop_workers, wait_until  # noqa: E402
from rq import Queue  # noqa: E402
from rq.worker import Worker  # noqa: E402

from rq_policies import PolicyQueue, PolicyWorker, QueueRate, UnknownQueueWarning  # noqa: E402
from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.fetch import fetch_call  # noqa: E402
from rq_policies.engine.policy import FETCH, registered  # noqa: E402

# A bench caps and limits fresh queues before their first job, on purpose.
warnings.simplefilter('ignore', UnknownQueueWarning)

TAKEN = 'bench:taken'


class RecordingWorker(PolicyWorker):
    """Records the server time it took each job at (right after the fetch, before the fork) on ``bench:taken``."""

    def execute_job(self, job, queue):
        seconds, micros = self.connection.time()
        self.connection.rpush(TAKEN, f'{seconds + micros / 1e6:.6f}')
        return super().execute_job(job, queue)


def server_now(conn: Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


# -- fetch cost -----------------------------------------------------------------------------------------------------

FETCH_VARIANTS = ('without the rate part', 'unlimited queue', 'limited, allows', 'limited 2 windows, allows',
                  'limited, refuses', 'limited 2 windows, refuses', 'key Rate, allows', 'key Rate 2 windows, allows')
#: Each two-window row and the one-window row it is compared with.
SECOND_WINDOW = (('limited 2 windows, allows', 'limited, allows'), ('limited 2 windows, refuses', 'limited, refuses'),
                 ('key Rate 2 windows, allows', 'key Rate, allows'))
BIG = 2**31 - 1
#: The per-key rates' job fields (``policies_key_rate``): one window, and two, each allowing every start.
KEY_FIELDS = {'key Rate, allows': f'{BIG} 1 {BIG} bench:k',
              'key Rate 2 windows, allows': f'{BIG},{BIG} 1,3600 {BIG},{BIG} bench:k'}


def _prepare(conn: Redis, variant: str, calls: int) -> object:
    conn.flushdb()
    name = 'cost'
    ids = [f'j{i}' for i in range(calls + 1)]  # the warm-up call takes one
    field = KEY_FIELDS.get(variant)
    with conn.pipeline(transaction=False) as pipe:
        for jid in ids:
            pipe.hset(f'rq:job:{jid}', mapping={'status': 'queued', **({'policies_key_rate': field} if field else {})})
        pipe.rpush(f'rq:queue:{name}', *ids)
        pipe.execute()
    if variant == 'limited, allows':
        QueueRate.set(name, BIG, per=1, burst=BIG, connection=conn)
    elif variant == 'limited 2 windows, allows':
        QueueRate.set(name, windows=[(BIG, 1, BIG), (BIG, 3600, BIG)], connection=conn)
    elif variant == 'limited, refuses':
        QueueRate.set(name, 1, per=3600, connection=conn)
        conn.set(f'rq:policies:tat:{name}', f'{server_now(conn) + 3600:.6f} 3600', ex=3600)
    elif variant == 'limited 2 windows, refuses':  # the second window refuses: both are read
        QueueRate.set(name, windows=[(BIG, 1, BIG), (1, 3600)], connection=conn)
        conn.set(f'rq:policies:tat:{name}', f'{server_now(conn):.6f} 0 1 {server_now(conn) + 3600:.6f} 3600 3600',
                 ex=3600)
    call = fetch_call([Queue(name, connection=conn)], 'bench:1:1:1', 90)
    if variant == 'without the rate part':
        call.arg('order', [p.name for p in registered(FETCH) if p is not QueueRate])
    return call


def _fresh(call: object, r: int, i: int) -> object:
    token = f'bench:{r}:{i}:1'
    call.set_key('claim', keys.claim(token))
    call.arg('token', token)
    return call


def fetch_cost(conn: Redis, rounds: int, calls: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in FETCH_VARIANTS}
    for r in range(rounds):
        order = list(FETCH_VARIANTS) if r % 2 == 0 else list(reversed(FETCH_VARIANTS))
        for variant in order:
            call = _prepare(conn, variant, calls)
            _fresh(call, r, -1).run(conn)  # the script is loaded before the counters start
            conn.config_resetstat()
            for i in range(calls):
                # A fresh claim token each call, as each worker fetch has: one token again is a replay, which the
                # script answers from its claim record (it timed 200 calls that took 1 job at 22.5 us each).
                _fresh(call, r, i).run(conn)
            stats = conn.info('commandstats')['cmdstat_evalsha']
            samples[variant].append(stats['usec'] / stats['calls'])
    return {name: statistics.median(values) for name, values in samples.items()}


# -- workers --------------------------------------------------------------------------------------------------------


def workers_idle(conn: Redis, queue: str, count: int) -> None:
    wait_until(lambda: Worker.count(queue=Queue(queue, connection=conn)) == count, 60, f'{count} workers')
    time.sleep(0.5)


def enqueue(conn: Redis, queue: str, count: int) -> None:
    q = PolicyQueue(queue, connection=conn)
    for start in range(0, count, 500):
        q.enqueue_many([Queue.prepare_data(bench_jobs.noop, (i,)) for i in range(start, min(count, start + 500))])


def taken(conn: Redis) -> list[float]:
    return sorted(float(v) for v in conn.lrange(TAKEN, 0, -1))


def achieved_rate(conn: Redis, url: str, limit: int, seconds: float) -> tuple[float, int]:
    conn.flushdb()
    count = int(limit * seconds) + 1
    procs = start_workers(url, 'rate.RecordingWorker', 'rated', 4)
    try:
        workers_idle(conn, 'rated', 4)
        QueueRate.set('rated', limit, per=1, connection=conn)
        enqueue(conn, 'rated', count)
        wait_until(lambda: conn.llen(TAKEN) >= count, seconds * 3 + 60, f'{count} starts')
    finally:
        stop_workers(procs)
    times = taken(conn)
    return (len(times) - 1) / (times[-1] - times[0]) / limit, len(times)


def eligible_to_start(conn: Redis, url: str, gaps: int) -> list[float]:
    conn.flushdb()
    interval = 0.5
    procs = start_workers(url, 'rate.RecordingWorker', 'sleepy', 1)
    try:
        workers_idle(conn, 'sleepy', 1)
        QueueRate.set('sleepy', 2, per=1, connection=conn)
        enqueue(conn, 'sleepy', gaps + 1)
        wait_until(lambda: conn.llen(TAKEN) >= gaps + 1, gaps * interval * 3 + 30, f'{gaps + 1} starts')
    finally:
        stop_workers(procs)
    times = taken(conn)
    return [later - earlier - interval for earlier, later in zip(times, times[1:])]


def idle_cost(conn: Redis, url: str, seconds: float) -> float:
    conn.flushdb()
    QueueRate.set('blocked', 1, per=3600, connection=conn)
    conn.set('rq:policies:tat:blocked', f'{server_now(conn) + 3600:.6f} 3600', ex=3600)
    enqueue(conn, 'blocked', 5)
    procs = start_workers(url, 'rate.RecordingWorker', 'blocked', 1)
    try:
        workers_idle(conn, 'blocked', 1)
        time.sleep(1.0)
        before = conn.info('commandstats').get('cmdstat_evalsha', {}).get('calls', 0)
        time.sleep(seconds)
        after = conn.info('commandstats').get('cmdstat_evalsha', {}).get('calls', 0)
    finally:
        stop_workers(procs)
    return (after - before) / seconds


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run(url: str, opts: argparse.Namespace) -> None:
    conn = Redis.from_url(url)
    print(f'== fetch cost: server time per fetch (median of {opts.rounds} interleaved rounds of {opts.calls})')
    cost = fetch_cost(conn, opts.rounds, opts.calls)
    base = cost['without the rate part']
    for name, usec in cost.items():
        print(f'  {name:28} {usec:7.2f} us   x{usec / base:.3f}')
    extra = cost['limited, allows'] - base
    print(f'  the rate check costs {extra:+.2f} us per fetch (target <= 10 us): {"ok" if extra <= 10 else "MISSED"}')
    for two, one in SECOND_WINDOW:
        print(f'  a second window: {two!r} against {one!r}: {cost[two] - cost[one]:+.2f} us, '
              f'x{cost[two] / cost[one]:.3f}')

    print(f'== achieved rate: 4 PolicyWorkers, {opts.limit} starts/s, burst 1, {opts.seconds:g} s')
    ratio, count = achieved_rate(conn, url, opts.limit, opts.seconds)
    print(f'  {count} starts: achieved x{ratio:.4f} of the limit (target 0.98 to 1.00): '
          f'{"ok" if 0.98 <= ratio <= 1.0 + 1e-3 else "MISSED"}')

    print(f'== eligible to start on a sleeping PolicyWorker ({opts.gaps} starts at 2/s)')
    delays = eligible_to_start(conn, url, opts.gaps)
    p50 = percentile(delays, 0.5)
    print(f'  p50 {p50 * 1000:.1f} ms, p90 {percentile(delays, 0.9) * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms '
          f'(target p50 <= 20 ms): {"ok" if p50 <= 0.020 else "MISSED"}')

    print(f'== idle cost: one PolicyWorker on an exhausted limited queue, {opts.idle_seconds:g} s')
    per_second = idle_cost(conn, url, opts.idle_seconds)
    print(f'  {per_second:.2f} fetch round trips a second (target <= 2): {"ok" if per_second <= 2 else "MISSED"}')
    conn.flushdb()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--calls', type=int, default=2000)
    parser.add_argument('--limit', type=int, default=20)
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--gaps', type=int, default=40)
    parser.add_argument('--idle-seconds', type=float, default=5)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=1, calls=200, seconds=2, gaps=4, idle_seconds=1)
    with server_url() as url:
        run(url, opts)
    return 0


if __name__ == '__main__':
    run_main(main)
