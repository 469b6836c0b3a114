"""asyncio doors: :class:`AsyncPolicyQueue`, the enqueue doors of :class:`rq_policies.PolicyQueue` on
``redis.asyncio``.

::

    from redis.asyncio import Redis
    from rq_policies.surfaces.aio import AsyncPolicyQueue

    q = AsyncPolicyQueue('emails', connection=Redis())
    job = await q.enqueue(send_welcome, user_id)          # -> Job, or None when a policy drops it
    await q.enqueued(send_welcome, user_id)               # and holder, force, reset, enqueue_at/in, enqueue_many
    why = await q.explain(job.id)

How it works: each door builds its job exactly as the synchronous door does (rq's own ``create_job``, our ``job_write``,
the same :func:`rq_policies.engine.admission.checked_call`, all CPU-only and run on the event loop: no thread pool),
then sends that one script call (``lua/admit.lua``) with an async ``EVALSHA`` (``EVAL`` with the source when the server
answers NOSCRIPT, which means the script did not run), and reads the reply with the same
:class:`rq_policies.engine.admission.Verdict` and :func:`rq_policies.engine.admission.settle`. So the verdicts, the
drops (None and the policy's INFO line), the errors (a Loner's ``on_conflict='raise'``, a bad option) and the replay
safety (a resend after a lost reply writes nothing twice: redis-py's asyncio retry resends the same bytes) are the
synchronous door's. A job an async door wrote is an ordinary rq job, run by ``PolicyWorker`` as any other.

Where it differs from the synchronous door (each named in the error it raises or below):

- No hint probe. The synchronous ``enqueue`` may first send a checks-only probe for a call it expects to be dropped
  (:mod:`rq_policies.engine.hints`), which saves building the job. The async door always sends the full call, which
  decides the same way in one round trip; building the job costs CPU only.
- What rq does on its own synchronous path is refused with :class:`AsyncDoorError`: ``depends_on=`` (rq's dependency
  handling WATCHes and retries), ``pipeline=``, ``unique=True``, rq 3's ``rate_limit=``, ``ttl=0``, and a queue with
  ``is_async=False``. Use :class:`rq_policies.PolicyQueue` for those.
- ``explain`` reads through the synchronous explainer in a thread (it is a diagnostic of several round trips, not a
  door), on a synchronous client made from the async client's connection settings (or ``sync_connection=``).

Cancellation: the admission script is atomic, so a task cancelled while it awaits a door leaves either the whole job
(with its policy state) or nothing, never half of it. What the caller cannot know is which: the command may have
reached the server before the cancellation. redis-py's asyncio connection closes itself when a send or a read is
interrupted (any ``BaseException``, cancellation included), so an unread reply is never read as another command's.
To learn the outcome, ask: ``await q.enqueued(f, *args)`` / ``await q.holder(f, *args)`` for a policy with an
identity, or ``await q.explain(job_id)`` for a job id you chose (``job_id=``). Sending the same door call again is
safe too: the policy decides again (a Loner drops the second one while the first holds the identity).

Connections: anything ``redis.asyncio.Redis`` accepts (its pools, ``BlockingConnectionPool``, Sentinel through
``redis.asyncio.sentinel.Sentinel.master_for``). A client with ``decode_responses=True`` works for the doors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import NoScriptError
from rq.job import Job, JobStatus
from rq.queue import Queue

from rq_policies.engine import admission, compat, identity, keys, scripts
from rq_policies.engine.admission import JobWrite, Verdict
from rq_policies.engine.exceptions import PipelineNotSupported, PolicyError
from rq_policies.engine.keys import is_cluster
from rq_policies.engine.ops import Call, text
from rq_policies.engine.policy import PolicySet
from rq_policies.engine.queue import DECLARED, PolicyQueue, take_options
from rq_policies.policies.loner import rules as loner

from . import otel

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


class _Planned(Exception):  # noqa: N818 - control flow inside one door, never seen by a caller
    """The builder's door reached its round trip: here is the call to send, and how to read its reply."""

    def __init__(self, kind: str, call: Call, write: JobWrite, spec: PolicySet | None = None, digest: str = ''):
        self.kind, self.call, self.write, self.spec, self.digest = kind, call, write, spec, digest


class _Builder(PolicyQueue):
    """The synchronous PolicyQueue with its round trips replaced by a :class:`_Planned` raise: everything before them
    (rq's job build, the door's policy, our ``job_write``) is the synchronous door's own code."""

    def _decide(self, spec: PolicySet, digest: str, write: JobWrite, force: bool, hint: Any, at_front: bool) -> Any:
        if write.mode == 'D':
            raise AsyncDoorError(self.name, 'depends_on= with a policy')
        # admit.lua, not the narrow script: an asyncio client packs a call with redis-py's packer, about 0.85 us an
        # argument, and the narrow call's flat arguments (the job's fields) would cost it 40 us more than the map.
        raise _Planned('admit', admission.checked_call(self, spec, digest, write, force, narrow=False), write, spec,
                       digest)

    def _plain_write(self, job: Job, at_front: bool, when: datetime | None) -> JobWrite:
        write = super()._plain_write(job, at_front, when)
        raise _Planned('plain', admission.plain_call(self, write, narrow=False), write)


async def run_call(call: Call, client: Any) -> Any:
    """Send one script call on an asyncio client: EVALSHA, then EVAL with the source when the server answers
    NOSCRIPT (the script did not run, so sending it again is safe). redis-py's asyncio retry resends a call whose
    reply was lost; every script that writes is safe to run twice. On a Redis Cluster a call refused while the
    prefix's slot migrates is sent again until it settles (:data:`rq_policies.engine.compat.SLOT_WAIT_SECONDS`)."""
    found = scripts.script(call.script)
    argv = call.argv()
    call_keys = call.keys
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


def _settle(queue: PolicyQueue, plan: _Planned, reply: Any) -> Job | None:
    """What the synchronous door returns for this reply (``PolicyQueue._decide``, or the plain write)."""
    job = plan.write.job
    if plan.kind == 'plain':
        return job
    verdict = Verdict.read(reply, plan.digest)
    if not admission.settle(queue, plan.spec, plan.write, verdict).written:
        return None
    return job


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
            raise ValueError('AsyncPolicyQueue: connection is required, pass connection=redis.asyncio.Redis(...)')
        if not hasattr(connection, 'evalsha') or not asyncio.iscoroutinefunction(
                getattr(type(connection), 'execute_command', None)):
            raise TypeError(f'AsyncPolicyQueue: connection must be a redis.asyncio client, got {connection!r}')
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
        self._queue = _Builder(name, **options)
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
        _no_replicas(self.name, kwargs)
        policy = kwargs.pop('policy', DECLARED)
        queue = await self._ready()
        try:
            with queue._door(policy, options=take_options(queue._spec(policy, f), kwargs)):
                Queue.enqueue(queue, f, *args, **kwargs)  # rq's own build; PolicyQueue.enqueue's probe is skipped
        except _Planned as plan:
            return await self._send(plan)
        raise AssertionError('unreachable: the builder plans every door')  # pragma: no cover

    async def enqueue_call(self, func: Any, *args: Any, policy: Any = DECLARED, **kwargs: Any) -> Job | None:
        """rq's ``enqueue_call`` with ``policy=``, awaited."""
        _no_replicas(self.name, kwargs)
        queue = await self._ready()
        try:
            with queue._door(policy):
                Queue.enqueue_call(queue, func, *args, **kwargs)
        except _Planned as plan:
            return await self._send(plan)
        raise AssertionError('unreachable')  # pragma: no cover

    async def enqueue_at(self, datetime: datetime, f: Any, *args: Any, **kwargs: Any) -> Job | None:
        """rq's ``enqueue_at`` with ``policy=``, awaited (the job waits in the scheduled registry)."""
        _no_replicas(self.name, kwargs)
        queue = await self._ready()
        try:
            queue.enqueue_at(datetime, f, *args, **kwargs)
        except _Planned as plan:
            return await self._send(plan)
        raise AssertionError('unreachable')  # pragma: no cover

    async def enqueue_in(self, time_delta: timedelta, f: Any, *args: Any, **kwargs: Any) -> Job | None:
        """rq's ``enqueue_in`` with ``policy=``, awaited."""
        _no_replicas(self.name, kwargs)
        queue = await self._ready()
        try:
            queue.enqueue_in(time_delta, f, *args, **kwargs)
        except _Planned as plan:
            return await self._send(plan)
        raise AssertionError('unreachable')  # pragma: no cover

    async def force(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        """:meth:`rq_policies.PolicyQueue.force`, awaited: enqueue now whatever the policies say."""
        _no_replicas(self.name, kwargs)
        queue = await self._ready()
        try:
            queue.force(f, *args, **kwargs)
        except _Planned as plan:
            return await self._send(plan)  # type: ignore[return-value]
        raise AssertionError('unreachable')  # pragma: no cover

    async def enqueue_many(self, job_datas: Iterable[Any], pipeline: Any = None,
                           group_id: str | None = None) -> list[Job | None]:
        """rq's ``enqueue_many`` with each job's declared policies: a list as long as ``job_datas``, None where a
        policy dropped the job. One round trip per job, in order (the synchronous door's policy path; a batch of
        jobs without a policy is not sent as one pipeline here). ``group_id`` is written on each job, as the
        synchronous door does for jobs with a policy."""
        queue = await self._ready()
        datas = list(job_datas)
        if pipeline is not None:
            raise PipelineNotSupported(self.name, 'enqueue_many')
        seen: set[str] = set()
        for data in datas:
            if data.job_id is not None:
                if data.job_id in seen:
                    raise ValueError(f"Job ID '{data.job_id}' appears more than once in enqueue_many()")
                seen.add(data.job_id)
        results: list[Job | None] = []
        for data in datas:
            fields = compat.create_job_kwargs(data._asdict())
            fields['status'] = JobStatus.QUEUED
            if group_id is not None:
                fields['group_id'] = group_id
            job = queue.create_job(**fields)
            try:
                with queue._door(DECLARED):
                    queue.enqueue_job(job, at_front=bool(data.at_front))
            except _Planned as plan:
                results.append(await self._send(plan))
                continue
            raise AssertionError('unreachable')  # pragma: no cover
        return results

    async def _send(self, plan: _Planned) -> Job | None:
        if otel.TRACER is not None:  # traced (rq_policies.surfaces.otel), only once it is enabled
            return await otel.send_async(self._queue, plan, self.connection)
        return _settle(self._queue, plan, await run_call(plan.call, self.connection))

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

    def _digest(self, func: Any, args: tuple, kwargs: dict, spec: PolicySet | None) -> str:
        queue = self._queue
        probe = queue.job_class.create(func, args=args, kwargs=kwargs, connection=queue.connection)
        return identity.digest(identity.func_path(probe), queue.name, args, kwargs,
                               spec.unique_context if spec else None)

    async def holder(self, func: Any, *args: Any, **kwargs: Any) -> str | None:
        """The id of the waiting job holding this call's loner identity on this queue, or None (one round trip)."""
        queue = self._queue
        digest = self._digest(func, args, kwargs, queue._declared_for(func))
        found = await run_call(loner.holder_call(queue.name, digest, queue.job_class.redis_job_namespace_prefix),
                               self.connection)
        return text(found) if found else None

    async def enqueued(self, func: Any, *args: Any, **kwargs: Any) -> bool:
        """Is a job of this call waiting on this queue (queued, scheduled, deferred)?"""
        return await self.holder(func, *args, **kwargs) is not None

    async def reset(self, func: Any, *args: Any, **kwargs: Any) -> int:
        """:meth:`rq_policies.PolicyQueue.reset`, awaited: clear this call's policy state (one script)."""
        policy = kwargs.pop('policy', DECLARED)
        queue = self._queue
        spec = queue._spec(policy, func)
        digest = self._digest(func, args, kwargs, spec)
        return int(await run_call(admission.reset_call(queue, spec, digest), self.connection))

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
                raise ValueError('AsyncPolicyQueue.explain on a Sentinel client needs sync_connection= (a '
                                 'redis.sentinel master_for client)')
            wanted = ('host', 'port', 'db', 'username', 'password', 'path', 'socket_timeout')
            options = {name: settings[name] for name in wanted if settings.get(name) is not None}
            if 'path' in options:
                self.sync_connection = redis.Redis(unix_socket_path=options.pop('path'), **options)
            else:
                self.sync_connection = redis.Redis(**options)
        return self.sync_connection
