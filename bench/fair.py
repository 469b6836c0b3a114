"""Fair in one run: what a fetch costs with 10,000 active keys and 100,000 waiting jobs against 10 keys, and the
throughput of Fair over 1,000 active keys against the same PolicyWorker without it.

    python bench/fair.py [--keys 10000] [--per-key 10] [--rounds 5] [--calls 2000] [--jobs 300] [--workers 2]
                         [--throughput-rounds 5] [--parts fetch,throughput] [--smoke]

Uses REDIS_URL when it is set (the database is flushed between parts: point it at a scratch database), otherwise
starts its own server with rq_policies.surfaces.testing.RedisServer.

* Fetch cost: ``lua/fetch.lua`` run in this process on a queue whose list is empty, each call taking the next Fair
  job by the turns (lua/policies/fair.lua's ``source``: the active key with the lowest virtual time, its line's
  first job), the server's own time per call (INFO commandstats, usec_per_call of EVALSHA). Two states side by side
  on two queues, each written as the admission writes it (job hashes deferred, lines, the active set): 10 keys, and
  ``--keys`` (10,000) keys with ``--per-key`` (10) jobs each (100,000 waiting), measured in alternating blocks of
  100 fetches (``--rounds`` x ``--calls`` fetches each). Ratio big / small, median of the per-block ratios (target
  <= 1.2): a start's cost must not grow with keys or waiting jobs. A third queue of plain jobs on its list (no
  Fair) shows what taking a turn adds to a fetch.
* Throughput: ``--workers`` forking PolicyWorkers per variant, each variant on a queue of its own for the whole run;
  rounds hand them ``--jobs`` trivial jobs in turn: without Fair, and under Fair over 1,000 keys (job i of tenant
  i % 1000, so 1,000 keys are active while the batch waits). Throughput from rq's own timestamps after
  ``enqueue_many`` returned (common.drain_rate); ratio Fair / plain as the median of the per-round ratios (target
  >= 0.95), with the spread.

``--smoke`` runs both parts briefly (1,000 keys, small rounds): CI's proof that the bench still works, not a
measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from redis import Redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import fair_jobs  # noqa: E402
from common import add_smoke, drain_rate, run_main, server_url, smoke_defaults, start_workers, stop_workers, wait_until  # noqa: E402,I001
from rq import Queue  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.registry import FinishedJobRegistry  # noqa: E402
from rq.utils import now as rq_now  # noqa: E402
from rq.worker import Worker  # noqa: E402

from rq_policies import PolicyQueue  # noqa: E402
from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.fetch import FetchReply, fetch_call  # noqa: E402
from rq_policies.engine.keys import FAIR_ACTIVE, FAIR_WAIT  # noqa: E402
from rq_policies.policies.fair.rules import FIELD  # noqa: E402


def spread(values: list[float]) -> str:
    return f'min {min(values):.3f}, max {max(values):.3f}'


# -- fetch cost -----------------------------------------------------------------------------------------------------


def _fill(conn: Redis, name: str, count: int, per_key: int) -> object:
    """Queue ``name``: ``count`` active keys of scope 'bench' with ``per_key`` waiting jobs each, written as the
    admission writes them (``count`` 0: ``per_key`` plain jobs on the queue's list instead); returns its fetch call."""
    if not count:
        with conn.pipeline(transaction=False) as pipe:
            ids = [f'{name}.p{i}' for i in range(per_key)]
            for jid in ids:
                pipe.hset(f'rq:job:{jid}', mapping={'status': 'queued', 'origin': name})
            pipe.rpush(f'rq:queue:{name}', *ids)
            pipe.execute()
    batch = 1000
    for start in range(0, count, batch):
        with conn.pipeline(transaction=False) as pipe:
            for n in range(start, min(count, start + batch)):
                key_id = f'bench:t{n}'
                line = {}
                for i in range(per_key):
                    jid = f'{name}.j{n}.{i}'
                    pipe.hset(f'rq:job:{jid}', mapping={'status': 'deferred', 'origin': name, FIELD: f'1 0 {key_id}'})
                    line[jid] = i + 1
                pipe.zadd(FAIR_WAIT(name, key_id), line)
                pipe.zadd(f'rq:deferred:{name}', dict.fromkeys(line, 0))
                pipe.zadd(FAIR_ACTIVE(name), {key_id: 0})
            pipe.execute()
    return fetch_call([Queue(name, connection=conn)], 'bench:1:1:1', 90)


def fetch_cost(conn: Redis, big: int, per_key: int, rounds: int, calls: int,
               block: int = 100) -> dict[str, list[float]]:
    """Per state, the server time of each block of ``block`` fetches; the states live side by side on three queues
    and their blocks alternate (the order flipped every block), so load drifting on a shared machine hits each
    state alike."""
    conn.flushdb()
    total = rounds * calls
    small_per_key = total // 10 + 10  # 10 keys hold every job the calls take
    states = {'10 keys': ('small', 10, small_per_key),
              f'{big:,} keys, {big * per_key:,} waiting': ('big', big, per_key + total // big + 1),
              'no Fair: plain jobs on the list': ('plain', 0, total + 1)}
    fetches = {name: _fill(conn, queue, count, each) for name, (queue, count, each) in states.items()}
    samples: dict[str, list[float]] = {name: [] for name in states}
    for call in fetches.values():
        call.run(conn)  # the script is loaded before the counters start
    n = 0
    for b in range(total // block):
        order = list(fetches.items()) if b % 2 == 0 else list(reversed(fetches.items()))
        for name, call in order:
            conn.config_resetstat()
            for _ in range(block):
                n += 1
                token = f'bench:{os.getpid()}:{id(samples)}:{n}'  # fresh per call and per run: never a replay
                call.arg('token', token).set_key('claim', keys.claim(token))
                reply = FetchReply.decode(call.run(conn))
                assert reply.job and not reply.replayed, reply  # a fresh job taken every call
            stats = conn.info('commandstats')['cmdstat_evalsha']
            samples[name].append(stats['usec'] / stats['calls'])
    return samples


# -- throughput -----------------------------------------------------------------------------------------------------


def throughput(conn: Redis, url: str, jobs: int, workers: int, rounds: int) -> dict[str, list[float]]:
    conn.flushdb()
    variants = {'PolicyWorker, no Fair': 'plain', 'PolicyWorker, Fair over 1,000 keys': 'fair'}
    procs = []
    try:
        for queue in variants.values():
            procs += start_workers(url, 'rq_policies.PolicyWorker', queue, workers)
        for queue in variants.values():
            wait_until(lambda q=queue: Worker.count(queue=Queue(q, connection=conn)) == workers, 60, 'workers')
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(rounds):
            order = list(variants.items()) if r % 2 == 0 else list(reversed(variants.items()))
            for name, queue in order:
                q = PolicyQueue(queue, connection=conn)
                registry = FinishedJobRegistry(queue, connection=conn)
                for job_id in registry.get_job_ids():
                    registry.remove(job_id, delete_job=True)
                func = fair_jobs.fair_noop if queue == 'fair' else fair_jobs.plain_noop
                datas = [Queue.prepare_data(func, (i,), {'tenant': i % 1000}) for i in range(jobs)]
                made = [job.id for job in q.enqueue_many(datas)]
                enqueued = rq_now()
                wait_until(lambda reg=registry: reg.count >= jobs, 300, f'{jobs} jobs on {queue}')
                samples[name].append(drain_rate(Job.fetch_many(made, connection=conn), enqueued))
    finally:
        stop_workers(procs)
    return samples


def run(url: str, opts: argparse.Namespace) -> int:
    conn = Redis.from_url(url)
    missed = 0
    if 'fetch' in opts.parts:
        print(f'== fetch cost: server time per fetch (median of {opts.rounds * opts.calls // 100} interleaved blocks '
              'of 100)')
        cost = fetch_cost(conn, opts.keys, opts.per_key, opts.rounds, opts.calls)
        for name, values in cost.items():
            print(f'  {name:36} {statistics.median(values):7.2f} us  ({spread(values)})')
        small, big, plain = cost.values()
        per_round = [b / a for a, b in zip(small, big)]
        ratio = statistics.median(per_round)
        print(f'  big / small, median of per-block ratios {ratio:.3f} ({spread(per_round)}) (target <= 1.2): '
              f'{"ok" if ratio <= 1.2 else "MISSED"}')
        over = [a / p for a, p in zip(small, plain)]
        print(f'  a Fair start / a plain pop (10 keys), median of per-block ratios {statistics.median(over):.3f} '
              f'({spread(over)}): what taking the turn adds to a fetch')
        missed += ratio > 1.2
    if 'throughput' in opts.parts:
        print(f'== throughput: {opts.workers} PolicyWorkers per variant, {opts.jobs} jobs, {opts.throughput_rounds} '
              'rounds')
        rates = throughput(conn, url, opts.jobs, opts.workers, opts.throughput_rounds)
        for name, values in rates.items():
            print(f'  {name:40} {statistics.median(values):8.1f} jobs/s ({spread(values)})')
        plain, fair = rates.values()
        by_round = [f / p for f, p in zip(fair, plain)]
        ratio = statistics.median(by_round)
        print(f'  Fair / plain, median of the per-round ratios {ratio:.3f} ({spread(by_round)}; target >= 0.95): '
              f'{"ok" if ratio >= 0.95 else "MISSED"}')
        missed += ratio < 0.95
    conn.flushdb()
    conn.close()
    if missed:
        print(f'{missed} target(s) missed')
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--keys', type=int, default=10_000)
    parser.add_argument('--per-key', type=int, default=10)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--calls', type=int, default=2000)
    parser.add_argument('--jobs', type=int, default=300)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--throughput-rounds', type=int, default=5)
    parser.add_argument('--parts', default='fetch,throughput', help='comma-separated: fetch, throughput')
    add_smoke(parser)
    opts = parser.parse_args()
    opts.parts = set(opts.parts.split(','))
    smoke_defaults(opts, keys=1000, rounds=1, calls=200, jobs=30, throughput_rounds=1)
    with server_url() as url:
        return run(url, opts)


if __name__ == '__main__':
    run_main(main)
