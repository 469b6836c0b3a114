"""Hold ledgers: the one crash-safe way rq-policies counts what runs (QueueSlot, LimitedCapacityWorker).

A ledger is a ZSET of *holds*, one member each (member = the hold's token, score = the epoch second, server clock, it
expires), not a counter. INCR on start and DECR on the end is right until a holder is SIGKILLed between the two; then
the count never comes back down. A TTL on a counter trades that for the mirror bug: the whole count expires at once
while jobs still run. With a ledger:

* a killed holder stops refreshing and its hold ages out within its ttl, with no operator action and no reaper (the
  ledger key itself expires once its last hold could have, ``lua/lib/outlive.lua``);
* a release names one member, so a release arriving after its own hold lapsed frees nothing that has since been
  handed to someone else;
* a refresh comes only from the owner of a job that still runs, so a hold it finds lapsed (a stall longer than its
  ttl, a restart without persistence) is written again, counted in ``rq:policies:lapses`` and reported to the
  caller, who logs it: a lease may lapse, never silently, and a running job is always counted again (the ledger may
  then be over its cap until enough jobs end; fetches are refused meanwhile).

:class:`Hold` names one hold; :class:`Ledger` is the holds one owner has (a process, a job) with the three operations
on them (acquire, refresh, release); :class:`Keeper` refreshes an owner's holds from a process of its own where no
heartbeat does (a LimitedCapacityWorker job), and :class:`WorkerKeeper` is the one long-lived such process of an
in-process worker, handed each job's holds in turn. The Lua side is ``lua/acquire_hold.lua``,
``lua/refresh_holds.lua`` and ``lua/lib/ledger_*.lua``, which the fetch script uses too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import marshal
import mmap
import os
import select
import signal
import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import keys
from .ops import Call

logger = logging.getLogger('rq_policies')

#: Seconds a hold survives unrefreshed by default. rq's worker beats every ``job_monitoring_interval`` (30 s by
#: default) while a job runs and gives its own key ``job_monitoring_interval + 60`` seconds; a hold outlives a missed
#: beat by exactly as much (pinned by a test). Shorter and a busy worker's holds evaporate under a slow Redis while
#: its jobs run; longer and a killed worker's capacity comes back later than the worker leaves the dashboard.
TTL_SECONDS = 90

#: Payloads published on ``rq:policies:wake:<queue>`` besides a pushed job's id (see ``lua/lib/save_job.lua``). A
#: waiting worker treats a push to a queue it found full as no news; these two always wake it: a hold was released,
#: or a ledger's capacity changed. A release publishes ``released <ledger> <token>`` (:func:`release_message`), so
#: that of the idle workers it wakes only the first to claim it (:func:`woken`) looks again: one freed hold, one look.
WAKE_RELEASED = 'released'
WAKE_CAPACITY = 'capacity'
#: A job of the queue was scheduled: ``scheduled <epoch s>`` (its due time, server clock). An idle PolicyWorker ends its
#: wait then (its fetch promotes the job), with no look before.
WAKE_SCHEDULED = 'scheduled'

#: Seconds the record that an idle worker answered a release lives (:func:`woken`): only a duplicate of the same
#: release, within moments, may find it.
WOKEN_SECONDS = 10


def release_message(hold: Hold) -> str:
    """The wake-up a release of ``hold`` publishes: :data:`WAKE_RELEASED`, the ledger and the hold's token."""
    return f'{WAKE_RELEASED} {hold.ledger} {hold.token}'


def wake_up(connection: Any, channel: str, message: str) -> Any:
    """Publish ``message`` on the wake-up ``channel`` (:func:`keys.wake`) for idle PolicyWorkers, on ``connection``
    or a pipeline of it: SPUBLISH, sharded pub/sub, as the scripts do (see :mod:`rq_policies.engine.wake` for why)."""
    return connection.spublish(channel, message)


def woken(connection: Any, message: str) -> bool:
    """Is this idle worker the first to answer the release ``message`` names? (One SET NX, expiring.)

    A bare :data:`WAKE_RELEASED` (a per-key unpark, a Fair resume) names no hold: every worker answers it.
    """
    _, _, what = message.partition(' ')
    if not what:
        return True
    return bool(connection.set(keys.woken(what), 1, nx=True, ex=WOKEN_SECONDS))


@dataclass(frozen=True)
class Hold:
    """One hold: the member ``token`` of the ledger key ``ledger``, living ``ttl`` seconds unless refreshed.

    ``job`` names the job it counts, for logs (not part of its identity); ``policy`` names the fetch policy whose
    ``release_hold`` gives it back, when that is more than a bare ZREM (a per-key hold unparks a job).
    """

    ledger: str
    token: str
    ttl: int
    job: str | None = field(default=None, compare=False)
    policy: str = field(default='', compare=False)


def acquire_call(hold: Hold, capacity: int) -> Call:
    """The ``lua/acquire_hold.lua`` call taking ``hold`` while ``ledger`` has fewer than ``capacity`` live holds.

    Run it on a connection (replies 1 when taken, 0 at capacity) or inside a pipeline, as a LimitedCapacityWorker job
    does in the MULTI that also takes it off the queued set.
    """
    call = Call('acquire_hold', capacity=capacity, token=hold.token, ttl=hold.ttl)
    return call.key('ledger', hold.ledger)


def refresh_call(holds: list[Hold]) -> Call:
    """The ``lua/refresh_holds.lua`` call refreshing ``holds`` (each by its own ttl); it replies with the 1-based
    positions of those found lapsed (re-added and counted)."""
    call = Call(
        'refresh_holds', tokens=[h.token for h in holds], ttls=[h.ttl for h in holds],
        fields=[keys.lapse_field(h.ledger) for h in holds],
    )
    call.key('lapses', keys.LAPSES)
    return call.key_list('holds', [h.ledger for h in holds])


def log_lapses(log: Any, lapsed: Iterable[Hold]) -> None:
    """Log each hold a refresh found lapsed under its running job (a WARNING naming ledger, job and holder)."""
    for hold in lapsed:
        log.warning(
            'rq-policies: hold on %s lapsed while job %s still runs (holder %s): re-added, so the ledger counts it '
            'again; a stall longer than the hold ttl (%s s) let another job take its place meanwhile',
            keys.lapse_field(hold.ledger), hold.job, hold.token, hold.ttl,
        )


def _is_pipeline(conn: Any) -> bool:
    return hasattr(conn, 'execute') and hasattr(conn, 'command_stack')


class Ledger:
    """The holds one owner has right now, and the operations on the ledgers they are in.

    Fork-aware: a forked child does not own its parent's holds (the parent refreshes and releases them), so a child
    finds the instance empty.
    """

    def __init__(self, holds: Iterable[Hold] = ()) -> None:
        self._lock = threading.Lock()
        self._holds: dict[str, Hold] = {h.token: h for h in holds}
        self._pid = os.getpid()

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._holds = {}
            self._pid = os.getpid()
            self._lock = threading.Lock()

    # -- what the owner has ---------------------------------------------------------------------------------------

    def add(self, hold: Hold) -> None:
        """Remember ``hold`` as this owner's (taken elsewhere, e.g. by the fetch script), so it is refreshed."""
        self._check_fork()
        with self._lock:
            self._holds[hold.token] = hold

    def discard(self, token: str) -> None:
        """Forget the hold named ``token`` (released, or lapsed); nothing is sent."""
        self._check_fork()
        with self._lock:
            self._holds.pop(token, None)

    def holds(self) -> list[Hold]:
        """The holds this owner has."""
        self._check_fork()
        with self._lock:
            return list(self._holds.values())

    def snapshot(self) -> dict[str, str]:
        """Which ledger each hold is in: token -> ledger key."""
        return {h.token: h.ledger for h in self.holds()}

    def __bool__(self) -> bool:
        return bool(self.holds())

    # -- the three operations -------------------------------------------------------------------------------------

    def acquire(self, connection: Any, hold: Hold, capacity: int) -> bool:
        """Take ``hold`` unless its ledger is at ``capacity``; a taken hold is this owner's until released.

        Replay-safe: a retried call whose first attempt landed finds its own member and answers True again.
        """
        taken = acquire_call(hold, capacity).run(connection) == 1
        if taken:
            self.add(hold)
        return taken

    def refresh(self, connection: Any, holds: list[Hold] | None = None, ttl: int | None = None) -> list[Hold]:
        """Refresh ``holds`` (default: every hold this owner has) in one call; a lapsed one is re-added and counted.

        Call it only while the holds' jobs run: the script writes back a hold it finds gone.
        ``ttl`` replaces each hold's own (a worker's ``hold_ttl``, as on its heartbeat).

        Returns:
            The holds found lapsed (and re-added): the caller logs them (:func:`log_lapses`).
        """
        holds = self.holds() if holds is None else holds
        if not holds:
            return []
        sent = holds if ttl is None else [Hold(h.ledger, h.token, ttl, h.job) for h in holds]
        positions = refresh_call(sent).run(connection)
        return [sent[int(i) - 1] for i in positions]

    def refresh_in(self, pipeline: Any, ttl: int | None = None) -> list[Hold]:
        """Queue a refresh of every hold this owner has onto a pipeline the caller already owns (a heartbeat's).

        ``ttl`` replaces each hold's own (a worker's ``hold_ttl``). It adds nothing to the pipeline when nothing is
        held, which is every process in an install that caps nothing.

        Returns:
            The holds sent, in the order the script's reply (the lapsed positions) refers to.
        """
        holds = self.holds()
        if not holds:
            return []
        if ttl is not None:
            holds = [Hold(h.ledger, h.token, ttl, h.job) for h in holds]
        refresh_call(holds).run(pipeline)
        return holds

    def release(self, connection: Any, hold: Hold, wake: str | None = None, answered: bool = False) -> bool:
        """Give back ``hold``. Idempotent: it only ever removes the hold's own member.

        A bare ZREM (plus, with ``wake``, a :func:`release_message` on that channel for idle workers) so it can ride a
        pipeline: pass a pipeline as ``connection`` and it goes out with it (the return value is then True: the answer
        arrives with ``execute()``). With ``answered`` (a caller that reads the answer, ``QueueSlot.release``), a call
        on a connection is one script, ``lua/release_hold.lua``, that keeps its answer a minute: a replay after a
        lost reply answers what the first attempt did (a bare ZREM's replay says False).

        Returns:
            True when the hold was still in its ledger.
        """
        if answered and not _is_pipeline(connection):
            from .compat import adopt_cluster

            call = Call('release_hold', token=hold.token, wake=wake,
                        message=release_message(hold) if wake is not None else '')
            removed = call.key('ledger', hold.ledger).answered().run(adopt_cluster(connection))
            self.discard(hold.token)
            return removed == 1
        if _is_pipeline(connection):
            connection.zrem(hold.ledger, hold.token)
            if wake is not None:
                wake_up(connection, wake, release_message(hold))
            self.discard(hold.token)
            return True
        from .compat import adopt_cluster

        # a RedisCluster is adopted (compat.adopt_cluster) as at every door; SPUBLISH is routed by its channel
        with adopt_cluster(connection).pipeline(transaction=False) as pipe:
            pipe.zrem(hold.ledger, hold.token)
            if wake is not None:
                wake_up(pipe, wake, release_message(hold))
            removed = pipe.execute()[0]
        self.discard(hold.token)
        return removed == 1


#: The holds this process has taken through QueueSlot or a fetch: a PolicyWorker's heartbeat refreshes them.
#: (``QueueSlot.HELD`` is a deprecated alias of it.)
PROCESS = Ledger()


class Keeper:
    """Refreshes an owner's holds where no heartbeat does, from a small process of its own.

    One keeper per owner, started and stopped around what it keeps: a LimitedCapacityWorker job keeps its one hold
    while ``perform_work`` runs; a PolicySimpleWorker on a fakeredis connection keeps the process's holds from a
    thread while a job runs; ``active`` limits the refreshes to when a condition holds. (A PolicySimpleWorker on a
    real server keeps one :class:`WorkerKeeper` for its life instead, and a forking PolicyWorker's orphaned work
    horse is kept by the worker's one long-lived hold guard, which finds the horse in memory they share: see
    ``rq_policies.engine.worker``.)

    The keeper is a forked child, not a thread: a job stuck in C code that holds the GIL (a catastrophic regex, a
    long ``numpy`` call without releasing it) would starve a thread, and the hold would lapse under a job that still
    runs. The child has its own interpreter lock and its own connection; it refreshes the holds the ledger had at
    :meth:`start` and dies with its parent: it watches a pipe whose other end only the parent holds (end of file once
    the parent exits, even by SIGKILL), and its parent pid. It ignores SIGINT and SIGTERM (its parent decides when the
    job ends) and shares its parent's process group, so rq's ``killpg`` of a work horse kills it too. A connection
    that is not a real socket (fakeredis, in users' unit tests) keeps a thread, which has no other process to reach.

    Call :meth:`stop` before releasing the holds: it waits for the child, so no refresh can write a hold back after
    its release.

    Args:
        connection: the Redis connection (the child opens its own with the same settings).
        ledger: the owner's holds; the refresh runs over what it has at :meth:`start`.
        every: seconds between refreshes (a third of the ttl leaves room for two missed ones).
        ttl: the lifetime each refresh gives (default: each hold's own).
        tick: seconds between looks at ``active`` (default: ``every``).
        active: refresh only while this returns True (default: always); it runs in the keeper's process.
        until_empty: stop once the ledger has no hold left (thread mode; a process keeper's holds are fixed).
        log: where a failed refresh and a lapsed hold are reported.
        name: the keeper's name (the thread's, or the process title's in logs).
        process: keep from a child process (default: unless the connection is fakeredis).
    """

    def __init__(
        self,
        connection: Any,
        ledger: Ledger,
        every: float,
        *,
        ttl: int | None = None,
        tick: float | None = None,
        active: Callable[[], bool] | None = None,
        until_empty: bool = False,
        log: Any = logger,
        name: str = 'rq-policies-holds',
        process: bool | None = None,
    ) -> None:
        self.connection = connection
        self.ledger = ledger
        self.every = every
        self.ttl = ttl
        self.tick = every if tick is None else tick
        self.active = active
        self.until_empty = until_empty
        self.log = log
        self.name = name
        self.process = forkable(connection) if process is None else process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._pid = 0
        self._pipe = -1

    def start(self) -> Keeper:
        if not self.process:
            self._thread.start()
            return self
        holds = self.ledger.holds()
        self._pid, self._pipe = fork_child(lambda read_end: self._child(read_end, holds))
        return self

    def alive(self) -> bool:
        """Is the keeper still running (its thread, or its process)?"""
        if not self.process:
            return self._thread.is_alive()
        if not self._pid:
            return False
        if exited(self._pid):
            self._pid = 0
            return False
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Stop refreshing and wait for the keeper (the holds stay: releasing them is the owner's call)."""
        self._stop.set()
        if not self.process:
            if self._thread.is_alive():
                self._thread.join(timeout=timeout)
            return
        if self._pipe >= 0:
            os.close(self._pipe)  # end of file in the child: it exits
            self._pipe = -1
        deadline = time.monotonic() + timeout
        pause = 0.0002  # the child exits within a fraction of a millisecond unless it is mid-refresh: poll fast first
        while self.alive():
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGKILL)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def _child(self, pipe: int, holds: list[Hold]) -> None:
        ignore_stop_signals()
        parent = os.getppid()
        connection = self.connection  # redis-py's pool notices the fork and opens sockets of its own here
        own = Ledger(holds)
        last: float | None = None
        while True:
            ready, _, _ = select.select([pipe], [], [], self.tick)
            if ready or os.getppid() != parent:
                return  # the parent stopped us, or died
            if self.active is not None and not self.active():
                continue
            if last is not None and time.monotonic() - last < self.every:
                continue
            last = self._refresh(connection, own, last)

    def _run(self) -> None:
        last: float | None = None
        while not self._stop.wait(self.tick):
            if self.active is not None and not self.active():
                continue
            if last is not None and time.monotonic() - last < self.every:
                continue
            last = self._refresh(self.connection, self.ledger, last)
            if self.until_empty and not self.ledger:
                return

    def _refresh(self, connection: Any, held: Ledger, last: float | None = None) -> float | None:
        """One refresh; returns when it happened (or ``last`` when it failed: retried on the next tick)."""
        try:
            lapsed = held.refresh(connection, ttl=self.ttl)
        except Exception:  # retried on the next tick; the ttl covers two missed refreshes
            self.log.warning('rq-policies: could not refresh holds', exc_info=True)
            return last
        log_lapses(self.log, lapsed)
        return time.monotonic()



class ForkedHelper:
    """A small process its owner forks once and keeps (a :class:`WorkerKeeper`, a forking worker's hold guard,
    :class:`rq_policies.engine.guard.HorseGuard`): its pid, the write end of the pipe it watches for its owner's exit,
    and the one check that it still runs. Each hands its helper what it needs through shared memory, not messages."""

    #: What the log line that reports the helper's death calls it.
    helper_name = 'helper'
    log: Any = logger
    _pid = 0
    _write = -1

    def _running(self) -> bool:
        """Does the helper run? One WNOHANG wait; a helper found dead is reported and forgotten (the caller then
        forks another)."""
        if not self._pid:
            return False
        if not exited(self._pid):
            return True
        self.log.warning('rq-policies: the %s (pid %s) died; starting another', self.helper_name, self._pid)
        self._close()
        return False

    def _reaped(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the helper to exit (polled fast first: a helper told to stop exits within a
        fraction of a millisecond unless it is mid-refresh); True once it has exited and been reaped."""
        deadline = time.monotonic() + seconds
        pause = 0.0002
        while not exited(self._pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        return True

    def _close(self) -> None:
        if self._write >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write)
        self._write, self._pid = -1, 0


def exited(pid: int) -> bool:
    """Has the child ``pid`` exited (reaped by this one WNOHANG wait, or before)?"""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


def ignore_stop_signals() -> None:
    """In a helper process: SIGINT and SIGTERM are its owner's to act on (the owner decides when a job ends)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


#: The head of a :class:`WorkerKeeper`'s handoff, three native 8-byte words: the number of the job armed now (0: none),
#: when it was armed (``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process of the host) and the
#: length of the holds that follow the head (marshalled tuples).
_KEEPER_HEAD = struct.Struct('=3Q')
_KEEPER_HANDOFF_BYTES = 64 * 1024
#: Seconds the worker waits for a refresh in flight before it kills its keeper (WorkerKeeper.disarm, .stop).
_KEEPER_WAIT_SECONDS = 5.0


class WorkerKeeper(ForkedHelper):
    """One long-lived process per in-process worker (PolicySimpleWorker) that refreshes the holds of the job it runs.

    A :class:`Keeper` forked for every job cost a capped in-process worker four fifths of its throughput (a fork, a
    new connection and a wait for the child's exit, per job). This keeper is forked once, at the worker's first
    capped job (again only if it died), and does nothing per job: what it needs sits in its handoff, a small region
    of memory it shares with the worker (a shared mapping made before its fork). :meth:`arm` writes the job's holds
    there when the job starts and :meth:`disarm` clears them when it ends: plain stores into memory under a lock, no
    message and no wake-up of the keeper. The keeper looks at the handoff every ``tick`` seconds and refreshes the
    armed holds ``every`` seconds after the job was armed, and every ``every`` seconds after that, for as long as the
    job runs.

    The lock (a POSIX record lock, ``lockf``, on the handoff's file) orders a refresh and a release: the keeper holds it
    from reading the handoff until the refresh's reply, and :meth:`disarm` takes it to clear the handoff, so once disarm
    returns no refresh of the ended job is in flight or can start, and the worker's release that follows cannot be
    undone by a refresh writing the hold back (``lua/refresh_holds.lua`` re-adds a hold it finds gone: it must only
    ever run for a job that still runs). The kernel drops a record lock when its holder dies, so neither side can
    leave the other waiting on a dead process; a refresh stuck longer than :data:`_KEEPER_WAIT_SECONDS` (a server
    that stopped answering) gets the keeper killed, and another is started at the next capped job.

    A process, not a thread: a job holding the GIL (a catastrophic regex, a long C call) would starve a thread. It
    ignores SIGINT and SIGTERM (its worker decides when a job ends), shares the worker's process group (a kill of
    the group kills it too), and exits as soon as its worker does: it watches a pipe only the worker holds the other
    end of (end of file when the worker exits, even by SIGKILL), a pidfd of the worker where the OS has them (the
    pipe's end may live on in a process the job forked), and its parent pid. A SIGKILLed worker's holds are then no
    longer refreshed and age out within ``hold_ttl``. :meth:`stop` (the worker's teardown) ends it at once.

    Args:
        connection: the worker's Redis connection (the keeper opens its own with the same settings).
        every: seconds between refreshes of a running job's holds (a third of their ttl leaves room for two missed).
        ttl: the lifetime each refresh gives (the worker's ``hold_ttl``).
        tick: seconds between the keeper's looks at the handoff and at its worker (default: ``min(1, every)``).
        log: where a failed refresh, a lapsed hold and a dead keeper are reported.
    """

    helper_name = 'hold keeper'

    def __init__(self, connection: Any, every: float, ttl: int, *, tick: float | None = None,
                 log: Any = logger) -> None:
        self.connection = connection
        self.every = every
        self.ttl = ttl
        self.tick = min(1.0, every) if tick is None else tick
        self.log = log
        self._owner = os.getpid()
        self._fd = -1
        self._handoff: mmap.mmap | None = None
        self._number = 0

    @property
    def pid(self) -> int:
        """The keeper's pid (0 when none runs)."""
        return self._pid

    def arm(self, holds: list[Hold]) -> bool:
        """In the worker, as a job starts: have its ``holds`` refreshed until :meth:`disarm` (starts the keeper the
        first time). Returns False, with a warning, for holds too many for the handoff (then not refreshed)."""
        if os.getpid() != self._owner or not holds:
            return False
        # marshal, not pickle: a tenth of the time for these plain tuples (about 1 us), and nothing but data
        data = marshal.dumps([(h.ledger, h.token, h.ttl, h.job, h.policy) for h in holds])
        if _KEEPER_HEAD.size + len(data) > _KEEPER_HANDOFF_BYTES:
            self.log.warning('rq-policies: %s holds are too many for the hold keeper (%s bytes); they are not '
                             'refreshed while this job runs', len(holds), len(data))
            return False
        self._ensure()
        if not self._lock(_KEEPER_WAIT_SECONDS):  # the previous job's last refresh is stuck: a keeper of its own
            self.log.warning('rq-policies: the hold keeper (pid %s) did not finish a refresh within %s s; starting '
                             'another', self._pid, _KEEPER_WAIT_SECONDS)
            self._kill()
            self._ensure()
            self._lock()  # a new keeper's handoff is empty: it takes the lock for no refresh
        handoff = self._handoff
        assert handoff is not None
        self._number += 1
        try:
            handoff[_KEEPER_HEAD.size:_KEEPER_HEAD.size + len(data)] = data
            _KEEPER_HEAD.pack_into(handoff, 0, self._number, time.monotonic_ns(), len(data))
        finally:
            self._unlock()
        return True

    def disarm(self) -> None:
        """In the worker, as the job ends and before any of its holds is released: once this returns, no refresh of
        them is in flight and none will start."""
        if os.getpid() != self._owner or self._handoff is None:
            return
        if not self._lock(_KEEPER_WAIT_SECONDS):
            self.log.warning('rq-policies: the hold keeper (pid %s) did not finish a refresh within %s s; killing it',
                             self._pid, _KEEPER_WAIT_SECONDS)
            self._kill()
            return
        try:
            struct.pack_into('=Q', self._handoff, 0, 0)
        finally:
            self._unlock()

    def stop(self) -> None:
        """In the worker, leaving: the keeper exits (after a refresh in flight, if any) and is reaped."""
        if os.getpid() != self._owner or not self._pid:
            return
        if self._write >= 0:
            os.close(self._write)  # end of file in the keeper: it exits
            self._write = -1
        if not self._reaped(_KEEPER_WAIT_SECONDS):
            self._kill()
            return
        self._close()

    def _ensure(self) -> None:
        """Start the keeper unless it runs (checked with one WNOHANG wait)."""
        if self._running():
            return
        fd = _shared_file(_KEEPER_HANDOFF_BYTES)
        self._fd, self._handoff = fd, mmap.mmap(fd, _KEEPER_HANDOFF_BYTES)
        worker = os.getpid()
        self._pid, self._write = fork_child(lambda read_end: self._run(read_end, worker))

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self._pid, 0)
        self._close()

    def _close(self) -> None:
        super()._close()
        if self._handoff is not None:
            self._handoff.close()
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._handoff = -1, None

    def _lock(self, timeout: float | None = None) -> bool:
        """Take the handoff's lock (a record lock: the keeper and the worker are different processes); with a
        ``timeout``, give up after that many seconds and answer False."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if timeout is None:
                fcntl.lockf(self._fd, fcntl.LOCK_EX)
                return True
        deadline = time.monotonic() + timeout
        pause = 0.0002
        while time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                continue
        return False

    def _unlock(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)

    # -- in the keeper's process ----------------------------------------------------------------------------------

    def _run(self, pipe: int, worker: int) -> None:
        ignore_stop_signals()
        watched = [pipe]
        if hasattr(os, 'pidfd_open'):
            with contextlib.suppress(OSError):
                watched.append(os.pidfd_open(worker))  # readable once the worker has exited
        handoff = self._handoff
        assert handoff is not None
        last_job, last_at = 0, 0.0  # the job last refreshed and when (monotonic seconds)
        failed = False
        timeout = self.tick
        while True:
            if select.select(watched, [], [], timeout)[0] or os.getppid() != worker:
                return  # the worker stopped us (end of file), or died
            timeout = self.tick
            number, armed_ns, _ = _KEEPER_HEAD.unpack_from(handoff, 0)  # a hint; read again under the lock
            if not number:
                continue
            since = last_at if last_job == number else armed_ns / 1e9
            due = since + (self.tick if failed and last_job == number else self.every)
            now = time.monotonic()
            if now < due:
                timeout = min(self.tick, due - now)
                continue
            found, lapsed, error = self._refresh_armed(handoff, number)
            if not found:
                continue  # that job ended (or another began) meanwhile
            if error is not None:
                self.log.warning('rq-policies: could not refresh holds', exc_info=error)
                failed, last_job, last_at = True, number, since  # retried a tick from now
                continue
            failed, last_job, last_at = False, number, now
            log_lapses(self.log, lapsed)

    def _refresh_armed(self, handoff: mmap.mmap, number: int) -> tuple[bool, list[Hold], BaseException | None]:
        """Under the lock: refresh the holds armed now if they are still job ``number``'s. Returns (whether they
        were, the holds found lapsed, the error of a failed refresh)."""
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            armed, _, length = _KEEPER_HEAD.unpack_from(handoff, 0)
            if armed != number:
                return False, [], None
            holds = [Hold(*fields) for fields in marshal.loads(handoff[_KEEPER_HEAD.size:_KEEPER_HEAD.size + length])]
            try:
                return True, Ledger(holds).refresh(self.connection, ttl=self.ttl), None
            except Exception as exc:  # retried on the next tick; the ttl covers two missed refreshes
                return True, [], exc
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)


def _shared_file(size: int) -> int:
    """A file of ``size`` bytes that only this process and its children can reach: a memfd where the OS has them,
    else an unlinked temporary file. Returns its descriptor (not inherited across exec)."""
    if hasattr(os, 'memfd_create'):
        fd = os.memfd_create('rq-policies-keeper', os.MFD_CLOEXEC)
    else:
        import tempfile

        with tempfile.TemporaryFile() as handle:
            fd = os.dup(handle.fileno())
    os.ftruncate(fd, size)
    return fd


def fork_child(run: Callable[[int], object]) -> tuple[int, int]:
    """Fork a small process that runs ``run(read_end)`` (the read end of a new pipe from the parent) and exits, with
    status 0 when ``run`` returns and 1 when it raises; nothing of the parent's code runs in it after that. Returns
    ``(pid, write end)`` in the parent. Used by the :class:`Keeper` and by the worker's hold guard.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a threaded process: the child runs only its loop (redis-py's pool and
        # logging reinitialize their locks at fork) and never returns into the parent's code.
        warnings.simplefilter('ignore', DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(write_end)
            run(read_end)
        except BaseException:  # noqa: BLE001 - nothing of the parent's may run in this process
            code = 1
        finally:
            os._exit(code)
    os.close(read_end)
    return pid, write_end


def forkable(connection: Any) -> bool:
    """Can a forked keeper reach the same server? Not for fakeredis, whose server lives in this process."""
    return not type(connection).__module__.startswith('fakeredis') and hasattr(connection, 'connection_pool')


# -- tokens -----------------------------------------------------------------------------------------------------------

_local = threading.local()


def token() -> str:
    """This thread's hold token, ``<host>:<pid>:<tid>``; rebuilt after a fork, so a child never shares it."""
    pid = os.getpid()
    memo = getattr(_local, 'token', None)
    if memo is not None and memo[0] == pid:
        return memo[1]
    built = f'{socket.gethostname()}:{pid}:{threading.get_ident()}'
    _local.token = (pid, built)
    _local.seq = 0
    return built


def claim_token() -> str:
    """A token naming one claim, ``<host>:<pid>:<tid>:<n>``: a stale release of an earlier claim frees nothing."""
    base = token()
    _local.seq = getattr(_local, 'seq', 0) + 1
    return f'{base}:{_local.seq}'
