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
narrow script's or ``lua/admit.lua``'s: CPU only, on the event loop, in a slice of a turn of the loop:
:class:`_Slices`), on a PolicyQueue whose connection refuses any use (:class:`AsyncDoorError`), then awaits that call
(alone on a pooled connection, or in the pipeline of the calls made in the same turn: :class:`_Pipe`) and hands the
reply to the same core. So its verdicts, errors and replay safety are the synchronous door's. What differs (no hint
probe; rq's own synchronous paths refused: ``depends_on=``, ``pipeline=``, ``unique=True``, ``rate_limit=``,
``ttl=0``, ``is_async=False``; ``explain`` in a thread), cancellation (whole job or nothing, and how to learn which),
the connections it takes and the loop's share it takes: docs/asyncio.md.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from redis.exceptions import NoScriptError, ResponseError
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


#: The CPU (seconds of the loop thread's wall clock) the asyncio doors of one event loop take before they let the
#: loop turn: each door's build, each reply read and acted on, is counted; past this, the next step waits for the
#: loop's next turn (:class:`_Slices`), so a ticker or a web handler on the same loop waits at most about this long
#: for the doors, however many tasks enqueue at once.
SLICE_SECONDS = 0.001

#: The most one reply's read counts against the slice (a read that waited for the server counts as a read).
_READ_MOST = 0.0002

#: The most script calls one pipelined send carries (:class:`_Pipe`).
PIPELINE_MAX = 64


class _Slices:
    """The asyncio doors' share of one event loop: :data:`SLICE_SECONDS` of work, then a turn of the loop.

    asyncio runs every task that is ready in one turn of the loop, back to back: 200 tasks whose replies arrived
    together ran 200 job builds before a ticker, or any other coroutine, ran again (30 ms, and 0.4 s at the 99th
    percentile on a loaded machine). Each door step counts what it took (:meth:`spend`); once a turn's slice is
    spent, the next step waits (:meth:`turn`) and is let go at a later turn, first come first served, as many a
    turn as a slice holds (by the steps' measured cost). The pipelines' reads go first (``first=True``): a reply
    read frees a waiting task.
    """

    __slots__ = ('loop', 'spent', 'waiters', 'step', 'pending')

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.spent = 0.0
        self.waiters: deque[asyncio.Future] = deque()
        self.step = 100e-6  # a door step's cost, as measured (a moving average)
        self.pending = False

    async def turn(self, first: bool = False) -> None:
        """Return at once while this turn's slice lasts, else at a later turn of the loop."""
        if self.spent < SLICE_SECONDS and not self.waiters:
            return
        waiter = self.loop.create_future()
        if first:
            self.waiters.appendleft(waiter)
        else:
            self.waiters.append(waiter)
        if not self.pending:
            self.pending = True
            self.loop.call_soon(self._next)
        await waiter

    def spend(self, seconds: float, step: bool = False) -> None:
        """Count ``seconds`` of the loop's time against this turn's slice (``step``: a door's build, whose cost
        sets how many waiters a turn lets go)."""
        self.spent += seconds
        if step:
            self.step += (seconds - self.step) * 0.1

    def _next(self) -> None:
        """A new turn: a fresh slice, and as many waiters let go as it holds (at least one)."""
        self.pending = False
        self.spent = 0.0
        room = max(1, int(SLICE_SECONDS / max(self.step, 1e-6)))
        waiters = self.waiters
        while waiters and room:
            waiter = waiters.popleft()
            if not waiter.done():  # a cancelled task's is done
                waiter.set_result(None)
                room -= 1
        if waiters:  # this runs after the tasks let go (queued before it): the rest go at the turn after
            self.pending = True
            self.loop.call_soon(self._next)


_SLICES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slices] = weakref.WeakKeyDictionary()


def _slices() -> _Slices:
    """The running loop's :class:`_Slices`."""
    loop = asyncio.get_running_loop()
    found = _SLICES.get(loop)
    if found is None:
        found = _SLICES[loop] = _Slices(loop)
    return found


class _Entry:
    """One script call in a pipeline: its command, the future its caller awaits, and whether it goes with its
    source (EVAL, after a NOSCRIPT)."""

    __slots__ = ('call', 'future', 'source', 'todo', 'task')

    def __init__(self, call: Call, future: asyncio.Future) -> None:
        self.call, self.future, self.source = call, future, False
        self.todo: deque[_Entry] | None = None  # its pipeline's calls not yet answered, and the task that sends them
        self.task: asyncio.Task | None = None

    def command(self) -> tuple:
        found = scripts.script(self.call.script)
        call_keys = self.call.keys
        head = ('EVAL', found.script) if self.source else ('EVALSHA', found.sha)
        return (*head, len(call_keys), *call_keys, *self.call.argv())


class _Pipe:
    """The script calls of the tasks of one loop on one client's connection pool, sent in pipelines: the calls
    made in one turn of the loop go in one write on one pooled connection (:data:`PIPELINE_MAX` at most), and
    their replies are read in order, each handed to its caller as it comes (a reply is read whole before the next,
    so an error reply, a script's error, belongs to its call alone).

    What one call on a connection of its own had, each call keeps: a connection error closes the connection and the
    calls not yet answered go again, in order, on a new one, through the connection's retry (every script that writes
    is safe to run twice); a NOSCRIPT reply (the script did not run) sends that call again with its source. A task
    cancelled before the write sends nothing; one cancelled after it leaves its reply to be read and dropped (the
    script ran whole or not at all); a pipeline whose callers are all gone closes its connection instead of reading
    on (:func:`_gone`). The reads count against the loop's slice (:class:`_Slices`)."""

    __slots__ = ('pool', 'loop', 'queued', 'scheduled', 'running', 'alone')

    def __init__(self, pool: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.loop = pool, loop
        self.alone = 0  # lone calls in flight
        self.queued: list[_Entry] = []
        self.scheduled = False
        self.running: set[asyncio.Task] = set()

    async def send(self, call: Call) -> Any:
        """``call``'s reply (or its error), sent in this turn's pipeline; or, when nothing else is in flight or
        queued, at once on a connection of its own (a lone caller pays for no pipeline)."""
        if not self.alone and not self.queued and not self.running:
            self.alone += 1
            try:
                return await _alone(self.pool, call)
            finally:
                self.alone -= 1
        entry = _Entry(call, self.loop.create_future())
        self.queued.append(entry)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        try:
            return await entry.future
        except asyncio.CancelledError:
            _gone(entry)
            raise

    def _flush(self) -> None:
        self.scheduled = False
        queued, self.queued = self.queued, []
        for start in range(0, len(queued), PIPELINE_MAX):
            todo = deque(queued[start:start + PIPELINE_MAX])
            task = self.loop.create_task(self._run(todo))
            self.running.add(task)
            task.add_done_callback(self.running.discard)
            for entry in todo:
                entry.todo, entry.task = todo, task

    async def _run(self, todo: deque[_Entry]) -> None:
        if all(entry.future.done() for entry in todo):  # every caller left before the write: nothing is sent
            return
        try:
            connection = await self.pool.get_connection()
        except BaseException as exc:
            _fail(todo, exc)
            if not isinstance(exc, Exception):
                raise
            return  # the callers have the error
        try:
            await connection.retry.call_with_retry(lambda: _exchange(connection, todo),
                                                   lambda error: connection.disconnect())
        except BaseException as exc:
            if todo:  # replies may be on their way: never read as another command's
                await connection.disconnect()
            _fail(todo, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            await self.pool.release(connection)


async def _alone(pool: Any, call: Call) -> Any:
    """``call`` sent on a connection of ``pool``'s own: EVALSHA, then EVAL with the source on NOSCRIPT."""
    connection = await pool.get_connection()
    try:
        found = scripts.script(call.script)
        call_keys, argv = call.keys, call.argv()
        try:
            return await _sent(connection, ('EVALSHA', found.sha, len(call_keys), *call_keys, *argv))
        except NoScriptError:
            return await _sent(connection, ('EVAL', found.script, len(call_keys), *call_keys, *argv))
    finally:
        await pool.release(connection)


async def _sent(connection: Any, command: tuple) -> Any:
    """``command``'s reply on ``connection``, through the connection's own retry (a connection error closes it, and
    the command goes again on a new one). An interrupted send or read (a cancellation) closes the connection inside
    redis-py, so an unread reply is never read as another command's."""
    packed = scripts.pack_command(connection, command)

    async def once() -> Any:
        await connection.send_packed_command(packed)
        return await connection.read_response()

    return await connection.retry.call_with_retry(once, lambda error: connection.disconnect())


def _gone(entry: _Entry) -> None:
    """``entry``'s caller left (its task cancelled): once every call of its pipeline not yet answered has, the
    pipeline's task is cancelled, which closes its connection (the replies are no one's) and gives it back to the
    pool at once, as a cancelled call on a connection of its own did."""
    task, todo = entry.task, entry.todo
    if task is not None and todo is not None and not task.done() and all(other.future.done() for other in todo):
        task.cancel()


def _fail(entries: Iterable[_Entry], exc: BaseException) -> None:
    for entry in entries:
        if not entry.future.done():
            if isinstance(exc, asyncio.CancelledError):
                entry.future.cancel()
            else:
                entry.future.set_exception(exc)


def _answer(entry: _Entry, reply: Any) -> None:
    future = entry.future
    if not future.done():  # a caller cancelled after the write: its reply is dropped
        if isinstance(reply, BaseException):
            future.set_exception(reply)
        else:
            future.set_result(reply)


async def _exchange(connection: Any, todo: deque[_Entry]) -> None:
    """Send ``todo``'s calls in one write on ``connection`` and hand each its reply, taking each off ``todo`` as its
    reply is read (what a retry sends again is what is left); a NOSCRIPT reply puts its call back, with its source."""
    slices = _slices()
    clock = time.perf_counter
    while todo:
        start = clock()
        batch: list[_Entry] = []
        packed: list[bytes] = []
        for entry in list(todo):
            if entry.future.done():  # its caller left before this write: not sent (again)
                todo.remove(entry)
                continue
            try:
                packed += scripts.pack_command(connection, entry.command())
            except Exception as exc:  # noqa: BLE001 - an argument redis-py refuses: that call's error alone
                todo.remove(entry)
                _answer(entry, exc)
                continue
            batch.append(entry)
            if slices.spent + clock() - start >= SLICE_SECONDS:
                slices.spend(clock() - start)
                await slices.turn(first=True)
                start = clock()
        slices.spend(clock() - start)
        if not batch:
            return
        await connection.send_packed_command(packed)
        for entry in batch:
            start = clock()
            try:
                reply = await connection.read_response()
            except NoScriptError as exc:  # the script did not run: sent again, with its source
                todo.popleft()
                if entry.source:
                    _answer(entry, exc)
                else:
                    entry.source = True
                    todo.append(entry)
                continue
            except ResponseError as exc:  # read whole: this call's error, and the connection is clean
                reply = exc
            todo.popleft()
            _answer(entry, reply)
            # the read's parse, not its wait for the server (a read that waited let the loop turn: counted as a read)
            slices.spend(min(clock() - start, _READ_MOST))
            if slices.spent >= SLICE_SECONDS:
                await slices.turn(first=True)


_PIPES: weakref.WeakKeyDictionary[Any, _Pipe] = weakref.WeakKeyDictionary()


def _pipe(pool: Any) -> _Pipe:
    """``pool``'s :class:`_Pipe` on the running loop."""
    loop = asyncio.get_running_loop()
    found = _PIPES.get(pool)
    if found is None or found.loop is not loop:
        found = _PIPES[pool] = _Pipe(pool, loop)
    return found


async def run_call(call: Call, client: Any) -> Any:
    """Send one script call on an asyncio client: EVALSHA, then EVAL with the source when the server answers
    NOSCRIPT (the script did not run, so sending it again is safe). A reply lost on the way is resent by the
    connection's retry; every script that writes is safe to run twice.

    On a client with a connection pool the call goes in the pipeline of this turn of the loop (:class:`_Pipe`):
    the calls of many tasks in one write on one pooled connection, each packed in one pass
    (``scripts.pack_command``, as the synchronous doors pack theirs), with that connection's retry. A
    single-connection client and a cluster client (a pool per node) take redis-py's path; on a Redis Cluster a call
    refused while the prefix's slot migrates is sent again until it settles
    (:data:`rq_policies.engine.compat.SLOT_WAIT_SECONDS`)."""
    pool = getattr(client, 'connection_pool', None)
    if pool is not None and not getattr(client, 'single_connection_client', False):
        return await _pipe(pool).send(call)
    found = scripts.script(call.script)
    call_keys, argv = call.keys, call.argv()
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


async def _built(door: Any, *args: Any, **kwargs: Any) -> list[Plan]:
    """The plans ``door`` (a synchronous door of the builder queue) makes inside
    :func:`rq_policies.engine.queue.planning`, built at a turn of the loop with room for it (:class:`_Slices`)."""
    slices = _slices()
    await slices.turn()
    start = time.perf_counter()
    try:
        with planning() as plans:
            door(*args, **kwargs)
    finally:
        slices.spend(time.perf_counter() - start, step=True)
    return plans


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
        plans = await _built(queue.enqueue_many, job_datas, group_id=group_id)
        return [await self._send(plan) for plan in plans]

    async def _through(self, door: Any, *args: Any, **kwargs: Any) -> Job | None:
        """The synchronous ``door`` run up to its round trip (:func:`rq_policies.engine.queue.planning`), at this
        turn's slice of the loop (:class:`_Slices`), that round trip awaited."""
        _no_replicas(self.name, kwargs)
        await self._ready()
        plan, = await _built(door, *args, **kwargs)  # every door of the builder plans exactly one round trip, or
        return await self._send(plan)               # is refused on its connection

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
        start = time.perf_counter()
        try:
            return admission.settle(plan, admission.read(plan, reply))
        finally:
            _slices().spend(time.perf_counter() - start)

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
