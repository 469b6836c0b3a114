"""PolicyWorker and PolicySimpleWorker: rq's workers, fetching through the policies.

Run ``rq worker -w rq_policies.PolicyWorker QUEUES`` (no other flag needed; ``rq worker-pool -w`` works too). Compared
with stock rq:

* the fetch is one script (``lua/fetch.lua``, see :mod:`rq_policies.fetch`) that pops the job, runs every policy's
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
  them instead: :class:`~rq_policies.ledger.WorkerKeeper`); a forking worker's hold guard also keeps what its
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
  promoted once, see :mod:`rq_policies.fetch` and lua/lib/promote.lua);
* a Redis outage or restart does not end the worker where rq's work loop would quit: it waits for the server,
  retrying every ``max_connection_wait_time`` (0.5 s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any

import redis
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.worker import SimpleWorker, Worker

from . import admission, health, keys, ledger, otel, scripts
from .compat import LEGACY_FAILURE, adopt_cluster
from .exceptions import PolicyError
from .fetch import IDLE_POLL_SECONDS, Claim, Fetcher, current_fetcher, release_claim
from .ledger import WAKE_CAPACITY, WAKE_RELEASED, WAKE_SCHEDULED, Keeper
from .ops import Call, text
from .policy import positive_int, registered
from .queue import PolicyQueue

#: Environment variable that sets ``hold_ttl`` for workers started from the command line (``rq worker``,
#: ``rq worker-pool``), where no constructor argument reaches the worker.
HOLD_TTL_ENV = 'RQ_POLICIES_HOLD_TTL'

#: Seconds a hold outlives a missed heartbeat by default, on top of ``job_monitoring_interval``: rq's own margin for
#: the worker key while a job runs (``job_monitoring_interval + 60``).
HOLD_TTL_MARGIN = 60

#: Seconds a hold guard whose worker died waits for a work horse forked just before to write its pid (announce).
_ANNOUNCE_GRACE = 5.0

#: The head of the slot a forking PolicyWorker shares with its hold guard and its work horses (see _HorseGuard), four
#: native 8-byte words: the number of the claim armed now (0: none), the number the horse pid that follows belongs
#: to, the horse's pid, and the length of the pickled claim that follows the head. _SLOT_BYTES in all.
_SLOT = struct.Struct('=4Q')
_ARMED, _PID_OF, _PID, _LENGTH = 0, 8, 16, 24
_SLOT_BYTES = 64 * 1024
#: What a worker leaving with no job running writes to its guard's pipe.
_STOP = b'stop'
#: A claim armed whose horse has not written its pid (_HorseGuard._horse).
_PENDING = object()

#: How long the idle wait waits for the server to confirm a subscription before looking again anyway (seconds).
_SUBSCRIBE_CONFIRM_SECONDS = 1.0

_mixed: dict[type, type] = {}

# Errors that mean "Redis is not reachable right now" (a restart, or a failover in progress).
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ReadOnlyError)


def policy_queue_class(queue_class: type[Queue]) -> type[PolicyQueue]:
    """``queue_class`` itself when it is a PolicyQueue; else a subclass of it that fetches through the policies.

    A PolicyWorker given a custom ``queue_class`` that is not a PolicyQueue (``rq worker`` passes ``rq.Queue``,
    django-rq its own) sets its ``queue_class`` to this subclass: the fetch, and the queues it builds and hands to
    the job, must go through PolicyQueue. The subclass keeps the custom class visible: ``isinstance(queue,
    CustomQueue)`` holds, it bears the custom class's ``__name__`` and ``__qualname__`` (so ``type(queue).__name__``
    and the queue's ``str``/``repr`` read ``CustomQueue``), and ``wrapped_queue_class`` is the class itself. It is
    made once per custom class. Only ``worker.queue_class is CustomQueue`` no longer holds.
    """
    if issubclass(queue_class, PolicyQueue):
        return queue_class
    if queue_class is Queue:
        return PolicyQueue
    found = _mixed.get(queue_class)
    if found is None:
        found = type(
            queue_class.__name__, (PolicyQueue, queue_class),
            {'__module__': __name__, '__qualname__': queue_class.__qualname__, 'wrapped_queue_class': queue_class},
        )
        _mixed[queue_class] = found
    return found



class _WorkerFetcher(Fetcher):
    """A worker's fetch state, with a pub/sub wake-up for the idle wait.

    The subscription lives only while the worker is idle: it is dropped when a job is claimed, so a busy worker's
    connection does not pile up wake-ups for the length of a long job. Taking it again before the next wait costs
    one round trip plus one more look, and closes the race between the last look and the subscription.
    """

    def __init__(self, hold_ttl: int) -> None:
        super().__init__()
        self.hold_ttl = hold_ttl
        self._pubsub: Any = None
        self._channels: dict[str, str] = {}  # subscribed channel -> queue name

    def listen(self, connection: Any, queue_names: list[str]) -> bool:
        wanted = {keys.wake(name): name for name in queue_names}
        if self._pubsub is not None and wanted == self._channels:
            return False
        try:
            if self._pubsub is None:
                self._pubsub = connection.pubsub()
            elif self._channels:
                self._pubsub.unsubscribe(*self._channels)
            self._pubsub.subscribe(*wanted)
            self._channels = wanted
            # Wait for the server's confirmations: a wake-up is only delivered once SUBSCRIBE has run.
            confirmed: set[str] = set()
            deadline = time.monotonic() + _SUBSCRIBE_CONFIRM_SECONDS
            while len(confirmed) < len(wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message['type'] == 'subscribe':
                    confirmed.add(text(message['channel']))
        except Exception:
            self.close()
            raise
        return True

    def wait(self, connection: Any, queue_names: list[str], seconds: float, full: frozenset[str] = frozenset()) -> bool:
        if self._pubsub is None:
            self.listen(connection, queue_names)
        deadline = time.monotonic() + min(seconds, IDLE_POLL_SECONDS)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                message = self._pubsub.get_message(timeout=left)
                if message is not None and self._scheduled(connection, message):
                    deadline = min(deadline, time.monotonic() + max(self.due_at - self.server_now(connection), 0.0))
                    continue
                if message is not None and self._news(message, full) and self._first(connection, message):
                    return True
        except Exception:
            self.close()
            raise

    def _scheduled(self, connection: Any, message: dict) -> bool:
        """A ``scheduled <time>`` wake-up (PolicyQueue scheduled a job of one of these queues): noted, so the wait
        ends at its due time (server clock); nothing to look at before."""
        if message['type'] != 'message' or text(message['channel']) not in self._channels:
            return False
        head, _, at = text(message['data']).partition(' ')
        if head != WAKE_SCHEDULED:
            return False
        try:
            self.note_due(float(at))
        except ValueError:
            return False
        return self.due_at is not None

    def _news(self, message: dict, full: frozenset[str]) -> bool:
        """Could this message make the next look succeed? A push to a queue that is full cannot."""
        if message['type'] != 'message':
            return False
        queue = self._channels.get(text(message['channel']))
        if queue is None:
            return False  # left over from an earlier subscription
        data = text(message['data'])
        return data.split(' ', 1)[0] in (WAKE_RELEASED, WAKE_CAPACITY) or queue not in full

    @staticmethod
    def _first(connection: Any, message: dict) -> bool:
        """Of the idle workers a release woke, only the first to claim it looks again (one freed hold, one look);
        the others go back to waiting after that one SET. Any other news is everyone's."""
        data = text(message['data'])
        if data.split(' ', 1)[0] != WAKE_RELEASED:
            return True
        return ledger.woken(connection, data)

    def on_claim(self, claim: Claim) -> None:
        super().on_claim(claim)
        if self._pubsub is not None and self._channels:
            try:
                self._pubsub.unsubscribe()  # the confirmations are read, and skipped, at the next listen()
            except Exception:  # the subscription is dropped whole instead; the next idle wait subscribes anew
                logging.getLogger('rq_policies').warning(
                    'rq-policies: could not unsubscribe the idle wake-up; closing its connection', exc_info=True)
                self.close()
            self._channels = {}

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            finally:
                self._pubsub = None
                self._channels = {}


class PolicyWorkerMixin:
    """The policy behaviour shared by PolicyWorker and PolicySimpleWorker."""

    queue_class: type[Queue] = PolicyQueue

    #: Seconds a hold lives unrefreshed. None (the default) means ``job_monitoring_interval + 60``, which is
    #: :data:`rq_policies.ledger.TTL_SECONDS` at rq's default interval; the ``RQ_POLICIES_HOLD_TTL`` environment
    #: variable sets it for workers started by ``rq worker``. A SIGKILLed worker's capacity comes back within this
    #: time; a live worker refreshes its holds every ``job_monitoring_interval``, so a forking worker's hold_ttl must
    #: be longer than that interval.
    hold_ttl: int | None = None

    #: When the worker stops with a release still pending because Redis is unreachable (a restart, a Sentinel
    #: failover), it keeps trying this many seconds before leaving the hold to age out. rq's own work loop quits on a
    #: Redis error in the middle of a job, so this is what returns a hold promptly after a short outage.
    release_grace_seconds: float = 10.0

    #: At most how often the worker reads the server's ``evicted_keys`` to warn (once) when keys are evicted while
    #: it runs; each reading rides a heartbeat it sends anyway (see :class:`~rq_policies.health.EvictionWatch`).
    eviction_watch_seconds: float = health.EVICTION_WATCH_SECONDS
    #: rq's work loop sleeps after a connection error, doubling the sleep up to 60 s: after a 30 s outage a stock
    #: worker looks again up to 32 s after the server is back. A PolicyWorker retries every half second after rq's
    #: first 1 s sleep (two refused connects a second while the server is down), so due jobs, which its own fetch
    #: promotes, run within about two seconds of the server answering again.
    exponential_backoff_factor: float = 1.0
    max_connection_wait_time: float = 0.5

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before rq's own set-up, which a cluster client without a hash-tagged RQ_KEY_PREFIX would fail less clearly.
        keys.check_connection(kwargs.get('connection'))
        adopt_cluster(kwargs.get('connection'))  # rq 3's Worker on a RedisCluster (compat.adopt_cluster)
        super().__init__(*args, **kwargs)
        # `rq worker` passes its own queue class (rq.Queue by default) and `rq worker-pool` none at all; fetching
        # must go through ours regardless.
        self.queue_class = policy_queue_class(self.queue_class)  # type: ignore[misc]
        self.hold_ttl = self._resolve_hold_ttl()
        self._policy_fetcher = _WorkerFetcher(self.hold_ttl)
        self._pending_releases: list[Claim] = []  # finished claims whose hold is not released yet
        self._running_claim: Claim | None = None  # the claim of the job executing now
        # evicted_keys, read on heartbeats: a rise while the worker runs is logged once
        self._evictions = health.EvictionWatch(self.log, self.eviction_watch_seconds)  # type: ignore[attr-defined]

    def _resolve_hold_ttl(self) -> int:
        interval = int(self.job_monitoring_interval)  # type: ignore[attr-defined]
        if self.hold_ttl is not None:
            ttl = positive_int('hold_ttl', self.hold_ttl)
        elif os.environ.get(HOLD_TTL_ENV):
            raw = os.environ[HOLD_TTL_ENV]
            try:
                ttl = int(raw)
            except ValueError:
                raise ValueError(f'{HOLD_TTL_ENV} must be a positive integer, got {raw!r}') from None
            if ttl < 1:
                raise ValueError(f'{HOLD_TTL_ENV} must be a positive integer, got {raw!r}')
        else:
            return interval + HOLD_TTL_MARGIN
        self._check_hold_ttl(ttl, interval)
        return ttl

    def check_for_suspension(self, burst: bool) -> None:
        # The first Redis call of each turn of rq's work loop, where rq quits on any error but a timeout: an outage
        # that begins while a job runs would end the worker. Wait here for the server instead (once a second), so
        # the worker serves its queues again as soon as the server answers, with no restart.
        return self._through_outage(super().check_for_suspension, burst)  # type: ignore[misc]

    def _through_outage(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, retried every ``max_connection_wait_time`` while Redis is unreachable (one
        warning), unless the worker was asked to stop."""
        warned = False
        while True:
            try:
                return call(*args, **kwargs)
            except _UNREACHABLE as exc:
                if getattr(self, '_stop_requested', False):
                    raise
                if not warned:
                    self.log.warning('rq-policies: Redis unreachable (%s); retrying every %s s', exc,  # type: ignore[attr-defined]
                                     self.max_connection_wait_time)
                    warned = True
                time.sleep(self.max_connection_wait_time)

    def _check_hold_ttl(self, ttl: int, interval: int) -> None:
        if ttl <= interval:
            raise ValueError(
                f'hold_ttl must be longer than job_monitoring_interval ({interval} s), got {ttl}: holds are refreshed '
                'once per interval while a job runs, and a shorter one would lapse under a running job'
            )

    # -- fetch ----------------------------------------------------------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        # rq retries connection errors inside its dequeue loop, but not the worker state it writes before that loop
        # (set_state), where an outage that began during a job would end the worker: wait for the server here too.
        return self._through_outage(self._dequeue_once, *args, **kwargs)

    def _dequeue_once(self, *args: Any, **kwargs: Any) -> Any:
        self._release_now()  # normally already gone with the work loop's heartbeat; never carried past a fetch
        token = current_fetcher.set(self._policy_fetcher)
        try:
            return super().dequeue_job_and_maintain_ttl(*args, **kwargs)  # type: ignore[misc]
        except BaseException:
            # A stop request or an error after the claim, before the job ever reached execute_job.
            self._drop_claim()
            raise
        finally:
            current_fetcher.reset(token)

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        # Our fetch always moves the id to the intermediate list, multi-queue workers included, so it always has to
        # come off it when the job starts (stock rq only removes it for single-queue workers).
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)  # type: ignore[misc]

    def cleanup_execution(self, job: Any, pipeline: Any, *args: Any, **kwargs: Any) -> None:
        # The narrowest rq hook every ending of a run passes (success, failure, stop-job, timeout, a killed horse),
        # on the pipeline that records the ending. The policies' end-of-run release is queued as that pipeline's
        # last command, after rq's own status write and any retry or repeat re-enqueue, so its script reads the
        # status the pipeline leaves: only a final ending frees what the job held while it ran.
        # rq 3 passes execution=; rq 2.12's takes no such argument: pass on exactly what rq gave.
        super().cleanup_execution(job, pipeline, *args, **kwargs)  # type: ignore[misc]
        execute = pipeline.execute
        prefix, job_id = job.redis_job_namespace_prefix, job.id

        def execute_last(*args: Any, **kwargs: Any) -> Any:
            del pipeline.execute  # once: a pipeline retried after a WatchError comes back through here
            admission.ended(pipeline, prefix, job_id)
            return execute(*args, **kwargs)

        pipeline.execute = execute_last

    # -- the hold's life ------------------------------------------------------------------------------------------

    def execute_job(self, job: Any, queue: Any) -> Any:
        claim = self._take_claim(job)
        self._running_claim = claim  # a forked work horse inherits it (see PolicyWorker.main_work_horse)
        try:
            with self._keeping():
                result = super().execute_job(job, queue)  # type: ignore[misc]
        except BaseException as exc:
            # Cold shutdown and other escapes skip the work loop's heartbeat: release now, but only once the job's
            # process has ended (rq's cold shutdown waits for the killed horse before it raises). An error in the
            # heartbeat (OOM under noeviction, BUSY, NOPERM) also lands here while the horse, in a process group of
            # its own, runs on: its hold stays, and the horse keeps it once this worker has quit.
            if self._job_process_ended():
                self._release_later(claim)
                self._release_now()
            elif claim is not None:
                self.log.warning(  # type: ignore[attr-defined]
                    'rq-policies: job %s still runs in its work horse after %r; its hold on %r stays, kept by the '
                    'horse once this worker has quit', claim.job_id, exc, claim.queue_name,
                )
            raise
        finally:
            self._running_claim = None
        # Every other path (success, failure, retry, timeout, stop-job command, killed work horse, warm shutdown)
        # returns here after the job has ended. The release waits for the next heartbeat without a pipeline, which
        # the work loop sends right after this; rq's own heartbeats *during* the job never carry it.
        self._release_later(claim)
        return result

    def _job_process_ended(self) -> bool:
        """Has the process that ran the job ended? In-process (PolicySimpleWorker): yes, once execute_job left."""
        return True

    def _keeping(self) -> contextlib.AbstractContextManager[Any]:
        """What keeps the holds while the job runs, stopped before any release (the heartbeat, by default)."""
        return contextlib.nullcontext()

    def _take_claim(self, job: Any) -> Claim | None:
        self._release_now()
        claim, self._policy_fetcher.claim = self._policy_fetcher.claim, None
        if claim is None or not claim.holds:
            return None
        if claim.job_id != job.id:  # not the job we fetched (a subclass ran another one): do not sit on its holds
            self._release_later(claim)
            self._release_now()
            return None
        return claim

    #: Does a heartbeat on a pipeline (rq's, at a job's start and while it runs) refresh the holds? Not in an
    #: in-process worker: its one such heartbeat is at the job's start, just after the fetch took the holds with
    #: a full ``hold_ttl``, and its keeper refreshes them while the job runs.
    _refresh_on_heartbeat = True

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)  # type: ignore[misc]
            self._forget_records(pipeline)
            self._evictions.ride(pipeline)
            if not self._refresh_on_heartbeat:
                return
            at = len(pipeline.command_stack)
            sent = ledger.PROCESS.refresh_in(pipeline, ttl=self.hold_ttl)
            if sent:
                self._watch_refresh(pipeline, at, sent)
            return
        # rq sends a bare heartbeat as three commands and three round trips; one pipeline carries the same commands,
        # and the releases of jobs that ended ride it: no round trip of their own. On an error they stay pending,
        # and the heartbeat after the reconnect, the next fetch or teardown sends them.
        # Redis unreachable (a restart, an outage): rq's work loop would quit on the error of the heartbeat it sends
        # after each job; the fetch that follows meets the same error inside rq's reconnect loop instead, which
        # retries every second (max_connection_wait_time), so the worker carries on once the server is back.
        pending = list(self._pending_releases)
        try:
            with self.connection.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
                super().heartbeat(timeout, pipeline=pipe)  # type: ignore[misc]
                self._forget_records(pipe)
                self._evictions.ride(pipe)
                for claim in pending:
                    release_claim(claim, pipe)
                pipe.execute()
        except _UNREACHABLE as exc:
            self.log.warning('rq-policies: heartbeat failed, Redis unreachable (%s); retrying', exc)  # type: ignore[attr-defined]
            return
        del self._pending_releases[: len(pending)]

    def _forget_records(self, pipeline: Any) -> None:
        """Delete, on ``pipeline``, the claim records of fetches whose reply has arrived (no replay can come now)."""
        records = self._policy_fetcher.records
        if records:
            pipeline.delete(*records)
            records.clear()

    def _watch_refresh(self, pipeline: Any, at: int, sent: list[ledger.Hold]) -> None:
        """Read the refresh's answer (command ``at`` of ``pipeline``) when rq executes its heartbeat pipeline: a hold
        found lapsed (re-added by the script) is logged, never passed over in silence."""
        execute = pipeline.execute

        def execute_and_read(*args: Any, **kwargs: Any) -> Any:
            replies = execute(*args, **kwargs)
            try:
                positions = replies[at]
                ledger.log_lapses(self.log, [sent[int(i) - 1] for i in positions])  # type: ignore[attr-defined]
            except Exception:  # an answer of another shape is not worth failing rq's heartbeat for, nor hiding
                self.log.warning(  # type: ignore[attr-defined]
                    'rq-policies: could not read which holds the heartbeat found lapsed (reply %r)',
                    replies[at] if at < len(replies) else None, exc_info=True)
            return replies

        pipeline.execute = execute_and_read

    def _release_later(self, claim: Claim | None) -> None:
        if claim is not None and claim.holds:
            self._pending_releases.append(claim)

    def _drop_claim(self) -> None:
        claim, self._policy_fetcher.claim = self._policy_fetcher.claim, None
        self._release_later(claim)
        self._release_now()

    def _flush_release(self, grace: float = 0.0) -> None:
        """Send every pending release, retrying an unreachable Redis for up to ``grace`` seconds."""
        deadline = time.monotonic() + grace
        while self._pending_releases:
            claim = self._pending_releases[0]
            try:
                release_claim(claim, self.connection)  # type: ignore[attr-defined]
            except _UNREACHABLE:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
                continue
            self._pending_releases.pop(0)

    def _release_now(self, grace: float = 0.0) -> None:
        try:
            self._flush_release(grace)
        except _UNREACHABLE:
            # Redis unreachable (a restart, a failover): keep the releases pending, so the heartbeat that goes out
            # once the worker has reconnected carries them. A release names its claim, so a late one frees nothing
            # else; if the worker never reconnects, the hold ages out within hold_ttl, the floor under all this.
            tokens = [claim.token for claim in self._pending_releases]
            self.log.warning(  # type: ignore[attr-defined]
                'rq-policies: could not release holds %s yet; they expire within %s s', tokens, self.hold_ttl
            )

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)  # type: ignore[misc]
        check = health.warn_if_evicting(self.connection, self.log)  # type: ignore[attr-defined]  # maxmemory-policy
        self._evictions.start(check)  # evicted_keys at start: a rise while it runs is logged once
        # Before the first fork: no work horse reads a script's files again, nor loads one on the server (its
        # end-of-run pipeline's EVALSHA finds the scripts this pool loaded here).
        scripts.preload(self.connection)  # type: ignore[attr-defined]

    # -- a job raised a policy's exception (Snooze, BackOff): Policy.on_job_exception ----------------------------

    def _policy_outcome(self, job: Any, queue: Any, exc_info: tuple, execution: Any = None) -> tuple | None:
        """None when a policy took over the job that raised ``exc_info`` (written, off its started registry); else
        the exc_info rq's failure path records (the policy's own error when it refused, as Snooze past max_snoozes).
        """
        exc = exc_info[1]
        if exc is None:
            return exc_info
        for cls in registered():
            try:
                with self.connection.pipeline() as pipe:  # type: ignore[attr-defined]
                    if not cls.on_job_exception(job, queue, exc, pipe):
                        continue
                    if LEGACY_FAILURE:
                        self.cleanup_execution(job, pipeline=pipe)  # type: ignore[attr-defined]
                    else:
                        self.cleanup_execution(job, pipeline=pipe, execution=execution)  # type: ignore[attr-defined]
                    pipe.execute()
            except PolicyError:
                return sys.exc_info()
            self.log.info('rq-policies: job %s: %s (%s)', job.id, exc, cls.name)  # type: ignore[attr-defined]
            return None
        return exc_info

    def _finalize_failure(self, job: Any, queue: Any, execution: Any, exc_info: tuple) -> None:  # rq >= 3
        outcome = self._policy_outcome(job, queue, exc_info, execution)
        if outcome is not None:
            super()._finalize_failure(job, queue, execution, outcome)  # type: ignore[misc]

    # rq 2.12 ends a job that raised with handle_execution_ended, the job's failure callback, handle_exception and
    # handle_job_failure in turn, inside its except block: the outcome is decided at the first of them.
    _policy_taken: Any = None
    _policy_error: Any = None

    def handle_execution_ended(self, job: Any, queue: Any, heartbeat_ttl: int) -> None:
        super().handle_execution_ended(job, queue, heartbeat_ttl)  # type: ignore[misc]
        self._policy_taken = self._policy_error = None
        exc_info = sys.exc_info()
        if not LEGACY_FAILURE or exc_info[1] is None or job.get_status(refresh=False) != JobStatus.FAILED:
            return
        outcome = self._policy_outcome(job, queue, exc_info, getattr(self, 'execution', None))
        if outcome is None:
            self._policy_taken = job.id
            job.execute_failure_callback = lambda *args, **kwargs: None  # not a failure: no failure callback
        elif outcome is not exc_info:
            self._policy_error = (job.id, outcome)

    def handle_exception(self, job: Any, *exc_info: Any) -> None:
        if self._policy_taken is not None and self._policy_taken == job.id:
            return
        if self._policy_error is not None and self._policy_error[0] == job.id:
            exc_info = self._policy_error[1]
        super().handle_exception(job, *exc_info)  # type: ignore[misc]

    def handle_job_failure(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        if self._policy_taken is not None and self._policy_taken == job.id:
            self._policy_taken = None
            return None
        if self._policy_error is not None and self._policy_error[0] == job.id:
            import traceback

            kwargs['exc_string'] = ''.join(traceback.format_exception(*self._policy_error[1]))
            self._policy_error = None
        return super().handle_job_failure(job, queue, *args, **kwargs)  # type: ignore[misc]

    def perform_job(self, job: Any, queue: Any, *args: Any) -> Any:  # rq 3 passes the execution too
        if otel.TRACER is not None:  # the job's span (rq_policies.otel), only once it is enabled
            return otel.perform(job, queue, super().perform_job, *args)  # type: ignore[misc]
        return super().perform_job(job, queue, *args)  # type: ignore[misc]

    def teardown(self) -> None:
        try:
            self._drop_claim()
            self._release_now(self.release_grace_seconds)
            self._policy_fetcher.close()
        finally:
            super().teardown()  # type: ignore[misc]


def _resolve_driver_info_once(connection: Any) -> None:
    """Resolve redis-py's client name and version once, for every connection ``connection``'s pool opens from now on.

    redis-py 7 and later look their own version up (``importlib.metadata``: the package's METADATA file read and
    parsed) in every new ``Connection``, to send it with CLIENT SETINFO. A forking worker's work horse opens a new
    connection for every job (the pool is reset after a fork), so that lookup cost each job about 2 ms of CPU, more
    than anything the policies add. The pool now carries the resolved ``DriverInfo``, the value each connection would
    have built for itself: the server sees the same name and version. A pool given a name, a version or its own
    driver info, one whose connections are not redis-py's, and a redis-py without ``DriverInfo`` are left alone.
    """
    try:
        from redis.connection import AbstractConnection
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py < 7: the version is read once, at import
        return
    pool = getattr(connection, 'connection_pool', None)
    kwargs = getattr(pool, 'connection_kwargs', None)
    connection_class = getattr(pool, 'connection_class', None)
    if not isinstance(kwargs, dict) or not isinstance(connection_class, type):
        return
    if not issubclass(connection_class, AbstractConnection) or not ledger.forkable(connection):
        return
    if kwargs.keys() & {'driver_info', 'lib_name', 'lib_version'}:
        return
    kwargs['driver_info'] = DriverInfo()


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


class _HorseGuard:
    """One small process per forking PolicyWorker that keeps what its running work horse holds, whatever becomes of
    the worker: the holds of a capped job (a queue's cap, a key's limit) and the identity of an
    ``until='finished'`` job.

    rq runs the work horse in a process group of its own, so a worker SIGKILLed alone or with its process group
    (``kill -9 -PGID``, supervisord's ``killasgroup``) leaves its horse running the job, and a worker SIGSTOPped
    alone stops refreshing while its horse runs on (rq's monitor loop may not beat again until the horse has ended,
    even after SIGCONT). The guard is what keeps the running horse counted then. It is forked from the worker once,
    at its first job (again only if it died), not once per job, and moves to a process group of its own at once,
    so a kill of the worker's group leaves it to its work.

    What it needs sits in a slot of memory the worker shares with the guard and with every horse it forks
    (:data:`_SLOT`, an anonymous shared mapping made before the guard's fork): the worker writes the job's claim
    there before it forks the horse, the horse writes its pid there as the first thing it does, and the worker
    clears the slot once it has reaped the horse. Plain stores into memory: a job costs the worker and its horse no
    system call for the guard beyond the horse closing its copy of the guard's pipe.

    Once a ``tick`` the guard looks at the slot (and checks its worker). A horse that has run for about a third of
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

    def __init__(self, connection: Any, hold_ttl: int, tick: float, log: Any,
                 job_prefix: str = Job.redis_job_namespace_prefix,
                 every: float | None = None) -> None:
        self.connection = connection
        self.hold_ttl = hold_ttl
        self.every = hold_ttl / 3 if every is None else every
        self.tick = min(tick, self.every / 2)
        self.job_prefix = job_prefix
        self.log = log
        self._pid = 0
        self._write = -1
        # MAP_SHARED (Python's default for an anonymous map): the guard and every horse forked later see one slot.
        self._slot = mmap.mmap(-1, _SLOT_BYTES)
        self._number = 0  # the number of the last claim armed (the slot's first word while its horse runs)

    def ensure(self) -> None:
        """Start the guard unless it runs (checked with one WNOHANG wait)."""
        if self._pid:
            try:
                done, _ = os.waitpid(self._pid, os.WNOHANG)
            except ChildProcessError:
                done = self._pid
            if not done:
                return
            self.log.warning('rq-policies: the hold guard (pid %s) died; starting another', self._pid)
            self._close()
        worker = os.getpid()
        pid, write_end = ledger.fork_child(lambda read_end: self._run(read_end, worker))
        with contextlib.suppress(OSError):  # also from this side: no kill of the worker's group may race the move
            os.setpgid(pid, pid)
        os.set_blocking(write_end, False)  # a stopped guard must never block the worker
        self._pid, self._write = pid, write_end

    def arm(self, claim: Claim) -> bool:
        """In the worker, just before it forks the horse of ``claim``: write the claim to the slot (no system call).

        Returns False, with a warning, for a claim too large for the slot (not guarded: the worker's heartbeat still
        keeps its holds while the worker lives).
        """
        data = pickle.dumps(claim, protocol=pickle.HIGHEST_PROTOCOL)
        if _SLOT.size + len(data) > len(self._slot):
            self.log.warning('rq-policies: the claim of job %s is too large for the hold guard (%s bytes); its hold '
                             'is not kept if the worker dies while the job runs', claim.job_id, len(data))
            return False
        self._number += 1
        self._slot[_SLOT.size:_SLOT.size + len(data)] = data
        struct.pack_into('=Q', self._slot, _LENGTH, len(data))
        struct.pack_into('=Q', self._slot, _ARMED, self._number)  # last: the claim is whole once it is armed
        return True

    def announce(self) -> None:
        """In the work horse of the armed claim, first thing: write this horse's pid to the slot; drop the pipe."""
        struct.pack_into('=Q', self._slot, _PID, os.getpid())
        struct.pack_into('=Q', self._slot, _PID_OF, struct.unpack_from('=Q', self._slot, _ARMED)[0])  # after the pid
        self.detach()

    def detach(self) -> None:
        """In a child of the worker (a work horse): close its inherited end of the pipe."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
        self._pid = 0

    def ended(self) -> None:
        """In the worker: the horse of the armed claim has ended (reaped); the slot is cleared (no system call)."""
        struct.pack_into('=Q', self._slot, _ARMED, 0)

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
        deadline = time.monotonic() + 2.0
        while self._pid and time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(self._pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.01)
        self._close()

    def _close(self) -> None:
        if self._write >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write)
        self._write, self._pid = -1, 0

    # -- in the guard's process -----------------------------------------------------------------------------------

    def _run(self, pipe: int, worker: int) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)  # a group of its own: kill -9 -PGID of the worker leaves the guard to keep the horse
        orphaned_at: float | None = None
        current: _Guarded | None = None
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
                    claim = pickle.loads(self._slot[_SLOT.size:_SLOT.size + length])
                    # armed at most a tick ago: the first keep comes at most `every` after the horse started
                    current = _Guarded(pid, claim, armed, now + max(0.0, self.every - self.tick))
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
        """The slot's head, read twice 10 ms apart until both reads agree: a horse starting this moment may be
        writing its pid, a worker arming the next claim its number."""
        while True:
            first = _SLOT.unpack_from(self._slot)
            time.sleep(0.01)
            if _SLOT.unpack_from(self._slot) == first:
                return first

    def _keep(self, current: _Guarded) -> bool:
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


class _Guarded:
    """The work horse a guard watches: its pid (through a pidfd where the OS has them), its claim, the number of
    its claim in the slot, and when it is kept next."""

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


class PolicyWorker(PolicyWorkerMixin, Worker):
    """rq's forking Worker, fetching through the policies: ``rq worker -w rq_policies.PolicyWorker``.

    rq runs the work horse in a process group of its own, so a worker SIGKILLed alone (``kill -9`` of its pid, an
    OOM kill of the parent) or with its process group (``kill -9 -PGID``, supervisord's ``killasgroup``) leaves its
    horse running the job to the end, and a worker SIGSTOPped alone stops beating while its horse runs on. What the
    job holds (a cap's or a key's hold, an ``until='finished'`` identity) is therefore kept by the worker's
    hold guard (one small process per worker, in a process group of its own, :class:`_HorseGuard`) for as long as
    the horse lives: every ``hold_ttl / 3`` seconds once a job has run that long, at once when the worker is gone,
    and released when the horse has ended. The cap counts the job for as long as it actually runs (bounded by the
    job's timeout, which the horse enforces itself). ``docs/reliability.md`` has every kill shape and its bound.

    At bootstrap it resolves redis-py's driver info once, on its connection pool (see
    :func:`_resolve_driver_info_once`): a work horse opens a new connection per job, and redis-py 7 and later would
    read their own package metadata for each.
    """

    #: How often the hold guard looks at its worker and at the running horse (seconds; no Redis command).
    orphan_check_seconds: float = 1.0

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        _resolve_driver_info_once(self.connection)  # type: ignore[attr-defined]

    _guard: _HorseGuard | None = None
    _guarded: Claim | None = None  # the claim of the job whose horse runs now, armed in the guard's slot
    _announce = False  # the horse forked now writes its pid to the guard's slot

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        self._announce = False
        if ledger.forkable(self.connection):  # type: ignore[attr-defined]
            if self._guard is None:
                interval = int(self.job_monitoring_interval)  # type: ignore[attr-defined]
                # A keep every third of the shorter of the hold ttl and rq's ttl of the worker's key while a job
                # runs: a horse's liveness key is written before a dead worker's key could expire.
                self._guard = _HorseGuard(self.connection, self.hold_ttl, self.orphan_check_seconds,  # type: ignore[arg-type, attr-defined]
                                          self.log, job_prefix=job.redis_job_namespace_prefix,  # type: ignore[attr-defined]
                                          every=min(self.hold_ttl, interval + 60) / 3)  # type: ignore[type-var]
            self._guard.ensure()
            claim = self._running_claim
            if claim is None or claim.job_id != job.id:
                claim = Claim(job.id, queue.name)  # no hold: an until='finished' identity may still need it
            if self._guard.arm(claim):
                self._guarded, self._announce = claim, True
        super().fork_work_horse(job, queue)  # the horse never returns from it

    def main_work_horse(self, job: Any, queue: Any) -> None:
        if self._guard is not None:
            if self._announce:
                self._guard.announce()
            else:
                self._guard.detach()
        super().main_work_horse(job, queue)  # ends in os._exit

    def execute_job(self, job: Any, queue: Any) -> Any:
        try:
            return self._execute_job_once(job, queue)
        except _UNREACHABLE as exc:
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
        super().maintain_heartbeats(*args, **kwargs)  # type: ignore[misc]
        if self._guard is not None and self._guarded is not None:
            self._guard.ensure()  # a guard killed mid-job is replaced now; the new one finds the horse in the slot

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
            if self._guard is not None:
                self._guard.stop(job_running=self._guarded is not None)


class PolicySimpleWorker(PolicyWorkerMixin, SimpleWorker):
    """rq's SimpleWorker (no fork), fetching through the policies.

    A SimpleWorker sends no heartbeat while a job runs, so a hold would lapse under a long job. The worker's one
    keeper (:class:`~rq_policies.ledger.WorkerKeeper`, a small process forked at the first capped job and kept for
    the worker's life) refreshes the running job's holds every ``hold_ttl / 3`` seconds while it runs: a process of
    its own, so a job that holds the GIL for long (a C call) cannot starve it; it exits with the worker (even a
    SIGKILLed one), so a killed worker's holds still age out within ``hold_ttl``. A job's holds are handed to it
    through shared memory when the job starts and taken back when it ends, before their release: a capped job costs
    what an uncapped one does, bar a few microseconds. That is also why any positive ``hold_ttl`` is accepted here.
    """

    _keeper: ledger.WorkerKeeper | None = None
    _refresh_on_heartbeat = False  # the fetch took the holds a moment ago with a full ttl; the keeper refreshes them

    def _check_hold_ttl(self, ttl: int, interval: int) -> None:
        return None

    @contextlib.contextmanager
    def _keeping(self) -> Iterator[None]:
        holds = ledger.PROCESS.holds()
        if not holds:
            yield
            return
        if not ledger.forkable(self.connection):  # type: ignore[attr-defined]
            # fakeredis (users' unit tests): its server lives in this process, which a thread reaches.
            keeper = Keeper(
                self.connection, ledger.PROCESS, self.hold_ttl / 3, ttl=self.hold_ttl, log=self.log,  # type: ignore[operator, attr-defined]
            ).start()
            try:
                yield
            finally:
                keeper.stop()  # before any release: no refresh may write a released hold back
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
        try:
            yield
        finally:
            if armed:
                self._keeper.disarm()  # before any release: no refresh may write a released hold back

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if self._keeper is not None:
                self._keeper.stop()
