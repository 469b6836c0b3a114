"""PolicyWorker and PolicySimpleWorker: rq's workers, fetching through the policies.

Run ``rq worker -w rq_policies.PolicyWorker QUEUES`` (no other flag needed). Compared with stock rq:

* the fetch is one script (``lua/dequeue_job.lua``) that pops the job, clears its loner marker and, on a queue capped
  with :class:`~rq_policies.QueueSlot`, takes a hold; a full queue is skipped and the others are served in rq's order;
* the popped id always goes through the queue's intermediate list, so a worker that dies between the pop and the
  start leaves the job where rq's maintenance recovers it, for multi-queue workers too (stock rq only does this for
  single-queue workers);
* a hold is released on every exit path of the job, anchored in ``execute_job`` (the parent's side, which every path
  passes): the release rides the work loop's next heartbeat, or goes out at once when the job's execution raised
  (cold shutdown);
* holds are refreshed by a script appended to the heartbeat pipeline rq sends while a job runs;
* an idle worker waits on pub/sub (woken by admissions and releases) and looks again at least every second, instead
  of blocking on BLPOP, which would pop without the checks.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from rq.queue import Queue
from rq.worker import SimpleWorker, Worker

from . import keys, scripts
from .queue import IDLE_POLL_SECONDS, Claim, Fetcher, PolicyQueue, _fetcher
from .queue_slot import QueueSlot

_mixed: dict[type, type] = {}

# Errors that mean "Redis is not reachable right now" (a restart, or a failover in progress).
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ReadOnlyError)


def policy_queue_class(queue_class: type[Queue]) -> type[PolicyQueue]:
    """``queue_class`` itself when it is a PolicyQueue; else a subclass of it that fetches through the policies."""
    if issubclass(queue_class, PolicyQueue):
        return queue_class
    if queue_class is Queue:
        return PolicyQueue
    found = _mixed.get(queue_class)
    if found is None:
        found = type(f'Policy{queue_class.__name__}', (PolicyQueue, queue_class), {'__module__': __name__})
        _mixed[queue_class] = found
    return found


class _WorkerFetcher(Fetcher):
    """A worker's fetch state, with a pub/sub wake-up for the idle wait."""

    def __init__(self, hold_ttl: int) -> None:
        super().__init__()
        self.hold_ttl = hold_ttl
        self._pubsub: Any = None
        self._channels: tuple[str, ...] = ()

    def wait(self, connection: Any, queue_names: list[str], seconds: float) -> None:
        channels = tuple(keys.wake(name) for name in queue_names)
        deadline = time.monotonic() + min(seconds, IDLE_POLL_SECONDS)
        try:
            if self._pubsub is None or channels != self._channels:
                self.close()
                self._pubsub = connection.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(*channels)
                self._channels = channels
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if self._pubsub.get_message(timeout=left) is not None:
                    while self._pubsub.get_message(timeout=0) is not None:  # coalesce a burst into one look
                        pass
                    return
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            finally:
                self._pubsub = None
                self._channels = ()


class PolicyWorkerMixin:
    """The policy behaviour shared by PolicyWorker and PolicySimpleWorker."""

    queue_class: type[Queue] = PolicyQueue

    #: Seconds a QueueSlot hold lives unrefreshed (see QueueSlot.TTL_SECONDS).
    hold_ttl: int = QueueSlot.TTL_SECONDS

    #: When the worker stops with a release still pending because Redis is unreachable (a restart, a Sentinel
    #: failover), it keeps trying this many seconds before leaving the hold to age out. rq's own work loop quits on a
    #: Redis error in the middle of a job, so this is what returns a slot promptly after a short outage.
    release_grace_seconds: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # `rq worker` passes its own queue class (rq.Queue by default); fetching must go through ours regardless.
        self.queue_class = policy_queue_class(self.queue_class)  # type: ignore[misc]
        self._policy_fetcher = _WorkerFetcher(self.hold_ttl)
        self._pending_releases: list[Claim] = []  # finished claims whose hold is not released yet

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        token = _fetcher.set(self._policy_fetcher)
        try:
            return super().dequeue_job_and_maintain_ttl(*args, **kwargs)  # type: ignore[misc]
        finally:
            _fetcher.reset(token)

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        # Our fetch always moves the id to the intermediate list, multi-queue workers included, so it always has to
        # come off it when the job starts (stock rq only removes it for single-queue workers).
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)  # type: ignore[misc]

    def execute_job(self, job: Any, queue: Any) -> Any:
        claim = self._policy_fetcher.claim
        self._policy_fetcher.claim = None
        if claim is not None and claim.token is not None and claim.job_id == job.id:
            self._release_now()
            self._pending_releases.append(claim)
        try:
            return super().execute_job(job, queue)  # type: ignore[misc]
        except BaseException:
            # Cold shutdown and other escapes skip the work loop's heartbeat: release now.
            self._release_now()
            raise

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)  # type: ignore[misc]
            QueueSlot.refresh_in(pipeline, ttl=max(self.hold_ttl, int(timeout or 0)))
            return
        pending = list(self._pending_releases)
        if not pending:
            super().heartbeat(timeout)  # type: ignore[misc]
            return
        # The release rides the heartbeat the work loop sends after every job: no round trip of its own.
        with self.connection.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
            super().heartbeat(timeout, pipeline=pipe)  # type: ignore[misc]
            for claim in pending:
                QueueSlot.release(claim.queue_name, claim.token, connection=pipe)
            pipe.execute()
        del self._pending_releases[: len(pending)]

    def _flush_release(self, grace: float = 0.0) -> None:
        deadline = time.monotonic() + grace
        while self._pending_releases:
            claim = self._pending_releases[0]
            try:
                QueueSlot.release(claim.queue_name, claim.token, connection=self.connection)  # type: ignore[attr-defined]
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
            # Redis unreachable (a restart, a failover): keep the release pending, so the heartbeat that goes out
            # once the worker has reconnected carries it. A release names its claim, so a late one frees nothing
            # else; if the worker never reconnects, the hold ages out within hold_ttl, the floor under all this.
            tokens = [claim.token for claim in self._pending_releases]
            self.log.warning('rq-policies: could not release QueueSlot holds %s yet', tokens)  # type: ignore[attr-defined]

    def teardown(self) -> None:
        try:
            self._release_now(self.release_grace_seconds)
            self._policy_fetcher.close()
        finally:
            super().teardown()  # type: ignore[misc]


class PolicyWorker(PolicyWorkerMixin, Worker):
    """rq's forking Worker, fetching through the policies: ``rq worker -w rq_policies.PolicyWorker``."""


class PolicySimpleWorker(PolicyWorkerMixin, SimpleWorker):
    """rq's SimpleWorker (no fork), fetching through the policies.

    A SimpleWorker sends no heartbeat while a job runs, so a hold would lapse under a long job. A small thread keeps
    this worker's holds refreshed every ``job_monitoring_interval`` seconds while a job runs; it dies with the
    process, so a killed worker's holds still age out.
    """

    def execute_job(self, job: Any, queue: Any) -> Any:
        stop = threading.Event()
        keeper = threading.Thread(target=self._keep_holds, args=(stop,), name='rq-policies-holds', daemon=True)
        keeper.start()
        try:
            return super().execute_job(job, queue)
        finally:
            stop.set()
            keeper.join(timeout=5)

    def _keep_holds(self, stop: threading.Event) -> None:
        interval = max(1, min(self.job_monitoring_interval, self.hold_ttl // 3))
        while not stop.wait(interval):
            held = QueueSlot.HELD.snapshot()
            if not held:
                continue
            tokens = list(held)
            try:
                scripts.run('refresh_slots', self.connection, [held[t] for t in tokens], [self.hold_ttl, *tokens])
            except Exception:  # a missed refresh is retried on the next tick; the TTL covers a few of them
                self.log.warning('rq-policies: could not refresh QueueSlot holds', exc_info=True)
