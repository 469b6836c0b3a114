"""Helpers of the throttle and debounce tests: the server clock, slot phases, and real worker subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from redis import Redis

from tests.helpers import with_root
from tests.helpers.records import ran, server_now  # noqa: F401  (re-exported)


def clear_of_a_slot_edge(conn: Redis, slot: int | None, margin: float = 3.0) -> None:
    """Wait, if the current epoch-aligned ``slot``-second slot has less than ``margin`` seconds left, until the next
    one starts: a test that enqueues twice and expects the same slot (a winner, then a drop) must not see a boundary
    fall between the two (a Throttle(60) test failed so, its winner admitted 4 ms before the minute turned). No
    ``slot`` (a policy that counts in no slots): no wait."""
    if not slot:
        return
    left = slot - server_now(conn) % slot
    if left < margin:
        time.sleep(left + 0.05)


def wait_for_phase(conn: Redis, width: int, low: float, high: float, later_than: float | None = None) -> float:
    """Sleep until the server clock is ``low``..``high`` seconds into a ``width``-second slot; return that time.

    With ``later_than`` (a server time), only a slot after the one that time is in will do.
    """
    while True:
        now = server_now(conn)
        phase = now % width
        fresh = later_than is None or now // width > later_than // width
        if fresh and low <= phase <= high:
            return now
        time.sleep((low - phase) if fresh and phase < low else (width - phase + low))


def wait_for_runs(conn: Redis, tag: str, count: int, timeout: float) -> list[tuple[str, str, float]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = ran(conn, tag)
        if len(rows) >= count:
            return rows
        time.sleep(0.05)
    return ran(conn, tag)


class WorkerProcess:
    """``rq worker -w rq_policies.PolicyWorker --with-scheduler`` (the forking worker) in a subprocess of its own."""

    def __init__(self, url: str, env: dict[str, str], *queues: str, scheduler: bool = True) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix='rq-policies-worker-', suffix='.log', delete=False)
        cmd = [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'rq_policies.PolicyWorker', '--url', url,
               '--logging_level', 'INFO', *(['--with-scheduler'] if scheduler else []), *queues]
        # Its own session, so the scheduler process it forks can be stopped with it.
        self.process = subprocess.Popen(cmd, env=with_root(env), stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def output(self) -> str:
        with open(self.log.name, errors='replace') as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # warm shutdown: the worker stops its scheduler too
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # a scheduler child left behind, if any
        except ProcessLookupError:
            pass
        self.log.close()
        os.unlink(self.log.name)

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
