"""What a durable admission costs: a door that waits for a replica (``wait_replicas=1``) against the same door that
does not, on a primary with one replica, measured in one run.

    python bench/durable.py [--rounds 15] [--calls 200] [--smoke]

The door sends ``WAIT 1 <timeout>`` (and a one-key ``SET`` that makes the count right after a resend) in the same
round trip as its admission script, on the same connection (``rq_policies.engine.admission.run_replicated``), and
returns once the replica has acknowledged. Variants: a job without a policy, and a Loner admitted, each with and without
``wait_replicas=1``. Rounds interleave the variants (the order reversed every other round); each variant's figures are
the median per-call wall time (printed as enqueues per second), its p25 / p75, and the server CPU per enqueue of the
primary and of the replica (``INFO cpu``: ``used_cpu_user`` + ``used_cpu_sys``, read before and after each variant's
batch), each as a ratio of the durable variant to the same door without the wait.

The wait is a replica round trip: the replica receives the write, its next ``REPLCONF ACK`` (which ``WAIT`` asks
for at once) reaches the primary, and the blocked client is answered. On loopback that is tens of microseconds; across
machines it is the network's round trip, which this bench does not show. ``--smoke`` runs every case a few times (CI:
the bench still works).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, run_main, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402

from rq_policies import Loner, PolicyQueue  # noqa: E402
from rq_policies.surfaces.testing import RedisServer  # noqa: E402


def server_cpu(client: Redis) -> float:
    found = client.info('cpu')
    return float(found['used_cpu_user']) + float(found['used_cpu_sys'])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=15)
    parser.add_argument('--calls', type=int, default=200)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, calls=20)

    with RedisServer(extra_args=['--repl-diskless-sync-delay', '0']) as primary, \
            RedisServer(extra_args=['--replicaof', '127.0.0.1', str(primary.port)]) as replica:
        conn, on_replica = Redis.from_url(primary.url), Redis.from_url(replica.url)
        deadline = time.monotonic() + 30
        while on_replica.info('replication').get('master_link_status') != 'up':
            if time.monotonic() > deadline:
                raise RuntimeError('the replica never synced')
            time.sleep(0.05)
        conn.flushall()
        plain = PolicyQueue('bench_plain', connection=conn)
        durable = PolicyQueue('bench_durable', connection=conn, wait_replicas=1, wait_timeout_ms=5000)
        loner = Loner()
        variants = {
            'no policy': lambda i: plain.enqueue(work, i),
            'no policy, wait_replicas=1': lambda i: durable.enqueue(work, i),
            'Loner admitted': lambda i: plain.enqueue(work, f'l{i}', policy=loner),
            'Loner admitted, wait_replicas=1': lambda i: durable.enqueue(work, f'l{i}', policy=loner),
        }
        pairs = (('no policy, wait_replicas=1', 'no policy'), ('Loner admitted, wait_replicas=1', 'Loner admitted'))
        info = conn.info('server')
        print(f"server: {info.get('valkey_version') or info.get('redis_version')}, one replica on loopback; "
              f'{opts.rounds} rounds x {opts.calls} calls\n')
        wall: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        replica_cpu: dict[str, list[float]] = {name: [] for name in variants}
        counter = 0
        for r in range(opts.rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for name, call in order:
                conn.delete('rq:queue:bench_plain', 'rq:queue:bench_durable')
                before, before_replica = server_cpu(conn), server_cpu(on_replica)
                for _ in range(opts.calls):
                    counter += 1
                    start = time.perf_counter()
                    call(counter)
                    wall[name].append(time.perf_counter() - start)
                cpu[name].append((server_cpu(conn) - before) / opts.calls)
                replica_cpu[name].append((server_cpu(on_replica) - before_replica) / opts.calls)
        acks = int(conn.info('commandstats').get('cmdstat_wait', {}).get('calls', 0))
        print(f'{"variant":34} {"enqueues/s":>10} {"p25 us":>8} {"p75 us":>8} {"primary CPU us":>15} '
              f'{"replica CPU us":>15}')
        for name in variants:
            q1, median, q3 = statistics.quantiles(wall[name], n=4)
            print(f'{name:34} {1 / statistics.median(wall[name]):10.0f} {q1 * 1e6:8.1f} {q3 * 1e6:8.1f} '
                  f'{statistics.median(cpu[name]) * 1e6:15.1f} {statistics.median(replica_cpu[name]) * 1e6:15.1f}')
        print('\ndurable / the same door without the wait (medians; CPU: spread of the per-round ratios p25-p75):')
        for slow, fast in pairs:
            rate = statistics.median(wall[fast]) / statistics.median(wall[slow])
            rounds = [a / b for a, b in zip(cpu[slow], cpu[fast]) if b > 0]
            replica_rounds = [a / b for a, b in zip(replica_cpu[slow], replica_cpu[fast]) if b > 0]
            cpu_ratio = statistics.median(rounds) if rounds else float('nan')
            replica_ratio = statistics.median(replica_rounds) if replica_rounds else float('nan')
            low, high = (statistics.quantiles(rounds, n=4)[0::2] if len(rounds) >= 2 else (cpu_ratio, cpu_ratio))
            print(f'  {slow:34} enqueues/s x{rate:.2f}   primary CPU per enqueue x{cpu_ratio:.2f} ({low:.2f}-'
                  f'{high:.2f})   replica CPU per enqueue x{replica_ratio:.2f}')
        print(f'\nWAIT calls on the primary: {acks} (one per durable door)')
        conn.flushall()
        conn.close()
        on_replica.close()


if __name__ == '__main__':
    run_main(main)
