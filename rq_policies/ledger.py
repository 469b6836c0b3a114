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
on them (acquire, refresh, release); :class:`Keeper` refreshes an owner's holds from a thread where no heartbeat
does. The Lua side is ``lua/acquire_hold.lua``, ``lua/refresh_holds.lua`` and ``lua/lib/ledger_*.lua``, which the fetch
script uses too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
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


def woken(connection: Any, message: str) -> bool:
    """Is this idle worker the first to answer the release ``message`` names? (One SET NX, expiring.)

    A bare :data:`WAKE_RELEASED` (published by an older release) names no hold: every worker answers it.
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

    def release(self, connection: Any, hold: Hold, wake: str | None = None) -> bool:
        """Give back ``hold``. Idempotent: it only ever removes the hold's own member.

        A bare ZREM (plus, with ``wake``, a :func:`release_message` on that channel for idle workers) so it can ride a
        pipeline: pass a pipeline as ``connection`` and it goes out with it (the return value is then True: the answer
        arrives with ``execute()``).

        Returns:
            True when the hold was still in its ledger.
        """
        if _is_pipeline(connection):
            connection.zrem(hold.ledger, hold.token)
            if wake is not None:
                connection.publish(wake, release_message(hold))
            self.discard(hold.token)
            return True
        with connection.pipeline(transaction=False) as pipe:
            pipe.zrem(hold.ledger, hold.token)
            if wake is not None:
                pipe.publish(wake, release_message(hold))
            removed = pipe.execute()[0]
        self.discard(hold.token)
        return removed == 1


#: The holds this process has taken through QueueSlot or a fetch (``QueueSlot.HELD``): a PolicyWorker's heartbeat
#: refreshes them.
PROCESS = Ledger()


class Keeper:
    """Refreshes an owner's holds where no heartbeat does, from a small process of its own.

    The one keeper for every such place, parametrized where they differ: a LimitedCapacityWorker job keeps its one
    hold while ``perform_work`` runs; a PolicySimpleWorker keeps the process's holds while a job runs (it sends no
    heartbeat then); ``active`` limits the refreshes to when a condition holds. (A forking PolicyWorker's orphaned
    work horse is kept by the worker's one long-lived hold guard instead, which finds the horse in memory they
    share: see ``rq_policies.worker``.)

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
        try:
            done, _ = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:
            done = self._pid
        if done:
            self._pid = 0
        return not done

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
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
