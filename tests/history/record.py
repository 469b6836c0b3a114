"""The recorder: each process of a history run appends its events (:mod:`tests.history.events`) to a JSONL file of
its own, stamped with the Redis server's clock.

Why files: the records must survive the faults they witness (a Redis restart, an outage, a failover, a SIGKILL of
the recording process itself), so they never go through the server under test. Each process writes its own file,
``<folder>/<p>.jsonl``, line-buffered: a process killed mid-write loses at most its last line (the checker skips a
torn last line), and no two processes ever write one file. A forked child (a work horse) writes a file of its own,
opened at its first event (so a child that records nothing, the hold guard, leaves no file).

The clock: every script decides by the server's ``TIME``, so every event is stamped with it. The recorder measures
the offset between this host's clock and the server's once at start (the middle of the ``TIME`` round trip, the best
of three reads on an open connection; the round trip, ``dt`` in the ``hello`` event, bounds the stamp's error to
``dt / 2``) and again after a reconnect (a process that witnessed a connection error calls
:meth:`Recorder.reconnected`); a later measurement is taken only when its round trip is no longer than the first's,
so ``hello``'s bound holds for every stamp, and one that fails keeps the offset it had.
It reads ``TIME`` on a small client of its own, straight to a server's address (not through the fault proxy), trying
each address it was given in turn: on one host the servers of a Sentinel group or a cluster share one clock.

The environment a run gives its processes (:func:`from_env` reads it):

* ``HISTORY_DIR``: the history's folder;
* ``HISTORY_CLOCK``: ``host:port`` addresses whose ``TIME`` the stamps follow, comma-separated;
* ``HISTORY_TOPOLOGY``: single | sentinel | cluster (for ``hello``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from tests.history.events import TYPES

DIR_ENV = 'HISTORY_DIR'
CLOCK_ENV = 'HISTORY_CLOCK'
TOPOLOGY_ENV = 'HISTORY_TOPOLOGY'

#: Seconds a ``TIME`` read may take before the calibration gives up (the server is down: the old offset stays).
CLOCK_TIMEOUT = 0.5

#: ``TIME`` reads per calibration; the one with the shortest round trip gives the offset.
TRIES = 3

#: At most one calibration per this many seconds (a producer meeting errors in a loop during an outage would
#: otherwise try on every call).
RECALIBRATE_EVERY = 1.0


def parse_addresses(text: str) -> list[tuple[str, int]]:
    """``'127.0.0.1:6379,127.0.0.1:6380'`` as ``[('127.0.0.1', 6379), ('127.0.0.1', 6380)]``."""
    found = []
    for part in text.split(','):
        part = part.strip()
        if part:
            host, _, port = part.rpartition(':')
            found.append((host or '127.0.0.1', int(port)))
    return found


class ServerClock:
    """This host's offset from the server's clock, from ``TIME`` read on a client of its own.

    Attributes:
        offset: seconds to add to ``time.time()`` for the server's time (0 until a measurement succeeded).
        dt: the last successful measurement's round trip (seconds), None before any.
    """

    def __init__(self, addresses: list[tuple[str, int]]) -> None:
        self.addresses = list(addresses)
        self.offset = 0.0
        #: The round trip of the measurement in force (the first one's, which ``hello`` reports, or a tighter one).
        self.dt: float | None = None
        self._last_try = 0.0

    def measure(self) -> bool:
        """Read ``TIME`` on the first address that answers, on a connection already open (its set-up is not part
        of the round trip), the best of ``TRIES`` reads (the shortest round trip); True when the offset was
        measured. A later measurement replaces the offset only when its round trip is no longer than the first's:
        the bound ``hello`` reported, ``dt / 2``, holds for every stamp of the process."""
        from redis import Redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        try:
            return self._measure(Redis, Retry(NoBackoff(), 0))
        finally:
            self._last_try = time.monotonic()  # from the end of a try: a server that is down costs one try a second

    def _measure(self, redis_class: Any, no_retry: Any) -> bool:
        for host, port in self.addresses:
            # No retry: a server that is down (a restart, an outage) answers nothing at once, and the recording
            # process must not wait on it.
            client = redis_class(host=host, port=port, socket_timeout=CLOCK_TIMEOUT,
                                 socket_connect_timeout=CLOCK_TIMEOUT, retry=no_retry)
            try:
                client.ping()  # connected (and redis-py's set-up commands sent) before anything is timed
                best = None
                for _ in range(TRIES):
                    before = time.time()
                    seconds, micros = client.time()
                    after = time.time()
                    if best is None or after - before < best[0]:
                        best = (after - before, seconds + micros / 1e6 - (before + after) / 2)
            except Exception:  # down, restarting, loading: try the next one, or keep the old offset
                continue
            finally:
                client.close()
            dt, offset = best
            if self.dt is None:
                self.offset, self.dt = offset, dt
            elif dt <= self.dt:
                self.offset = offset  # as tight as the first: the bound hello reported still holds
            return True
        return False

    def maybe_measure(self) -> bool:
        """:meth:`measure`, unless one was tried less than ``RECALIBRATE_EVERY`` seconds ago."""
        if time.monotonic() - self._last_try < RECALIBRATE_EVERY:
            return False
        return self.measure()

    def now(self) -> float:
        """The server's time now, as this host's clock and the offset put it."""
        return time.time() + self.offset


class Recorder:
    """One process's history file: :meth:`event` appends one event, stamped with the server's clock.

    Args:
        folder: the history's folder.
        p: this process's name in the history (``producer-3``, ``worker-2``, ``runner``), unique within the run;
            also its file's name.
        role: producer | worker | horse | nemesis | runner.
        clock: the server clock to stamp with (shared by the recorders of one process); None: measure one from
            ``addresses``.
        addresses: where the clock reads ``TIME`` (when ``clock`` is None).
        topology: single | sentinel | cluster.
        hello: more fields of the ``hello`` event (``worker`` for workers and horses).
    """

    def __init__(self, folder: os.PathLike | str, p: str, role: str, clock: ServerClock | None = None,
                 addresses: list[tuple[str, int]] | None = None, topology: str | None = None,
                 **hello: Any) -> None:
        self.folder = Path(folder)
        self.p = p
        self.role = role
        self.topology = topology
        self.clock = clock if clock is not None else ServerClock(addresses or [])
        if clock is None:
            self.clock.measure()
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._file = None
        self._hello = hello
        #: In a forked child (a work horse), what names its own file: set by the parent before the fork
        #: (:meth:`child`), read at the child's first event.
        self.child_name: tuple[str, str, dict[str, Any]] | None = None
        self._open()

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._file = open(self.folder / f'{self.p}.jsonl', 'a', buffering=1, encoding='utf-8')  # noqa: SIM115
        self._write({'e': 'hello', 'role': self.role, 'pid': os.getpid(), 'dt': self.clock.dt,
                     'topology': self.topology, **self._hello})

    def child(self, p: str, role: str, **hello: Any) -> None:
        """Name the file of the next forked child's events (``p``, ``role`` and its ``hello`` fields): a forking
        worker calls it before each fork; the child opens that file at its first event."""
        self.child_name = (p, role, hello)

    def _forked(self) -> None:
        """In a forked child, at its first event: a file of its own (its parent's stays the parent's)."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        if self.child_name is not None:
            self.p, self.role, self._hello = self.child_name
        else:  # a child nobody named: a name of its own all the same
            self.p, self.role = f'{self.p}-child-{self._pid}', 'child'
        self.child_name = None
        self._file = None  # the parent's descriptor is the parent's: never written from here
        self._open()

    def now(self) -> float:
        return self.clock.now()

    def event(self, e: str, **fields: Any) -> float:
        """Append event ``e`` with ``fields``; returns its stamp (server time, seconds)."""
        if e not in TYPES:
            raise ValueError(f'unknown event type {e!r}: one of {TYPES}')
        if os.getpid() != self._pid:
            self._forked()
        return self._write({'e': e, **fields})

    def _write(self, fields: dict[str, Any]) -> float:
        with self._lock:
            t = round(self.clock.now(), 6)
            line = json.dumps({'t': t, 'p': self.p, **fields}, separators=(',', ':'), default=str)
            self._file.write(line + '\n')
            return t

    def reconnected(self) -> None:
        """This process met a connection error (a restart, an outage, a failover): measure the offset again (at
        most once a second; a failed measurement keeps the old one)."""
        self.clock.maybe_measure()

    def close(self) -> None:
        if self._file is not None and os.getpid() == self._pid:
            self._file.close()
        self._file = None


#: This process's recorder (:func:`here`), made from the environment at first use.
_HERE: Recorder | None = None


def from_env(p: str, role: str, **hello: Any) -> Recorder:
    """A recorder configured by the run's environment (``HISTORY_DIR``, ``HISTORY_CLOCK``, ``HISTORY_TOPOLOGY``),
    made this process's own (:func:`here`)."""
    global _HERE
    folder = os.environ.get(DIR_ENV)
    if not folder:
        raise RuntimeError(f'{DIR_ENV} is not set: this process is not part of a history run')
    _HERE = Recorder(folder, p, role, addresses=parse_addresses(os.environ.get(CLOCK_ENV, '')),
                     topology=os.environ.get(TOPOLOGY_ENV), **hello)
    return _HERE


def here() -> Recorder:
    """This process's recorder (a forked work horse's is its own file, opened at its first event)."""
    if _HERE is None:
        raise RuntimeError('no recorder in this process: from_env() first')
    return _HERE
