"""A forking PolicyWorker's hold guard: the process that keeps what a running work horse holds, whatever becomes of
its worker (:class:`HorseGuard`), and the ``lua/keep_horse.lua`` call it sends (:func:`keep_call`).

The worker hands each job's claim to the guard through its *handoff*, a small region of shared memory (no message,
no system call per job); see :class:`HorseGuard` and docs/reliability.md, "Kill shapes".
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import pickle
import select
import struct
import time
from typing import Any

from rq.job import Job

from . import keys, ledger
from .fetch import Claim, release_claim
from .ops import Call

#: Seconds a hold guard whose worker died waits for a work horse forked just before to write its pid (announce).
_ANNOUNCE_GRACE = 5.0

#: The head of the handoff a forking PolicyWorker shares with its hold guard and its work horses (see HorseGuard), four
#: native 8-byte words: the number of the claim armed now (0: none), the number the horse pid that follows belongs
#: to, the horse's pid, and the length of the pickled claim that follows the head. _HANDOFF_BYTES in all.
_HANDOFF = struct.Struct('=4Q')
_ARMED, _PID_OF, _PID, _LENGTH = 0, 8, 16, 24
_HANDOFF_BYTES = 64 * 1024
#: What a worker leaving with no job running writes to its guard's pipe.
_STOP = b'stop'


def keep_call(claim: Claim, hold_ttl: int, job_prefix: str, mode: str = 'keep', first: bool = False,
              alive_ttl: int | None = None) -> Call:
    """The ``lua/keep_horse.lua`` call keeping what the running horse of ``claim`` holds: its holds (each given
    ``hold_ttl`` seconds) and, for a started ``until='finished'`` job, its liveness key (``alive_ttl``,
    default ``hold_ttl``). ``mode`` 'keep' extends only what is live; 'recount' writes back and counts what lapsed.
    """
    holds = claim.holds
    call = Call(
        'keep_horse', mode=mode, tokens=[h.token for h in holds], ttls=[hold_ttl] * len(holds),
        fields=[keys.lapse_field(h.ledger) for h in holds], alive_ttl=alive_ttl or hold_ttl,
        alive_field=keys.loner_lapse_field(claim.queue_name), first=first,
    )
    call.key_list('holds', [h.ledger for h in holds])
    call.key('lapses', keys.LAPSES)
    call.key('job', job_prefix + claim.job_id)
    return call.key('alive', keys.alive(claim.job_id))


class HorseGuard(ledger.ForkedHelper):
    """One small process per forking PolicyWorker that keeps what its running work horse holds, whatever becomes of
    the worker: the holds of a capped job (a queue's cap, a key's limit) and the identity of an
    ``until='finished'`` job.

    rq runs the work horse in a process group of its own, so a worker SIGKILLed alone or with its process group
    (``kill -9 -PGID``, supervisord's ``killasgroup``) leaves its horse running the job, and a worker SIGSTOPped
    alone stops refreshing while its horse runs on (rq's monitor loop may not beat again until the horse has ended,
    even after SIGCONT). The guard is what keeps the running horse counted then. It is forked from the worker once,
    at its first job (again only if it died), not once per job, and moves to a process group of its own at once,
    so a kill of the worker's group leaves it to its work.

    What it needs sits in its handoff, a small region of memory the worker shares with the guard and with every horse
    it forks (:data:`_HANDOFF`, an anonymous shared mapping made before the guard's fork): the worker writes the claim
    there before it forks the horse, the horse writes its pid there as the first thing it does, and the worker
    clears the handoff once it has reaped the horse. Plain stores into memory: a job costs the worker and its horse no
    system call for the guard beyond the horse closing its copy of the guard's pipe.

    Once a ``tick`` the guard looks at the handoff (and checks its worker). A horse that has run for about a third of
    the hold ttl (``every``) is kept from then on, every ``every`` seconds while it lives, by ``lua/keep_horse.lua``:
    its holds are extended, never written back (the worker releases them once the horse has ended; a keep that
    lands just after must not bring them back), and the liveness key of an ``until='finished'`` job is written
    (``rq:policies:alive:<id>``, which ``lua/lib/holder_running.lua`` reads beside the worker's key). A keep that
    finds something gone while the horse still runs has found a lapse (the whole tree was stopped longer than the
    ttl): the guard writes it back at once, counted in ``rq:policies:lapses`` and logged. Jobs shorter than
    ``every`` cost no command at all. The worker's heartbeat still refreshes the holds too, while it beats.

    Once the worker is gone (its end of the guard's pipe closes, or the guard's parent changes) the guard keeps the
    running horse at once and then every ``every`` seconds for as long as that horse lives, releases its holds once
    it has ended (watched through a pidfd, so the release is prompt and never lands before the job's process is
    gone), and exits. A claim whose horse has not written its pid yet (the worker died just after the fork) is
    waited for up to :data:`_ANNOUNCE_GRACE` seconds. The guard opens its pidfd when it first sees the horse's pid: a
    horse that ended in the moment between its worker's death and the guard's look is then found gone and its hold
    released at once; its pid taken again by another process in that moment would be watched instead, which at worst
    keeps the hold until that process ends.

    A process, not a thread in the horse: a job holding the GIL (a catastrophic regex) would starve a thread. It
    ignores SIGINT and SIGTERM (its worker decides) and exits when the worker exits with no job still running. If
    everything is SIGKILLed, the holds age out within ``hold_ttl`` and the liveness key too.
    """

    helper_name = 'hold guard'

    def __init__(self, connection: Any, hold_ttl: int, tick: float, log: Any,
                 job_prefix: str = Job.redis_job_namespace_prefix,
                 every: float | None = None) -> None:
        self.connection = connection
        self.hold_ttl = hold_ttl
        self.every = hold_ttl / 3 if every is None else every
        self.tick = min(tick, self.every / 2)
        self.job_prefix = job_prefix
        self.log = log
        # MAP_SHARED (Python's default for an anonymous map): the guard and every horse forked later see one handoff.
        self._handoff = mmap.mmap(-1, _HANDOFF_BYTES)
        self._number = 0  # the number of the last claim armed (the handoff's first word while its horse runs)

    def ensure(self) -> None:
        """Start the guard unless it runs (checked with one WNOHANG wait)."""
        if self._running():
            return
        worker = os.getpid()
        pid, write_end = ledger.fork_child(lambda read_end: self._run(read_end, worker))
        with contextlib.suppress(OSError):  # also from this side: no kill of the worker's group may race the move
            os.setpgid(pid, pid)
        os.set_blocking(write_end, False)  # a stopped guard must never block the worker
        self._pid, self._write = pid, write_end

    def arm(self, claim: Claim) -> bool:
        """In the worker, just before it forks the horse of ``claim``: write the claim to the handoff (no system call).

        Returns False, with a warning, for a claim too large for the handoff (not guarded: the worker's heartbeat still
        keeps its holds while the worker lives).
        """
        data = pickle.dumps(claim, protocol=pickle.HIGHEST_PROTOCOL)
        if _HANDOFF.size + len(data) > len(self._handoff):
            self.log.warning('rq-policies: the claim of job %s is too large for the hold guard (%s bytes); its hold '
                             'is not kept if the worker dies while the job runs', claim.job_id, len(data))
            return False
        self._number += 1
        self._handoff[_HANDOFF.size:_HANDOFF.size + len(data)] = data
        struct.pack_into('=Q', self._handoff, _LENGTH, len(data))
        struct.pack_into('=Q', self._handoff, _ARMED, self._number)  # last: the claim is whole once it is armed
        return True

    def announce(self) -> None:
        """In the work horse of the armed claim, first thing: write this horse's pid to the handoff; drop the pipe."""
        struct.pack_into('=Q', self._handoff, _PID, os.getpid())
        armed = struct.unpack_from('=Q', self._handoff, _ARMED)[0]
        struct.pack_into('=Q', self._handoff, _PID_OF, armed)  # after the pid
        self.detach()

    def detach(self) -> None:
        """In a child of the worker (a work horse): close its inherited end of the pipe."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
        self._pid = 0

    def ended(self) -> None:
        """In the worker: the horse of the armed claim has ended (reaped); the handoff is cleared (no system call)."""
        struct.pack_into('=Q', self._handoff, _ARMED, 0)

    def stop(self, job_running: bool) -> None:
        """In the worker, leaving: with no job still running, the guard exits; else it stays for that job."""
        if self._write < 0:
            return
        if job_running:
            os.close(self._write)  # the guard sees its worker go and keeps the running horse's hold
            self._write, self._pid = -1, 0
            return
        with contextlib.suppress(OSError):
            os.write(self._write, _STOP)
        if self._pid:
            self._reaped(2.0)
        self._close()

    # -- in the guard's process -----------------------------------------------------------------------------------

    def _run(self, pipe: int, worker: int) -> None:
        ledger.ignore_stop_signals()
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # a group of its own: kill -9 -PGID of the worker leaves the guard to keep the horse
        orphaned_at: float | None = None
        current: Guarded | None = None
        try:
            while True:
                timeout = self.tick
                if current is not None:
                    timeout = max(0.0, min(self.tick, current.next_keep - time.monotonic()))
                if orphaned_at is None:
                    if select.select([pipe], [], [], timeout)[0]:
                        if os.read(pipe, 4096):
                            return  # stopped: the worker leaves with no job running
                        orphaned_at = time.monotonic()  # every writer closed: the worker left (died, or quit)
                    elif os.getppid() != worker:
                        orphaned_at = time.monotonic()
                elif current is not None and current.pidfd >= 0:
                    select.select([current.pidfd], [], [], timeout)
                else:
                    time.sleep(min(timeout, 0.05))
                armed, pid_of, pid, length = self._head()
                if current is not None and current.number != armed:
                    current.close()  # its horse ended and the worker reaped it (and releases its holds)
                    current = None
                if not armed:
                    if orphaned_at is not None:
                        return  # the worker left with no job running
                    continue
                if pid_of != armed or not pid:  # armed, but the horse has not written its pid (yet)
                    if orphaned_at is not None and time.monotonic() - orphaned_at > _ANNOUNCE_GRACE:
                        return  # no horse ever wrote its pid: the worker died before (or just at) the fork
                    continue
                now = time.monotonic()
                if current is None:
                    claim = pickle.loads(self._handoff[_HANDOFF.size:_HANDOFF.size + length])
                    # armed at most a tick ago: the first keep comes at most `every` after the horse started
                    current = Guarded(pid, claim, armed, now + max(0.0, self.every - self.tick))
                if orphaned_at is not None and not current.orphaned:
                    current.orphaned = True
                    current.next_keep = now  # at once: nobody else keeps it now
                    if current.alive():
                        self.log.warning('rq-policies: worker %s is gone while job %s runs on; its hold guard keeps '
                                         'what the job holds on %r until the job ends', worker,
                                         current.claim.job_id, current.claim.queue_name)
                if not current.alive():
                    if orphaned_at is not None:
                        self._release(current.claim)  # the worker is gone and the job's process has ended
                        return
                    current.next_keep = float('inf')  # ended: the worker reaps it and releases its holds
                    continue
                if now >= current.next_keep:
                    current.next_keep = now + (self.every if self._keep(current) else self.tick)
        finally:
            if current is not None:
                current.close()

    def _head(self) -> tuple[int, int, int, int]:
        """The handoff's head, read twice 10 ms apart until both reads agree: a horse starting this moment may be
        writing its pid, a worker arming the next claim its number."""
        while True:
            first = _HANDOFF.unpack_from(self._handoff)
            time.sleep(0.01)
            if _HANDOFF.unpack_from(self._handoff) == first:
                return first

    def _keep(self, current: Guarded) -> bool:
        """One keep of the running horse (``lua/keep_horse.lua``); what it finds gone while the horse still runs had
        lapsed, and is written back, counted and logged at once. False when Redis could not be reached."""
        claim = current.claim
        try:
            gone, alive = keep_call(claim, self.hold_ttl, self.job_prefix, first=not current.alive_kept).run(
                self.connection)
            if alive == 1:
                current.alive_kept = True
            if (gone or alive == 2) and current.alive():
                # The horse still runs, so nothing was released: it lapsed (a stop of the whole tree, a stall
                # longer than the ttl). Written back and counted (a replayed recount counts nothing more), and logged
                # from what the keep found: a keep writes nothing where it finds a gap, so its replay answers alike.
                keep_call(claim, self.hold_ttl, self.job_prefix, 'recount').run(self.connection)
                ledger.log_lapses(self.log, [dataclasses.replace(claim.holds[int(i) - 1], ttl=self.hold_ttl)
                                             for i in gone])
                if alive == 2:
                    current.alive_kept = True
                    self.log.warning(
                        "rq-policies: the liveness of job %s (held until='finished' on %r) lapsed while its work "
                        'horse still runs (a stop longer than the hold ttl, %s s): written again, so its identity is '
                        'held again; an identical job may have been admitted meanwhile', claim.job_id,
                        claim.queue_name, self.hold_ttl)
        except Exception:  # retried on the next tick; the ttl covers two missed keeps
            self.log.warning('rq-policies: could not keep the holds of job %s', claim.job_id, exc_info=True)
            return False
        return True

    def _release(self, claim: Claim) -> None:
        if not claim.holds:
            return
        try:
            release_claim(claim, self.connection)
        except Exception:
            self.log.warning('rq-policies: could not release the hold of job %s; it expires within %s s',
                             claim.job_id, self.hold_ttl, exc_info=True)
            return
        self.log.info('rq-policies: job %s ended after its worker died; its hold on %r is released', claim.job_id,
                      claim.queue_name)


class Guarded:
    """The work horse a guard watches: its pid (through a pidfd where the OS has them), its claim, the number of
    its claim in the handoff, and when it is kept next."""

    def __init__(self, pid: int, claim: Claim, number: int = 0, next_keep: float = 0.0) -> None:
        self.pid = pid
        self.claim = claim
        self.number = number
        self.next_keep = next_keep
        self.orphaned = False  # its worker is gone
        self.alive_kept = False  # the liveness key of an until='finished' job was written
        self.pidfd = -1
        if hasattr(os, 'pidfd_open'):
            try:
                self.pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                self.pid = 0  # already gone (and reaped)
            except OSError:
                pass  # no pidfds here (an old kernel): polled instead

    def alive(self) -> bool:
        if not self.pid:
            return False
        if self.pidfd >= 0:
            return not select.select([self.pidfd], [], [], 0)[0]  # readable once the process has exited
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
        return True

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
