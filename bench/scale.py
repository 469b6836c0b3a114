"""Every door at scale: its cost beside 100,000 live identities, 1,000 live holds or a 100,000-job backlog, as a
ratio to the same door on an empty server, measured in one run with the calls interleaved.

    python bench/scale.py [--rounds 9] [--calls 200] [--identities 100000] [--holds 1000] [--backlog 100000] [--smoke]

Two servers run side by side: one empty, one loaded. Each variant makes the same call on both, alternately, so the
ratio is the cost of the state alone (target: within 1.1x, the policy-engine issue). The doors: a Loner admission
and a Throttle win (beside live markers and windows of other identities), the capped fetch (beside live holds of
the same queue's ledger, under a cap they do not reach) and an enqueue and a fetch of a queue with a long backlog.

Before the timed rounds, every door runs ``--warmup`` untimed calls on both servers. Right after the load, the loaded
server's first few thousand writes cost about 30 us of server time more each (whichever door ran first paid it, 1.12
to 1.15x, and the same door in a later round did not: measured with INFO commandstats), a transient of loading
300,000 keys in seconds, not of holding them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, run_main, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402

from rq_policies import Loner, PolicyQueue, QueueSlot, Throttle, UnknownQueueWarning  # noqa: E402
from rq_policies.engine.fetch import Fetcher, current_fetcher  # noqa: E402
from rq_policies.surfaces.testing import RedisServer  # noqa: E402

# A bench caps and limits fresh queues before their first job, on purpose.
warnings.simplefilter('ignore', UnknownQueueWarning)


def load(conn: Redis, opts: argparse.Namespace) -> None:
    """Fill the loaded server: live identities of both policies, live holds, and a backlog."""
    q = PolicyQueue('scale', connection=conn)
    for start in range(0, opts.identities, 1000):
        batch = range(start, min(start + 1000, opts.identities))
        with conn.pipeline(transaction=False) as pipe:
            for i in batch:  # markers and windows as the scripts write them, naming no job: stale, never matched
                pipe.set(f'rq:policies:loner:scale:{i:064x}', f'other-{i}')
                pipe.set(f'rq:policies:throttle:scale:{i:064x}:1', f'other-{i}', ex=3600)
            pipe.execute()
    QueueSlot.set('capped', 10**6, connection=conn)
    for i in range(opts.holds):
        QueueSlot.acquire('capped', capacity=10**6, ttl=3600, token=f'elsewhere:{i}:1:1', connection=conn)
        QueueSlot.HELD.discard(f'elsewhere:{i}:1:1')  # other workers' holds: not this process's to refresh
    for start in range(0, opts.backlog, 1000):
        n = min(1000, opts.backlog - start)
        q.enqueue_many([PolicyQueue.prepare_data(work, (start + i,), job_id=f'backlog-{start + i}') for i in range(n)])
    del q


def doors(conn: Redis, tag: str) -> dict:
    loner = PolicyQueue('scale', connection=conn)
    capped = PolicyQueue('capped', connection=conn)
    counter = [0]

    def admit(_: int) -> None:
        counter[0] += 1
        loner.enqueue(work, f'{tag}-{counter[0]}', policy=Loner())

    def throttle(_: int) -> None:
        counter[0] += 1
        loner.enqueue(work, f'{tag}-t-{counter[0]}', policy=Throttle(3600))

    def fetch_capped(_: int) -> None:
        capped.enqueue(work, 1)
        token = current_fetcher.set(Fetcher())
        try:
            job, _queue = PolicyQueue.dequeue_any([capped], None, connection=conn)
        finally:
            current_fetcher.reset(token)
        QueueSlot.release('capped', QueueSlot.HELD.holds()[-1].token if QueueSlot.HELD else None, connection=conn)

    def fetch_backlog(_: int) -> None:
        token = current_fetcher.set(Fetcher())
        try:
            PolicyQueue.dequeue_any([loner], None, connection=conn)
        finally:
            current_fetcher.reset(token)
        loner.enqueue(work, 1, policy=None)  # keep the backlog as long as it was

    return {'Loner admitted': admit, 'Throttle win': throttle, 'capped fetch (holds)': fetch_capped,
            'fetch + enqueue (backlog)': fetch_backlog}


def wide_look(opts: argparse.Namespace) -> None:
    """Server time of one fetch over 50 queues with 40 capped and full, against a fetch of one capped queue."""
    with RedisServer() as server:
        conn = Redis.from_url(server.url)
        names = [f'w{i}' for i in range(50)]
        for name in names[:40]:
            QueueSlot.set(name, 1, connection=conn)
            QueueSlot.acquire(name, capacity=1, ttl=3600, token=f'busy:{name}', connection=conn)
            QueueSlot.HELD.discard(f'busy:{name}')
            PolicyQueue(name, connection=conn).enqueue(work, 1)  # waiting behind the full cap
        QueueSlot.set('single', 10**6, connection=conn)
        wide = [PolicyQueue(name, connection=conn) for name in names]
        single = PolicyQueue('single', connection=conn)

        def look(queues: list, refill: bool) -> float:
            if refill:
                single.enqueue(work, 1)
            conn.config_resetstat()
            token = current_fetcher.set(Fetcher())
            try:
                got = PolicyQueue.dequeue_any(queues, None, connection=conn) if refill else None
                if not refill:
                    from rq_policies.engine.fetch import fetch_call

                    fetch_call(queues, 'look', 60, burst=False).run(conn)
            finally:
                current_fetcher.reset(token)
            stats = conn.info('commandstats')['cmdstat_evalsha']
            if got is not None:
                QueueSlot.release('single', QueueSlot.HELD.holds()[-1].token, connection=conn)
            return stats['usec'] / stats['calls']

        wides, singles = [], []
        for _ in range(opts.rounds * 5):
            wides.append(look(wide, False))
            singles.append(look([single], True))
        w, s1 = statistics.median(wides), statistics.median(singles)
        mark = 'ok' if w <= 2 * s1 else 'MISSED'
        print(f'fetch look over 50 queues (40 capped and full, 10 empty): {w:.1f} us of server time; a capped '
              f'single-queue fetch that takes a job: {s1:.1f} us; ratio {w / s1:.2f} (target <= 2: {mark})')
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--identities', type=int, default=100_000)
    parser.add_argument('--holds', type=int, default=1000)
    parser.add_argument('--backlog', type=int, default=100_000)
    parser.add_argument('--warmup', type=int, default=1500, help='untimed calls of every door on both servers first')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, calls=10, identities=2000, holds=50, backlog=2000, warmup=10)
    with RedisServer() as empty_server, RedisServer() as loaded_server:
        empty, loaded = Redis.from_url(empty_server.url), Redis.from_url(loaded_server.url)
        QueueSlot.set('capped', 10**6, connection=empty)
        load(loaded, opts)
        # the empty server's backlog fetch needs jobs too, a few of them
        PolicyQueue('scale', connection=empty).enqueue_many(
            [PolicyQueue.prepare_data(work, (i,)) for i in range(opts.calls * opts.rounds + 10)])
        # the empty server's backlog fetch needs a job for every warm-up call too
        PolicyQueue('scale', connection=empty).enqueue_many(
            [PolicyQueue.prepare_data(work, (i,)) for i in range(opts.warmup)])
        sides = {'empty': doors(empty, 'e'), 'loaded': doors(loaded, 'l')}
        for side in sides.values():
            for door in side.values():
                for i in range(opts.warmup):
                    door(i)
        print(f'{opts.identities} identities, {opts.holds} holds, {opts.backlog} backlog; '
              f'{opts.rounds} rounds x {opts.calls} calls, interleaved call by call')
        print(f'{"door":30} {"empty us":>9} {"loaded us":>10} {"ratio":>7}  per-round ratios        target')
        worst = 0.0
        for name in sides['empty']:
            per_round = []
            all_e: list[float] = []
            all_l: list[float] = []
            for _ in range(opts.rounds):
                e_times, l_times = [], []
                for i in range(opts.calls):
                    for side, times in (('empty', e_times), ('loaded', l_times)) if i % 2 else (
                            ('loaded', l_times), ('empty', e_times)):
                        start = time.perf_counter()
                        sides[side][name](i)
                        times.append(time.perf_counter() - start)
                per_round.append(statistics.median(l_times) / statistics.median(e_times))
                all_e += e_times
                all_l += l_times
            ratio = statistics.median(per_round)
            worst = max(worst, ratio)
            spread = f'{min(per_round):.2f} .. {max(per_round):.2f}'
            mark = 'ok' if ratio <= 1.1 else 'MISSED'
            print(f'{name:30} {statistics.median(all_e) * 1e6:9.1f} {statistics.median(all_l) * 1e6:10.1f} '
                  f'{ratio:7.3f}  {spread:22}  <= 1.1 {mark}')
        empty.close()
        loaded.close()
    wide_look(opts)
    return 0


if __name__ == '__main__':
    run_main(main)
