"""A master, a replica and three sentinels on loopback, for failover tests."""

from __future__ import annotations

import time

from redis import Redis
from redis.sentinel import Sentinel

from rq_policies.surfaces.testing import RedisServer, free_port


class SentinelCluster:
    master_name = 'mymaster'

    def __init__(self) -> None:
        self.master = RedisServer()
        self.replica = RedisServer()
        self.sentinels: list[RedisServer] = []

    def start(self) -> SentinelCluster:
        self.master.extra_args = ['--repl-diskless-sync-delay', '0']  # start the initial sync at once
        self.master.start()
        self.replica.extra_args = ['--replicaof', '127.0.0.1', str(self.master.port)]
        self.replica.start()
        for _ in range(3):
            port = free_port()
            sentinel = RedisServer(port=port)
            conf = sentinel.dir / 'sentinel.conf'
            conf.write_text(
                f'port {port}\nbind 127.0.0.1\ndir {sentinel.dir}\n'
                f'sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 2\n'
                f'sentinel down-after-milliseconds {self.master_name} 1000\n'
                f'sentinel failover-timeout {self.master_name} 5000\n'
                f'sentinel parallel-syncs {self.master_name} 1\n'
            )
            sentinel.binary_args = [str(conf), '--sentinel']
            self._start_sentinel(sentinel, conf)
            self.sentinels.append(sentinel)
        self._wait(lambda: self.replica.client().info('replication')['master_link_status'] == 'up', 'replica to sync')
        self._wait(lambda: self.sentinel().discover_slaves(self.master_name) != [], 'sentinels to see the replica')
        return self

    @staticmethod
    def _start_sentinel(server: RedisServer, conf) -> None:
        import subprocess

        server.process = subprocess.Popen(
            [server.binary, str(conf), '--sentinel', '--logfile', str(server.dir / 'sentinel.log')],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        SentinelCluster._wait(lambda: Redis(port=server.port, socket_timeout=1).ping(), 'sentinel to start')

    @staticmethod
    def _wait(predicate, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise RuntimeError(f'timed out waiting for {what}')

    @property
    def instances(self) -> list[tuple[str, int]]:
        return [('127.0.0.1', s.port) for s in self.sentinels]

    def sentinel(self) -> Sentinel:
        return Sentinel(self.instances, socket_timeout=1)

    def master_address(self) -> tuple[str, int]:
        return self.sentinel().discover_master(self.master_name)

    def close(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            server.close()
