"""A master, a replica and three sentinels on loopback, for failover tests."""

from __future__ import annotations

import time

from redis import Redis
from redis.sentinel import Sentinel

from rq_policies.surfaces.testing import RedisServer, free_port


class SentinelCluster:
    master_name = 'mymaster'

    def __init__(self, appendonly: bool = False) -> None:
        # appendonly: each server keeps an AOF (fsync always), so a killed one comes back with what it had. Without
        # it a SIGKILLed server comes back from the RDB file its last full sync as a replica left in its folder,
        # minutes old: were the sentinels to keep it master, its replica would sync that old data and roll the
        # whole dataset back (Redis's "replication with persistence turned off" hazard).
        self.master = RedisServer(appendonly=appendonly)
        self.replica = RedisServer(appendonly=appendonly)
        self.sentinels: list[RedisServer] = []
        self._durable = ['--appendfsync', 'always'] if appendonly else []

    def start(self) -> SentinelCluster:
        self.master.extra_args = ['--repl-diskless-sync-delay', '0', *self._durable]  # start the initial sync at once
        self.master.start()
        self.replica.extra_args = ['--replicaof', '127.0.0.1', str(self.master.port), *self._durable]
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

    def current_master(self) -> RedisServer:
        """The server the sentinels name as master now (the replica, once it has been promoted)."""
        host, port = self.master_address()
        return next(server for server in (self.master, self.replica) if server.port == port)

    def _linked_replica(self, server: RedisServer) -> bool:
        info = server.client(socket_timeout=1).info('replication')
        return info['role'] == 'slave' and info.get('master_link_status') == 'up'

    def kill_master(self, timeout: float = 60.0) -> tuple[RedisServer, RedisServer]:
        """SIGKILL the master and wait until the sentinels have promoted the replica; returns (the killed server,
        the new master). :meth:`restart` brings the killed one back (the sentinels make it a replica)."""
        old = self.current_master()
        new = self.replica if old is self.master else self.master
        old.process.kill()
        old.process.wait()
        self._wait(lambda: self.master_address()[1] == new.port, 'the sentinels to promote the replica', timeout)
        return old, new

    def restart(self, server: RedisServer, timeout: float = 60.0) -> None:
        """Start a killed server again on its port; the sentinels reconfigure it as the new master's replica. Waits
        until it is a replica with its link up."""
        server.start()
        self._wait(lambda: self._linked_replica(server), 'the old master to rejoin as a linked replica', timeout)

    def fail_over(self, timeout: float = 60.0) -> tuple[RedisServer, RedisServer]:
        """A graceful failover (``SENTINEL FAILOVER``): the replica is promoted and the old master follows it;
        returns (the old master, the new one) once the old one is a linked replica."""
        old, new = self.begin_fail_over(timeout)
        self.finish_fail_over(old, new, timeout)
        return old, new

    def begin_fail_over(self, timeout: float = 60.0) -> tuple[RedisServer, RedisServer]:
        """Ask the sentinels for a graceful failover (``SENTINEL FAILOVER``) once the replica is linked, and return
        (the master now, the replica it promotes) at once: the promotion and the old master's reconfiguration follow
        (:meth:`finish_fail_over` waits for both)."""
        old = self.current_master()
        new = self.replica if old is self.master else self.master
        self._wait(lambda: self._linked_replica(new), 'the replica to be linked before the failover', timeout)
        for sentinel in self.sentinels:
            try:
                Redis(port=sentinel.port, socket_timeout=2).execute_command('SENTINEL FAILOVER', self.master_name)
                break
            except Exception:  # this one is busy or not the leader yet: ask the next
                continue
        return old, new

    def finish_fail_over(self, old: RedisServer, new: RedisServer, timeout: float = 60.0) -> None:
        """Wait until the sentinels name ``new`` the master and ``old`` follows it as a linked replica."""
        self._wait(lambda: self.master_address()[1] == new.port, 'the sentinels to promote the replica', timeout)
        self._wait(lambda: self._linked_replica(old), 'the old master to follow the new one', timeout)

    def close(self) -> None:
        for server in [*self.sentinels, self.replica, self.master]:
            server.close()
