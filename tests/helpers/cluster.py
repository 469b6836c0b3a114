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
