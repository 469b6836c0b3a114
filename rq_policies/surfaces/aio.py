"""asyncio doors: :class:`AsyncPolicyQueue`, the enqueue doors of :class:`rq_policies.PolicyQueue` on
``redis.asyncio``.

::

    from redis.asyncio import Redis
    from rq_policies.surfaces.aio import AsyncPolicyQueue

    q = AsyncPolicyQueue('emails', connection=Redis())
    job = await q.enqueue(send_welcome, user_id)          # -> Job, or None when a policy drops it
    await q.enqueued(send_welcome, user_id)               # and holder, force, reset, enqueue_at/in, enqueue_many
    why = await q.explain(job.id)

This module is the door core's asyncio driver: each door runs the synchronous door itself inside
:func:`rq_policies.engine.queue.planning` (rq's job build, the policies, the core's plan of the one script call, the
narrow script's or ``lua/admit.lua``'s: CPU only, on the event loop), on a PolicyQueue whose connection refuses any
use (:class:`AsyncDoorError`), then awaits that call and hands the reply to the same core. So its verdicts, errors and
replay safety are the synchronous door's. What differs (no hint probe; rq's own synchronous paths refused:
``depends_on=``, ``pipeline=``, ``unique=True``, ``rate_limit=``, ``ttl=0``, ``is_async=False``; ``explain`` in a
thread), cancellation (whole job or nothing, and how to learn which) and the connections it takes:
docs/asyncio.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import NoScriptError
from rq.job import Job

from rq_policies.engine import admission, compat, keys, scripts
from rq_policies.engine.admission import Plan
from rq_policies.engine.exceptions import InvalidArgument, PipelineNotSupported, PolicyError
from rq_policies.engine.keys import is_cluster
from rq_policies.engine.ops import Call, text
from rq_policies.engine.queue import DECLARED, PolicyQueue, call_digest, declared_for, door_spec, planning
from rq_policies.policies.loner import rules as loner

__all__ = ['AsyncPolicyQueue', 'AsyncDoorError', 'run_call']


class AsyncDoorError(PolicyError, NotImplementedError):
    """An async door was asked for something only rq's synchronous path does (its message names it)."""

    def __init__(self, queue: str, what: str):
        self.queue = queue
        super().__init__(
            f'AsyncPolicyQueue({queue!r}): {what} takes rq\'s own synchronous path, which an asyncio door cannot '
            'run without blocking the event loop; use rq_policies.PolicyQueue for it'
        )


class _SyncOnly:
    """The builder queue's ``connection``: any synchronous Redis use raises :class:`AsyncDoorError` at once."""

    def __init__(self, queue: str) -> None:
        self._queue = queue

    def __getattr__(self, name: str) -> Any:
        if name.startswith('__'):
            raise AttributeError(name)
        raise AsyncDoorError(self._queue, f'this call (it reached connection.{name}: depends_on=, pipeline=, '
                                          'unique=True, rate_limit=, ttl=0 or an rq option this door does not know)')

    def __bool__(self) -> bool:  # rq tests ``if not connection``
        return True


def _no_replicas(queue: str, kwargs: dict[str, Any]) -> None:
    """The synchronous doors' ``wait_replicas=`` (a WAIT after the admission) is not in the asyncio doors: refused,
    rather than handed to the job's function as its own argument."""
    for name in ('wait_replicas', 'wait_timeout_ms'):
        if name in kwargs:
            raise AsyncDoorError(queue, f'{name}= (waiting for replicas after the admission)')


async def run_call(call: Call, client: Any) -> Any:
    """Send one script call on an asyncio client: EVALSHA, then EVAL with the source when the server answers
    NOSCRIPT (the script did not run, so sending it again is safe). A reply lost on the way is resent by the
    connection's retry; every script that writes is safe to run twice.

    On a client with a connection pool the command is packed in one pass (``scripts.pack_command``, as the
    synchronous doors pack theirs: redis-py's packer costs about 0.85 us an argument, and the narrow admission's
    flat arguments, the job's fields, would cost it 40 us more a call) and sent on a connection of the pool, with
    that connection's retry, as redis-py's own command path does. A single-connection client and a cluster client (a
    pool per node) take redis-py's path; on a Redis Cluster a call refused while the prefix's slot migrates is sent
    again until it settles (:data:`rq_policies.engine.compat.SLOT_WAIT_SECONDS`)."""
    found = scripts.script(call.script)
    call_keys, argv = call.keys, call.argv()
    pool = getattr(client, 'connection_pool', None)
    if pool is not None and not getattr(client, 'single_connection_client', False):
        connection = await pool.get_connection()
        try:
            try:
                return await _sent(connection, ('EVALSHA', found.sha, len(call_keys), *call_keys, *argv))
            except NoScriptError:
                return await _sent(connection, ('EVAL', found.script, len(call_keys), *call_keys, *argv))
        finally:
            await pool.release(connection)
    wait = None
    if is_cluster(client):  # as scripts.run: never run while the slot migrates (keys.SLOT_GUARD) ...
        call_keys = [*call_keys, keys.SLOT_GUARD]
    while True:
        try:
            try:
                return await client.evalsha(found.sha, len(call_keys), *call_keys, *argv)
            except NoScriptError:
                return await client.eval(found.script, len(call_keys), *call_keys, *argv)
        except Exception as exc:
            # ... and ride the migration out as the synchronous adopted client does (compat.adopt_cluster): a call
            # the server refused ran nowhere; SlotMigrating past slot_wait_seconds.
            if not compat.slot_moving(exc):
                raise
            wait = wait or compat.SlotWait(float(getattr(client, 'slot_wait_seconds', compat.SLOT_WAIT_SECONDS)))
            await asyncio.sleep(wait.pause(exc))


async def _sent(connection: Any, command: tuple) -> Any:
    """``command``'s reply on ``connection``, through the connection's own retry (a connection error closes it, and
    the command goes again on a new one). An interrupted send or read (a cancellation) closes the connection inside
    redis-py, so an unread reply is never read as another command's."""
    packed = scripts.pack_command(connection, command)

    async def once() -> Any:
        await connection.send_packed_command(packed)
        return await connection.read_response()

    return await connection.retry.call_with_retry(once, lambda error: connection.disconnect())


class AsyncPolicyQueue:
    """The enqueue doors of :class:`rq_policies.PolicyQueue`, awaited on a ``redis.asyncio`` client.

    Args:
        name: the queue's name (the same queue in Redis as ``PolicyQueue(name)``).
        connection: a ``redis.asyncio.Redis`` (required).
        job_class: as rq's ``Queue``.
        serializer: as rq's ``Queue``.
        default_timeout: as rq's ``Queue``.
        sync_connection: a synchronous ``redis.Redis`` for :meth:`explain` (optional: one is made from
            ``connection``'s settings when needed; required for a Sentinel-managed client).
    """

    def __init__(self, name: str = 'default', connection: Any = None, job_class: Any = None, serializer: Any = None,
                 default_timeout: int | None = None, sync_connection: Any = None, **kwargs: Any) -> None:
        if connection is None:
            raise InvalidArgument(
                'connection', message='AsyncPolicyQueue: connection is required, pass '
                                      'connection=redis.asyncio.Redis(...)')
        if not hasattr(connection, 'evalsha') or not asyncio.iscoroutinefunction(
                getattr(type(connection), 'execute_command', None)):
            raise InvalidArgument(
                'connection', message=f'AsyncPolicyQueue: connection must be a redis.asyncio client, got '
                                      f'{connection!r}')
        if kwargs.get('is_async') is False:
            raise AsyncDoorError(name, 'is_async=False (the job runs in the caller)')
        _no_replicas(name, kwargs)
        self.connection = connection
        self.sync_connection = sync_connection
        options: dict[str, Any] = {'connection': _SyncOnly(name), **kwargs}
        if job_class is not None:
            options['job_class'] = job_class
        if serializer is not None:
            options['serializer'] = serializer
        if default_timeout is not None:
            options['default_timeout'] = default_timeout
        self._queue = PolicyQueue(name, **options)
        self._version_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f'AsyncPolicyQueue({self.name!r})'

    @property
    def name(self) -> str:
        return self._queue.name

    @property
    def key(self) -> str:
        return self._queue.key

    @property
    def job_class(self) -> type[Job]:
        return self._queue.job_class

    # -- the doors ------------------------------------------------------------------------------------------------

    async def enqueue(self, f: Any, *args: Any, **kwargs: Any) -> Job | None:
        """rq's ``enqueue`` with ``policy=``, awaited: the Job, or None when a policy dropped it."""
        return await self._through(self._queue.enqueue, f, *args, **kwargs)

    async def enqueue_call(self, func: Any, *args: Any, policy: Any = DECLARED, **kwargs: Any) -> Job | None:
        """rq's ``enqueue_call`` with ``policy=``, awaited."""
        return await self._through(self._queue.enqueue_call, func, *args, policy=policy, **kwargs)

    async def enqueue_at(self, datetime: datetime, f: Any, *args: Any, **kwargs: Any) -> Job | None:
        """rq's ``enqueue_at`` with ``policy=``, awaited (the job waits in the scheduled registry)."""
        return await self._through(self._queue.enqueue_at, datetime, f, *args, **kwargs)

    async def enqueue_in(self, time_delta: timedelta, f: Any, *args: Any, **kwargs: Any) -> Job | None:
        """rq's ``enqueue_in`` with ``policy=``, awaited."""
        return await self._through(self._queue.enqueue_in, time_delta, f, *args, **kwargs)

    async def force(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        """:meth:`rq_policies.PolicyQueue.force`, awaited: enqueue now whatever the policies say."""
        return await self._through(self._queue.force, f, *args, **kwargs)  # type: ignore[return-value]

    async def enqueue_many(self, job_datas: Iterable[Any], pipeline: Any = None,
                           group_id: str | None = None) -> list[Job | None]:
        """rq's ``enqueue_many`` with each job's declared policies: a list as long as ``job_datas``, None where a
        policy dropped the job. The synchronous ``enqueue_many`` builds and plans every job (a refused option raises
        before anything is sent), then each goes out in one round trip, in order (a batch of jobs without a policy is
        not sent as one pipeline here). ``group_id`` is written on each job, as the synchronous door does for jobs
        with a policy."""
        if pipeline is not None:
            raise PipelineNotSupported(self.name, 'enqueue_many')
        queue = await self._ready()
        with planning() as plans:
            queue.enqueue_many(job_datas, group_id=group_id)
        return [await self._send(plan) for plan in plans]

    async def _through(self, door: Any, *args: Any, **kwargs: Any) -> Job | None:
        """The synchronous ``door`` run up to its round trip (:func:`rq_policies.engine.queue.planning`), that round
        trip awaited."""
        _no_replicas(self.name, kwargs)
        await self._ready()
        with planning() as plans:
            door(*args, **kwargs)
        plan, = plans  # every door of the builder plans exactly one round trip, or is refused on its connection
        return await self._send(plan)

    async def _send(self, plan: Plan) -> Job | None:
        """The door core's asyncio driver: ``plan``'s one call awaited, its reply read and acted on by the core, as
        the synchronous door does (:meth:`rq_policies.PolicyQueue._send`)."""
        try:
            if plan.write.mode == 'D':
                raise AsyncDoorError(self.name, 'depends_on= with a policy')
            reply = await run_call(plan.call, self.connection)
        except BaseException as exc:
            admission.failed(plan, exc)
            raise
        return admission.settle(plan, admission.read(plan, reply))

    async def _ready(self) -> PolicyQueue:
        """The builder, with the server's version rq stamps on each job read once (asynchronously)."""
        queue = self._queue
        if not queue.redis_server_version:
            # One read for every task that awaits the first enqueues at once (1000 concurrent first calls sent
            # 1000 INFOs, and an asyncio cluster client refuses sends past its max_connections per node).
            if self._version_lock is None:
                self._version_lock = asyncio.Lock()
            async with self._version_lock:
                if not queue.redis_server_version:
                    info = await self.connection.info('server')
                    parts = [int(part) for part in str(info['redis_version']).split('.')[:3]]
                    queue.redis_server_version = tuple(parts + [0] * (3 - len(parts)))
        return queue

    # -- asking, reset --------------------------------------------------------------------------------------------

    async def holder(self, func: Any, *args: Any, **kwargs: Any) -> str | None:
        """The id of the waiting job holding this call's loner identity on this queue, or None (one round trip)."""
        queue = self._queue
        digest = call_digest(queue, func, args, kwargs, declared_for(func))
        found = await run_call(loner.holder_call(queue.name, digest, queue.job_class.redis_job_namespace_prefix),
                               self.connection)
        return text(found) if found else None

    async def enqueued(self, func: Any, *args: Any, **kwargs: Any) -> bool:
        """Is a job of this call waiting on this queue (queued, scheduled, deferred)?"""
        return await self.holder(func, *args, **kwargs) is not None

    async def reset(self, func: Any, *args: Any, **kwargs: Any) -> int:
        """:meth:`rq_policies.PolicyQueue.reset`, awaited: clear this call's policy state (one script)."""
        queue = self._queue
        spec = door_spec(kwargs.pop('policy', DECLARED), func)
        return int(await run_call(admission.reset_call(queue, spec, call_digest(queue, func, args, kwargs, spec)),
                                  self.connection))

    async def explain(self, job_id: str) -> dict[str, Any]:
        """:func:`rq_policies.explain` for one job: its status, queue and each policy's verdict on it now.

        A diagnostic of several round trips, read by the synchronous explainer in a thread (``asyncio.to_thread``)
        on ``sync_connection`` (made from the async client's host, port, db and credentials when not given; from
        an asyncio ``RedisCluster``, a synchronous ``RedisCluster`` on the nodes it knows)."""
        from .explainer import explain

        connection = self._sync()
        return await asyncio.to_thread(explain, job_id, connection, self.job_class.redis_job_namespace_prefix)

    def _sync(self) -> Any:
        if self.sync_connection is None and is_cluster(self.connection):
            # redis.asyncio's RedisCluster has no connection_pool (a pool per node): a synchronous RedisCluster
            # from the nodes it knows and their credentials (adopted, as PolicyQueue adopts one).
            from redis.cluster import ClusterNode, RedisCluster

            settings = self.connection.get_connection_kwargs()
            wanted = ('username', 'password', 'socket_timeout', 'socket_connect_timeout')
            options = {name: settings[name] for name in wanted if settings.get(name) is not None}
            if 'SSL' in getattr(settings.get('connection_class'), '__name__', ''):
                options['ssl'] = True
            nodes = [ClusterNode(node.host, node.port) for node in self.connection.get_nodes()]
            self.sync_connection = compat.adopt_cluster(RedisCluster(startup_nodes=nodes, **options))
        if self.sync_connection is None:
            import redis

            pool = self.connection.connection_pool
            settings = dict(getattr(pool, 'connection_kwargs', {}))
            if 'service_name' in settings or type(pool).__name__.startswith('Sentinel'):
                raise InvalidArgument(
                    'sync_connection', message='AsyncPolicyQueue.explain on a Sentinel client needs sync_connection= '
                                               '(a redis.sentinel master_for client)')
            wanted = ('host', 'port', 'db', 'username', 'password', 'path', 'socket_timeout')
            options = {name: settings[name] for name in wanted if settings.get(name) is not None}
            if 'path' in options:
                self.sync_connection = redis.Redis(unix_socket_path=options.pop('path'), **options)
            else:
                self.sync_connection = redis.Redis(**options)
        return self.sync_connection
