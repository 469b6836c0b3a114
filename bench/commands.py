"""Redis cost of each door, from the server's own command statistics, plus round trips seen by the client.

    python bench/commands.py [--ops 2000]

For each door it runs N operations against a fresh server, then reads INFO commandstats (which counts the commands
a script runs as well as the script call) and reports per operation: client round trips, server commands executed,
and server CPU microseconds (commandstats usec, the time Redis's single thread spent). These figures feed
docs/scaling.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_jobs import work  # noqa: E402
from common import server_url  # noqa: E402
from redis import Redis  # noqa: E402
from redis.client import Pipeline  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies import Debounce, Loner, PolicyQueue, QueueSlot, Throttle  # noqa: E402
from rq_policies.fetch import Fetcher, current_fetcher  # noqa: E402
from rq_policies.ledger import Hold  # noqa: E402


class CountingPipeline(Pipeline):
    def execute(self, raise_on_error: bool = True):
        if self.command_stack:
            self.counter[0] += 1
        return super().execute(raise_on_error)


class Counting(Redis):
    """A client that counts its round trips (a command, or a pipeline's execute)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.round_trips = [0]

    def execute_command(self, *args, **options):
        self.round_trips[0] += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction=True, shard_hint=None):
        pipe = CountingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.counter = self.round_trips
        return pipe


def measure(conn: Counting, label: str, ops: int, setup, action) -> dict:
    conn.flushdb()
    state = setup()
    conn.config_resetstat()
    conn.round_trips[0] = 0
    for i in range(ops):
        action(state, i)
    trips = conn.round_trips[0]
    stats = conn.info('commandstats')
    stats.pop('cmdstat_config', None)
    stats.pop('cmdstat_info', None)
    calls = sum(v['calls'] for v in stats.values())
    usec = sum(v['usec'] for v in stats.values())
    top = sorted(((v['calls'] / ops, k.replace('cmdstat_', '')) for k, v in stats.items()), reverse=True)
    return {'door': label, 'round_trips': trips / ops, 'commands': calls / ops, 'usec': usec / ops,
            'detail': ', '.join(f'{name} {n:.2g}' for n, name in top[:6])}


def measure_lifecycle(conn: Counting, label: str, jobs: int, worker_class, queue_class, policy, cap) -> dict:
    """One job's whole life (enqueue, fetch, start, finish, heartbeats) through an in-process worker, per job."""
    conn.flushdb()
    if cap:
        QueueSlot.set_capacity('life', cap, connection=conn)
    q = queue_class('life', connection=conn)
    worker = worker_class([q], connection=conn)
    conn.config_resetstat()
    conn.round_trips[0] = 0
    for i in range(jobs):
        if policy is None:
            q.enqueue(work, i)
        else:
            q.enqueue(work, i, policy=policy)
    worker.work(burst=True, logging_level='WARNING')
    stats = conn.info('commandstats')
    for skip in ('cmdstat_config', 'cmdstat_info', 'cmdstat_client|setname', 'cmdstat_client|list'):
        stats.pop(skip, None)
    calls = sum(v['calls'] for v in stats.values())
    usec = sum(v['usec'] for v in stats.values())
    return {'door': label, 'round_trips': conn.round_trips[0] / jobs, 'commands': calls / jobs,
            'usec': usec / jobs, 'detail': f'{jobs} jobs through a SimpleWorker burst'}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--ops', type=int, default=2000)
    opts = parser.parse_args()
    rows = []
    with server_url() as url:
        conn = Counting.from_url(url)
        stock = lambda: Queue('s', connection=conn)  # noqa: E731
        pq = lambda: PolicyQueue('p', connection=conn)  # noqa: E731
        n = opts.ops
        rows.append(measure(conn, 'stock Queue.enqueue', n, stock, lambda q, i: q.enqueue(work, i)))
        rows.append(measure(conn, 'enqueue, no policy (PolicyQueue)', n, pq, lambda q, i: q.enqueue(work, i)))
        rows.append(measure(conn, 'Loner admitted', n, pq, lambda q, i: q.enqueue(work, i, policy=Loner())))

        def held(policy):
            def setup():
                q = pq()
                q.enqueue(work, 'held', policy=policy)
                return q
            return setup

        rows.append(measure(conn, 'Loner dropped (fast path)', n, held(Loner()),
                            lambda q, i: q.enqueue(work, 'held', policy=Loner())))
        rows.append(measure(conn, 'Throttle win', n, pq, lambda q, i: q.enqueue(work, i, policy=Throttle(3600))))
        rows.append(measure(conn, 'Throttle dropped (fast path)', n, held(Throttle(3600)),
                            lambda q, i: q.enqueue(work, 'held', policy=Throttle(3600))))
        rows.append(measure(conn, 'Throttle trailing replace', n, held(Throttle(3600, trailing=True)),
                            lambda q, i: q.enqueue(work, 'held', policy=Throttle(3600, trailing=True))))
        rows.append(measure(conn, 'Debounce replace', n, held(Debounce(3600)),
                            lambda q, i: q.enqueue(work, 'held', policy=Debounce(3600))))

        def filled(capped: bool):
            def setup():
                q = pq()
                if capped:
                    QueueSlot.set_capacity('p', 10**6, connection=conn)
                for i in range(n):
                    Queue('p', connection=conn).enqueue(work, i)
                current_fetcher.set(Fetcher())
                return q
            return setup

        def fetch(q, i):
            job, _queue = PolicyQueue.dequeue_any([q], None, connection=conn)
            return job

        rows.append(measure(conn, 'fetch, uncapped (script + job fetch)', n, filled(False), fetch))
        rows.append(measure(conn, 'fetch, capped (script + job fetch)', n, filled(True), fetch))

        def holds(k):
            def setup():
                QueueSlot.HELD.snapshot()
                tokens = [f'holder-{j}' for j in range(k)]
                for t in tokens:
                    QueueSlot.acquire('p', capacity=10**6, token=t, connection=conn)
                    QueueSlot.HELD.add(Hold('rq:policies:slots:p', t, QueueSlot.TTL_SECONDS))
                return tokens
            return setup

        rows.append(measure(conn, 'release (ZREM + wake)', n, holds(n),
                            lambda tokens, i: QueueSlot.release('p', token=tokens[i], connection=conn)))
        for t in list(QueueSlot.HELD.snapshot()):
            QueueSlot.HELD.discard(t)

        def beat(tokens, i):
            with conn.pipeline() as pipe:
                pipe.expire('rq:worker:x', 100)
                QueueSlot.refresh_in(pipe, ttl=90)
                pipe.execute()

        rows.append(measure(conn, 'heartbeat refresh of 1 hold (rides the beat)', n, holds(1), beat))
        for t in list(QueueSlot.HELD.snapshot()):
            QueueSlot.HELD.discard(t)

        from rq import SimpleWorker

        from rq_policies import PolicySimpleWorker

        for label, wc, qc, pol, cap in (
            ('lifecycle: stock rq', SimpleWorker, Queue, None, None),
            ('lifecycle: PolicyWorker, no policy', PolicySimpleWorker, PolicyQueue, None, None),
            ('lifecycle: PolicyWorker, Loner', PolicySimpleWorker, PolicyQueue, Loner(), None),
            ('lifecycle: PolicyWorker, capped queue', PolicySimpleWorker, PolicyQueue, None, 10**6),
        ):
            rows.append(measure_lifecycle(conn, label, min(n, 500), wc, qc, pol, cap))

    print(f'{"door":46} {"round trips":>11} {"commands":>9} {"server us":>10}  commands per op')
    for r in rows:
        print(f'{r["door"]:46} {r["round_trips"]:11.2f} {r["commands"]:9.2f} {r["usec"]:10.1f}  {r["detail"]}')


if __name__ == '__main__':
    main()
