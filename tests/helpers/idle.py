"""Making a real server close the connections its clients keep open, as production servers and proxies do: the
server's ``timeout`` setting closing idle connections, or a restart on the same port."""

from __future__ import annotations

import time

from rq_policies.surfaces.testing import RedisServer

#: The ways :func:`close_idle_connections` closes them.
HOW = ('idle-timeout', 'restart')


def wait_for_no_clients(server: RedisServer, seconds: float = 15.0) -> None:
    """Wait until ``server`` has closed every connection but the one asking (its ``timeout`` closes idle ones)."""
    deadline = time.monotonic() + seconds
    while True:
        admin = server.client()
        try:
            if admin.info('clients')['connected_clients'] == 1:
                return
        finally:
            admin.close()
        assert time.monotonic() < deadline, 'the server never closed the idle connections'
        time.sleep(0.1)


def close_idle_connections(server: RedisServer, how: str) -> None:
    """Make ``server`` close the connections its clients keep: ``'idle-timeout'``, its ``timeout`` setting (1 s)
    closing them once idle (waited for), or ``'restart'`` on the same port (no persistence: the data goes too)."""
    if how == 'restart':
        server.restart()
        return
    assert how == 'idle-timeout', how
    admin = server.client()
    admin.config_set('timeout', 1)
    admin.close()
    wait_for_no_clients(server)
