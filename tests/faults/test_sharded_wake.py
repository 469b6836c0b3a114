"""Idle PolicyWorkers wake on sharded pub/sub (SPUBLISH/SSUBSCRIBE), on a single server as on a cluster.

The first test runs wherever the session runs (Valkey, Redis 7, and the session's cluster under
``RQ_POLICIES_CLUSTER=1``): a real forking worker, idle on its queue, starts a pushed job well before its once-a-second
probe could have found it; the server shows the worker's subscription as a shard subscription (PUBSUB SHARDNUMSUB 1,
NUMSUB 0) and counts SPUBLISH, not PUBLISH; on a cluster the other primaries get none of the wake-ups (the cluster
bus counters of CLUSTER INFO), which a classic PUBLISH, sent at the end as a control, does reach. The cluster tests
below start a cluster of their own (3 primaries, 3 replicas: tests/helpers/cluster.py), as
tests/faults/test_cluster.py does, and
take its prefix's slot away from an idle worker's subscription: by a failover (the primary SIGKILLed) and by a slot
migration; the same worker process is woken on the new owner afterwards. The fakeredis test keeps the wake-up working
for users' unit tests.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

import pytest

from rq_policies import PolicyQueue
from rq_policies.engine import keys
from rq_policies.engine.compat import RQ3
from rq_policies.engine.fetch import IDLE_POLL_SECONDS
from tests.helpers import jobs
from tests.helpers.cluster import not_on_cluster
from tests.helpers.wake import ROUNDS, WOKEN_WITHIN, cluster_worker, numsub, wake_delays
from tests.helpers.workers import output, start_worker, stop, wait_for


def _cluster_info(client) -> dict[str, int]:
    raw = client.execute_command('CLUSTER INFO')
    if isinstance(raw, (bytes, str)):  # redis-py parses it into a dict; a raw reply is 'field:value' lines
        raw = dict(line.split(':', 1) for line in (raw.decode() if isinstance(raw, bytes) else raw).split())
    return {k: int(v) for k, v in raw.items() if k.startswith('cluster_stats_messages_publish')}


def _live(valkey_cluster):
    return [n for n in valkey_cluster.nodes if n.process is not None and n.process.poll() is None]


def test_an_idle_worker_is_woken_by_sharded_pub_sub(connection, redis_url, worker_env, session_cluster, tmp_path):
    q = PolicyQueue('sharded', connection=connection)
    channel = keys.wake('sharded')
    owner = others = None
    if session_cluster is not None:
        primary, _ = session_cluster.owner_of(keys.PREFIX)
        owner = session_cluster.node_client(primary.port)
        others = {n.port: session_cluster.node_client(n.port) for n in _live(session_cluster) if n is not primary}
        node = owner
    else:
        node = connection
    spans = tmp_path / 'spans'
    proc = start_worker(redis_url, ['sharded'], worker_env)
    try:
        assert wait_for(lambda: numsub(node, channel) == (1, 0), 30), output(proc)
        before = {port: _cluster_info(c) for port, c in (others or {}).items()}
        stats = node.info('commandstats')
        delays = wake_delays(q, node, spans, 'w', proc)
        after_stats = node.info('commandstats')
        after = {port: _cluster_info(c) for port, c in (others or {}).items()}
    finally:
        stop(proc)
    assert max(delays) < WOKEN_WITHIN, delays  # woken, not found by the probe
    spublished = after_stats.get('cmdstat_spublish', {}).get('calls', 0) - stats.get('cmdstat_spublish', {}).get(
        'calls', 0)
    assert spublished >= ROUNDS  # a push each (in the door's script)
    assert after_stats.get('cmdstat_publish', {}).get('calls', 0) == stats.get('cmdstat_publish', {}).get('calls', 0)
    if session_cluster is None:
        return
    try:
        # No node but the owner (and its replica, which SPUBLISH reaches in its shard) hears of a wake-up: nothing
        # PUBLISH-like on the bus anywhere, and no shard publish to the other primaries.
        replica_ports = {port for port, c in others.items() if c.info('replication')['role'] == 'slave'
                         and int(c.info('replication')['master_port']) == primary.port}
        for port in others:
            grown = {k: after[port].get(k, 0) - before[port].get(k, 0) for k in after[port]}
            assert grown.get('cluster_stats_messages_publish_received', 0) == 0, (port, grown)
            if port not in replica_ports:
                assert grown.get('cluster_stats_messages_publishshard_received', 0) == 0, (port, grown)
        # The control: a classic PUBLISH on the same channel reaches every other node over the bus.
        owner.publish(channel, 'control')
        assert wait_for(lambda: all(
            _cluster_info(c).get('cluster_stats_messages_publish_received', 0)
            > after[port].get('cluster_stats_messages_publish_received', 0) for port, c in others.items()), 10)
    finally:
        owner.close()
        for c in others.values():
            c.close()


@not_on_cluster('an ACL user is one node\'s')
def test_a_refused_subscription_leaves_the_idle_wait_polling(connection, redis_url, caplog):
    """The server answers SSUBSCRIBE with an error (here NOPERM: an ACL user without the channels; on a cluster,
    MOVED from a node that lost the slot): the fetcher neither raises nor retries at once, it polls for
    IDLE_POLL_SECONDS and then subscribes again."""
    from redis import Redis

    from rq_policies.engine.wake import WakeFetcher

    connection.execute_command('ACL', 'SETUSER', 'nochannels', 'on', '>pw', '~*', 'resetchannels', '+@all')
    restricted = Redis.from_url(redis_url, username='nochannels', password='pw')
    fetcher = WakeFetcher(hold_ttl=30)
    try:
        with caplog.at_level('WARNING', logger='rq_policies'):
            assert fetcher.listen(restricted, ['refused']) is True  # look once more: nothing heard from now on
            refused = [r for r in caplog.records if 'subscription was refused' in r.getMessage()]
            assert len(refused) == 1 and 'permission' in refused[0].getMessage(), refused[0].getMessage()
            assert fetcher.listen(restricted, ['refused']) is False  # no new attempt within the second
            started = time.monotonic()
            assert fetcher.wait(restricted, ['refused'], 0.3) is False  # polls: a plain sleep
            assert 0.25 < time.monotonic() - started < 1.0
            time.sleep(IDLE_POLL_SECONDS)
            assert fetcher.listen(restricted, ['refused']) is True  # tried again, refused again
            assert len([r for r in caplog.records if 'subscription was refused' in r.getMessage()]) == 2
    finally:
        fetcher.close()
        restricted.close()
        connection.execute_command('ACL', 'DELUSER', 'nochannels')


# -- on a cluster of its own: the subscription's node goes away -------------------------------------------------------

needs_cluster = pytest.mark.skipif(
    not RQ3 or keys.hash_tag(keys.PREFIX) is None,
    reason="a cluster needs rq 3 and a hash-tagged prefix: RQ_KEY_PREFIX='{rq}' pytest -m cluster")


@pytest.fixture(scope='module')
def own_cluster():
    from tests.helpers.cluster import ValkeyCluster

    with ValkeyCluster(primaries=3, replicas=1, node_timeout_ms=1000) as found:
        yield found


@pytest.fixture
def on_own_cluster(own_cluster, worker_env):
    own_cluster.flush()
    client = own_cluster.client()
    env = dict(worker_env, CLUSTER_URL=own_cluster.url, RQ_KEY_PREFIX=os.environ.get('RQ_KEY_PREFIX', ''),
               CLUSTER_NODES=','.join(f'127.0.0.1:{port}' for port in own_cluster.ports))
    try:
        yield client, env
    finally:
        client.close()
        own_cluster.flush()


@pytest.mark.cluster
@pytest.mark.long
@needs_cluster
@pytest.mark.parametrize('how', ['failover', 'migration'])
def test_an_idle_worker_is_woken_on_the_new_owner_of_the_slot(own_cluster, on_own_cluster, tmp_path, capsys, how):
    """An idle worker, subscribed on the primary of the prefix's slot, loses that node: SIGKILLed (its replica
    promotes itself) or the slot migrated to another primary (the old owner ends its shard subscriptions with a
    ``sunsubscribe``). The same worker process subscribes on the new owner with no restart and is woken there."""
    cluster, env = on_own_cluster
    env = dict(env, CLUSTER_RETRIES='3')
    q = PolicyQueue('moving', connection=cluster)
    channel = keys.wake('moving')
    spans = tmp_path / 'spans'
    primary, replica = own_cluster.owner_of(keys.PREFIX)
    deadline = time.monotonic() + 30
    while replica is None and time.monotonic() < deadline:  # a node restarted by an earlier test still syncing
        time.sleep(0.1)
        primary, replica = own_cluster.owner_of(keys.PREFIX)
    proc = cluster_worker(env, 'moving', tmp_path / 'worker.log')
    old = own_cluster.node_client(primary.port)
    new = None
    try:
        assert wait_for(lambda: numsub(old, channel) == (1, 0), 30), output(proc)
        assert max(wake_delays(q, old, spans, 'before', proc)) < WOKEN_WITHIN
        assert wait_for(lambda: numsub(old, channel)[0] == 1, 30), output(proc)
        time.sleep(0.5)  # idle, waiting on the old owner
        moved_at = time.monotonic()
        if how == 'failover':
            target = replica
            old.close()
            primary.process.kill()
            primary.process.wait()
            assert wait_for(lambda: own_cluster.role(replica.port) == 'master', 30)
        else:
            target = next(n for n in own_cluster.nodes[:own_cluster.primaries] if n is not primary
                          and own_cluster.role(n.port) == 'master')
            _migrate_slot(own_cluster, primary, target)
        promoted = time.monotonic() - moved_at
        new = own_cluster.node_client(target.port)
        assert wait_for(lambda: numsub(new, channel) == (1, 0), 60), output(proc)
        resubscribed = time.monotonic() - moved_at
        delays = wake_delays(q, new, spans, 'after', proc)
        alive = proc.poll() is None
    finally:
        stop(proc)
        old.close()
        if new is not None:
            new.close()
        if how == 'failover' and primary.process is not None and primary.process.poll() is not None:
            primary.start()  # back as a replica of the promoted one (its nodes.conf says so)
    with capsys.disabled():
        print(f'\n{how}: the new owner serves the slot {promoted:.2f} s after, the worker subscribed there '
              f'{resubscribed:.2f} s after; wake-up delays there {[round(d, 3) for d in delays]}')
    assert alive, output(proc)
    assert max(delays) < WOKEN_WITHIN, delays
    assert statistics.median(delays) < IDLE_POLL_SECONDS / 4, delays



@pytest.mark.cluster
@pytest.mark.long
@needs_cluster
def test_a_subscription_taken_as_the_slot_moves_away_is_taken_anew_not_raised(own_cluster, on_own_cluster):
    """The 20-minute cluster history run on befa209: 3 of its workers quit (exit code 0) right after a migration of the
    prefix's slot, on "redis-py dropped the subscription on <old owner>" raised from the idle subscription's
    confirmation wait (wake.py's listen), which only the idle wait itself handled. Here the worker's fetcher
    subscribes, the slot moves to another primary, and the fetcher's next subscriptions (another queue added, then
    the same channels again) never raise: the subscription is given up and taken anew on the new owner."""
    from rq_policies.engine.wake import WakeFetcher

    cluster, _ = on_own_cluster
    primary, _ = own_cluster.owner_of(keys.PREFIX)
    target = next(n for n in own_cluster.nodes[:own_cluster.primaries] if n is not primary
                  and own_cluster.role(n.port) == 'master')
    fetcher = WakeFetcher(hold_ttl=30)
    new = own_cluster.node_client(target.port)
    try:
        assert fetcher.listen(cluster, ['moving-a']) is True
        _migrate_slot(own_cluster, primary, target)
        deadline = time.monotonic() + 30
        names = ['moving-a', 'moving-b']
        while numsub(new, keys.wake('moving-b'))[0] != 1:
            assert time.monotonic() < deadline, 'never subscribed on the new owner'
            fetcher.listen(cluster, names)  # must not raise
            if fetcher._pubsub is None:
                time.sleep(0.1)  # a given-up subscription waits out its poll before the next attempt
        assert fetcher.hearing() >= {'moving-a', 'moving-b'}
    finally:
        fetcher.close()
        new.close()


def _migrate_slot(valkey_cluster, source, target) -> None:
    """Move the prefix's slot from ``source`` to ``target`` (SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE)."""
    from redis.crc import key_slot

    slot = key_slot(keys.PREFIX.encode())
    src, dst = valkey_cluster.node_client(source.port), valkey_cluster.node_client(target.port)
    try:
        src_id, dst_id = src.execute_command('CLUSTER MYID'), dst.execute_command('CLUSTER MYID')
        dst.execute_command('CLUSTER SETSLOT', slot, 'IMPORTING', src_id)
        src.execute_command('CLUSTER SETSLOT', slot, 'MIGRATING', dst_id)
        while batch := src.execute_command('CLUSTER GETKEYSINSLOT', slot, 100):
            src.execute_command('MIGRATE', '127.0.0.1', target.port, '', 0, 5000, 'KEYS', *batch)
        for client in (dst, src):
            client.execute_command('CLUSTER SETSLOT', slot, 'NODE', dst_id)
    finally:
        src.close()
        dst.close()
    assert wait_for(lambda: valkey_cluster.owner_of(keys.PREFIX)[0] is target, 10)


# -- fakeredis (users' unit tests) ------------------------------------------------------------------------------------


def test_the_idle_wait_wakes_on_fakeredis():
    """fakeredis (>= 2.18 has SPUBLISH, in scripts too, and SSUBSCRIBE): a push through a PolicyQueue wakes a
    waiting fetcher, and a capacity change does."""
    fakeredis = pytest.importorskip('fakeredis')
    from rq_policies import QueueSlot
    from rq_policies.engine.wake import WakeFetcher

    fake = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    fetcher = WakeFetcher(hold_ttl=30)
    try:
        assert fetcher.listen(fake, ['unit']) is True
        assert fetcher.listen(fake, ['unit']) is False  # already subscribed
        for wake in (lambda: PolicyQueue('unit', connection=fake).enqueue(jobs.plain, 1),
                     lambda: QueueSlot.set('unit', 2, connection=fake)):
            got: list = []
            waiter = threading.Thread(target=lambda: got.append(fetcher.wait(fake, ['unit'], 5.0)))  # noqa: B023
            started = time.monotonic()
            waiter.start()
            time.sleep(0.2)
            wake()
            waiter.join(5)
            assert got == [True] and time.monotonic() - started < IDLE_POLL_SECONDS
    finally:
        fetcher.close()
        fake.close()
