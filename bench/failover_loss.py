"""What a failover loses: acknowledged admissions that never run, with and without a durable door (``wait_replicas=1``),
on a real 3 + 3 cluster (tests/helpers/cluster.py), measured in one run.

    python bench/failover_loss.py [--rounds 6] [--producers 4] [--before 1.5] [--after 2.0] [--smoke]

Each round (rounds alternate the two modes, plain doors and durable doors): two PolicySimpleWorkers run the jobs of a
queue of the round's own, ``--producers`` threads enqueue jobs without a policy, each with an id of its own, as fast
as the doors answer, and record the wall-clock time each enqueue was acknowledged (returned). ``--before`` seconds in,
the primary serving the prefix's slot is SIGKILLed (its replica promotes itself: cluster-node-timeout 1 s); the
producers go on ``--after`` seconds past the promotion, then stop, and the workers drain the queue. Then every
acknowledged job is looked for: it ran (its start is in a local file each job appends to, which survives the kill),
or it is on the new primary (its hash, on a queue or in a registry); one that is neither is **lost**, printed with its
acknowledgement time relative to the kill. A durable door that raised ``NotReplicated`` (the promoted replica has no
replica of its own until the killed node is back) admitted its job without acknowledging it as replicated: counted
apart, and looked for as well. A door that raised anything else acknowledged nothing.

The killed node is restarted after each round (it rejoins as a replica) and the next round waits until it has synced.
The loss a plain door can show is the writes in the replication lag at the kill: on loopback the replica is
microseconds to milliseconds behind, more under load. ``--starve S`` makes the lag real: the replica is SIGSTOPped S
seconds before the kill and SIGCONTed right after it (a replica starved of CPU, a paused VM): what the primary
acknowledged meanwhile and had not sent (or the replica had not read from its socket) is gone with it, and the
replica is promoted all the same (the test cluster's ``cluster-replica-validity-factor 0``). ``--smoke`` runs one
short round of each mode (CI: the bench still works).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault('RQ_KEY_PREFIX', '{rq}')  # before rq is imported: a cluster needs a hash-tagged prefix

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import add_smoke, run_main, smoke_defaults  # noqa: E402
from redis.cluster import ClusterNode, RedisCluster  # noqa: E402
from rq.job import Job  # noqa: E402

from rq_policies import PolicyQueue  # noqa: E402
from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.exceptions import NotReplicated  # noqa: E402
from tests.helpers import jobs  # noqa: E402
from tests.helpers.cluster import ValkeyCluster  # noqa: E402


def synced(cluster: ValkeyCluster, timeout: float = 60.0) -> tuple:
    """The prefix slot's primary and a replica that is linked to it and caught up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            primary, replica = cluster.owner_of(keys.PREFIX)
        except RuntimeError:  # the nodes still settling after the last round's failover and restart
            primary = replica = None
        if replica is not None:
            client = cluster.node_client(replica.port)
            try:
                info = client.info('replication')
            finally:
                client.close()
            if info.get('master_link_status') == 'up':
                return primary, replica
        if time.monotonic() > deadline:
            raise RuntimeError('the prefix slot has no synced replica')
        time.sleep(0.1)


def client(cluster: ValkeyCluster) -> RedisCluster:
    live = [ClusterNode('127.0.0.1', node.port) for node in cluster.nodes
            if node.process is not None and node.process.poll() is None]
    return RedisCluster(startup_nodes=live, socket_timeout=5)


def one_round(cluster: ValkeyCluster, number: int, durable: bool, opts, env: dict, spans: Path) -> dict:
    queue_name = f'loss{number}'
    primary, replica = synced(cluster)
    logs = [tempfile.TemporaryFile() for _ in range(2)]
    workers = [subprocess.Popen([sys.executable, '-m', 'tests.helpers.cluster_worker', 'PolicySimpleWorker',
                                 queue_name], env=env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
    acked: dict[str, float] = {}
    unconfirmed: dict[str, float] = {}
    errors: list[float] = []
    stop = threading.Event()

    def produce(k: int) -> None:
        producer = client(cluster)
        options = {'wait_replicas': 1, 'wait_timeout_ms': 1000} if durable else {}
        q = PolicyQueue(queue_name, connection=producer, **options)
        n = 0
        try:
            while not stop.is_set():
                n += 1
                job_id = f'{queue_name}-{k}-{n}'
                try:
                    q.enqueue(jobs.span_to_file, str(spans), 0, job_id=job_id)
                    acked[job_id] = time.time()
                except NotReplicated:
                    unconfirmed[job_id] = time.time()
                except Exception:
                    errors.append(time.time())
                    time.sleep(0.05)
        finally:
            producer.close()

    watcher = client(cluster)
    threads = [threading.Thread(target=produce, args=(k,)) for k in range(opts.producers)]
    try:
        deadline = time.monotonic() + 60
        while watcher.scard(f'{keys.KEY_PREFIX}:workers') < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        for thread in threads:
            thread.start()
        time.sleep(max(opts.before - opts.starve, 0.0))
        if opts.starve:  # the replica stops reading the stream: the primary's writes pile up in its output buffer
            os.kill(replica.process.pid, signal.SIGSTOP)
            time.sleep(opts.starve)
        killed_at = time.time()
        primary.process.kill()
        primary.process.wait()
        if opts.starve:
            os.kill(replica.process.pid, signal.SIGCONT)
        while cluster.role(replica.port) != 'master' and time.time() < killed_at + 30:
            time.sleep(0.02)
        promoted_at = time.time()
        time.sleep(opts.after)
        stop.set()
        for thread in threads:
            thread.join(60)
        watcher.close()
        watcher = client(cluster)
        every = list(acked) + list(unconfirmed)
        pq = PolicyQueue(queue_name, connection=watcher)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (pq.count or pq.started_job_registry.count):
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        stop.set()
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        for log in logs:
            log.close()
        if primary.process is not None and primary.process.poll() is not None:
            primary.start()  # back as a replica of the promoted one
    ran = set()
    if spans.exists():
        ran = {line.split()[0] for line in spans.read_text().splitlines() if ' start ' in line}
    queued = {item.decode() for item in watcher.lrange(pq.key, 0, -1)}

    def found(job_id: str) -> bool:
        return job_id in ran or job_id in queued or bool(watcher.exists(Job.key_for(job_id)))

    lost = {job_id: at - killed_at for job_id, at in acked.items() if not found(job_id)}
    lost_unconfirmed = [job_id for job_id in unconfirmed if not found(job_id)]
    twice: dict[str, list[float]] = {}
    if spans.exists():
        seen: dict[str, list[float]] = {}
        for line in spans.read_text().splitlines():
            job_id, kind, at = line.split()
            if kind == 'start' and job_id.startswith(queue_name + '-'):
                seen.setdefault(job_id, []).append(float(at) - killed_at)
        twice = {job_id: at for job_id, at in seen.items() if len(at) > 1}
    watcher.close()
    before_kill = sum(1 for at in acked.values() if at < killed_at)
    return {
        'round': number, 'mode': 'durable' if durable else 'plain', 'acked': len(acked), 'acked_before_kill':
        before_kill, 'unconfirmed': len(unconfirmed), 'errors': len(errors), 'lost': len(lost),
        # the acknowledgement times of the lost admissions, ms from the kill (negative: before it): first and last
        'lost_ack_ms_from_kill': [round(min(lost.values()) * 1000, 1), round(max(lost.values()) * 1000, 1)]
        if lost else [],
        'lost_unconfirmed': len(lost_unconfirmed), 'ran_twice': len(twice),
        # the jobs run twice (a fetch lost with the primary): the first and the last of their first starts and of their
        # second starts, ms from the kill
        'twice_starts_ms': [[round(min(sorted(starts)[0] for starts in twice.values()) * 1000),
                             round(max(sorted(starts)[0] for starts in twice.values()) * 1000)],
                            [round(min(sorted(starts)[1] for starts in twice.values()) * 1000),
                             round(max(sorted(starts)[1] for starts in twice.values()) * 1000)]] if twice else [],
        'promotion_s': round(promoted_at - killed_at, 2), 'ran': len(ran & set(every)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=6, help='rounds of each mode')
    parser.add_argument('--producers', type=int, default=4)
    parser.add_argument('--before', type=float, default=1.5, help='seconds of load before the kill')
    parser.add_argument('--after', type=float, default=2.0, help='seconds of load after the promotion')
    parser.add_argument('--starve', type=float, default=0.0,
                        help='SIGSTOP the replica this many seconds before the kill (SIGCONT right after it): a '
                             'replica starved of CPU, or a VM paused, as the primary dies')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=1, producers=2)
    if opts.smoke:
        opts.before, opts.after = min(opts.before, 0.5), min(opts.after, 0.5)
    with ValkeyCluster(primaries=3, replicas=1, node_timeout_ms=1000) as cluster, \
            tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, CLUSTER_NODES=','.join(f'127.0.0.1:{port}' for port in cluster.ports),
                   CLUSTER_URL=cluster.url,
                   PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get('PYTHONPATH', '')]))
        spans = Path(scratch) / 'spans'
        results = []
        for number in range(2 * opts.rounds):
            durable = number % 2 == 1
            result = one_round(cluster, number, durable, opts, env, spans)
            results.append(result)
            print(result, flush=True)
        print(f'\n{"mode":8} {"rounds":>6} {"acked":>7} {"lost":>5} {"rounds w/ loss":>14} {"most in a round":>15} '
              f'{"unconfirmed":>11} {"ran twice":>9} {"promotion s":>12}')
        for mode in ('plain', 'durable'):
            rows = [r for r in results if r['mode'] == mode]
            promotions = [r['promotion_s'] for r in rows]
            print(f'{mode:8} {len(rows):6} {sum(r["acked"] for r in rows):7} {sum(r["lost"] for r in rows):5} '
                  f'{sum(1 for r in rows if r["lost"]):14} {max(r["lost"] for r in rows):15} '
                  f'{sum(r["unconfirmed"] for r in rows):11} {sum(r["ran_twice"] for r in rows):9} '
                  f'{min(promotions):.2f}-{max(promotions):.2f} (median {statistics.median(promotions):.2f})')
        offsets = [offset for r in results for offset in r['lost_ack_ms_from_kill']]
        if offsets:
            print(f'\nlost admissions were acknowledged {min(offsets):.1f} to {max(offsets):.1f} ms from the kill '
                  '(negative: before it)')


if __name__ == '__main__':
    run_main(main)
