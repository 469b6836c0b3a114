"""A real Valkey (or Redis 7) cluster for the tests: 3 primaries and 3 replicas, started on free ports.

Built with the server's own commands, no external tool: each node runs with ``--cluster-enabled yes``; the primaries
take a third of the 16,384 slots each (``CLUSTER ADDSLOTSRANGE``), every node meets the first (``CLUSTER MEET``),
and each replica follows one primary (``CLUSTER REPLICATE``). ``cluster-node-timeout`` is small (1,000 ms by default)
so that a replica promotes itself soon after its primary dies (a dead primary cannot run ``CLUSTER FAILOVER``).
"""

from __future__ import annotations

import os
import socket
import time

from redis import Redis
from redis.cluster import ClusterNode, RedisCluster

from rq_policies.surfaces.testing import RedisServer, free_port

SLOTS = 16384

#: ``RQ_POLICIES_CLUSTER=1``: the session runs its tests on a cluster of its own (tests/conftest.py).
ON_CLUSTER = bool(os.environ.get('RQ_POLICIES_CLUSTER'))
#: rq's option that makes its CLI (and ours) build a cluster client from ``--url``.
CLUSTER_CLASS = ['--connection-class', 'redis.cluster.RedisCluster']


def connect(url: str, **kwargs):
    """The client ``url`` needs in this session: a ``RedisCluster`` on the session's cluster
    (``RQ_POLICIES_CLUSTER=1``), a ``Redis`` otherwise. Worker subprocesses and job code call it too."""
    if ON_CLUSTER:
        return RedisCluster.from_url(url, **kwargs)
    return Redis.from_url(url, **kwargs)


def aconnect(url: str, **kwargs):
    """:func:`connect` for redis-py's asyncio clients."""
    if ON_CLUSTER:
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

        return AsyncRedisCluster.from_url(url, **kwargs)
    from redis.asyncio import Redis as AsyncRedis

    return AsyncRedis.from_url(url, **kwargs)


def not_on_cluster_reason(why: str) -> str:
    return f'not on a cluster (RQ_POLICIES_CLUSTER=1): {why}'


def not_on_cluster(why: str):
    """Marks a test that cannot hold on a cluster by nature, naming why (skipped under ``RQ_POLICIES_CLUSTER=1``)."""
    import pytest

    return pytest.mark.skipif(ON_CLUSTER, reason=not_on_cluster_reason(why))


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(('127.0.0.1', port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError('no free port pair (port, port + 10000) for a cluster node')


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f'cluster: {what} within {timeout} s')
        time.sleep(0.05)


class ValkeyCluster:
    """``primaries`` primaries with ``replicas`` replicas each, on 127.0.0.1. ``client()`` gives a RedisCluster."""

    def __init__(self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.node_timeout_ms = node_timeout_ms
        count = primaries * (1 + replicas)
        self.primaries = primaries
        self.nodes: list[RedisServer] = []
        for _ in range(count):
            self.nodes.append(RedisServer(port=_cluster_port(), extra_args=[
                '--cluster-enabled', 'yes', '--cluster-node-timeout', str(node_timeout_ms),
                # a replica promotes itself whatever its replication lag (the default factor 10 could keep a replica
                # that lost its primary mid-run from standing for election); the cost is measured by the failover test
                '--cluster-replica-validity-factor', '0',
                '--cluster-require-full-coverage', 'no', '--appendonly', 'no',
            ]))

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        return f'redis://127.0.0.1:{self.nodes[0].port}/0'

    def node_client(self, port: int) -> Redis:
        return Redis(host='127.0.0.1', port=port, socket_timeout=5, decode_responses=True)

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT on every node: each node's command counters start from zero."""
        for port in self.ports:
            client = self.node_client(port)
            try:
                client.config_resetstat()
            finally:
                client.close()

    def start(self, timeout: float = 30.0) -> ValkeyCluster:
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout: float) -> None:
        for node in self.nodes:
            node.start()
        clients = [self.node_client(port) for port in self.ports]
        try:
            ids = [c.execute_command('CLUSTER MYID') for c in clients]
            share = SLOTS // self.primaries
            for i in range(self.primaries):
                first = i * share
                last = SLOTS - 1 if i == self.primaries - 1 else first + share - 1
                clients[i].execute_command('CLUSTER ADDSLOTSRANGE', first, last)
            for c in clients[1:]:
                c.execute_command('CLUSTER MEET', '127.0.0.1', self.ports[0])

            def everyone_known():
                return all(len(c.execute_command('CLUSTER NODES')) == len(clients) for c in clients)

            _wait(everyone_known, timeout, 'every node to know every other')
            for j, c in enumerate(clients[self.primaries:]):
                primary = ids[j % self.primaries]
                deadline = time.monotonic() + timeout
                while True:  # the replica may not know the primary as a primary yet
                    try:
                        c.execute_command('CLUSTER REPLICATE', primary)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)

            def ready():
                for c in clients:
                    if c.execute_command('CLUSTER INFO').get('cluster_state') != 'ok':
                        return False
                    if c.info('replication')['role'] == 'slave' and c.info('replication').get(
                            'master_link_status') != 'up':
                        return False
                return True

            _wait(ready, timeout, 'cluster_state ok and every replica linked')
        finally:
            for c in clients:
                c.close()

    def client(self, **kwargs) -> RedisCluster:
        """A client that starts from any live node (the first may have been killed by a failover test)."""
        kwargs.setdefault('socket_timeout', 5)
        live = [ClusterNode('127.0.0.1', node.port) for node in self.nodes
                if node.process is not None and node.process.poll() is None]
        return RedisCluster(startup_nodes=live, **kwargs)

    def owner_of(self, key: str) -> tuple[RedisServer, RedisServer | None]:
        """The node serving ``key``'s slot as primary now, and one replica of it (or None)."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            c = self.node_client(node.port)
            try:
                shards = c.execute_command('CLUSTER SHARDS')
            finally:
                c.close()
            for shard in shards:
                shard = _as_dict(shard)
                ranges = shard['slots']
                if not any(int(ranges[k]) <= slot <= int(ranges[k + 1]) for k in range(0, len(ranges), 2)):
                    continue
                primary = replica = None
                for entry in shard['nodes']:
                    entry = _as_dict(entry)
                    match = next((n for n in self.nodes if n.port == int(entry['port'])), None)
                    if entry['role'] == 'master' and entry.get('health') == 'online':
                        primary = match
                    elif entry['role'] != 'master' and entry.get('health') == 'online':
                        replica = match
                if primary is not None:
                    return primary, replica
            break
        raise RuntimeError(f'cluster: no live primary serves slot {slot}')

    def role(self, port: int) -> str:
        """A node's replication role now: ``master``, ``slave``, or ``unreachable`` (down, or not answering)."""
        client = self.node_client(port)
        try:
            return client.info('replication')['role']
        except Exception:
            return 'unreachable'
        finally:
            client.close()

    def node_id(self, node: RedisServer) -> str:
        client = self.node_client(node.port)
        try:
            return client.execute_command('CLUSTER MYID')
        finally:
            client.close()

    def kill_primary(self, key: str, timeout: float = 30.0) -> tuple[RedisServer, RedisServer]:
        """SIGKILL the primary serving ``key``'s slot and wait until its replica has promoted itself (a dead primary
        cannot run ``CLUSTER FAILOVER``: the replica takes over once ``cluster-node-timeout`` has passed). Returns
        (the killed node, the promoted one); :meth:`rejoin` brings the killed one back as a replica."""
        primary, replica = self.owner_of(key)
        deadline = time.monotonic() + timeout
        while replica is None:  # a node restarted a moment ago may still be syncing
            if time.monotonic() > deadline:
                raise RuntimeError(f'cluster: no replica of the primary serving {key!r} to promote')
            time.sleep(0.1)
            primary, replica = self.owner_of(key)
        primary.process.kill()
        primary.process.wait()
        _wait(lambda: self.role(replica.port) == 'master', timeout, 'the replica to promote itself')
        return primary, replica

    def rejoin(self, node: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed node again on its port: its ``nodes.conf`` makes it a replica of whoever took its slots;
        waits until it follows a primary with its link up."""
        node.start()

        def linked() -> bool:
            client = self.node_client(node.port)
            try:
                info = client.info('replication')
                return info['role'] == 'slave' and info.get('master_link_status') == 'up'
            except Exception:
                return False
            finally:
                client.close()

        _wait(linked, timeout, f'node {node.port} to rejoin as a linked replica')

    def fail_over(self, key: str, timeout: float = 30.0) -> tuple[RedisServer, RedisServer]:
        """A graceful ``CLUSTER FAILOVER`` of the primary serving ``key``'s slot, run on its replica (the replica
        waits until it has the primary's writes, then takes over); returns (the old primary, the new one) once the
        roles have switched."""
        primary, replica = self.owner_of(key)
        deadline = time.monotonic() + timeout
        while replica is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f'cluster: no replica of the primary serving {key!r} to fail over to')
            time.sleep(0.1)
            primary, replica = self.owner_of(key)
        client = self.node_client(replica.port)
        try:
            client.execute_command('CLUSTER FAILOVER')
        finally:
            client.close()
        _wait(lambda: self.role(replica.port) == 'master' and self.role(primary.port) == 'slave', timeout,
              'the graceful failover to switch roles')
        return primary, replica

    def migrate_slot(self, slot: int, target: RedisServer, batch: int = 20, pause: float = 0.01,
                     first: tuple[str, ...] = (), hold: float = 0.0) -> int:
        """Move ``slot`` to primary ``target`` while clients run, as ``redis-cli --cluster reshard`` does: SETSLOT
        IMPORTING on the target and MIGRATING on the source, MIGRATE ``batch`` keys at a time (``pause`` seconds
        between batches, so clients meet a slot split between two nodes: ASK, TRYAGAIN), then SETSLOT NODE on the
        target, the source and every other primary. ``first``: keys moved before the others, then ``hold`` seconds
        with the slot split so. Returns how many keys moved."""
        source = next(node for node in self.nodes if node.process is not None and node.process.poll() is None
                      and self._serves(node, slot))
        if source is target:
            return 0
        src, dst = self.node_client(source.port), self.node_client(target.port)
        try:
            src_id, dst_id = src.execute_command('CLUSTER MYID'), dst.execute_command('CLUSTER MYID')
            dst.execute_command('CLUSTER SETSLOT', slot, 'IMPORTING', src_id)
            src.execute_command('CLUSTER SETSLOT', slot, 'MIGRATING', dst_id)
            moved = 0
            if first:
                src.execute_command('MIGRATE', '127.0.0.1', target.port, '', 0, 5000, 'KEYS', *first)
                moved += len(first)
                time.sleep(hold)
            while True:
                keys = src.execute_command('CLUSTER GETKEYSINSLOT', slot, batch)
                if not keys:
                    break
                src.execute_command('MIGRATE', '127.0.0.1', target.port, '', 0, 5000, 'KEYS', *keys)
                moved += len(keys)
                time.sleep(pause)
            for client in (dst, src):
                client.execute_command('CLUSTER SETSLOT', slot, 'NODE', dst_id)
            for node in self.nodes:
                if node is source or node is target or node.process is None or node.process.poll() is not None:
                    continue
                if self.role(node.port) != 'master':
                    continue
                other = self.node_client(node.port)
                try:
                    other.execute_command('CLUSTER SETSLOT', slot, 'NODE', dst_id)
                except Exception:
                    pass  # it learns the new owner from the target's gossip anyway
                finally:
                    other.close()
            return moved
        finally:
            src.close()
            dst.close()

    def _serves(self, node: RedisServer, slot: int) -> bool:
        """Is ``node`` the primary that owns ``slot`` by its own view (CLUSTER SHARDS)?"""
        client = self.node_client(node.port)
        try:
            if client.info('replication')['role'] != 'master':
                return False
            myself = client.execute_command('CLUSTER MYID')
            for shard in client.execute_command('CLUSTER SHARDS'):
                shard = _as_dict(shard)
                ranges = shard['slots']
                if any(int(ranges[k]) <= slot <= int(ranges[k + 1]) for k in range(0, len(ranges), 2)):
                    return any(_as_dict(entry)['id'] == myself and _as_dict(entry)['role'] == 'master'
                               for entry in shard['nodes'])
            return False
        except Exception:
            return False
        finally:
            client.close()

    def flush(self) -> None:
        """FLUSHALL on every live primary (replicas follow)."""
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            c = self.node_client(node.port)
            try:
                if c.info('replication')['role'] == 'master':
                    c.flushall()
            finally:
                c.close()

    def keys(self) -> list[str]:
        """Every key on every live primary (SCAN of each)."""
        found: list[str] = []
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            c = self.node_client(node.port)
            try:
                if c.info('replication')['role'] == 'master':
                    found += list(c.scan_iter(count=1000))
            finally:
                c.close()
        return sorted(found)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> ValkeyCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _as_dict(value):
    """CLUSTER SHARDS answers flat lists (RESP2) or maps: the same as a dict."""
    if isinstance(value, dict):
        return value
    return {value[i]: value[i + 1] for i in range(0, len(value), 2)}
