"""A fault-injecting TCP proxy for the tests: real loopback sockets between a client and the test server.

``FaultProxy`` listens on a free 127.0.0.1 port and forwards every connection to the server, one thread per
direction. Faults are armed from the test and fire on the traffic itself, so a client sees exactly what a slow or
broken network would show it (a late reply, a closed socket, silence), and the server really runs what it received:

* :meth:`FaultProxy.delay_reply`: the reply to the next request matching ``match`` reaches the client ``seconds``
  late (the server ran the command at once; a client with a shorter ``socket_timeout`` gives up and retries);
* :meth:`FaultProxy.drop_reply`: the next matching request is forwarded, the server's reply is discarded and the
  connection is closed (the command ran; the client sees a closed connection);
* :meth:`FaultProxy.refuse`: the next matching request is not forwarded and the connection is closed (the command
  never reached the server: a server that went away just then);
* :meth:`FaultProxy.stall`: nothing moves in either direction for ``seconds``, from now or from the next matching
  request (a client that gives up and resends then has both attempts reach the server after the stall, in either
  order);
* :meth:`FaultProxy.before_request`: a callback runs just before a matching request is forwarded (a ``SCRIPT FLUSH``
  on the server at the worst moment, say);
* :meth:`FaultProxy.outage`: the server is unreachable for ``seconds``: every connection is closed, and one opened
  meanwhile is closed at once (the client sees a reset, as with a server that is down or a network that is cut).

A request matches when one chunk read from the client contains every byte string of ``match`` (a command is sent
in one write by redis-py, so its name and arguments arrive together). The proxy is bounded: it closes everything
after ``lifetime`` seconds, its threads are daemons that poll a stop flag, and :meth:`close` ends it at once.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Union

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

Match = Union[bytes, tuple[bytes, ...]]

_POLL_SECONDS = 0.2
_CHUNK = 65536


def _matches(match: Match, data: bytes) -> bool:
    parts = (match,) if isinstance(match, bytes) else match
    return all(part in data for part in parts)


class _Fault:
    """One armed fault: what it does, on which requests, how many more times."""

    def __init__(self, kind: str, match: Match, seconds: float = 0.0, times: int = 1,
                 callback: Callable[[], Any] | None = None) -> None:
        self.kind, self.match, self.seconds, self.times, self.callback = kind, match, seconds, times, callback


class _Link:
    """One proxied connection: the client's socket, the server's, and what is armed on its next reply."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.reply_fault: _Fault | None = None
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class FaultProxy:
    """A loopback TCP proxy in front of ``target`` that delays, drops and stalls on command.

    Args:
        target_host: the server's host.
        target_port: the server's port.
        lifetime: seconds after which the proxy closes every connection and stops listening by itself.
        record: keep every request for :meth:`seen` (a long run, the soak, passes False: nothing is kept).
    """

    def __init__(self, target_host: str, target_port: int, lifetime: float = 300.0, record: bool = True) -> None:
        self.target = (target_host, target_port)
        self.lifetime = lifetime
        self.record = record
        self._lock = threading.Lock()
        self._faults: list[_Fault] = []
        self._stall_until = 0.0
        self._refuse_until = 0.0
        self._links: list[_Link] = []
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(('127.0.0.1', 0))
        self._listener.listen(64)
        self._listener.settimeout(_POLL_SECONDS)
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        #: (kind, matched request's first 80 bytes) of every fault that fired, in order.
        self.fired: list[tuple[str, bytes]] = []
        self._seen: list[bytes] = []
        self._thread = threading.Thread(target=self._accept, name='faultproxy-accept', daemon=True)

    @property
    def url(self) -> str:
        return f'redis://127.0.0.1:{self.port}/0'

    def start(self) -> FaultProxy:
        self._deadline = time.monotonic() + self.lifetime
        self._thread.start()
        return self

    # -- controls -------------------------------------------------------------------------------------------------

    def delay_reply(self, seconds: float, match: Match = b'', times: int = 1) -> None:
        """Hold the reply to the next ``times`` requests matching ``match`` for ``seconds`` before forwarding it."""
        self._arm(_Fault('delay', match, seconds=seconds, times=times))

    def drop_reply(self, match: Match = b'', times: int = 1) -> None:
        """Forward the next matching request, then discard the server's reply and close that connection."""
        self._arm(_Fault('drop', match, times=times))

    def refuse(self, match: Match = b'', times: int = 1) -> None:
        """Close the connection instead of forwarding the next ``times`` matching requests: the server never gets
        them, the client sees a closed connection."""
        self._arm(_Fault('refuse', match, times=times))

    def before_request(self, callback: Callable[[], Any], match: Match = b'', times: int = 1) -> None:
        """Run ``callback()`` (in the proxy's thread) just before each of the next ``times`` matching requests is
        forwarded to the server."""
        self._arm(_Fault('before', match, times=times, callback=callback))

    def stall(self, seconds: float, match: Match | None = None) -> None:
        """Forward nothing in either direction, on any connection, for ``seconds`` (bytes wait in the proxy, none are
        lost): from now, or with ``match`` from when the next matching request arrives (that request waits too)."""
        if match is not None:
            self._arm(_Fault('stall', match, seconds=seconds))
            return
        with self._lock:
            self._stall_until = max(self._stall_until, time.monotonic() + seconds)

    def outage(self, seconds: float) -> None:
        """Cut the server off for ``seconds`` from now: every open connection is closed, and connections opened
        meanwhile are closed as soon as they are accepted. Armed faults stay armed."""
        with self._lock:
            self._refuse_until = max(self._refuse_until, time.monotonic() + seconds)
            links = list(self._links)
        for link in links:
            link.close()

    def in_outage(self) -> bool:
        with self._lock:
            return time.monotonic() < self._refuse_until

    def disarm(self) -> None:
        """Forget every armed fault that has not fired."""
        with self._lock:
            self._faults.clear()

    def seen(self, match: Match) -> int:
        """How many client chunks forwarded so far matched ``match`` (e.g. how often a command was sent)."""
        with self._lock:
            return sum(1 for chunk in self._seen if _matches(match, chunk))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()
        self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the machinery --------------------------------------------------------------------------------------------

    def _arm(self, fault: _Fault) -> None:
        if fault.times < 1:
            raise ValueError(f'times must be >= 1, got {fault.times!r}')
        with self._lock:
            self._faults.append(fault)

    def _take(self, data: bytes) -> list[_Fault]:
        """The armed faults this request fires (each counted down once), in the order they were armed."""
        with self._lock:
            if self.record:
                self._seen.append(data[:4096])
            fired = []
            for fault in list(self._faults):
                if _matches(fault.match, data):
                    fault.times -= 1
                    if fault.times == 0:
                        self._faults.remove(fault)
                    fired.append(fault)
                    self.fired.append((fault.kind, data[:80]))
            return fired

    def _wait_stall(self, link: _Link) -> None:
        while not link.closed.is_set() and not self._stop.is_set():
            with self._lock:
                left = self._stall_until - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, _POLL_SECONDS))

    def _expired(self) -> bool:
        return self._stop.is_set() or time.monotonic() > self._deadline

    def _accept(self) -> None:
        while not self._expired():
            try:
                client, _ = self._listener.accept()
            except (socket.timeout, OSError):
                continue
            if self.in_outage():
                try:
                    client.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(_POLL_SECONDS)
            link = _Link(client, server)
            with self._lock:
                self._links = [known for known in self._links if not known.closed.is_set()]
                self._links.append(link)
                self.connections += 1
            threading.Thread(target=self._upstream, args=(link,), name='faultproxy-up', daemon=True).start()
            threading.Thread(target=self._downstream, args=(link,), name='faultproxy-down', daemon=True).start()
        self._stop.set()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def _read(self, link: _Link, sock: socket.socket) -> bytes | None:
        """The next chunk from ``sock``; None once the link is closed, the peer hung up or the proxy stops."""
        while not link.closed.is_set():
            if self._expired():
                link.close()
                return None
            try:
                data = sock.recv(_CHUNK)
            except socket.timeout:
                continue
            except OSError:
                link.close()
                return None
            if not data:
                link.close()
                return None
            return data
        return None

    def _send(self, link: _Link, sock: socket.socket, data: bytes) -> bool:
        try:
            sock.sendall(data)
            return True
        except OSError:
            link.close()
            return False

    def _upstream(self, link: _Link) -> None:
        """Client -> server: fire the faults a request matches, then forward it."""
        while True:
            data = self._read(link, link.client)
            if data is None:
                return
            faults = self._take(data)
            for fault in faults:
                if fault.kind == 'before' and fault.callback is not None:
                    fault.callback()
            if any(fault.kind == 'refuse' for fault in faults):
                link.close()  # never forwarded
                return
            for fault in faults:
                if fault.kind in ('delay', 'drop'):
                    link.reply_fault = fault
                elif fault.kind == 'stall':
                    self.stall(fault.seconds)
            self._wait_stall(link)
            if not self._send(link, link.server, data):
                return

    def _downstream(self, link: _Link) -> None:
        """Server -> client: forward replies, late or not at all when a fault is armed on this link."""
        while True:
            data = self._read(link, link.server)
            if data is None:
                return
            fault, link.reply_fault = link.reply_fault, None
            if fault is not None and fault.kind == 'drop':
                link.close()  # the server ran it; the client never hears
                return
            if fault is not None and fault.kind == 'delay':
                if link.closed.wait(fault.seconds):
                    return
            self._wait_stall(link)
            if not self._send(link, link.client, data):
                return


def retrying(retries: int = 3) -> Retry:
    """The retry a production client has: ``ConnectionError`` and ``TimeoutError`` resend the same command.

    ``Redis(host=..., port=...)`` gets one by default in redis-py >= 6, but ``Redis.from_url`` (what rq's command line
    and most settings use) builds its connections with none in redis-py 8, so the tests give it explicitly: every
    version then resends a command whose reply did not come within ``socket_timeout``.
    """
    return Retry(ExponentialBackoff(cap=0.05, base=0.01), retries)


class RetryingRedis(Redis):
    """A client class for ``rq worker --connection-class tests.helpers.faultproxy.RetryingRedis``: ``from_url`` with
    :func:`retrying` (and whatever ``socket_timeout`` the url's query gives)."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RetryingRedis:
        kwargs.setdefault('retry', retrying())
        return super().from_url(url, **kwargs)

