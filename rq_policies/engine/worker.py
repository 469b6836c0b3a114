"""PolicyWorker and PolicySimpleWorker: rq's workers, fetching through the policies.

Run ``rq worker -w rq_policies.PolicyWorker QUEUES`` (no other flag needed; ``rq worker-pool -w`` works too). Compared
with stock rq:

* the fetch is one script (``lua/fetch.lua``, see :mod:`rq_policies.engine.fetch`) that pops the job, runs every
  policy's
  fetch hooks (a loner's marker is cleared; on a capped queue a hold is taken) and skips a queue a fetch policy
  gates (a full one), serving the others in rq's order;
* the popped id always goes through the queue's intermediate list, so a worker that dies between the pop and the
  start leaves the job where rq's maintenance recovers it, for multi-queue workers too (stock rq only does this for
  single-queue workers);
* a hold is released on every exit path of the job, anchored in ``execute_job`` (the parent's side, which every path
  passes): once the job has ended, the release rides the heartbeat the work loop sends next, or goes out at once
  when the execution raised (cold shutdown);
* holds are refreshed by a script appended to the heartbeat pipeline rq sends every ``job_monitoring_interval``
  while a job runs, and live ``hold_ttl`` seconds unrefreshed, so a SIGKILLed worker's holds age out by themselves
  (a PolicySimpleWorker, which sends no heartbeat while its job runs, has one long-lived keeper process refresh
  them instead: :class:`~rq_policies.engine.ledger.WorkerKeeper`); a forking worker's hold guard also keeps what its
  running work horse holds (its holds, an ``until='finished'`` identity) for as long as the horse lives,
  whatever becomes of the worker (killed alone or with its process group, SIGSTOPped): ``docs/reliability.md``,
  "Kill shapes";
* an idle worker waits on pub/sub (woken by pushes, releases and cap changes; of the idle workers a release wakes,
  only the first to claim it looks again), probes the queues it did not find full once a second and looks again
  at full ones every ``hold_ttl / 3`` seconds (1 to 10), instead of blocking on BLMOVE/BLPOP, which would pop
  without the checks;
* the fetch promotes the due jobs of its queues' scheduled registries (``enqueue_at``/``enqueue_in``, the time-based
  policies' pending jobs, retries with intervals, stock rq's scheduled jobs) by the server's clock, and an idle
  worker wakes for the earliest due time: ``--with-scheduler`` is not needed (running it is safe: each job is
  promoted once, see :mod:`rq_policies.engine.fetch` and lua/lib/promote.lua);
* a Redis outage or restart does not end the worker where rq's work loop would quit: it waits for the server,
  retrying every ``max_connection_wait_time`` (0.5 s).
"""


from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rq.worker import SimpleWorker, Worker

from . import compat, ledger
from .fetch import Claim
from .guard import HorseGuard, keep_call
from .ledger import Keeper
from .wake import WakeFetcher
from .worker_mixin import HOLD_TTL_ENV, HOLD_TTL_MARGIN, UNREACHABLE, PolicyWorkerMixin, policy_queue_class

__all__ = ['HOLD_TTL_ENV', 'HOLD_TTL_MARGIN', 'PolicySimpleWorker', 'PolicyWorker', 'PolicyWorkerMixin', 'keep_call',
           'policy_queue_class']

# The names these lived under before the split into wake.py, guard.py and worker_mixin.py (tests and benches import
# them from here).
_WorkerFetcher = WakeFetcher
_HorseGuard = HorseGuard
_UNREACHABLE = UNREACHABLE


def _resolve_driver_info_once(connection: Any) -> None:
    """:func:`rq_policies.engine.compat.resolve_driver_info_once` (its name before the split)."""
    compat.resolve_driver_info_once(connection)


class PolicyWorker(PolicyWorkerMixin, Worker):
    """rq's forking Worker, fetching through the policies: ``rq worker -w rq_policies.PolicyWorker``.

    rq runs the work horse in a process group of its own, so a worker SIGKILLed alone (``kill -9`` of its pid, an
    OOM kill of the parent) or with its process group (``kill -9 -PGID``, supervisord's ``killasgroup``) leaves its
    horse running the job to the end, and a worker SIGSTOPped alone stops beating while its horse runs on. What the
    job holds (a cap's or a key's hold, an ``until='finished'`` identity) is therefore kept by the worker's
    hold guard (one small process per worker, in a process group of its own, :class:`HorseGuard`) for as long as
    the horse lives: every ``hold_ttl / 3`` seconds once a job has run that long, at once when the worker is gone,
    and released when the horse has ended. The cap counts the job for as long as it actually runs (bounded by the
    job's timeout, which the horse enforces itself). ``docs/reliability.md`` has every kill shape and its bound.

    At bootstrap it resolves redis-py's driver info once, on its connection pool (see
    :func:`rq_policies.engine.compat.resolve_driver_info_once`): a work horse that opens a new connection would
    otherwise have redis-py 7 and later read their own package metadata for it. Each horse adopts one connection the
    worker keeps for its horses (:func:`rq_policies.engine.compat.horse_connection`), instead of opening one per job,
    where the connection is redis-py's plain TCP or Unix socket in its own ConnectionPool.
    """

    #: How often the hold guard looks at its worker and at the running horse (seconds; no Redis command).
    orphan_check_seconds: float = 1.0

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        compat.resolve_driver_info_once(self.connection)  # type: ignore[attr-defined]

    _guard: HorseGuard | None = None
    _guarded: Claim | None = None  # the claim of the job whose horse runs now, armed in the guard's handoff
    _announce = False  # the horse forked now writes its pid to the guard's handoff
    _horse_conn: Any = None  # the connection each horse adopts in turn (compat.horse_connection), or None
    _horse_exit: int | None = None  # the last horse's wait status, as wait_for_horse reaped it (None: not seen)

    #: A stop-job command that came while the job was started but its horse not yet forked (:meth:`kill_horse`): the
    #: id of the job it stops, acted on right after the fork. Guarded by ``_stop_lock`` against the command thread.
    _stop_pending: str | None = None
    _stop_lock = threading.Lock()

    def kill_horse(self, sig: signal.Signals = signal.SIGKILL) -> None:
        # rq's kill_horse is os.killpg(os.getpgid(self.horse_pid), sig), and the horse moves to a group of its own
        # (os.setpgrp) only once it runs, after the fork. A stop-job command handled between the job's start (from
        # which rq accepts the stop) and that moment SIGKILLed the worker's own process group: with no horse yet
        # (horse_pid 0: getpgid(0) is the caller's group), or a horse forked but not yet in its group. The worker
        # died and its job stayed started until its key's ttl. Seen with the cancel-in-progress mode, whose admissions
        # stop jobs as they start (tests/loner/test_loner_cancel.py's random bursts). Here a stop before the fork
        # waits for it, and a horse still in the worker's group is killed alone (it runs no job code yet).
        with self._stop_lock:
            pid = self.horse_pid  # type: ignore[attr-defined]
            if not pid:
                self._stop_pending = getattr(self, '_stopped_job_id', None)
                return
        try:
            if os.getpgid(pid) == os.getpgrp():  # a group only ever changes from the worker's to the horse's own
                os.kill(pid, sig)
                return
        except ProcessLookupError:
            return
        super().kill_horse(sig)  # type: ignore[misc]

    def execute_job(self, job: Any, queue: Any) -> Any:
        with self._stop_lock:
            self._stop_pending = None  # a stop left from before this job names another job
        return self._execute_job_guarded(job, queue)

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        self._fork_work_horse(job, queue)
        with self._stop_lock:  # in the worker (the horse never returns from the fork)
            pending, self._stop_pending = self._stop_pending, None
        if pending is not None and pending == job.id:
            self.kill_horse()

    def _fork_work_horse(self, job: Any, queue: Any) -> None:
        self._announce = False
        self._pass_horse_connection()
        if ledger.forkable(self.connection):  # type: ignore[attr-defined]
            if self._guard is None:
                interval = int(self.job_monitoring_interval)  # type: ignore[attr-defined]
                # A keep every third of the shorter of the hold ttl and rq's ttl of the worker's key while a job
                # runs: a horse's liveness key is written before a dead worker's key could expire.
                self._guard = HorseGuard(self.connection, self.hold_ttl, self.orphan_check_seconds,  # type: ignore[arg-type, attr-defined]
                                          self.log, job_prefix=job.redis_job_namespace_prefix,  # type: ignore[attr-defined]
                                          every=min(self.hold_ttl, interval + 60) / 3)  # type: ignore[type-var]
            self._guard.ensure()
            claim = self._running_claim
            if claim is None or claim.job_id != job.id:
                claim = Claim(job.id, queue.name)  # no hold: an until='finished' identity may still need it
            if self._guard.arm(claim):
                self._guarded, self._announce = claim, True
        super().fork_work_horse(job, queue)  # the horse never returns from it

    def _pass_horse_connection(self) -> None:
        """Before a fork: keep the horses' connection when the last horse left it clean (exited normally, nothing
        unread on it), else close it and make a new one (compat.horse_connection: about 100 us of the server's CPU
        a job saved, a connect and redis-py's handshake)."""
        made, status, self._horse_exit = self._horse_conn, self._horse_exit, None
        if made is not None:
            normal = status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            if normal and compat.horse_connection_clean(made):
                return
            made.disconnect()
        self._horse_conn = compat.horse_connection(self.connection)  # type: ignore[attr-defined]

    def wait_for_horse(self) -> Any:
        pid, status, rusage = super().wait_for_horse()  # type: ignore[misc]
        if pid:
            self._horse_exit = status
        return pid, status, rusage

    def main_work_horse(self, job: Any, queue: Any) -> None:
        made, self._horse_conn = self._horse_conn, None
        if made is not None:
            compat.adopt_horse_connection(self.connection, made)  # type: ignore[attr-defined]
        if self._guard is not None:
            if self._announce:
                self._guard.announce()
            else:
                self._guard.detach()
        super().main_work_horse(job, queue)  # ends in os._exit

    def _execute_job_guarded(self, job: Any, queue: Any) -> Any:
        try:
            return self._execute_job_once(job, queue)
        except UNREACHABLE as exc:
            if not self._job_process_ended():
                raise  # the horse runs on: the worker quits, and its hold guard keeps the job's holds
            # The job's process has ended and only the worker's own bookkeeping after it (rq's set_state) met an
            # unreachable Redis: rq's work loop would quit on it, leaving the queues unserved until someone restarts
            # the worker. Carry on: the next fetch reconnects (retrying every second), the job's hold release is
            # pending and rides the first heartbeat after it.
            self.log.warning('rq-policies: Redis unreachable after job %s ended (%s); the worker carries on and '
                             'reconnects', job.id, exc)
            return None

    def _execute_job_once(self, job: Any, queue: Any) -> Any:
        try:
            return super().execute_job(job, queue)
        finally:
            guarded, self._guarded = self._guarded, None
            if guarded is not None and self._guard is not None and self._job_process_ended():
                self._guard.ended()
            elif guarded is not None:
                self._guarded = guarded  # the horse runs on (the worker is quitting): the guard keeps its hold

    def maintain_heartbeats(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().maintain_heartbeats(*args, **kwargs)  # type: ignore[misc]
        except _UNREACHABLE as exc:
            # rq's monitor would end the worker here and leave its horse running in a process group of its own:
            # the worker keeps watching its horse instead, and beats again at the next tick (the hold guard keeps
            # the job's hold meanwhile), so the job's end is recorded once the server answers.
            self.log.warning(  # type: ignore[attr-defined]
                'rq-policies: heartbeat during a job failed, Redis unreachable (%s); still watching the work horse', exc
            )
        if self._guard is not None and self._guarded is not None:
            self._guard.ensure()  # a guard killed mid-job is replaced now; the new one finds the horse in the handoff

    def set_current_job_working_time(self, *args: Any, **kwargs: Any) -> None:
        # rq 2.x's monitor writes the job's working time on the worker's hash every tick, before the heartbeat:
        # the same outage, the same answer as in maintain_heartbeats (rq 3.x no longer calls it).
        try:
            super().set_current_job_working_time(*args, **kwargs)  # type: ignore[misc]
        except _UNREACHABLE as exc:
            self.log.warning(  # type: ignore[attr-defined]
                'rq-policies: recording the working time failed, Redis unreachable (%s); still watching the work horse',
                exc,
            )

    def _job_process_ended(self) -> bool:
        """Has the work horse ended (reaped here, or by rq's cold shutdown, which waits for the horse it killed)?"""
        pid = self.horse_pid
        if not pid:
            return True
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # already reaped
            return True
        return done != 0

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            made, self._horse_conn = self._horse_conn, None
            if made is not None:
                made.disconnect()
            if self._guard is not None:
                self._guard.stop(job_running=self._guarded is not None)


class PolicySimpleWorker(PolicyWorkerMixin, SimpleWorker):
    """rq's SimpleWorker (no fork), fetching through the policies.

    A SimpleWorker sends no heartbeat while a job runs, so a hold would lapse under a long job. The worker's one keeper
    (:class:`~rq_policies.engine.ledger.WorkerKeeper`, a small process forked at the first capped job and kept for the
    worker's life) refreshes the running job's holds every ``hold_ttl / 3`` seconds while it runs: a process of its own,
    so a job that holds the GIL for long (a C call) cannot starve it; it exits with the worker (even a SIGKILLed one),
    so a killed worker's holds still age out within ``hold_ttl``. A job's holds are handed to it through shared memory
    when the job starts and taken back when it ends, before their release: a capped job costs what an uncapped one does,
    bar a few microseconds. That is also why any positive ``hold_ttl`` is accepted here.
    """

    _keeper: ledger.WorkerKeeper | None = None
    _refresh_on_heartbeat = False  # the fetch took the holds a moment ago with a full ttl; the keeper refreshes them
    _bookkeeping_on_end = True  # the job ran in this process: the end of run's transaction carries the worker's too

    def _check_hold_ttl(self, ttl: int, interval: int) -> None:
        return None

    #: What refreshes the running job's holds: None (nothing to refresh), 'thread' (fakeredis), 'process' (the
    #: worker's keeper) or 'none' (no keeper could start).
    _kept_by: str | None = None

    def _holds_quiet(self) -> bool:
        # The end of run's transaction may release the holds once the keeper has let them go (its disarm waits for a
        # refresh in flight and stops the next): the same step _keeping takes after the job, taken a moment sooner.
        if self._kept_by == 'process' and self._keeper is not None:
            self._keeper.disarm()
            return True
        return self._kept_by in (None, 'none')

    @contextlib.contextmanager
    def _keeping(self) -> Iterator[None]:
        holds = ledger.PROCESS.holds()
        self._kept_by = None
        if not holds:
            yield
            return
        if not ledger.forkable(self.connection):  # type: ignore[attr-defined]
            # fakeredis (users' unit tests): its server lives in this process, which a thread reaches.
            keeper = Keeper(
                self.connection, ledger.PROCESS, self.hold_ttl / 3, ttl=self.hold_ttl, log=self.log,  # type: ignore[operator, attr-defined]
            ).start()
            self._kept_by = 'thread'
            try:
                yield
            finally:
                keeper.stop()  # before any release: no refresh may write a released hold back
                self._kept_by = None
            return
        if self._keeper is None:
            self._keeper = ledger.WorkerKeeper(
                self.connection, self.hold_ttl / 3, self.hold_ttl, log=self.log,  # type: ignore[operator, arg-type, attr-defined]
            )
        try:
            armed = self._keeper.arm(holds)
        except OSError:  # no fork (EAGAIN, ENOMEM): the job still runs; its holds age out if it outlives hold_ttl
            self.log.warning('rq-policies: could not start the hold keeper; the holds of job %s are not refreshed '  # type: ignore[attr-defined]
                             'while it runs', holds[0].job, exc_info=True)
            armed = False
        self._kept_by = 'process' if armed else 'none'
        try:
            yield
        finally:
            if armed:
                self._keeper.disarm()  # before any release: no refresh may write a released hold back
            self._kept_by = None

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if self._keeper is not None:
                self._keeper.stop()
