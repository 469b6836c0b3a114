"""What a wake-up costs a cluster's nodes: PUBLISH (rq-policies before 0.3) against SPUBLISH (sharded pub/sub, now).

    python bench/wake.py [--messages 20000] [--rounds 5] [--primaries 3] [--smoke]

Starts its own cluster (tests/cluster.py: ``--primaries`` primaries with a replica each, the session's server binary,
Valkey by default) and one subscriber on the wake-up channel of a queue under the prefix ``{rq}``, as an idle
PolicyWorker holds one: SUBSCRIBE for the PUBLISH variant, SSUBSCRIBE for the SPUBLISH one, both on the primary that
owns the channel's slot. Each round sends ``--messages`` wake-ups (pipelined by 100, a job id's size) of each variant,
then waits a second for the bus to deliver them, and an idle spell of the same length (the cluster's own PING/PONG),
variants interleaved; for every node it reads
before and after the process CPU (INFO cpu, user + sys) and the cluster bus messages received (CLUSTER INFO). Printed:
per wake-up, the CPU µs and bus messages of the owner, its replica, and the other primaries and their replicas
(the idle spell's CPU per second subtracted), as medians over the rounds, and the ratio SPUBLISH / PUBLISH. A PUBLISH
is broadcast over the bus to every node; an SPUBLISH goes to the owner's shard only, so the others' cost should be
their idle cost (ratio near 0) and grow no more with the cluster's size.

``--smoke`` sends a few hundred messages once: CI's proof that the bench still works, not a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
for helpers in (HERE.parent / 'tests' / 'helpers', HERE.parent / 'tests'):  # tests/cluster.py, wherever it lives
    if (helpers / 'cluster.py').exists():
        sys.path.insert(0, str(helpers))
        break

from common import add_smoke, run_main, smoke_defaults  # noqa: E402

CHANNEL = '{rq}:policies:wake:bench'
#: Seconds each variant waits after its last reply before the counters are read (the idle spell's length includes it).
SETTLE_SECONDS = 1.0


def _cpu(client) -> float:
    info = client.info('cpu')
    return float(info['used_cpu_user']) + float(info['used_cpu_sys'])


def _bus_received(client) -> int:
    return int(client.execute_command('CLUSTER INFO')['cluster_stats_messages_received'])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--messages', type=int, default=20000)
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--primaries', type=int, default=3)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, messages=300, rounds=1)
    from cluster import ValkeyCluster

    with ValkeyCluster(primaries=opts.primaries, replicas=1) as cluster:
        owner, _ = cluster.owner_of(CHANNEL)
        clients = {node.port: cluster.node_client(node.port) for node in cluster.nodes}
        role = {}
        for node in cluster.nodes:
            info = clients[node.port].info('replication')
            if node is owner:
                role[node.port] = 'owner'
            elif info['role'] == 'master':
                role[node.port] = 'other primary'
            else:
                role[node.port] = "owner's replica" if int(info['master_port']) == owner.port else 'other replica'
        pub = clients[owner.port]
        subscriber = cluster.node_client(owner.port)
        classic, sharded = subscriber.pubsub(), subscriber.pubsub()
        classic.subscribe(CHANNEL)
        sharded.ssubscribe(CHANNEL)
        try:
            samples: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
            for r in range(opts.rounds):
                order = ['PUBLISH', 'SPUBLISH', 'idle']
                if r % 2:
                    order.reverse()
                for variant in order:
                    before = {port: (_cpu(c), _bus_received(c)) for port, c in clients.items()}
                    started = time.perf_counter()
                    if variant == 'idle':
                        time.sleep(samples.get('PUBLISH', {}).get('owner', [(0, 0, SETTLE_SECONDS)])[-1][2])
                    else:
                        for start in range(0, opts.messages, 100):
                            with pub.pipeline(transaction=False) as pipe:
                                for i in range(start, min(start + 100, opts.messages)):
                                    pipe.execute_command(variant, CHANNEL, f'{i:036d}')
                                pipe.execute()
                        time.sleep(SETTLE_SECONDS)  # the bus delivers after the reply: counted in this variant
                    seconds = time.perf_counter() - started
                    for port, c in clients.items():
                        cpu, bus = before[port]
                        samples.setdefault(variant, {}).setdefault(role[port], []).append(
                            (_cpu(c) - cpu, _bus_received(c) - bus, seconds))
                for pubsub in (classic, sharded):  # drain what the subscribers got
                    while pubsub.get_message(timeout=0.01) is not None:
                        pass
        finally:
            classic.close()
            sharded.close()
            subscriber.close()
            for c in clients.values():
                c.close()
    idle_cpu_per_s = {who: statistics.median(cpu / s for cpu, _, s in rows) for who, rows in samples['idle'].items()}
    idle_bus_per_s = {who: statistics.median(bus / s for _, bus, s in rows) for who, rows in samples['idle'].items()}
    print(f'{opts.primaries} primaries, {opts.rounds} rounds of {opts.messages} wake-ups per variant '
          f'(per node: CPU µs and bus messages received per wake-up, idle subtracted; medians over rounds and nodes)')
    print(f'{"node":18} {"PUBLISH µs":>11} {"SPUBLISH µs":>12} {"ratio":>6} {"PUBLISH msgs":>13} {"SPUBLISH msgs":>14}')
    for who in ('owner', "owner's replica", 'other primary', 'other replica'):
        figures = {}
        for variant in ('PUBLISH', 'SPUBLISH'):
            rows = samples[variant][who]
            cpu = statistics.median((c - idle_cpu_per_s[who] * s) / opts.messages * 1e6 for c, _, s in rows)
            bus = statistics.median((b - idle_bus_per_s[who] * s) / opts.messages for _, b, s in rows)
            figures[variant] = (cpu, bus)
        ratio = figures['SPUBLISH'][0] / figures['PUBLISH'][0] if figures['PUBLISH'][0] > 0 else float('nan')
        print(f'{who:18} {figures["PUBLISH"][0]:11.2f} {figures["SPUBLISH"][0]:12.2f} {ratio:6.2f} '
              f'{figures["PUBLISH"][1]:13.2f} {figures["SPUBLISH"][1]:14.2f}')
    return 0


if __name__ == '__main__':
    run_main(main)
