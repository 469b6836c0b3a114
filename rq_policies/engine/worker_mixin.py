"""The policy behaviour PolicyWorker and PolicySimpleWorker share (:class:`PolicyWorkerMixin`): the fetch through
``lua/fetch.lua``, a claim's holds released on every exit path and refreshed on rq's heartbeats, the end-of-run
release on rq's own pipeline, a policy's exception (Snooze, BackOff) taken over from rq's failure path, and the
outage wait. What differs by how the job runs (a forked horse's guard, an in-process job's keeper) is in
:mod:`rq_policies.engine.worker`; the idle wait is :mod:`rq_policies.engine.wake`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

import redis
from rq.job import JobStatus
from rq.queue import Queue
from rq.suspension import WORKERS_SUSPENDED
from rq.utils import now as rq_now
from rq.utils import utcformat
from rq.worker import WorkerStatus

from . import admission, compat, events, health, keys, ledger, scripts
from .compat import LEGACY_FAILURE, adopt_cluster, slot_moving
from .exceptions import InvalidArgument, PolicyError, StopAsked
from .fetch import Claim, current_fetcher, hand_back, release_claim
from .ops import on_next_execute, text
from .policy import positive_int, registered
from .queue import PolicyQueue
from .wake import WakeFetcher

#: Environment variable that sets ``hold_ttl`` for workers started from the command line (``rq worker``,
#: ``rq worker-pool``), where no constructor argument reaches the worker.
HOLD_TTL_ENV = 'RQ_POLICIES_HOLD_TTL'

#: Seconds a hold outlives a missed heartbeat by default, on top of ``job_monitoring_interval``: rq's own margin for
#: the worker key while a job runs (``job_monitoring_interval + 60``).
HOLD_TTL_MARGIN = 60

#: Errors that mean "Redis is not reachable right now" (a restart, or a failover in progress; on a cluster, also the
#: prefix's slot in migration for longer than the client waits: ``SlotMigrating``, a ``ConnectionError``).
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ReadOnlyError)

_mixed: dict[type, type] = {}

#: A bare heartbeat (rq sends one before and one after each fetch) is not sent again when the worker's key got one
#: this recently, with a ttl at least as long, and nothing rides it (a release, a state, a claim record to delete):
#: the key's expiry moves by less than this, and the job's life saves two round trips. rq's dashboards read the
#: worker's ``last_heartbeat`` this much older at most.
HEARTBEAT_COALESCE_SECONDS = 1.0

#: rq's work loop asks whether workers are suspended (``rq suspend``) before every fetch, one round trip of its own.
#: The heartbeat the loop sends after each job asks it too; an answer this fresh stands for rq's question.
SUSPENSION_FRESH_SECONDS = 1.0


#: What a Redis Cluster client raises while a slot has no primary (a failover in progress) or no node answers.
_CLUSTER_AWAY = (redis.exceptions.ClusterDownError, redis.exceptions.SlotNotCoveredError,
                 redis.exceptions.RedisClusterUnreachableError)


def away(error: BaseException) -> bool:
    """Is ``error`` the server gone for now, with nothing of the call run or its outcome unknown (an outage, a
    failover; on a cluster, a slot without a primary, or the prefix's slot in migration:
    :func:`rq_policies.engine.compat.slot_moving`)?"""
    return isinstance(error, (*UNREACHABLE, *_CLUSTER_AWAY)) or slot_moving(error)


class _StartLost(PolicyError):
    """Control flow inside a worker: the fetch that took this job did not outlive the server going away (a failover
    promoted a replica that never had it), so the job is not this worker's to run. Never raised to a caller."""


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
            {'__module__': 'rq_policies.engine.worker', '__qualname__': queue_class.__qualname__,
             'wrapped_queue_class': queue_class},
        )
        _mixed[queue_class] = found
    return found



def _counted_once(worker: Any, job: Any, record: Any) -> Any:
    """``record`` (rq's failure or retry handling), each call from the job's retry counters and the worker's
    execution as they are now: rq's ``Job.retry`` counts a retry down on the job before its transaction is sent, and
    rq 2.12's ``cleanup_execution`` clears the worker's execution while building it, so an end sent again after the
    server went away (:meth:`PolicyWorkerMixin._record_end`) would count the retry twice and leave the run's
    execution in the started registry (for rq's cleanup to fail the job later, however it ended)."""
    counters = {name: getattr(job, name) for name in ('retries_left', 'number_of_retries') if hasattr(job, name)}
    # rq 2.12's plain attribute only: rq 3's is a property over the worker's executions (set, it would put back an
    # execution the worker already dropped), and rq 3 passes the execution to the handling itself.
    execution = None if compat.RQ3 else getattr(worker, 'execution', None)

    def counted(*args: Any, **kwargs: Any) -> Any:
        for name, value in counters.items():
            setattr(job, name, value)
        if execution is not None:
            worker.execution = execution
        return record(*args, **kwargs)

    return counted


class PolicyWorkerMixin:
    """The policy behaviour shared by PolicyWorker and PolicySimpleWorker."""

    queue_class: type[Queue] = PolicyQueue

    #: Seconds a hold lives unrefreshed. None (the default) means ``job_monitoring_interval + 60``, which is
    #: :data:`rq_policies.engine.ledger.TTL_SECONDS` at rq's default interval; the ``RQ_POLICIES_HOLD_TTL`` environment
    #: variable sets it for workers started by ``rq worker``. A SIGKILLed worker's capacity comes back within this
    #: time; a live worker refreshes its holds every ``job_monitoring_interval``, so a forking worker's hold_ttl must
    #: be longer than that interval.
    hold_ttl: int | None = None

    #: When the worker stops with a release still pending because Redis is unreachable (a restart, a Sentinel
    #: failover), it keeps trying this many seconds before leaving the hold to age out. rq's own work loop quits on a
    #: Redis error in the middle of a job, so this is what returns a hold promptly after a short outage.
    release_grace_seconds: float = 10.0

    #: At most how often the worker reads the server's ``evicted_keys`` to warn (once) when keys are evicted while
    #: it runs; each reading rides a heartbeat it sends anyway (see :class:`~rq_policies.engine.health.EvictionWatch`).
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
        self._policy_fetcher = WakeFetcher(self.hold_ttl)
        self._pending_releases: list[Claim] = []  # finished claims whose hold is not released yet
        self._running_claim: Claim | None = None  # the claim of the job executing now
        #: Executions of the job being started that a failed attempt wrote, or may have: deleted by the next look
        #: that reaches the server (_fetch_stands), not before (a look the server refused deleted nothing).
        self._stale_executions: list[Any] = []
        #: The job executing now and the admission policies its end-of-run release runs (``Claim.ending``): None when
        #: unknown (every one runs).
        self._running_ending: tuple[str, tuple[str, ...] | None] | None = None
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
                raise InvalidArgument(
                    HOLD_TTL_ENV, message=f'{HOLD_TTL_ENV} must be a positive integer, got {raw!r}') from None
            if ttl < 1:
                raise InvalidArgument(HOLD_TTL_ENV, message=f'{HOLD_TTL_ENV} must be a positive integer, got {raw!r}')
        else:
            return interval + HOLD_TTL_MARGIN
        self._check_hold_ttl(ttl, interval)
        return ttl

    def check_for_suspension(self, burst: bool) -> None:
        # The first Redis call of each turn of rq's work loop, where rq quits on any error but a timeout: an outage
        # that begins while a job runs would end the worker. Wait here for the server instead (once a second), so
        # the worker serves its queues again as soon as the server answers, with no restart.
        # The heartbeat after the job just asked (heartbeat): not suspended a moment ago stands for rq's question.
        asked = self._suspension_seen
        self._suspension_seen = None  # used once: the next turn of the loop asks again
        if asked is not None and not asked[1] and time.monotonic() - asked[0] < SUSPENSION_FRESH_SECONDS:
            return None
        return self._through_outage(super().check_for_suspension, burst)  # type: ignore[misc]

    def _through_outage(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, retried every ``max_connection_wait_time`` while Redis is unreachable (one
        warning), unless the worker was asked to stop. On a cluster, a slot migration that outlasts the client's own
        wait (``SlotMigrating``) is waited out the same way."""
        warned = False
        while True:
            try:
                return call(*args, **kwargs)
            except Exception as exc:
                if not away(exc) or getattr(self, '_stop_requested', False):
                    raise
                if not warned:
                    self.log.warning('rq-policies: Redis unreachable (%s); retrying every %s s', exc,  # type: ignore[attr-defined]
                                     self.max_connection_wait_time)
                    warned = True
                time.sleep(self.max_connection_wait_time)

    def subscribe(self) -> None:
        # rq's own, with a thread that looks at its stop flag every second (compat.PUBSUB_WAIT_SECONDS): with
        # redis-py 8.2, rq's 60 s wait held every shutdown up to a minute.
        compat.subscribe(self)

    def run_maintenance_tasks(self, *args: Any, **kwargs: Any) -> Any:
        # rq's registry cleanup, in its work loop, which quits on any error: an outage (or a slot migration) that
        # began just then would end the worker.
        return self._through_outage(super().run_maintenance_tasks, *args, **kwargs)  # type: ignore[misc]

    def _check_hold_ttl(self, ttl: int, interval: int) -> None:
        if ttl <= interval:
            raise InvalidArgument(
                'hold_ttl',
                message=f'hold_ttl must be longer than job_monitoring_interval ({interval} s), got {ttl}: holds are '
                        'refreshed once per interval while a job runs, and a shorter one would lapse under a running '
                        'job',
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
        except BaseException as exc:
            # A stop request or an error after the claim, before the job ever reached execute_job.
            self._drop_claim(exc)
            raise
        finally:
            current_fetcher.reset(token)

    #: The claim record of the fetch that took the job being started (``''`` when unknown): see :meth:`_record_start`.
    _running_record: str = ''

    #: The job whose start (rq's ``prepare_job_execution``) is being written now: rq's heartbeat on that pipeline
    #: also takes the fetch's take off (:meth:`_forget_records`).
    _starting_job: str | None = None

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        started = self._policy_fetcher.started
        if started is not None and started[0] == job.id:
            # lua/start.lua wrote the start on rq's prepare_execution pipeline (_ask_start): what rq's own would send
            # here is there already, one round trip less per job.
            self._policy_fetcher.started = None
            self._policy_fetcher.starting = None
            compat.started_locally(self, job, started[1])
            self.procline(f'Processing {job.func_name} from {job.origin} since {time.time()}')  # type: ignore[attr-defined]
            asked, self._policy_fetcher.stop_asked = self._policy_fetcher.stop_asked, None
            if asked is not None and asked[0] == job.id:
                # Another job's admission asked this job's stop before the start (lua/start.lua): rq's stop-job
                # command would have come too early to act. End it as that command ends a job, without running it:
                # raised inside rq's perform_job, so rq's failure handling marks it stopped (never retried) and its
                # end gives back its holds.
                self._stopped_job_id = job.id
                raise StopAsked(job.id, asked[1])
            return
        # Our fetch always moves the id to the intermediate list, multi-queue workers included, so it always has to
        # come off it when the job starts (stock rq only removes it for single-queue workers).
        self._starting_job = job.id
        try:
            self._record_start(super().prepare_job_execution, job, remove_from_intermediate_queue=True)  # type: ignore[misc]
        finally:
            self._starting_job = None
        starting = self._policy_fetcher.starting
        if starting is not None and starting.job_id == job.id:
            self._policy_fetcher.starting = None  # started: its take went with the start

    #: The job rq's prepare_execution is writing the execution of (:meth:`set_state` starts it on that pipeline).
    _preparing: Any = None

    def prepare_execution(self, job: Any) -> Any:
        # The worker's side of a start (rq's Execution, the worker busy), just before the fork: the same outage.
        self._preparing = job
        try:
            execution = self._record_start(super().prepare_execution, job, parent=True)  # type: ignore[misc]
        finally:
            self._preparing = None
        fetcher = self._policy_fetcher
        claim = fetcher.starting
        if claim is None or claim.job_id != job.id:
            return execution
        if fetcher.start_state is None:  # rq wrote the execution on a pipeline the question did not ride: ask now
            fetcher.start_state = scripts.run('claim_start', self.connection,  # type: ignore[attr-defined]
                                              [keys.taken(claim.queue_name), claim.record],
                                              [claim.job_id, claim.fetch_token]) == 1
        if fetcher.start_state:
            return execution
        # The job was handed back to its queue while this worker was stopped (or starved) between its fetch and
        # here, longer than hold_ttl: another worker runs it. Its execution goes, and the job is not started here.
        fetcher.starting = None
        self.log.warning(  # type: ignore[attr-defined]
            'rq-policies: job %s was handed back to %r while this worker was stopped between its fetch and the start '
            '(its claim lapsed after hold_ttl, %s s); another worker runs it, this one does not',
            job.id, claim.queue_name, self.hold_ttl)
        with self.connection.pipeline() as pipe:  # type: ignore[attr-defined]
            execution.delete(job=job, pipeline=pipe)
            super().set_state(WorkerStatus.IDLE, pipeline=pipe)  # type: ignore[misc]
            pipe.execute()
        executions = getattr(self, 'executions', None)
        if isinstance(executions, dict):  # rq 3 keeps the worker's executions by id (rq 2.12: one, ``execution``)
            executions.pop(execution.id, None)
        raise _StartLost(job.id)

    #: The worker's state as last sent to Redis (None: unknown), and an idle state not sent yet, which the next
    #: heartbeat carries (:meth:`set_state`).
    _state_sent: Any = None
    _state_unsent: Any = None
    #: When the worker's key last got a heartbeat (monotonic) and with which ttl (:data:`HEARTBEAT_COALESCE_SECONDS`).
    _beat: tuple[float, int] | None = None
    #: ``(monotonic time, answer)`` of the last suspension question a heartbeat carried (:meth:`check_for_suspension`).
    _suspension_seen: tuple[float, bool] | None = None

    def set_state(self, state: Any, pipeline: Any = None) -> None:
        if pipeline is None and state == WorkerStatus.IDLE:
            # rq marks the worker idle after each job and again before each fetch, a round trip each: the first rides
            # the heartbeat rq's work loop sends right after the job, the second is already there.
            self._state = state  # what rq's get_state answers (rq keeps it there, and writes it in its set_state)
            self._state_unsent = None if self._state_sent == state else state
            return
        super().set_state(state, pipeline=pipeline)  # type: ignore[misc]
        self._state_sent, self._state_unsent = state, None
        # rq's prepare_execution writes the job's execution and the worker's busy state on one pipeline, before the
        # work horse is forked: the question whether the fetch's take is still this worker's rides it (no round trip
        # of its own). Once the execution exists no hand-back takes the job, so the answer holds until the start.
        claim = self._policy_fetcher.starting
        if pipeline is not None and state == WorkerStatus.BUSY and claim is not None and \
                self._policy_fetcher.start_state is None:
            job = self._preparing
            if job is not None and job.id == claim.job_id:
                self._ask_start(pipeline, claim, job)
            else:
                self._ask_take(pipeline, claim)

    def _ask_start(self, pipeline: Any, claim: Claim, job: Any) -> None:
        """Queue on ``pipeline`` (rq's prepare_execution) the job's start, guarded by the question
        :meth:`_ask_take` asks (``lua/start.lua``), with the worker's heartbeat rq's prepare_job_execution sends: that
        pipeline, a round trip of its own, is then not sent (:meth:`prepare_job_execution`). The answer is read when
        the pipeline executes (``Fetcher.start_state``; ``Fetcher.started`` once the job is started)."""
        fetcher = self._policy_fetcher
        self.heartbeat(self.get_heartbeat_ttl(job), pipeline=pipeline)  # type: ignore[attr-defined]
        at_time = rq_now()
        at = len(pipeline)  # see _ask_take
        queue = next((q for q in self.queues if q.name == claim.queue_name), None)  # type: ignore[attr-defined]
        if queue is None:
            queue = self.queue_class(claim.queue_name, connection=self.connection)  # type: ignore[attr-defined]
        scripts.run('start', pipeline, [keys.taken(claim.queue_name), claim.record, job.key,
                                         queue.intermediate_queue_key],
                    [job.id, claim.fetch_token, utcformat(at_time), self.name,  # type: ignore[attr-defined]
                     '1' if compat.START_PERSISTS else '0'])
        compat.current_job(self, job, pipeline)  # rq 2.12's start also names the job on the worker's hash

        def read(replies: list[Any]) -> None:
            if fetcher.starting is claim and at < len(replies) and not isinstance(replies[at], Exception):
                reply = replies[at]
                fetcher.start_state = reply == 1 or isinstance(reply, (bytes, str))
                if fetcher.start_state:
                    fetcher.started = (job.id, at_time)
                if isinstance(reply, (bytes, str)):  # started, and its stop asked before: it must not run
                    fetcher.stop_asked = (job.id, text(reply))

        on_next_execute(pipeline, read)

    def _ask_take(self, pipeline: Any, claim: Claim) -> None:
        """Queue on ``pipeline`` the question ``lua/claim_start.lua`` answers: is the take of ``claim`` still this
        worker's? Its answer is read when the pipeline executes (``Fetcher.start_state``)."""
        fetcher = self._policy_fetcher
        # len(), not command_stack: a cluster pipeline queues its commands in its execution strategy, and its
        # command_stack stays empty (the index would be 0, and the answer read from rq's first command's reply).
        at = len(pipeline)
        scripts.run('claim_start', pipeline, [keys.taken(claim.queue_name), claim.record],
                    [claim.job_id, claim.fetch_token])

        def read(replies: list[Any]) -> None:
            if fetcher.starting is claim and at < len(replies) and not isinstance(replies[at], Exception):
                fetcher.start_state = replies[at] == 1

        on_next_execute(pipeline, read)

    def _record_start(self, record: Any, job: Any, *args: Any, parent: bool = False, **kwargs: Any) -> Any:
        """``record(job, ...)``: rq's writes of a job's start (``prepare_execution`` in the worker,
        ``prepare_job_execution`` where the job runs), riding out the server going away.

        rq turns any error there into the job's failure (``perform_job`` fails the job that raised, and a forked work
        horse that cannot even write that exits, which its worker records as a failure), so a job fetched as a
        failover began was failed without ever running. Here the start is recorded again once the server answers, if
        the fetch that took the job outlived it: its claim record (kept until the job has run) or the job's hash
        naming this worker as the one that started it (the lost reply of a start that was written) say so, read every
        ``max_connection_wait_time``. If neither does, the fetch was lost with the primary (asynchronous replication:
        the job is on its queue again, for any worker) or the outage outlasted the record
        (the worker's ``hold_ttl``: another PolicyWorker then hands the job back to its queue): the
        job is not run here, nor failed, and the warning names it. A job this worker did not fetch itself is left to rq.
        """
        warned = False
        while True:
            try:
                return record(job, *args, **kwargs)
            except Exception as exc:
                if not away(exc) or not self._running_record:
                    raise
                if not warned:
                    self.log.warning(  # type: ignore[attr-defined]
                        'rq-policies: could not record the start of job %s (%s); it runs once Redis answers, if the '
                        'fetch that took it still stands', job.id, exc)
                    warned = True
            while True:
                time.sleep(self.max_connection_wait_time)
                try:
                    ours = self._fetch_stands(job, parent)
                    break
                except Exception as exc:
                    if not away(exc):
                        raise
            if not ours:
                handed = self._give_up(job)
                self.log.warning(  # type: ignore[attr-defined]
                    'rq-policies: job %s is not run by this worker: the fetch that took it did not outlive Redis '
                    'going away (a failover lost it, and the job is on its queue again), or its claim record %s '
                    'expired during a long outage (%s)', job.id, self._running_record,
                    'handed back to its queue' if handed else 'not taken here any more')
                raise _StartLost(job.id)

    def _give_up(self, job: Any) -> bool:
        """A job this worker will not start (:meth:`_record_start`): every execution of it this worker wrote goes,
        read from Redis (one whose write's reply was lost in the outage is there, and not always in this process),
        and the job goes back to the head of its queue now if this worker's take of it is still noted (its claim
        lapsed; the other workers' hand-back leaves a take whose job has a live execution until that expires, 150 s
        and more). Whether it was handed back."""
        claim = self._policy_fetcher.starting
        try:
            mine = [execution for execution in job.get_executions()
                    if getattr(execution, 'worker_name', None) == self.name]  # type: ignore[attr-defined]
            if mine:
                with self.connection.pipeline() as pipe:  # type: ignore[attr-defined]
                    for execution in mine:
                        execution.delete(job=job, pipeline=pipe)
                    pipe.execute()
            if claim is None or claim.job_id != job.id:
                return False
            return bool(hand_back(self.connection, self.queues, own=claim))  # type: ignore[attr-defined]
        except Exception as exc:
            if not away(exc):
                raise
            return False  # the server went away again: its take lapsed, another PolicyWorker hands it back

    def _record_end(self, record: Any, job: Any, *args: Any, **kwargs: Any) -> Any:
        """``record(job, ...)``: rq's writes of a job's end (``handle_job_success``, ``handle_job_failure``,
        ``handle_job_retry``, a policy's take-over), riding out the server going away.

        rq lets such an error escape: the job, which ran, stays *started* in Redis (a forked work horse exits 1,
        and its worker fails it as "terminated unexpectedly"; or, the server still away, rq's cleanup of the started
        registry fails it as abandoned minutes later), so a retry or a Snooze is lost, or the job runs again as a
        retry of a run that ended ok, and an ``until='finished'`` identity stays held meanwhile. Here the end is
        written once the server answers (read every ``max_connection_wait_time``) unless it already was: each of
        these writes is one transaction, which leaves the job no longer *started* by this worker (its hash's
        status and worker_name), so a lost reply is not written twice. A job another worker started since, or
        one already ended (by rq's cleanup), is left as it is."""
        warned = False
        first = kwargs.pop('first_error', None)  # the caller's own first try failed so
        written = kwargs.pop('written', None) or self._end_written
        while True:
            try:
                if first is not None:
                    raise first
                return record(job, *args, **kwargs)
            except Exception as exc:
                first = None
                if not away(exc) or getattr(job, 'worker_name', None) != self.name:  # type: ignore[attr-defined]
                    raise
                if not warned:
                    self.log.warning(  # type: ignore[attr-defined]
                        'rq-policies: could not record the end of job %s (%s); it is recorded once Redis answers',
                        job.id, exc)
                    warned = True
            while True:
                time.sleep(self.max_connection_wait_time)
                try:
                    done = written(job)
                    break
                except Exception as exc:
                    if not away(exc):
                        raise
            if done:
                self.log.warning(  # type: ignore[attr-defined]
                    'rq-policies: the end of job %s was recorded before Redis went away', job.id)
                return None

    def _end_written(self, job: Any) -> bool:
        """Is the job no longer *started* by this worker (its hash's status and worker_name): its end written, by
        this worker before the server went away, or by rq's cleanup since; or another worker started it since?"""
        status, worker = self.connection.hmget(job.key, 'status', 'worker_name')  # type: ignore[attr-defined]
        return status is None or text(status) != JobStatus.STARTED or worker is None or (
            text(worker) != self.name)  # type: ignore[attr-defined]

    def _failure_written(self, execution: Any) -> Any:
        """The ``written`` check of a failure's end (:meth:`_record_end`), for ``execution`` (rq's argument, else the
        worker's own, read now: rq 2.12's cleanup_execution clears it while building the end). Not the job's status:
        a retry's ``Job.retry`` writes 'scheduled' by itself before the transaction, so a server gone between the two
        left the job 'scheduled' and still in the started registry, and the end was taken as written and never sent
        (a retry lost; the job failed as abandoned later). The end's transaction takes the execution off the started
        registry: while it is there, started by this worker, the end was not written."""
        execution = execution or getattr(self, 'execution', None)
        if execution is None:
            return self._end_written

        def written(job: Any) -> bool:
            with self.connection.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
                pipe.zscore(job.started_job_registry.key, execution.composite_key)
                pipe.hget(job.key, 'worker_name')
                score, worker = pipe.execute()
            return score is None or worker is None or text(worker) != self.name  # type: ignore[attr-defined]

        return written

    def _fetch_stands(self, job: Any, parent: bool) -> bool:
        """Does the fetch that took ``job`` still stand (:meth:`_record_start`)? In the worker, rq's executions of the
        job a failed attempt may have written are deleted first (each attempt makes one)."""
        stale = self._stale_executions
        if parent:
            stale.extend(compat.started_executions(self, job))  # kept until their deletion is sent and answered
        with self.connection.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
            for execution in stale:
                execution.delete(job=job, pipeline=pipe)
            pipe.exists(self._running_record)
            pipe.hmget(job.key, 'status', 'worker_name')
            replies = pipe.execute()
        stale.clear()
        status, worker = replies[-1]
        if status is not None and text(status) == JobStatus.STARTED and worker is not None and (
                text(worker) == self.name):  # type: ignore[attr-defined]
            return True  # the start was written, its reply lost
        return bool(replies[-2])

    def cleanup_execution(self, job: Any, pipeline: Any, *args: Any, **kwargs: Any) -> None:
        # The narrowest rq hook every ending of a run passes (success, failure, stop-job, timeout, a killed horse),
        # on the pipeline that records the ending. The policies' end-of-run release is queued as that pipeline's
        # last command, after rq's own status write and any retry or repeat re-enqueue, so its script reads the
        # status the pipeline leaves: only a final ending frees what the job held while it ran.
        # rq 3 passes execution=; rq 2.12's takes no such argument: pass on exactly what rq gave.
        super().cleanup_execution(job, pipeline, *args, **kwargs)  # type: ignore[misc]
        execution = kwargs.get('execution') or getattr(self, 'execution', None)  # rq 3's argument; rq 2.12's one
        execute = pipeline.execute
        prefix, job_id = job.redis_job_namespace_prefix, job.id
        # Only the policies that may hold something of this job until its end (read from its hash at the fetch): a
        # job under none ends with no script of ours. Unknown (a replayed fetch, another job's claim): all of them.
        running = self._running_ending
        ending = running[1] if running is not None and running[0] == job_id else None

        def execute_last(*args: Any, **kwargs: Any) -> Any:
            pipeline.execute = execute  # once: a pipeline retried after a WatchError comes back through here
            admission.ended(pipeline, prefix, job_id, ending)
            read = self._ride_end(pipeline, job_id)

            def send(*args: Any, **kwargs: Any) -> Any:
                replies = execute(*args, **kwargs)
                if read is not None:
                    read(replies)
                return replies

            if getattr(pipeline, 'watching', False) or getattr(job, 'worker_name', None) != self.name:  # type: ignore[attr-defined]
                return send(*args, **kwargs)  # rq retries a watched one itself (WatchError), the rest: _record_end
            # rq's failure path swallows its pipeline's error ("failed to persist failure of job"): ride the server's
            # absence out here, the same transaction sent again unless it was written (_record_end).
            queued = compat.queued_commands(pipeline)  # a cluster pipeline's too (its command_stack is empty)

            def again(job: Any) -> Any:
                compat.queue_again(pipeline, queued)
                return send(*args, **kwargs)

            def written(job: Any) -> bool:
                # The transaction takes the execution off the started registry (rq's cleanup_execution): gone, it was
                # applied. Not the job's status: rq's Job.retry writes 'scheduled' outside it, before it.
                if execution is None:
                    return self._end_written(job)
                return self.connection.zscore(job.started_job_registry.key, execution.composite_key) is None  # type: ignore[attr-defined]

            try:
                return send(*args, **kwargs)
            except Exception as exc:
                if not away(exc):
                    raise
                error = exc
            return self._record_end(again, job, first_error=error, written=written)

        pipeline.execute = execute_last

    #: Does the end of run's transaction carry the worker's own bookkeeping after the job (:meth:`_ride_end`)? Where
    #: the job runs in the worker's process; a forked work horse writes the end, and the worker is busy until it
    #: has reaped the horse.
    _bookkeeping_on_end = False

    def _ride_end(self, pipeline: Any, job_id: str) -> Any:
        """Queue on the end of run's transaction what the heartbeat rq's work loop sends after the job would carry:
        the worker's heartbeat and idle state, the suspension question rq asks next, the deletion of the fetch's
        claim record (the job has run: no start is recorded again), and the release of the claim's holds once nothing
        refreshes them any more (:meth:`_holds_quiet`). That heartbeat then has nothing to carry and is not sent
        (:data:`HEARTBEAT_COALESCE_SECONDS`), one round trip less per job, and the holds are free a moment sooner.
        The reader of the transaction's replies, or None (nothing queued)."""
        running = self._running_ending
        if not self._bookkeeping_on_end or running is None or running[0] != job_id:
            return None
        claim = self._running_claim
        if claim is None or claim.job_id != job_id or not claim.holds or not self._holds_quiet():
            claim = None  # released after the job, by the heartbeat (or none to release)
        else:
            release_claim(claim, pipeline)  # the keeper stopped refreshing them: _holds_quiet
        self.heartbeat(pipeline=pipeline)
        super().set_state(WorkerStatus.IDLE, pipeline=pipeline)  # type: ignore[misc]
        record = self._running_record
        if record:
            pipeline.delete(record)
        at = len(pipeline)  # see _ask_take
        pipeline.exists(WORKERS_SUSPENDED)
        fetcher = self._policy_fetcher

        def read(replies: list[Any]) -> None:
            if at < len(replies) and not isinstance(replies[at], Exception):
                self._suspension_seen = (time.monotonic(), bool(replies[at]))
                self._state_sent = WorkerStatus.IDLE
                if record and record in fetcher.records:
                    fetcher.records.remove(record)
                if claim is not None:
                    self._released_on_end = claim

        return read

    #: The claim whose holds the end of run's transaction released (:meth:`_ride_end`): not released again.
    _released_on_end: Claim | None = None

    def _holds_quiet(self) -> bool:
        """Has whatever refreshes the running job's holds stopped, for good, so that they may be released now (a
        refresh in flight could write a released hold back)? Not known here: no."""
        return False

    # -- the hold's life ------------------------------------------------------------------------------------------

    def execute_job(self, job: Any, queue: Any) -> Any:
        fetched = self._policy_fetcher.claim
        self._running_ending = (job.id, fetched.ending if fetched is not None and fetched.job_id == job.id else None)
        # The fetch's claim record stays until the job has run (_forget_records; it is deleted with the heartbeat
        # after it, and expires by itself): it is what proves, after the server went away as the job's start was
        # being recorded, that the fetch outlived it (_record_start).
        self._running_record = fetched.record if fetched is not None and fetched.job_id == job.id else ''
        claim = self._take_claim(job)
        self._running_claim = claim  # a forked work horse inherits it (see PolicyWorker.main_work_horse)
        try:
            with self._keeping():
                result = super().execute_job(job, queue)  # type: ignore[misc]
        except _StartLost:
            self._release_later(claim)  # nothing ran: the holds go back with the next heartbeat
            return None
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
            self._running_ending = None
            self._running_record = ''
        # Every other path (success, failure, retry, timeout, stop-job command, killed work horse, warm shutdown)
        # returns here after the job has ended. The release waits for the next heartbeat without a pipeline, which
        # the work loop sends right after this; rq's own heartbeats *during* the job never carry it. Unless the end
        # of run's transaction carried it (_ride_end).
        released, self._released_on_end = self._released_on_end, None
        if released is None or released is not claim:
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
        ttl = timeout or self.worker_ttl + 60  # type: ignore[attr-defined]  # rq's own default
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)  # type: ignore[misc]
            self._beat = (time.monotonic(), ttl)
            self._send_state(pipeline)
            self._forget_records(pipeline)
            self._evictions.ride(pipeline, self.connection)  # type: ignore[attr-defined]
            if not self._refresh_on_heartbeat:
                return
            at = len(pipeline)  # commands queued so far, a cluster pipeline's too (see _ask_take)
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
        beat = self._beat
        if not pending and self._state_unsent is None and not self._records_to_forget() and beat is not None and \
                beat[1] >= ttl and time.monotonic() - beat[0] < HEARTBEAT_COALESCE_SECONDS:
            return  # the key got one a moment ago, and nothing rides this one (HEARTBEAT_COALESCE_SECONDS)
        state = None
        try:
            with self.connection.pipeline(transaction=False) as pipe:  # type: ignore[attr-defined]
                super().heartbeat(timeout, pipeline=pipe)  # type: ignore[misc]
                state = self._send_state(pipe)
                self._forget_records(pipe)
                self._evictions.ride(pipe, self.connection)  # type: ignore[attr-defined]
                for claim in pending:
                    release_claim(claim, pipe)
                at = len(pipe)
                pipe.exists(WORKERS_SUSPENDED)  # rq's next question (check_for_suspension), answered here
                replies = pipe.execute()
        except Exception as exc:
            if not away(exc):
                raise
            self._state_unsent = state or self._state_unsent
            self.log.warning('rq-policies: heartbeat failed, Redis unreachable (%s); retrying', exc)  # type: ignore[attr-defined]
            return
        now = time.monotonic()
        self._beat = (now, ttl)
        self._suspension_seen = (now, bool(replies[at]))
        del self._pending_releases[: len(pending)]

    def _send_state(self, pipeline: Any) -> Any:
        """Queue on ``pipeline`` the idle state :meth:`set_state` left unsent, if any; that state (None: none)."""
        state, self._state_unsent = self._state_unsent, None
        if state is not None:
            super().set_state(state, pipeline=pipeline)  # type: ignore[misc]
            self._state_sent = state
        return state

    def _records_to_forget(self) -> bool:
        """Are there claim records :meth:`_forget_records` would delete now?"""
        records = self._policy_fetcher.records
        if not records:
            return False
        claim = self._policy_fetcher.claim
        kept = {claim.record if claim is not None else '', self._running_record}
        return any(record not in kept for record in records)

    def _forget_records(self, pipeline: Any) -> None:
        """Delete, on ``pipeline``, the claim records of fetches whose reply has arrived (no replay can come now),
        but that of the job fetched and not started yet, or running: it proves the fetch stood if its start has to
        be recorded again (:meth:`_record_start`), until the job has run, and while it lives the fetch's take is live
        (:func:`rq_policies.engine.fetch.hand_back`). On the pipeline that starts the job (rq's
        ``prepare_job_execution``) the take goes, with the job's status and its id's removal from the intermediate
        list."""
        starting = self._policy_fetcher.starting
        if starting is not None and self._starting_job == starting.job_id:
            pipeline.hdel(keys.taken(starting.queue_name), starting.job_id)
        records = self._policy_fetcher.records
        if records:
            claim = self._policy_fetcher.claim
            kept = {claim.record if claim is not None else '', self._running_record}
            gone = [record for record in records if record not in kept]
            if gone:
                pipeline.delete(*gone)
            records[:] = [record for record in records if record in kept]

    def _watch_refresh(self, pipeline: Any, at: int, sent: list[ledger.Hold]) -> None:
        """Read the refresh's answer (command ``at`` of ``pipeline``) when rq executes its heartbeat pipeline: a hold
        found lapsed (re-added by the script) is logged, never passed over in silence."""

        def read(replies: list[Any]) -> None:
            try:
                positions = replies[at]
                ledger.log_lapses(self.log, [sent[int(i) - 1] for i in positions])  # type: ignore[attr-defined]
            except Exception:  # an answer of another shape is not worth failing rq's heartbeat for, nor hiding
                self.log.warning(  # type: ignore[attr-defined]
                    'rq-policies: could not read which holds the heartbeat found lapsed (reply %r)',
                    replies[at] if at < len(replies) else None, exc_info=True)

        on_next_execute(pipeline, read)

    def _release_later(self, claim: Claim | None) -> None:
        if claim is not None and claim.holds:
            self._pending_releases.append(claim)

    def _drop_claim(self, why: BaseException | str = 'the worker stopped') -> None:
        """Give back a job this worker's fetch took and never started, and its holds (a stop request, warm or cold,
        can land between the fetch and the job's start: rq raises it wherever the worker is until it marks itself
        busy). The job goes back to the head of its queue at once (:func:`rq_policies.engine.fetch.hand_back`, as the
        worker's own take); if the server cannot be reached now, its take lapses after ``hold_ttl`` and another
        PolicyWorker hands it back then. Logged, naming the job."""
        fetcher = self._policy_fetcher
        claim, fetcher.claim = fetcher.claim, None
        if claim is None and fetcher.resume_token is not None:
            # The stop landed while a fetch's reply was on its way: its claim record says what it took, if anything.
            claim = fetcher.lost_claim(self.connection)  # type: ignore[attr-defined]
            fetcher.resume_token = None
        fetcher.starting, fetcher.start_state, fetcher.started, fetcher.stop_asked = None, None, None, None
        if claim is not None:
            handed: list[Any] = []
            with contextlib.suppress(*UNREACHABLE):
                handed = hand_back(self.connection, self.queues, own=claim)  # type: ignore[attr-defined]
            self.log.warning(  # type: ignore[attr-defined]
                'rq-policies: job %s was taken from %r but not started (%s); its holds are given back, and %s',
                claim.job_id, claim.queue_name, why if isinstance(why, str) else type(why).__name__,
                'it is back on its queue' if handed else
                f'its take lapses within hold_ttl ({self.hold_ttl} s), when another PolicyWorker hands it back to '
                'its queue',
            )
        self._release_later(claim)
        self._release_now()

    def _flush_release(self, grace: float = 0.0) -> None:
        """Send every pending release, retrying an unreachable Redis for up to ``grace`` seconds."""
        deadline = time.monotonic() + grace
        while self._pending_releases:
            claim = self._pending_releases[0]
            try:
                release_claim(claim, self.connection)  # type: ignore[attr-defined]
            except UNREACHABLE:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
                continue
            self._pending_releases.pop(0)

    def _release_now(self, grace: float = 0.0) -> None:
        try:
            self._flush_release(grace)
        except UNREACHABLE:
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
        # evicted_keys at start (a cluster's: the prefix slot primary's): a rise while it runs is logged once
        self._evictions.start(check, self.connection)  # type: ignore[attr-defined]
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
        if isinstance(exc, _StartLost):  # not run, not this worker's: nothing to record but dropping its execution
            self._drop_execution(job, execution)
            return None
        def take_over(job: Any, cls: Any) -> bool:
            with self.connection.pipeline() as pipe:  # type: ignore[attr-defined]
                if not cls.on_job_exception(job, queue, exc, pipe):
                    return False
                if LEGACY_FAILURE:
                    self.cleanup_execution(job, pipeline=pipe)  # type: ignore[attr-defined]
                else:
                    self.cleanup_execution(job, pipeline=pipe, execution=execution)  # type: ignore[attr-defined]
                pipe.execute()
            return True

        for cls in registered():
            try:
                if self._record_end(take_over, job, cls) is False:  # None: written before the server went away
                    continue
            except PolicyError:
                return sys.exc_info()
            self.log.info('rq-policies: job %s: %s (%s)', job.id, exc, cls.name)  # type: ignore[attr-defined]
            return None
        return exc_info

    def _drop_execution(self, job: Any, execution: Any) -> None:
        """Delete rq's record of this worker's execution of ``job`` (it never started here: :class:`_StartLost`), so
        that rq's cleanup of the started registry does not fail the job later."""
        if execution is None:
            return
        try:
            with self.connection.pipeline() as pipe:  # type: ignore[attr-defined]
                execution.delete(job=job, pipeline=pipe)
                pipe.execute()
        except Exception as exc:  # its ttl ends it anyway; rq's cleanup then finds the job queued or run elsewhere
            self.log.warning('rq-policies: could not delete the execution of job %s: %s', job.id, exc)  # type: ignore[attr-defined]

    def _finalize_failure(self, job: Any, queue: Any, execution: Any, exc_info: tuple) -> None:  # rq >= 3
        outcome = self._policy_outcome(job, queue, exc_info, execution)
        if outcome is not None:
            super()._finalize_failure(job, queue, execution, outcome)  # type: ignore[misc]

    # rq 2.12 ends a job that raised with handle_execution_ended, the job's failure callback, handle_exception and
    # handle_job_failure in turn, inside its except block: the outcome is decided at the first of them.
    _policy_taken: Any = None
    _policy_error: Any = None

    def handle_execution_ended(self, job: Any, queue: Any, heartbeat_ttl: int) -> None:
        exc_info = sys.exc_info()
        if LEGACY_FAILURE and isinstance(exc_info[1], _StartLost):  # never started here: nothing of it is written
            self._policy_error = None
            self._policy_taken = job.id
            job.execute_failure_callback = lambda *args, **kwargs: None
            self._drop_execution(job, getattr(self, 'execution', None))
            return
        # rq's own marks the end and writes the job's last_heartbeat, a round trip of its own right before the end of
        # run's transaction, which saves the job's hash with that field (rq's to_dict) on every ending rq records:
        # it rides there.
        job.ended_at = job.last_heartbeat = rq_now()
        self._policy_taken = self._policy_error = None
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
        kwargs.setdefault('written', self._failure_written(kwargs.get('execution')))
        return self._record_end(_counted_once(self, job, super().handle_job_failure), job, queue, *args, **kwargs)  # type: ignore[misc]

    def handle_job_success(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        # _counted_once: rq 2.12's cleanup_execution clears the worker's execution while building the end, and the
        # end's write now fails after that (its WATCH goes with the transaction): sent again, it must name the run's
        # execution still, or the job stays in the started registry.
        return self._record_end(_counted_once(self, job, self._guarded_success), job, queue, *args, **kwargs)

    #: Does a successful end go without rq's WATCH and SMEMBERS of the job's dependents (:meth:`_guarded_success`)?
    lean_end: bool = True

    def _guarded_success(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        """rq's ``handle_job_success``, its WATCH and SMEMBERS of the job's dependents (two round trips) not sent:
        ``lua/end_guard.lua`` checks the set in the same write as the end's transaction, and stops it when the job
        has dependents (rq's end then runs as it always does and hands them over) or when this end was written
        already (a lost reply sent again: nothing is written twice). See
        :func:`rq_policies.engine.compat.guarded_end`."""
        record = super().handle_job_success  # type: ignore[misc]
        execution = kwargs.get('execution') or getattr(self, 'execution', None)  # rq 3's argument; rq 2.12's own
        connection = self.connection  # type: ignore[attr-defined]
        if not self.lean_end or execution is None or job.ended_at is None or keys.is_cluster(connection):
            return record(job, queue, *args, **kwargs)
        guard_key = keys.end_guard(job.id)
        guard = scripts.evalsha_commands('end_guard', connection, [
            job.dependents_key, job.key, job.started_job_registry.key, guard_key,
        ], [utcformat(job.ended_at), execution.composite_key, 1000])

        def unguarded(answer: Any) -> None:
            # The script cache was emptied (a restart, a failover, SCRIPT FLUSH): the end ran as if the job had no
            # dependents; any it has are handed over now, as rq's own hand-over without a pipeline does.
            scripts.forget('end_guard', connection)
            self.log.warning('rq-policies: the end guard of job %s did not run (%s); its dependents, if any, are '  # type: ignore[attr-defined]
                             'handed over after its end', job.id, answer)
            compat.hand_over_dependents(queue, job)

        with compat.guarded_end(connection, job.dependents_key, guard_key, guard, unguarded):
            return record(job, queue, *args, **kwargs)

    def handle_job_retry(self, job: Any, queue: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault('written', self._failure_written(kwargs.get('execution')))
        return self._record_end(_counted_once(self, job, super().handle_job_retry), job, queue, *args, **kwargs)  # type: ignore[misc]

    def perform_job(self, job: Any, queue: Any, *args: Any) -> Any:  # rq 3 passes the execution too
        if events.RUNS:  # a surface watches the job's run (tracing: rq_policies.surfaces.otel)
            return events.perform(super().perform_job, job, queue, *args)  # type: ignore[misc]
        return super().perform_job(job, queue, *args)  # type: ignore[misc]

    def teardown(self) -> None:
        try:
            self._drop_claim()
            self._release_now(self.release_grace_seconds)
            self._policy_fetcher.close()
        finally:
            super().teardown()  # type: ignore[misc]
