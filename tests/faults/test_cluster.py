"""rq-policies on a real Redis Cluster: 3 primaries and 3 replicas of the session's server (tests/helpers/cluster.py).

These run in their own CI cell, on rq 3 with a hash-tagged prefix, which puts every key of rq and of ours in one
slot (docs/cluster.md)::

    RQ_KEY_PREFIX='{rq}' pytest -m cluster tests/faults/test_cluster.py

Elsewhere (no hash tag in the prefix, or rq 2.12, which has no prefix setting) they are skipped.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import pytest
from rq import Queue
from rq.job import Job

from rq_policies import Debounce, Loner, PolicyQueue, PolicySimpleWorker, QueueRate, QueueSlot, Throttle
from rq_policies.engine import keys
from rq_policies.engine.compat import RQ3
from tests.helpers import jobs, key_jobs
from tests.helpers.cluster import ValkeyCluster
from tests.helpers.throttle_helpers import clear_of_a_slot_edge
from tests.helpers.wake import WOKEN_WITHIN, cluster_worker, wake_delays

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not RQ3 or keys.hash_tag(keys.PREFIX) is None,
                       reason="a cluster needs rq 3 and a hash-tagged prefix: RQ_KEY_PREFIX='{rq}' pytest -m cluster"),
]


@pytest.fixture(scope='module')
def valkey_cluster():
    with ValkeyCluster(primaries=3, replicas=1, node_timeout_ms=1000) as found:
        yield found


@pytest.fixture
def cluster(valkey_cluster):
    valkey_cluster.flush()
    client = valkey_cluster.client()
    try:
        yield client
    finally:
        client.close()
        valkey_cluster.flush()


@pytest.fixture
def cluster_env(worker_env, valkey_cluster):
    return dict(worker_env, CLUSTER_URL=valkey_cluster.url, RQ_KEY_PREFIX=os.environ['RQ_KEY_PREFIX'],
                CLUSTER_NODES=','.join(f'127.0.0.1:{port}' for port in valkey_cluster.ports))


def one_slot(valkey_cluster) -> list[str]:
    """Every key on the cluster, checked to be in the prefix's slot (on the one primary that serves it)."""
    found = valkey_cluster.keys()
    head = keys.PREFIX.split(':', 1)[0] + ':'
    assert all(key.startswith(head) for key in found), found
    return found


def test_a_prefix_without_hash_tag_is_refused_at_the_first_door_and_worker_start(valkey_cluster, worker_env):
    """RQ_KEY_PREFIX='rq' (no hash tag) on a cluster: PolicyQueue and PolicyWorker refuse the connection with a
    message naming RQ_KEY_PREFIX and an example, before anything is written (rather than the server's CROSSSLOT)."""
    probe = '''
import json, os
from redis.cluster import RedisCluster
from rq_policies import PolicyQueue, PolicySimpleWorker, PolicyWorker
from rq_policies.engine.exceptions import PolicyConfigurationError
conn = RedisCluster.from_url(os.environ['CLUSTER_URL'])
said = []
for make in (lambda: PolicyQueue('q', connection=conn), lambda: PolicyWorker(['q'], connection=conn),
             lambda: PolicySimpleWorker(['q'], connection=conn)):
    try:
        make()
        said.append(None)
    except PolicyConfigurationError as exc:
        said.append(str(exc))
conn.close()
print(json.dumps(said))
'''
    env = dict(worker_env, CLUSTER_URL=valkey_cluster.url, RQ_KEY_PREFIX='rq')
    valkey_cluster.flush()
    out = subprocess.run([sys.executable, '-c', probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout)
    cli = subprocess.run([sys.executable, '-m', 'rq_policies', 'info', *CLUSTER_CLASS, '--url',
                          valkey_cluster.url], env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and 'Traceback' not in cli.stderr, cli.stderr
    said.append(cli.stderr)
    assert all(message is not None for message in said), said
    for message in said:
        assert "RQ_KEY_PREFIX='rq'" in message and "RQ_KEY_PREFIX='{rq}'" in message, message
    assert valkey_cluster.keys() == []


def test_every_door_on_a_cluster(cluster, valkey_cluster):
    """Every door and every policy's door runs its one script on the slot's primary; nothing lands elsewhere."""
    q = PolicyQueue('doors', connection=cluster)
    assert q.enqueue(jobs.plain, 1) is not None
    assert q.enqueue_call(jobs.plain, args=(2,)) is not None
    assert q.enqueue_in(datetime.timedelta(seconds=30), jobs.plain, 3) is not None
    assert q.enqueue_at(datetime.datetime.now(datetime.timezone.utc), jobs.plain, 4) is not None
    assert len(q.enqueue_many([Queue.prepare_data(jobs.plain, (5,)), Queue.prepare_data(jobs.plain, (6,))])) == 2
    held = q.enqueue(jobs.plain, 7, policy=Loner())
    assert held is not None and q.enqueue(jobs.plain, 7, policy=Loner()) is None
    clear_of_a_slot_edge(cluster, 60)  # the two Throttle(60) enqueues below in one slot
    assert q.enqueue(jobs.plain, 8, policy=Throttle(60)) is not None
    assert q.enqueue(jobs.plain, 8, policy=Throttle(60)) is None
    pending = q.enqueue(jobs.plain, 9, policy=Debounce(30))
    assert q.enqueue(jobs.plain, 9, policy=Debounce(30)).id == pending.id  # merged into the pending job
    assert q.enqueue(key_jobs.per_customer, 'c', 0, customer='acme') is not None
    QueueSlot.set('doors', 2, connection=cluster)
    QueueRate.set('doors', 10, per=1, connection=cluster)
    assert QueueSlot.get('doors', connection=cluster).capacity == 2
    held.delete()  # frees its identity (lua/release_markers.lua, routed by the job's key)
    assert q.enqueue(jobs.plain, 7, policy=Loner()) is not None
    found = one_slot(valkey_cluster)
    assert any(key.startswith(keys.PREFIX + 'loner:') for key in found)
    assert q.count == 7  # 1, 2, 5, 6, the second Loner of 7, the throttle's winner, the concurrency job
    assert q.scheduled_job_registry.count == 3  # enqueue_in, enqueue_at (rq schedules it), the debounced job


def test_a_cluster_client_no_door_adopted_takes_settings_releases_and_the_async_explain(cluster, valkey_cluster):
    """A ``RedisCluster`` that no PolicyQueue or worker has adopted (compat.adopt_cluster): a setting's classmethod
    (its write and its wake-up on one pipeline), a claim's release (what a hold guard does once its worker died) and
    the asyncio door's ``explain`` work on it. Each failed before: redis-py's cluster pipeline refuses PUBLISH by
    name, and redis.asyncio's RedisCluster has no ``connection_pool`` to make a synchronous client from."""
    import asyncio

    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    from rq_policies.engine.fetch import Claim, release_claim
    from rq_policies.engine.ledger import Hold
    from rq_policies.surfaces.aio import AsyncPolicyQueue

    assert QueueSlot.acquire('plain', capacity=1, token='plain:1', ttl=60, connection=cluster)
    for step in ('rate', 'release'):
        fresh = valkey_cluster.client()
        try:
            assert type(fresh) is RedisCluster  # not adopted
            if step == 'rate':
                QueueRate.set('plain', 5, per=1, connection=fresh)
            else:
                release_claim(Claim('plain-job', 'plain', (Hold(keys.holds('plain'), 'plain:1', 60),)), fresh)
        finally:
            fresh.close()
    assert QueueRate.get('plain', connection=cluster).limit == 5
    assert QueueSlot.status('plain', connection=cluster).in_use == 0

    async def main():
        client = AsyncRedisCluster.from_url(valkey_cluster.url)
        q = AsyncPolicyQueue('plain', connection=client)
        try:
            job = await q.enqueue(jobs.plain, 1)
            return job, await q.explain(job.id)
        finally:
            await client.aclose()
            if q.sync_connection is not None:
                q.sync_connection.close()

    job, why = asyncio.run(main())
    assert why['status'] == 'queued' and why['queue'] == 'plain', why
    assert Job.fetch(job.id, connection=cluster).get_status() == 'queued'


def test_a_simple_worker_runs_capped_loner_jobs_on_a_cluster(cluster, valkey_cluster):
    q = PolicyQueue('simple', connection=cluster)
    QueueSlot.set('simple', 1, connection=cluster)
    enqueued = [q.enqueue(jobs.plain, i, policy=Loner()) for i in range(5)]
    assert q.enqueue(jobs.plain, 0, policy=Loner()) is None  # its identity is held
    worker = PolicySimpleWorker([q], connection=cluster)
    assert worker.work(burst=True, with_scheduler=False)
    assert [Job.fetch(job.id, connection=cluster).get_status() for job in enqueued] == ['finished'] * 5
    assert cluster.zcard(keys.holds('simple')) == 0  # every hold released
    assert not [key for key in one_slot(valkey_cluster) if key.startswith(keys.PREFIX + 'loner:')]
    assert q.enqueue(jobs.plain, 0, policy=Loner()) is not None  # the identity is free again


@pytest.mark.long
def test_forking_workers_keep_a_cap_on_a_cluster(cluster, valkey_cluster, cluster_env, tmp_path):
    """Two forking PolicyWorkers, a cap of 2, 8 Loner jobs of 0.3 s: never more than 2 at once, all run once."""
    q = PolicyQueue('forking', connection=cluster)
    QueueSlot.set('forking', 2, connection=cluster)
    spans = tmp_path / 'spans'
    # distinct identities: 0.3 s and a thousandth more each
    enqueued = [q.enqueue(jobs.span_to_file, str(spans), 0.3 + i / 1000, policy=Loner(), job_id=f'f{i}')
                for i in range(8)]
    workers = [subprocess.Popen([sys.executable, '-m', 'tests.helpers.cluster_worker', 'PolicyWorker', '--burst',
                                 'forking'], env=cluster_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for _ in range(2)]
    outputs = [w.communicate(timeout=90)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert [Job.fetch(job.id, connection=cluster).get_status() for job in enqueued] == ['finished'] * 8, outputs
    lines = spans.read_text().splitlines()
    assert sorted(line.split()[0] for line in lines if ' start ' in line) == sorted(j.id for j in enqueued)
    assert jobs.max_overlap(lines) == 2  # the cap is used, never exceeded
    assert cluster.zcard(keys.holds('forking')) == 0
    one_slot(valkey_cluster)


@pytest.mark.long
def test_an_idle_worker_wakes_on_an_enqueue_on_a_cluster(cluster, cluster_env, valkey_cluster, tmp_path):
    """The idle wait's pub/sub works on a cluster: the door's SPUBLISH (in its script) reaches the idle worker's
    SSUBSCRIBE on the slot's primary, so a job pushed as soon as the worker is subscribed starts well before the idle
    poll would look again (tests/faults/test_sharded_wake.py checks the rest, with the same timing)."""
    q = PolicyQueue('idle', connection=cluster)
    primary, _ = valkey_cluster.owner_of(keys.PREFIX)
    owner = valkey_cluster.node_client(primary.port)
    worker = cluster_worker(cluster_env, 'idle', tmp_path / 'worker.log')
    try:
        delays = wake_delays(q, owner, tmp_path / 'spans', 'idle', worker)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        owner.close()
    assert max(delays) < WOKEN_WITHIN, delays



CLUSTER_CLASS = ['--connection-class', 'redis.cluster.RedisCluster']


def test_the_cli_and_rq_s_worker_command_take_rq_s_connection_class_option(cluster, valkey_cluster, cluster_env):
    """rq's own spelling, ``--connection-class redis.cluster.RedisCluster --url <any node>``: ``rq-policies info``,
    ``cap`` and ``explain`` work on the cluster, and so does ``rq worker -w rq_policies.PolicyWorker`` (forking)."""
    q = PolicyQueue('cli', connection=cluster)
    job = q.enqueue(jobs.plain, 1, policy=Loner())
    QueueSlot.set('cli', 2, connection=cluster)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, '-m', 'rq_policies', *args, *CLUSTER_CLASS, '--url',
                               valkey_cluster.url], env=cluster_env, capture_output=True, text=True, timeout=60)

    out = run('info', '--json')
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)['queues']['cli']
    assert info['capacity'] == 2 and info['loner']['waiting'] == 1
    out = run('cap', 'cli', '3', '--wait-replicas', '1', '--wait-timeout', '5000')
    assert out.returncode == 0 and 'capped at 3 (was 2)' in out.stdout, out.stderr
    assert 'On 1 replica(s).' in out.stderr  # the slot's primary has one replica, which has the write
    assert QueueSlot.get('cli', connection=cluster).capacity == 3
    out = run('explain', job.id)
    assert out.returncode == 0 and 'queue_slot queue cap 3' in out.stdout, out.stderr
    worker = subprocess.run([sys.executable, '-m', 'rq.cli', 'worker', '-w', 'rq_policies.PolicyWorker', '--burst',
                             *CLUSTER_CLASS, '--url', valkey_cluster.url, 'cli'], env=cluster_env,
                            capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert Job.fetch(job.id, connection=cluster).get_status() == 'finished'


def test_the_page_reads_the_slots_primary(cluster, valkey_cluster):
    """The page's data takes a plain connection: pointed at the primary of the prefix's slot, where every key is, it
    reads a cluster's state as a single server's (it does not follow a failover)."""
    from redis import Redis

    from rq_policies.surfaces.dashboard import data

    q = PolicyQueue('readers', connection=cluster)
    q.enqueue(jobs.plain, 1, policy=Loner())
    QueueSlot.set('readers', 2, connection=cluster)
    primary, _ = valkey_cluster.owner_of(keys.PREFIX)
    url = f'redis://127.0.0.1:{primary.port}/0'
    plain = Redis.from_url(url)
    try:
        view = data.overview(plain)
    finally:
        plain.close()
    assert [row['name'] for row in view['queues']['rows']] == ['readers']


def _node_role(valkey_cluster, port: int) -> str:
    client = valkey_cluster.node_client(port)
    try:
        return client.info('replication')['role']
    except Exception:
        return 'unreachable'
    finally:
        client.close()


def _statuses(connection, ids) -> dict[str, str | None]:
    found = {}
    for job_id in ids:
        status = connection.hget(Job.key_for(job_id), 'status')
        found[job_id] = status.decode() if status else None
    return found


@pytest.mark.slow
def test_failover_of_the_prefix_slot_primary_during_capped_loner_jobs(cluster, valkey_cluster, cluster_env,
                                                                      tmp_path, capsys):
    """SIGKILL the primary serving the prefix's slot while two forking PolicyWorkers run capped Loner jobs and a
    producer enqueues: its replica promotes itself (cluster-node-timeout 1 s; a dead primary cannot run CLUSTER
    FAILOVER), and producers and workers carry on with no restart. What asynchronous replication cost is measured
    and printed (docs/cluster.md has the figures): enqueues acknowledged but lost, jobs run twice, the cap exceeded,
    and how long the producer could not enqueue. Asserted: both workers are the same processes throughout, and
    every job enqueued after the promotion runs exactly once, within the cap."""
    import threading

    cap, total, seconds = 2, 150, 0.1
    PolicyQueue('failover', connection=cluster)  # the queue is known before its cap is set
    QueueSlot.set('failover', cap, connection=cluster)
    spans = tmp_path / 'spans'
    logs = [open(tmp_path / f'worker{i}.log', 'w') for i in range(2)]  # noqa: SIM115 - closed below
    # redis-py's default retries: 10 retries backing off to 1 s apart changed none of the figures (docs/cluster.md)
    env = dict(cluster_env, CLUSTER_RETRIES='0')
    workers = [subprocess.Popen([sys.executable, '-m', 'tests.helpers.cluster_worker', 'PolicyWorker', 'failover'],
                                env=env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
    acked: dict[str, float] = {}  # job id -> when its enqueue was acknowledged
    errors: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        producer = valkey_cluster.client()
        pq = PolicyQueue('failover', connection=producer)
        try:
            for i in range(total):
                job_id = f'j{i:03d}'
                while not stop.is_set():
                    try:  # distinct identities: the duration differs in the 5th decimal
                        pq.enqueue(jobs.span_to_file, str(spans), seconds + i / 100000, policy=Loner(),
                                   job_id=job_id)
                        acked[job_id] = time.time()
                        break
                    except Exception:  # the slot's primary is gone until its replica is promoted
                        errors.append(time.time())
                        time.sleep(0.05)
                time.sleep(0.04)
        finally:
            producer.close()

    thread = threading.Thread(target=produce)
    primary = None
    try:
        deadline = time.monotonic() + 60
        while cluster.scard(f'{keys.KEY_PREFIX}:workers') < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        thread.start()
        while len(acked) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
        primary, replica = valkey_cluster.owner_of(keys.PREFIX)
        while replica is None and time.monotonic() < deadline:  # a node restarted by an earlier run still syncing
            time.sleep(0.1)
            primary, replica = valkey_cluster.owner_of(keys.PREFIX)
        assert replica is not None
        killed_at = time.time()
        primary.process.kill()
        primary.process.wait()
        while _node_role(valkey_cluster, replica.port) != 'master' and time.time() < killed_at + 30:
            time.sleep(0.02)
        promoted_at = time.time()
        assert _node_role(valkey_cluster, replica.port) == 'master'
        thread.join(120)
        assert not thread.is_alive()
        assert len(acked) == total
        # until every job has ended (or, for one caught by the kill, 10 s after the last of the others)
        deadline, settled = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            statuses = _statuses(cluster, acked)
            open_ = [job_id for job_id, status in statuses.items() if status not in ('finished', None)]
            if not open_:
                break
            if all(acked[job_id] < promoted_at for job_id in open_):
                settled = settled or time.monotonic()
                if time.monotonic() > settled + 10:
                    break
            time.sleep(0.2)
        alive = [w.poll() is None for w in workers]
    finally:
        stop.set()
        thread.join(10)
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait()
        for log in logs:
            log.close()
        if primary is not None and primary.process is not None and primary.process.poll() is not None:
            primary.start()  # back as a replica of the promoted one (its nodes.conf says so)
    output = '\n'.join((tmp_path / f'worker{i}.log').read_text()[-3000:] for i in range(2))
    lines = spans.read_text().splitlines()
    starts: dict[str, list[float]] = {}
    for line in lines:
        job_id, kind, at = line.split()
        if kind == 'start':
            starts.setdefault(job_id, []).append(float(at))
    lost = sorted(job_id for job_id, status in statuses.items() if status is None and job_id not in starts)
    twice = sorted(job_id for job_id, seen in starts.items() if len(seen) > 1)
    unfinished = {job_id: f'{status}, started {len(starts.get(job_id, []))}x'
                  for job_id, status in sorted(statuses.items()) if status not in ('finished', None)}
    after = [job_id for job_id, at in acked.items() if at > promoted_at]
    figures = {
        'promotion_seconds': round(promoted_at - killed_at, 2),
        'producer_blocked_seconds': round(max(errors) - min(errors), 2) if errors else 0.0,
        'producer_errors': len(errors),
        'acked': len(acked), 'acked_after_promotion': len(after),
        'lost_acked_enqueues': len(lost), 'ran_twice': len(twice), 'unfinished': unfinished,
        'max_overlap': jobs.max_overlap(lines),
        'max_overlap_from_1s_after_promotion': jobs.max_overlap(lines, since=promoted_at + 1.0),
        'first_start_after_promotion_seconds': round(min(at for v in starts.values() for at in v if at > promoted_at)
                                                     - promoted_at, 2),
        'last_start_after_promotion_seconds': round(max(max(v) for v in starts.values()) - promoted_at, 2),
    }
    with capsys.disabled():
        print('\nfailover figures:', json.dumps(figures))
    assert alive == [True, True], output  # the same workers carried on
    assert all(statuses[job_id] == 'finished' and len(starts.get(job_id, [])) == 1 for job_id in after), (
        figures, output)
    assert figures['max_overlap_from_1s_after_promotion'] <= cap, figures


def test_producers_follow_a_slot_migration(cluster, valkey_cluster, capsys):
    """The prefix's slot moves to another primary (SETSLOT IMPORTING/MIGRATING, MIGRATE key by key, SETSLOT NODE)
    while a producer enqueues Loner jobs: the client follows the ASK and MOVED redirections (retrying on TRYAGAIN
    while a script's keys are split between the two nodes), and every acknowledged enqueue is there afterwards,
    on the new primary."""
    import threading

    from redis.crc import key_slot

    slot = key_slot(keys.PREFIX.encode())
    source, _ = valkey_cluster.owner_of(keys.PREFIX)
    target = next(node for node in valkey_cluster.nodes[:valkey_cluster.primaries] if node is not source
                  and _node_role(valkey_cluster, node.port) == 'master')
    src, dst = valkey_cluster.node_client(source.port), valkey_cluster.node_client(target.port)
    acked: list[str] = []
    failed: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = valkey_cluster.client()
        pq = PolicyQueue('moving', connection=producer)
        try:
            i = 0
            while not stop.is_set():
                job_id = f'm{i:05d}'
                for _ in range(50):
                    try:
                        pq.enqueue(jobs.plain, i, policy=Loner(), job_id=job_id)
                        acked.append(job_id)
                        break
                    except Exception as exc:
                        failed.append(repr(exc))
                        time.sleep(0.02)
                i += 1
        finally:
            producer.close()

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        while len(acked) < 200:
            time.sleep(0.02)
        src_id, dst_id = src.execute_command('CLUSTER MYID'), dst.execute_command('CLUSTER MYID')
        dst.execute_command('CLUSTER SETSLOT', slot, 'IMPORTING', src_id)
        src.execute_command('CLUSTER SETSLOT', slot, 'MIGRATING', dst_id)
        moved = 0
        while True:
            batch = src.execute_command('CLUSTER GETKEYSINSLOT', slot, 20)
            if not batch:
                break
            src.execute_command('MIGRATE', '127.0.0.1', target.port, '', 0, 5000, 'KEYS', *batch)
            moved += len(batch)
            time.sleep(0.01)  # let the producer run against a slot split between two nodes
        for client in (dst, src):
            client.execute_command('CLUSTER SETSLOT', slot, 'NODE', dst_id)
        during = len(acked)
        while len(acked) < during + 100:
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(30)
        src.close()
        dst.close()
    with capsys.disabled():
        print(f'\nslot migration: {moved} keys moved, {len(acked)} enqueues acknowledged, {during} by the end of the '
              f'move, {len(failed)} failed calls retried: {sorted(set(e.split("(")[0] for e in failed))}')
    assert moved > 200
    assert valkey_cluster.owner_of(keys.PREFIX)[0] is target
    missing = [job_id for job_id in acked if not cluster.exists(Job.key_for(job_id))]
    assert missing == [], (len(missing), failed[:5])
    assert len(set(acked)) == len(acked)
    assert PolicyQueue('moving', connection=cluster).count == len(acked)


def test_an_identity_s_keys_are_scanned_on_the_prefix_slot_s_node_only(cluster, valkey_cluster):
    """``state.identity_keys`` and ``state.reset_digest`` (``explain``'s identity rows, the CLI's and the page's
    reset) walk the prefix's slot with one node's cursor (``keys.scanner``), as the other readers do, not every
    primary of the cluster with a cluster client's SCAN."""
    from rq_policies.engine import identity
    from rq_policies.surfaces import state

    q = PolicyQueue('ids', connection=cluster)
    job = q.enqueue(jobs.plain, 3, policy=Loner())
    digest = identity.digest(identity.func_path(job), 'ids', job.args, job.kwargs)
    owner, _ = valkey_cluster.owner_of(keys.PREFIX)
    others = [node.port for node in valkey_cluster.nodes if node.port != owner.port]
    valkey_cluster.reset_stats()
    found = state.identity_keys(cluster, 'ids', digest)
    assert any(key.startswith(keys.PREFIX + 'loner:') for key in found), found
    assert state.reset_digest(cluster, 'ids', digest) >= 1
    assert state.identity_keys(cluster, 'ids', digest) == []
    assert q.enqueue(jobs.plain, 3, policy=Loner()) is not None  # the identity is free again
    for port in others:
        node = valkey_cluster.node_client(port)
        try:
            assert 'cmdstat_scan' not in node.info('commandstats'), port
        finally:
            node.close()
