"""Every difference between the rq versions rq-policies supports (2.12 and 3.x), and every private rq name
rq-policies uses, in one place; and the redis-py internals it works around or builds on (its driver info, read per
connection; a pipeline's transaction send and its WATCH handling, for a job's guarded end: :func:`guarded_end`).

rq-policies subclasses rq's Queue, Job and Worker, and overrides some of their methods (private ones too, where rq or
django-rq calls them: ``Worker._finalize_failure``, ``Queue._enqueue_job``); those overrides stay in their classes.
Any other use of rq's private state or methods (``job._status``, ``queue._persist_job``, ...) goes through a small
function here, so that a change of rq's internals is fixed in this one file, and ``tests/contract/test_rq_contract.py``
pins what each of them assumes on rq 2.12 and 3.x (``tests/engine/test_architecture.py`` keeps the names out of other
modules).
"""

from __future__ import annotations

import inspect
from importlib import import_module
from typing import Any

import rq
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.worker import Worker

RQ_VERSION: tuple[int, ...] = tuple(int(part) for part in rq.__version__.split('.')[:2] if part.isdigit())
RQ3 = RQ_VERSION >= (3, 0)

_CREATE_JOB_PARAMS = frozenset(inspect.signature(Queue.create_job).parameters) - {'self'}


def create_job_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    """Keep the fields of an ``EnqueueData`` that this rq's ``Queue.create_job`` accepts."""
    return {key: value for key, value in data.items() if key in _CREATE_JOB_PARAMS}


def has_rate_limit(job: Any) -> bool:
    """rq 3 added ``RateLimit`` (``job.has_rate_limit``); rq 2.12 jobs never have one."""
    return bool(getattr(job, 'has_rate_limit', False))


#: rq 3 ends a job that raised in ``Worker._finalize_failure`` (failure callback, exception handlers, failure
#: handling); rq 2.12 has no such method and does the same steps inline in ``perform_job``.
LEGACY_FAILURE = not hasattr(Worker, '_finalize_failure')


#: rq 3's scheduler enqueues a due job under a ``RateLimit`` through rq's rate-limit registry
#: (``Queue._enqueue_rate_limited_job``); rq 2.12 has no rate limits. The fetch's promotion leaves such a job for rq's
#: scheduler (lua/lib/promote.lua).
SCHEDULER_RATE_LIMITS = RQ3

#: rq's key prefix: rq 3 reads the ``RQ_KEY_PREFIX`` environment variable once, when ``rq.defaults`` is imported
#: (default ``rq``), and builds every key of its own from it (``<prefix>:queue:<q>``, ``<prefix>:job:<id>``, its
#: classes' ``redis_*_namespace_prefix`` and registries' ``key_template`` are set at import time too). rq 2.12 has
#: no such setting: its keys always start ``rq:``, whatever the environment says, and so do ours there.
#: rq-policies follows rq: its keys are ``<prefix>:policies:...`` (:mod:`rq_policies.engine.keys`), read once at import.
KEY_PREFIX: str = getattr(import_module('rq.defaults'), 'RQ_KEY_PREFIX', 'rq') if RQ3 else 'rq'

# -- job statuses ------------------------------------------------------------------------------------------------

#: What each job status of rq 2.12 and 3.x means for a policy identity its job holds (a loner marker,
#: LimitedCapacityWorker's queued set): ``waiting`` (the job will run some day: it holds), ``running`` (it holds under
#: ``until='finished'`` while a live worker runs it) or ``ended`` (nothing will run it: the identity is free).
#: ``created`` is a hash saved without an enqueue (nothing pushes it); rq 3's ``ready_to_enqueue`` is a released
#: dependent between its deferred registry and its queue (rq's ``ReadyJobRegistry`` pushes it, at once or at its next
#: cleanup) and ``rate_limited`` a job waiting for a slot of its ``RateLimit``. The Lua side spells the same sets
#: (``lua/lib/holder_waiting.lua``, ``lua/lib/lcw_room.lua``, ``lua/release_markers.lua``);
#: tests/contract/test_rq_contract.py checks this table covers the installed rq's ``JobStatus`` and that the
#: scripts read each status by it.
STATUS_ROLE: dict[str, str] = {
    'created': 'ended',
    'queued': 'waiting',
    'scheduled': 'waiting',
    'deferred': 'waiting',  # while each parent can still release it (lua/lib/holder_waiting.lua)
    'ready_to_enqueue': 'waiting',  # rq 3
    'rate_limited': 'waiting',  # rq 3
    'started': 'running',
    'finished': 'ended',
    'failed': 'ended',
    'stopped': 'ended',
    'canceled': 'ended',
}

#: The statuses in which a job still waits to run (see STATUS_ROLE).
WAITING_STATUSES = frozenset(status for status, role in STATUS_ROLE.items() if role == 'waiting')


# -- rq's private state and methods, each behind one function ----------------------------------------------------------


def set_local_status(job: Job, status: JobStatus) -> None:
    """Set ``job``'s status on the object only, as rq's own enqueue does before it writes the hash (``job._status``;
    ``Job.set_status`` would also write it)."""
    job._status = status


def has_dependencies(job: Job) -> bool:
    """Does ``job`` wait for other jobs (``depends_on=``)? Read from the object (``job._dependency_ids``; the public
    ``Job.dependency_ids`` reads Redis, where a job being enqueued is not yet)."""
    return bool(job._dependency_ids)


def default_timeout(queue: Queue) -> Any:
    """The ``default_timeout`` the queue was built with (``queue._default_timeout``: rq has no public name for it)."""
    return queue._default_timeout


def enqueue_now(queue: Queue, job: Job, pipeline: Any = None, at_front: bool = False) -> Job:
    """rq's enqueue of ``job`` without looking at its dependencies (``Queue._enqueue_job``): status queued, the hash
    saved (meta included), the id pushed through ``queue.push_job_id``, all on ``pipeline`` when given."""
    return queue._enqueue_job(job, pipeline=pipeline, at_front=at_front)


def persist_job(queue: Queue, job: Job, pipeline: Any, status: JobStatus) -> None:
    """rq's write of a job's hash with ``status`` on ``pipeline`` (``Queue._persist_job``: status, save, TTLs)."""
    queue._persist_job(job, pipeline, status=status)


#: rq 3's start (``Worker.prepare_job_execution``) persists the job's hash; rq 2.12's does not.
START_PERSISTS = RQ3


def started_locally(worker: Any, job: Job, at: Any) -> None:
    """The job object's fields as rq's ``Job.prepare_for_execution`` sets them, for a start ``lua/start.lua`` wrote
    (``job._status``: rq has no setter that does not also write)."""
    job.worker_name = worker.name
    job.last_heartbeat = job.started_at = at
    job._status = JobStatus.STARTED


def current_job(worker: Any, job: Job, pipeline: Any) -> None:
    """Queue on ``pipeline`` what rq 2.12's start writes on the worker's hash besides (the current job and its
    working time); rq 3 keeps those in its executions, and writes none."""
    if not RQ3:
        worker.set_current_job_id(job.id, pipeline=pipeline)
        worker.set_current_job_working_time(0, pipeline=pipeline)


def given_id(job: Job) -> str | None:
    """``job``'s id if it has one yet, without generating one as ``job.id`` does (``job._id``, for a repr)."""
    return job._id


def started_executions(worker: Any, job: Job) -> list[Any]:
    """rq's Execution objects ``worker`` made for ``job`` (``prepare_execution``), taken off the worker: rq 3 keeps
    them in ``worker.executions`` (id -> Execution), rq 2.12 the last one as ``worker.execution``. Each is added to the
    worker before the pipeline that writes it runs, so one whose write failed is there too."""
    executions = getattr(worker, 'executions', None)
    if isinstance(executions, dict):
        found = [execution for execution in executions.values() if getattr(execution, 'job_id', None) == job.id]
        for execution in found:
            executions.pop(execution.id, None)
        return found
    execution = getattr(worker, 'execution', None)
    if execution is not None and getattr(execution, 'job_id', None) == job.id:
        worker.execution = None
        return [execution]
    return []


# -- redis-py ----------------------------------------------------------------------------------------------------------


def queued_commands(pipeline: Any) -> tuple[list[tuple[Any, dict]], bool]:
    """The commands queued on ``pipeline`` (args, options) and whether it is in an explicit transaction
    (``multi()``): what :func:`queue_again` puts back to send the same again after an ``execute()`` that failed
    (redis-py resets a pipeline whatever the outcome). A cluster pipeline keeps its commands in its execution
    strategy (``_execution_strategy.command_queue``); its ``command_stack`` stays empty."""
    strategy = getattr(pipeline, '_execution_strategy', None)
    if strategy is not None:
        return ([(command.args, dict(command.options)) for command in strategy.command_queue],
                bool(getattr(strategy, '_explicit_transaction', False)))
    return [(args, dict(options)) for args, options in pipeline.command_stack], bool(pipeline.explicit_transaction)


def queue_again(pipeline: Any, queued: tuple[list[tuple[Any, dict]], bool]) -> None:
    """Queue on ``pipeline`` (reset since) what :func:`queued_commands` read from it."""
    commands, explicit = queued
    if getattr(pipeline, '_execution_strategy', None) is not None:
        if explicit:
            pipeline.multi()
        for args, options in commands:
            pipeline.execute_command(*args, **options)
        return
    pipeline.command_stack, pipeline.explicit_transaction = [(args, dict(options)) for args, options in commands], \
        explicit


def resolve_driver_info_once(connection: Any) -> None:
    """Resolve redis-py's client name and version once, for every connection ``connection``'s pool opens from now on.

    redis-py 7 and later look their own version up (``importlib.metadata``: the package's METADATA file read and
    parsed) in every new ``Connection``, to send it with CLIENT SETINFO. A forking worker's work horse opens a new
    connection for every job (the pool is reset after a fork), so that lookup cost each job about 2 ms of CPU, more
    than anything the policies add. The pool now carries the resolved ``DriverInfo``, the value each connection would
    have built for itself: the server sees the same name and version. A pool given a name, a version or its own
    driver info, one whose connections are not redis-py's, fakeredis (its server lives in this process) and a redis-py
    without ``DriverInfo`` are left alone.
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
    if not issubclass(connection_class, AbstractConnection) or type(connection).__module__.startswith('fakeredis'):
        return
    if kwargs.keys() & {'driver_info', 'lib_name', 'lib_version'}:
        return
    kwargs['driver_info'] = DriverInfo()



# -- the work horse's connection -----------------------------------------------------------------------------------
#
# redis-py's ConnectionPool resets itself in a forked child (its ``_checkpid``), so every work horse of a forking
# worker opens a connection of its own: a TCP connect, redis-py's handshake (HELLO, CLIENT SETINFO twice) and a close,
# per job, about 100 us of the server's CPU (measured on Valkey 9: bench/life.py). The worker instead makes one
# connection that it never uses itself and hands it to each horse in turn. A horse and its worker never use it at
# once (the worker waits for its horse), and the worker hands it on only after a horse that exited normally and with
# nothing left to read on it; any other end (killed, stopped by signal, exit code not 0, reaped elsewhere) closes it.
# Plain TCP and Unix-socket connections of redis-py's own ConnectionPool only: a TLS session's state lives in the
# process that used it last, and other pools (Sentinel's, a cluster's, a blocking pool, client-side caching) manage
# their connections in ways this does not follow; those horses connect as rq's do.


def horse_connection(connection: Any) -> Any | None:
    """A connection for the next work horse, made and connected in the worker (outside its pool's count), or None
    where it cannot be handed to a horse safely (see above), or when connecting fails (the horse then connects as
    rq's do)."""
    try:
        from redis.connection import Connection, ConnectionPool, UnixDomainSocketConnection
    except ImportError:  # pragma: no cover - redis-py always has them
        return None
    pool = getattr(connection, 'connection_pool', None)
    if type(pool) is not ConnectionPool or getattr(pool, 'cache', None) is not None:
        return None
    if pool.connection_class not in (Connection, UnixDomainSocketConnection):
        return None
    if not all(hasattr(pool, name) for name in ('_available_connections', '_created_connections', '_checkpid',
                                                '_lock', 'pid')):
        return None
    made = pool.connection_class(**pool.connection_kwargs)
    try:
        made.connect()
    except Exception:  # noqa: BLE001 - the horse connects by itself, and meets the error there as rq's would
        made.disconnect()
        return None
    return made


def horse_connection_clean(made: Any) -> bool:
    """May the worker hand ``made`` to its next horse: connected, nothing left to read on it (a reply the last horse
    did not read, or the server's close)?"""
    try:
        return getattr(made, '_sock', None) is not None and not made.can_read(timeout=0)
    except Exception:  # noqa: BLE001 - a socket that cannot be read is not handed on
        return False


def adopt_horse_connection(connection: Any, made: Any) -> None:
    """In the work horse: reset the pool for this process (as redis-py would at its first command) and put ``made``
    in it, owned by this process, so the job and rq's bookkeeping use it instead of opening one."""
    pool = connection.connection_pool
    pool._checkpid()
    made.pid = pool.pid
    with pool._lock:
        pool._available_connections.append(made)
        pool._created_connections += 1


#: Seconds the worker's command-channel thread (rq's ``subscribe``) waits for a message before it looks at its stop
#: flag. rq starts it with 60: since redis-py 8.2 ``PubSubWorkerThread.stop()`` joins the thread, and rq's
#: ``unsubscribe`` calls it without a timeout, so a worker's shutdown waited up to 60 s (a burst worker's exit too).
#: At 1 s, a burst worker exited after its queue ran dry within 1 s only 33 times in 50 (issue 34 asks every time);
#: each look is a wait on the socket, no command to the server.
PUBSUB_WAIT_SECONDS = 0.2


#: rq's worker command channel, before the worker's name: ``rq.command.PUBSUB_CHANNEL_TEMPLATE`` (``'rq:pubsub:%s'`` on
#: rq 2.12, ``RQ_KEY_PREFIX + ':pubsub:%s'`` on rq 3). Each worker SUBSCRIBEs (plain, not sharded) to its own channel;
#: ``Loner(on_conflict='cancel')`` PUBLISHes rq's stop-job command there from its admission script (a channel is no
#: key: a script may publish on any, and on a Redis Cluster a PUBLISH reaches every node's subscribers).
STOP_CHANNEL_PREFIX: str = import_module('rq.command').PUBSUB_CHANNEL_TEMPLATE % ''


#: rq's stop-job command word (``rq.command.send_stop_job_command`` publishes ``{"command": "stop-job", "job_id": id}``
#: as JSON on :data:`STOP_CHANNEL_PREFIX` + the job's ``worker_name``). The admission script builds the same map with
#: ``cjson.encode`` (lua/policies/loner.lua); the worker acts on it only while it runs that job
#: (``handle_stop_job_command``), so a stop sent again after the job ended, or to a worker now running another, does
#: nothing.
STOP_JOB_COMMAND = 'stop-job'


def subscribe(worker: Any) -> None:
    """rq's ``Worker.subscribe`` (the command channel: stop-job, shutdown, kill-horse), with its thread waking every
    :data:`PUBSUB_WAIT_SECONDS` instead of 60, so ``unsubscribe`` ends within a fifth of a second. The exception handler
    is rq's own (private in rq 2.12 and 3.x)."""
    worker.log.info('Worker %s: subscribing to channel %s', worker.name, worker.pubsub_channel_name)
    worker.pubsub = worker.connection.pubsub()
    worker.pubsub.subscribe(**{worker.pubsub_channel_name: worker.handle_payload})
    worker.pubsub_thread = worker.pubsub.run_in_thread(
        sleep_time=PUBSUB_WAIT_SECONDS, daemon=True, exception_handler=worker._pubsub_exception_handler
    )


def adopt_job(job: Any, job_class: type) -> Any:
    """``job`` as an instance of ``job_class`` when it is a plain instance of one of its bases (a stock rq ``Job``
    from ``Job.fetch``, a registry, rq-dashboard or django-rq's admin handed to a PolicyQueue); anything else as it is.

    rq's Queue and registries turn a job into its id only when it is an instance of their ``job_class``
    (``isinstance(job, self.job_class)``), so a stock ``Job`` reached Redis as an object (``DataError: Invalid input of
    type: 'Job'``), as in ``PolicyQueue(...)._enqueue_job(Job.fetch(id))``. The object is re-classed in place, which is
    sound only for a class that adds no state of its own: rq-policies' classes (``PolicyJob``), never a user's subclass
    (a queue with a ``job_class`` of your own takes jobs of that class, as rq's does). In place, so the caller's object
    sees what the enqueue sets on it (status, origin, enqueued_at), as with stock rq; and, being a ``PolicyJob`` now,
    its ``delete()``/``cancel()`` free its loner identity.
    """
    if type(job) is job_class or not isinstance(job, Job) or isinstance(job, job_class):
        return job
    if not issubclass(job_class, type(job)):
        return job
    for klass in job_class.__mro__:
        if klass is type(job):
            break
        if not klass.__module__.startswith('rq_policies') or '__slots__' in vars(klass):
            return job
    job.__class__ = job_class
    return job


# -- Redis Cluster: what rq 3's classes assume of a connection that redis-py's RedisCluster does not give ------------


class _NodesPool:
    """What rq reads of ``connection.connection_pool`` (``Worker._set_connection`` raises the socket timeout in its
    ``connection_kwargs``; the worker checks its ``connection_class`` for TLS): a cluster's are its nodes' shared
    ones, which every connection the client opens from then on is made with."""

    def __init__(self, cluster: Any) -> None:
        self.connection_kwargs = cluster.nodes_manager.connection_kwargs
        from redis.connection import Connection, SSLConnection

        self.connection_class = self.connection_kwargs.get(
            'connection_class', SSLConnection if self.connection_kwargs.get('ssl') else Connection)


#: How long a call on an adopted Redis Cluster client (:func:`adopt_cluster`) keeps trying while the prefix's slot is
#: being migrated to another node, in seconds. A script (every door, every fetch) or a transaction over keys of the
#: slot cannot run until the slot has settled on its new node (the server answers ``TRYAGAIN`` while the keys are
#: split, and every script of ours names :data:`rq_policies.engine.keys.SLOT_GUARD`, which exists nowhere), so the call
#: is sent again, first after 10 ms and then at most every 250 ms (redis-py's own attempts take about 0.4 s each), up to
#: this long; then :class:`rq_policies.engine.exceptions.SlotMigrating` is raised (a ``ConnectionError``: nothing of the
#: call ran). A client's own ``slot_wait_seconds`` attribute wins. A PolicyWorker rides out a longer migration as it
#: rides out an outage.
SLOT_WAIT_SECONDS = 10.0


def slot_moving(error: BaseException) -> bool:
    """Did a Redis Cluster refuse a call because its slot is being migrated (or moved), without running any of it?

    ``TRYAGAIN`` (a multi-key command or a script whose keys are split between the two nodes, or missing on one),
    ``ASK`` and ``MOVED`` (a transaction or a pipeline cannot follow them) and redis-py's ``ClusterError: TTL
    exhausted`` (it followed such answers 16 times and gave up): the server refused each before running anything."""
    from redis.exceptions import AskError, ClusterError, TryAgainError

    if isinstance(error, (TryAgainError, AskError)):  # MovedError is an AskError
        return True
    return isinstance(error, ClusterError) and 'TTL exhausted' in str(error)


class SlotWait:
    """The pauses of one call while its slot is being migrated: :meth:`pause` says how long to sleep before the next
    attempt, or raises :class:`~rq_policies.engine.exceptions.SlotMigrating` once ``seconds`` have passed since the
    first refusal."""

    __slots__ = ('seconds', 'since', 'delay')

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.since: float | None = None
        self.delay = 0.01

    def pause(self, error: BaseException) -> float:
        import time

        from .exceptions import SlotMigrating

        now = time.monotonic()
        if self.since is None:
            self.since = now
        waited = now - self.since
        if waited >= self.seconds:
            raise SlotMigrating(waited, error) from error
        delay, self.delay = self.delay, min(self.delay * 2, 0.25)
        return min(delay, self.seconds - waited)


def _cluster_classes() -> tuple[type, type] | None:
    try:
        from redis.cluster import ClusterPipeline, RedisCluster
        from redis.exceptions import WatchError
    except ImportError:  # pragma: no cover - redis-py always has it since 4.1
        return None
    import threading
    import time

    #: Set while redis-py splits a multi-key command by slot (DEL, EXISTS, MGET...) through ``self.pipeline()``: its
    #: own pipelines are not transactions (and one that is cannot follow ASK during a migration).
    splitting = threading.local()

    class PolicyClusterPipeline(ClusterPipeline):
        """redis-py's cluster pipeline, with EVAL and EVALSHA sent as any other command (redis-py lists EVALSHA as a
        command a pipeline cannot route, and its ``eval`` takes no script): each is routed by its first key, which a
        hash-tagged prefix puts in the one slot every other command of the pipeline uses. Keyless commands (TIME,
        INFO, PUBLISH, WAIT...) stay refused: none of ours or rq's rides a cluster pipeline (the server's clock is
        read by :func:`rq_policies.engine.ops.time_in`, the eviction watch's INFO goes to the slot's primary on its
        own).

        ``execute()`` rides out a migration of the slot (:func:`slot_moving`, up to :data:`SLOT_WAIT_SECONDS`): a
        transaction the server refused ran none of its commands and is sent again whole; one that WATCHes a key
        raises ``WatchError`` after the pause instead, so the caller's own loop (rq's) watches and reads again; in a
        pipeline that is not a transaction, only the commands refused are sent again."""

        slot_wait_seconds = SLOT_WAIT_SECONDS
        _slot_since: float | None = None  # a watched transaction's first refusal, across the caller's retries

        def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
            return self.execute_command('EVALSHA', sha, numkeys, *keys_and_args)

        def eval(self, script: Any, numkeys: int, *keys_and_args: Any) -> Any:  # type: ignore[override]
            return self.execute_command('EVAL', script, numkeys, *keys_and_args)

        # What rq reads of a redis.client.Pipeline (rq 3: queue.move_dependents_to_ready, worker, job): the same
        # state, kept by the transaction strategy of redis-py's cluster pipeline.
        @property
        def watching(self) -> bool:
            return bool(getattr(self._execution_strategy, '_watching', False))

        @property
        def explicit_transaction(self) -> bool:
            return bool(getattr(self._execution_strategy, '_explicit_transaction', False))

        def watch(self, *names: Any) -> Any:
            # WATCH goes out at once; refused (ASK for a key not on the source node any more, which a transaction
            # cannot follow), it watches nothing, and is sent again until the slot settles (rq WATCHes every job's
            # dependents key, which rarely exists, as it finishes the job).
            wait = SlotWait(self.slot_wait_seconds)
            while True:
                try:
                    return super().watch(*names)
                except Exception as exc:
                    if not slot_moving(exc):
                        raise
                    pause = wait.pause(exc)
                    self.reset()
                    time.sleep(pause)

        def execute(self, raise_on_error: bool = True) -> list[Any]:
            strategy = self._execution_strategy
            queued = [(command.args, dict(command.options)) for command in strategy.command_queue]
            if not hasattr(strategy, '_watching'):  # not a transaction
                return self._execute_settling(queued, raise_on_error)
            watching = self.watching
            wait = SlotWait(self.slot_wait_seconds)
            if watching and self._slot_since is not None:
                wait.since = self._slot_since
            while True:
                try:
                    replies = super().execute(raise_on_error)
                except Exception as exc:
                    if not slot_moving(exc):
                        raise
                    try:
                        pause = wait.pause(exc)
                    finally:
                        self._slot_since = wait.since if watching else None
                    time.sleep(pause)
                    if watching:  # the WATCH went with the refused EXEC: the caller watches and reads again
                        raise WatchError(f'the slot is being migrated ({exc}); watch again') from exc
                    for args, options in queued:  # none of it ran: the same transaction again
                        self.execute_command(*args, **options)
                    continue
                self._slot_since = None
                return replies

        def _execute_settling(self, queued: list[tuple[Any, dict]], raise_on_error: bool) -> list[Any]:
            replies = list(super().execute(raise_on_error=False))
            wait = SlotWait(self.slot_wait_seconds)
            while True:
                refused = [i for i, reply in enumerate(replies) if isinstance(reply, Exception) and slot_moving(reply)]
                if not refused:
                    break
                try:
                    pause = wait.pause(replies[refused[0]])
                except Exception as exc:  # SlotMigrating, in place of each refusal
                    for i in refused:
                        replies[i] = exc
                    break
                time.sleep(pause)
                for i in refused:  # each ran nowhere: sent again alone
                    args, options = queued[i]
                    self.execute_command(*args, **options)
                for i, reply in zip(refused, super().execute(raise_on_error=False)):
                    replies[i] = reply
            if raise_on_error:
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
            return replies

    class PolicyCluster(RedisCluster):
        """redis-py's RedisCluster as rq 3's classes use a connection (see :func:`adopt_cluster`)."""

        #: See :data:`SLOT_WAIT_SECONDS`; set it on a client to wait longer or shorter for a migrating slot.
        slot_wait_seconds = SLOT_WAIT_SECONDS

        @property
        def connection_pool(self) -> _NodesPool:
            return _NodesPool(self)

        def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
            # redis.Redis's pipelines are transactions unless asked otherwise, and rq relies on it: finishing a job
            # WATCHes its dependents key, which redis-py's cluster pipeline refuses outside a transaction. On a
            # cluster a transaction must stay in one slot: every key of rq and of ours is in the prefix's.
            if transaction is None:
                transaction = not getattr(splitting, 'active', False)
            pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
            pipe.__class__ = PolicyClusterPipeline
            pipe.slot_wait_seconds = self.slot_wait_seconds
            return pipe

        def _execute_pipeline_by_slot(self, *args: Any, **kwargs: Any) -> Any:
            splitting.active = True
            try:
                return super()._execute_pipeline_by_slot(*args, **kwargs)  # type: ignore[misc]
            finally:
                splitting.active = False

        def execute_command(self, *args: Any, **kwargs: Any) -> Any:
            # A command refused while the slot migrates ran nowhere (slot_moving): sent again until it settles, or
            # SlotMigrating (a ConnectionError) past slot_wait_seconds.
            wait = None
            while True:
                try:
                    return super().execute_command(*args, **kwargs)
                except Exception as exc:
                    if not slot_moving(exc):
                        raise
                    wait = wait or SlotWait(self.slot_wait_seconds)
                    time.sleep(wait.pause(exc))

    return PolicyCluster, PolicyClusterPipeline


_CLUSTER_CLASSES = _cluster_classes()


def adopt_cluster(connection: Any) -> Any:
    """A redis-py ``RedisCluster`` made usable by rq 3's Queue and Worker, in place; any other connection as it is.

    rq 3 runs on a cluster for its Queue, but its Worker does not: ``Worker._set_connection`` reads
    ``connection.connection_pool`` (a cluster client has one pool per node, and no such attribute), and finishing a
    job WATCHes a key in ``connection.pipeline()``, which a cluster pipeline allows only in a transaction (redis.Redis's
    pipelines are transactions by default, RedisCluster's are not). The client is re-classed in place to a subclass
    that adds no state: ``connection_pool`` (the nodes' shared connection settings, :class:`_NodesPool`) and
    ``pipeline()`` defaulting to a transaction, whose ``eval`` and ``evalsha`` are sent like any other command
    (redis-py's cluster pipeline refuses them by name). Its commands and pipelines also ride out a migration of the
    prefix's slot to another node, up to :data:`SLOT_WAIT_SECONDS` (see :func:`slot_moving`). In place, as
    :func:`adopt_job` does, so that the caller's object, rq's worker and our classes share one client. rq's own
    scheduler (``--with-scheduler``) and worker pool build a connection of their own from ``connection_pool`` and
    are not supported on a cluster: a PolicyWorker's fetch promotes due scheduled jobs itself.
    """
    if _CLUSTER_CLASSES is None:
        return connection
    cluster_class, _ = _CLUSTER_CLASSES
    from redis.cluster import RedisCluster

    if type(connection) is RedisCluster:
        connection.__class__ = cluster_class
    return connection


# -- a job's successful end without rq's WATCH and SMEMBERS round trips ----------------------------------------------
#
# rq's handle_job_success opens a pipeline, WATCHes the job's dependents set and reads it (SMEMBERS), two round trips
# each sent at once (redis-py sends every command of a watching pipeline immediately), then queues its end-of-run
# transaction. A PolicyWorker gives it a pipeline (:func:`guarded_end`) that answers that WATCH and that SMEMBERS
# without sending them ("no dependents") and sends, in front of the transaction and in the same write, the WATCH and
# ``lua/end_guard.lua``, which checks the set right there: when the job has dependents it stops the EXEC (a write of
# a key the connection WATCHes), redis-py raises rq's WatchError, and rq's loop builds its end again the way it always
# does (the pipeline then sends its WATCH and SMEMBERS: rq's hand-over of the dependents, unchanged). A dependent
# added by another client after the WATCH stops the EXEC as it does for rq. redis-py's plain ``Pipeline`` only (its
# ``_execute_transaction(connection, commands, raise_on_error)``); a cluster's, fakeredis's and any other pipeline
# keep rq's round trips.


#: Bytes up to which :class:`_Prefixed` joins its write into one buffer.
_JOINED_MAX = 65536


class _Prefixed:
    """``connection`` whose next packed send goes out after ``prefix``'s commands in the same write; their replies
    (``answers``, an error as its exception) are read before the first reply its reader asks for."""

    def __init__(self, connection: Any, prefix: tuple) -> None:
        self._connection, self._prefix = connection, prefix
        self.answers: list[Any] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        chunks = [*self._connection.pack_commands(self._prefix),
                  *([command] if isinstance(command, (bytes, str, memoryview)) else command)]
        if sum(len(chunk) for chunk in chunks) <= _JOINED_MAX and not any(isinstance(c, str) for c in chunks):
            chunks = [b''.join(chunks)]  # one segment on the wire: redis-py writes each chunk with a sendall of its own
        self._connection.send_packed_command(chunks, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        if self.answers is None:
            from redis.exceptions import ResponseError

            self.answers = []
            for _ in self._prefix:
                try:
                    self.answers.append(self._connection.read_response())
                except ResponseError as exc:
                    self.answers.append(exc)
        return self._connection.read_response(*args, **kwargs)


#: :class:`GuardedEnd`'s answers from ``lua/end_guard.lua``.
END_RUNS, END_HAS_DEPENDENTS, END_WRITTEN = 0, 1, 2


class GuardedEnd:
    """Mixed in front of the class of the pipeline rq's ``handle_job_success`` builds (:func:`guarded_end`).

    ``end_guard`` is ``(dependents key, the guard's own key, the guard's commands (its EVALSHA last, after a SCRIPT
    LOAD if needed), what to call when the guard did not run but the EXEC did)``: when the script cache was emptied
    (a restart, a failover, SCRIPT FLUSH), the guard answers NOSCRIPT and the transaction runs as if the job had no
    dependents, so the caller hands them over after it, as rq does when it has no pipeline.

    States: ``armed`` (the next WATCH of the dependents set is not sent), ``deferred`` (watched without a round
    trip), ``watched`` (an unexpected command under the WATCH sent it after all: the guard still rides the EXEC),
    ``spent`` (the job has dependents: rq's own round trips from now on).
    """

    end_guard: tuple = ()
    end_state = 'armed'
    #: The guard's answer at the last EXEC (``END_*``; an exception if the script failed, None if not read).
    end_answer: Any = None
    #: The commands the running ``execute`` sends before the transaction's MULTI (read by bench/commands.py's count).
    sent_before: tuple = ()

    def watch(self, *names: Any) -> Any:
        if self.end_state == 'armed' and self.end_guard and names == (self.end_guard[0],) and \
                not self.explicit_transaction and not self.command_stack:  # type: ignore[attr-defined]
            self.end_state, self.watching = 'deferred', True
            return True
        return super().watch(*names)  # type: ignore[misc]

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        if self.end_state == 'deferred':
            if str(args[0]).upper() == 'SMEMBERS' and tuple(args[1:]) == (self.end_guard[0],):
                return set()  # checked by the guard right before the EXEC, under the WATCH
            self.end_state = 'watched'
            super().immediate_execute_command('WATCH', self.end_guard[0])  # type: ignore[misc]
        return super().immediate_execute_command(*args, **options)  # type: ignore[misc]

    def execute(self, raise_on_error: bool = True) -> Any:
        if self.end_state not in ('deferred', 'watched') or not self.explicit_transaction:  # type: ignore[attr-defined]
            return super().execute(raise_on_error)  # type: ignore[misc]
        dependents, key, guard, unguarded = self.end_guard
        self.sent_before = (*guard[:-1], ('WATCH', dependents, key), guard[-1])
        self.end_answer = None
        try:
            replies = super().execute(raise_on_error)  # type: ignore[misc]
        except Exception:
            # The job has dependents: rq's loop builds its end again, with its own round trips. Anything else (a
            # dependent added after the WATCH, a connection lost with the reply): guarded again, and a transaction
            # already applied is then not applied twice (END_WRITTEN).
            self.end_state = 'spent' if self.end_answer == END_HAS_DEPENDENTS else 'armed'
            raise
        finally:
            self.sent_before = ()
        if isinstance(self.end_answer, Exception):  # the guard did not run (NOSCRIPT): the EXEC ran unguarded
            unguarded(self.end_answer)
        return replies

    def _disconnect_raise_on_watching(self, *args: Any, **kwargs: Any) -> Any:
        # The WATCH goes in the same write as the transaction: a connection lost is an error of its own, not
        # redis-py's WatchError for a WATCH lost with its connection (which rq's loop would take for a change of the
        # dependents, and send its end again unguarded); a resend of this write finds it written or not (the guard).
        if not self.sent_before:
            return super()._disconnect_raise_on_watching(*args, **kwargs)  # type: ignore[misc]
        watching, self.watching = self.watching, False
        try:
            return super()._disconnect_raise_on_watching(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.watching = watching

    def _execute_transaction(self, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        if not self.sent_before:
            return super()._execute_transaction(connection, commands, raise_on_error)  # type: ignore[misc]
        prefixed = _Prefixed(connection, self.sent_before)
        try:
            return super()._execute_transaction(prefixed, commands, raise_on_error)  # type: ignore[misc]
        except Exception as exc:
            from redis.exceptions import WatchError

            if isinstance(exc, WatchError) and prefixed.answers and prefixed.answers[-1] == END_WRITTEN:
                return [None] * len(commands)  # this end was written (a reply lost): nothing more to send
            raise
        finally:
            self.end_answer = prefixed.answers[-1] if prefixed.answers else None


_guarded_classes: dict[type, type] = {}


def guarded_end(connection: Any, dependents: str, key: str, guard: tuple, unguarded: Any) -> Any:
    """A context in which the next ``connection.pipeline()`` (rq's ``handle_job_success``'s) is a :class:`GuardedEnd`
    with ``end_guard = (dependents, key, guard, unguarded)`` (``guard``: the commands that run ``lua/end_guard.lua``,
    whose KEYS[4] is ``key``), where the pipeline is
    redis-py's plain ``Pipeline`` (or a subclass); any other pipeline comes back as it is."""
    import contextlib

    from redis.client import Pipeline

    @contextlib.contextmanager
    def context() -> Any:
        def one(*args: Any, **kwargs: Any) -> Any:
            connection.__dict__.pop('pipeline', None)  # once: every other pipeline is the client's own
            pipe = connection.pipeline(*args, **kwargs)
            kind = type(pipe)
            made_by = getattr(getattr(pipe, 'connection_pool', None), 'connection_class', None)
            if not isinstance(pipe, Pipeline) or getattr(pipe, '_execution_strategy', None) is not None or \
                    made_by is None or made_by.__module__.startswith('fakeredis'):
                return pipe
            guarded = _guarded_classes.get(kind)
            if guarded is None:
                guarded = _guarded_classes[kind] = type(f'Guarded{kind.__name__}', (GuardedEnd, kind), {})
            pipe.__class__ = guarded
            pipe.end_guard = (dependents, key, guard, unguarded)
            return pipe

        connection.pipeline = one
        try:
            yield
        finally:
            connection.__dict__.pop('pipeline', None)

    return context()


def hand_over_dependents(queue: Any, job: Any) -> None:
    """rq's hand-over of ``job``'s dependents after its end, outside the end's transaction (with rq's own WATCH
    loop): rq 3's ``move_dependents_to_ready`` and ``enqueue_ready_jobs_by_queue``, rq 2.12's
    ``enqueue_dependents``."""
    if RQ3:
        queue.enqueue_ready_jobs_by_queue(queue.move_dependents_to_ready(job))
    else:
        queue.enqueue_dependents(job)
