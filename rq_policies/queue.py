"""PolicyQueue: an rq Queue whose enqueue doors apply the job's policies, and whose fetch honours QueueSlot caps.

Every public enqueue door (``enqueue``, ``enqueue_call``, ``enqueue_at``, ``enqueue_in``, ``enqueue_many`` and the
``@job`` decorator's ``.delay()``) admits the job through one Lua script that checks the policy and writes the job
in the same round trip. An admitted job is an ordinary rq job; a dropped one returns ``None`` and is logged at INFO
with the id of the job that holds its identity.

Retries, the release of dependents and requeues reach ``enqueue_job``/``schedule_job`` from inside rq rather than
through a door, so they are the same job and are not checked again. ``enqueue_job`` called directly is likewise
unchecked: it is rq's internal re-enqueue path.
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.utils import import_attribute, now

from . import compat, debounce, identity, keys, loner, scripts, throttle
from .debounce import Debounce
from .exceptions import PipelineNotSupported, PolicyConfigurationError
from .job import PolicyJob, release_markers, rq_class_name
from .policy import Loner, PolicySet, declared, make_set
from .queue_slot import QueueSlot
from .throttle import Throttle

logger = logging.getLogger('rq_policies')

_DECLARED: Any = object()

#: Function paths ``_declared_for`` could not import and has warned about (once per path and process).
_UNIMPORTABLE_WARNED: set[str] = set()

#: Seconds a deferred (depends_on) job's hash and marker live before rq has finished setting up its dependencies;
#: if the producer dies in that window the hold lapses by itself.
DEFERRED_LEASE_SECONDS = 300

#: How long an idle PolicyWorker waits for a wake-up before it looks again (seconds). Admissions and releases wake
#: it at once over pub/sub; this bounds the delay for jobs pushed by stock rq producers or schedulers, which do not
#: publish, and for holds that expired because their worker died.
IDLE_POLL_SECONDS = 1.0


@dataclass
class _Door:
    """The policy override of the public enqueue call in progress (``_DECLARED``, None or a PolicySet)."""

    override: Any
    used: bool = False
    force: bool = False
    hint: Any = None  # the call's throttle hint key (rq_policies.throttle.quick_drop)


_door: ContextVar[_Door | None] = ContextVar('rq_policies_door', default=None)


@dataclass
class JobWrite:
    """How an admission script writes one job; the same for every policy's script."""

    job: Job
    mode: str  # R | L | S | D, see lua/includes/save_job.lua
    score: int  # epoch seconds for mode S, else 0
    dest: str  # the queue list, the scheduled registry, or the queue key (unused) for mode D
    ttl: int  # seconds the job hash lives, -1 for no expiry
    fields: list[Any]  # the job hash as a flat field/value list
    marker: str  # the identity's loner marker key
    loner: bool  # whether the Loner check applies


@dataclass
class Claim:
    """What one fetch took: the job, the queue and, on a capped queue, the hold that came with it."""

    job_id: str
    queue_name: str
    token: str | None
    #: Wall-clock time just before the fetch that took the job: the job stopped waiting after this instant.
    fetched_after: float = 0.0


class Fetcher:
    """Per-worker fetch state: the claim just made, the hold ttl, and the idle wait.

    PolicyWorker installs its own (with a pub/sub wake-up) around each fetch; without one,
    ``PolicyQueue.dequeue_any`` is rq's own.
    """

    hold_ttl: int = QueueSlot.TTL_SECONDS

    def __init__(self) -> None:
        self.claim: Claim | None = None

    def on_claim(self, claim: Claim) -> None:
        self.claim = claim
        if claim.token is not None:
            QueueSlot.HELD.add(claim.token, keys.slots(claim.queue_name))

    def listen(self, connection: Any, queue_names: list[str]) -> bool:
        """Get ready to be woken for ``queue_names``; True when that only starts now (look once more first)."""
        return False

    def wait(self, connection: Any, queue_names: list[str], seconds: float, full: frozenset[str] = frozenset()) -> None:
        """Wait up to ``seconds`` (at most IDLE_POLL_SECONDS) for something that could make a look succeed.

        ``full`` names the capped queues the last look found without a free slot: a push to one of them is no news.
        """
        time.sleep(min(seconds, IDLE_POLL_SECONDS))


_fetcher: ContextVar[Fetcher | None] = ContextVar('rq_policies_fetcher', default=None)


def func_path(job: Job) -> str:
    """The function part of a job's identity: rq's ``func_name``, qualified by the class for bound methods."""
    instance = job.instance
    if instance is not None:
        cls = type(instance)
        return f'{cls.__module__}.{cls.__qualname__}.{job.func_name}'
    return job.func_name


def _flatten(mapping: dict[str, Any]) -> list[Any]:
    """A job's ``to_dict()`` as the flat field/value list HSET takes (None values skipped, as rq's scripts do)."""
    flat: list[Any] = []
    for field_name, value in mapping.items():
        if value is None:
            continue
        flat.append(field_name)
        flat.append(value if isinstance(value, (bytes, str)) else str(value))
    return flat


def pack_fields(flat: list[Any]) -> bytes:
    """A flat field/value list as one length-prefixed blob (decoded by ``lua/includes/unpack_fields.lua``)."""
    parts = []
    for item in flat:
        data = item.encode('utf-8') if isinstance(item, str) else item
        parts.append(b'%d:%s' % (len(data), data))
    return b''.join(parts)


def _score(when: datetime) -> int:
    # rq's ScheduledJobRegistry.schedule: a naive datetime is local time.
    if not when.tzinfo:
        when = when.astimezone()
    return calendar.timegm(when.utctimetuple())


class PolicyQueue(Queue):
    """An rq Queue that admits jobs through their policies. Use it wherever you would use ``rq.Queue``.

    Its ``str``/``repr`` read like rq's (``<Queue name>``, ``Queue('name')``): it is the same queue in Redis, and
    logs and tools that parse rq's reprs read it the same way. A subclass of your own shows its own name.
    """

    job_class = PolicyJob

    def __repr__(self) -> str:
        return f'{rq_class_name(type(self))}({self.name!r})'

    def __str__(self) -> str:
        return f'<{rq_class_name(type(self))} {self.name}>'

    # -- the doors ------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _door(self, policy: Any, force: bool = False, hint: Any = None) -> Iterator[None]:
        if _door.get() is not None:  # an inner door of the same call (enqueue -> enqueue_call): the outer one rules
            yield
            return
        override = policy if policy is _DECLARED else make_set(policy)
        token = _door.set(_Door(override, force=force, hint=hint))
        try:
            yield
        finally:
            _door.reset(token)

    def enqueue(self, f: Any, *args: Any, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue``, plus ``policy=`` (a Policy, a list of them, or None to switch the declared ones off).

        Returns:
            The Job, or None when a policy dropped it.
        """
        policy = kwargs.pop('policy', _DECLARED)
        hint = None
        if _door.get() is None:
            dropped, hint = self._quick_drop(policy, f, args, kwargs)
            if dropped:
                return None
        with self._door(policy, hint=hint):
            return super().enqueue(f, *args, **kwargs)

    def enqueue_call(self, func: Any, *args: Any, policy: Any = _DECLARED, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue_call``, plus ``policy=``. Returns None when a policy dropped the job."""
        hint = None
        if _door.get() is None and not args:  # the @job decorator's .delay() arrives here
            call = {name: kwargs[name] for name in ('args', 'kwargs', 'job_id', 'pipeline', 'unique', 'rate_limit')
                    if kwargs.get(name) is not None}
            dropped, hint = self._quick_drop(policy, func, (), call)
            if dropped:
                return None
        with self._door(policy, hint=hint):
            return super().enqueue_call(func, *args, **kwargs)

    def enqueue_at(self, datetime: datetime, f: Any, *args: Any, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue_at``, plus ``policy=``. A scheduled job holds its loner identity until a worker takes it."""
        policy = kwargs.pop('policy', _DECLARED)
        with self._door(policy):
            return super().enqueue_at(datetime, f, *args, **kwargs)

    def enqueue_in(self, time_delta: timedelta, func: Any, *args: Any, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue_in``, plus ``policy=``."""
        policy = kwargs.pop('policy', _DECLARED)
        with self._door(policy):
            return super().enqueue_in(time_delta, func, *args, **kwargs)

    def enqueue_many(self, job_datas: Iterable[Any], pipeline: Any = None, group_id: str | None = None) -> list:  # type: ignore[override]
        """rq's ``enqueue_many`` with each job's declared policies applied.

        Returns:
            A list as long as ``job_datas``, with None where a policy dropped the job.

        Raises:
            PipelineNotSupported: ``pipeline=`` was given and some job has a policy.
        """
        datas = list(job_datas)
        specs = [self._declared_for(data.func) for data in datas]
        if not any(specs):
            return super().enqueue_many(datas, pipeline=pipeline, group_id=group_id)
        if pipeline is not None:
            first = next(data for data, spec in zip(datas, specs) if spec)
            raise PipelineNotSupported(self.name, str(getattr(first.func, '__name__', first.func)))
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
            job = self.create_job(**fields)
            with self._door(_DECLARED):
                results.append(self.enqueue_job(job, at_front=bool(data.at_front)))
        return results

    # -- where the doors arrive -----------------------------------------------------------------------------------

    def push_job_id(self, job_id: str, pipeline: Any = None, at_front: bool = False) -> None:
        """rq's push, plus a wake-up for idle PolicyWorkers (riding the same pipeline, or one of its own).

        Every push rq makes through this queue passes here: jobs without a policy, retries, released dependents,
        requeues. Pushes by stock ``rq.Queue`` producers do not publish; idle PolicyWorkers see those within
        ``IDLE_POLL_SECONDS``.
        """
        if pipeline is not None:
            super().push_job_id(job_id, pipeline=pipeline, at_front=at_front)
            pipeline.publish(keys.wake(self.name), job_id)
            return
        with self.connection.pipeline(transaction=False) as pipe:
            super().push_job_id(job_id, pipeline=pipe, at_front=at_front)
            pipe.publish(keys.wake(self.name), job_id)
            pipe.execute()

    def enqueue_job(self, job: Job, pipeline: Any = None, at_front: bool = False, **kwargs: Any) -> Job | None:  # type: ignore[override]
        spec = self._take_door(job)
        if spec is None:
            return super().enqueue_job(job, pipeline=pipeline, at_front=at_front, **kwargs)
        return self._admit(job, spec, pipeline, at_front=at_front, when=None, **kwargs)

    def schedule_job(self, job: Job, datetime: datetime, pipeline: Any = None, **kwargs: Any) -> Job | None:  # type: ignore[override]
        spec = self._take_door(job)
        if spec is None:
            return super().schedule_job(job, datetime, pipeline=pipeline, **kwargs)
        return self._admit(job, spec, pipeline, at_front=bool(job.enqueue_at_front), when=datetime, **kwargs)

    def _take_door(self, job: Job) -> PolicySet | None:
        door = _door.get()
        if door is None or door.used:
            return None
        door.used = True
        if door.override is _DECLARED:
            return self._declared_for(job)
        return door.override

    def _quick_drop(self, policy: Any, f: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """Drop an expected duplicate before its job is built (see rq_policies.hints); (dropped, hint key)."""
        spec = self._spec(policy, f)
        if spec is None:
            return False, None
        if spec.get(Throttle) is not None:
            return throttle.quick_drop(self, spec, f, args, kwargs)
        return loner.quick_drop(self, spec, f, args, kwargs)

    def _spec(self, policy: Any, func: Any) -> PolicySet | None:
        """The PolicySet a door applies: the declared one, or the caller's ``policy=``."""
        return self._declared_for(func) if policy is _DECLARED else make_set(policy)

    @staticmethod
    def _declared_for(func_or_job: Any) -> PolicySet | None:
        try:
            if isinstance(func_or_job, Job):
                target = func_or_job.func
            elif isinstance(func_or_job, str):
                target = import_attribute(func_or_job)
            else:
                target = func_or_job
        except (ImportError, AttributeError, ValueError) as error:
            # A producer may enqueue by path without having the code; then nothing is declared here. But a typo in
            # the path would silently switch a Loner off, so the first miss of each path is a warning.
            path = func_or_job.func_name if isinstance(func_or_job, Job) else str(func_or_job)
            if path in _UNIMPORTABLE_WARNED:
                logger.debug('rq-policies: cannot import %r to read its declared policies', path)
            else:
                _UNIMPORTABLE_WARNED.add(path)
                logger.warning(
                    'rq-policies: cannot import %r to read its declared policies (%s: %s); jobs enqueued by this path '
                    'get no policy here (a typo, or code this producer does not have?)',
                    path, type(error).__name__, error,
                )
            return None
        return declared(target)

    # -- admission ------------------------------------------------------------------------------------------------

    def _admit(
        self, job: Job, spec: PolicySet, pipeline: Any, at_front: bool, when: datetime | None, **kwargs: Any
    ) -> Job | None:
        if pipeline is not None:
            raise PipelineNotSupported(self.name, job.func_name)
        if kwargs.get('unique'):
            raise PolicyConfigurationError('unique=True cannot be combined with a policy: the policy already decides')
        if compat.has_rate_limit(job):
            raise PolicyConfigurationError(
                f'rate_limit= cannot be combined with a policy on enqueue (job {job.func_name!r}); cap the queue with '
                'QueueSlot instead, or enqueue with policy=None'
            )
        if not self._is_async:
            # A synchronous queue runs the job at once: nothing ever waits, so there is nothing to hold.
            return super().enqueue_job(job, at_front=at_front, **kwargs)
        digest = identity.digest(func_path(job), self.name, job.args, job.kwargs, spec.unique_context)
        door = _door.get()
        debounced = spec.get(Debounce)
        if door is not None and door.force:
            write = self._job_write(job, spec, digest, at_front, when)
            admitted = throttle.force(self, spec, digest, write)
        elif debounced is not None:
            write = self._job_write(job, spec, digest, at_front, when, schedule=True)
            admitted = debounce.enqueue(self, debounced, digest, write)
        else:
            write = self._job_write(job, spec, digest, at_front, when)
            throttled = spec.get(Throttle)
            if throttled is not None:
                admitted = throttle.enqueue(self, throttled, digest, write, door.hint if door is not None else None)
            else:
                admitted = self._admit_loner(write, digest, door.hint if door is not None else None)
        if not admitted:
            return None
        if write.mode == 'D':
            return self._finish_deferred(job, write.marker if write.loner else None, at_front)
        return job

    def _prepare(
        self, job: Job, when: datetime | None, at_front: bool, schedule: bool = False
    ) -> tuple[str, int, str]:
        """Set what rq's own enqueue sets on the job; return (mode, score, destination key).

        ``schedule`` writes the job as a scheduled one even without a time (the policy's script sets the time).
        """
        job.origin = self.name
        job.redis_server_version = self.get_redis_server_version()
        if job.timeout is None:
            job.timeout = self._default_timeout
        if when is not None or schedule:
            job._status = JobStatus.SCHEDULED
            from rq.registry import ScheduledJobRegistry

            return 'S', _score(when) if when is not None else 0, ScheduledJobRegistry(queue=self).key
        if job._dependency_ids:
            job._status = JobStatus.DEFERRED
            return 'D', 0, self.key
        job.enqueued_at = now()
        job._status = JobStatus.QUEUED
        return ('L' if at_front else 'R'), 0, self.key

    def _job_write(
        self, job: Job, spec: PolicySet, digest: str, at_front: bool, when: datetime | None, schedule: bool = False
    ) -> JobWrite:
        """Prepare the job as rq would and flatten it for an admission script."""
        has_loner = spec.get(Loner) is not None
        marker = keys.loner(self.name, digest)
        mode, score, dest = self._prepare(job, when, at_front, schedule)
        fields = _flatten(job.to_dict())
        if has_loner:
            fields += [keys.LONER_FIELD, marker]
        ttl = job.ttl if job.ttl and job.ttl > 0 else -1
        if mode == 'D' and ttl < 0:
            ttl = DEFERRED_LEASE_SECONDS
        return JobWrite(job, mode, score, dest, ttl, fields, marker, has_loner)

    def _admit_loner(self, write: JobWrite, digest: str = '', hint: Any = None) -> bool:
        job = write.job
        admitted, holder = scripts.run(
            'enqueue_job',
            self.connection,
            [job.key, write.dest, self.redis_queues_keys, write.marker, keys.DROPS],
            [
                job.id,
                write.mode,
                write.score,
                write.ttl,
                self.key,
                self.job_class.redis_job_namespace_prefix,
                1 if write.loner else 0,
                keys.drop_field('loner', self.name),
                keys.wake(self.name),
                pack_fields(write.fields),
            ],
        )
        if not admitted:
            loner.remember_held(hint, digest)
            loner.log_drop(job.func_name, self.name, holder)
            return False
        return True

    def _finish_deferred(self, job: Job, marker: str | None, at_front: bool) -> Job:
        """Hand an admitted job with dependencies to rq's own dependency handling, then drop the lease."""
        try:
            job = super().enqueue_job(job, at_front=at_front)
        except BaseException:
            if marker is not None:
                release_markers(self.connection, self.job_class, [job.id])
            raise
        with self.connection.pipeline(transaction=False) as pipe:
            if job.ttl and job.ttl > 0:
                pipe.expire(job.key, job.ttl)
            else:
                pipe.persist(job.key)
                if marker is not None:
                    pipe.persist(marker)
            pipe.execute()
        return job

    # -- asking -----------------------------------------------------------------------------------------------

    def holder(self, func: Any, *args: Any, **kwargs: Any) -> str | None:
        """The id of the waiting job holding this call's loner identity on this queue, or None."""
        probe = self.job_class.create(func, args=args, kwargs=kwargs, connection=self.connection)
        spec = self._declared_for(func)
        digest = identity.digest(func_path(probe), self.name, args, kwargs, spec.unique_context if spec else None)
        found = scripts.run(
            'loner_holder',
            self.connection,
            [keys.loner(self.name, digest)],
            [self.job_class.redis_job_namespace_prefix],
        )
        if not found:
            return None
        return found.decode() if isinstance(found, bytes) else found

    def enqueued(self, func: Any, *args: Any, **kwargs: Any) -> bool:
        """resque-loner's ``enqueued?``: is a job of this call waiting on this queue (queued, scheduled, deferred)?"""
        return self.holder(func, *args, **kwargs) is not None

    # -- force and reset ------------------------------------------------------------------------------------------

    def force(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        """Enqueue now, whatever the policies say (the Go throttler's ``Force``). Takes rq's ``enqueue`` options.

        The job takes this identity's current throttle slot, and a pending trailing job or pending debounced job of
        the identity is dropped (deleted). With a Loner, the job takes the loner marker when no other job holds it.

        Returns:
            The Job, always.
        """
        policy = kwargs.pop('policy', _DECLARED)
        with self._door(policy, force=True):
            return super().enqueue(f, *args, **kwargs)

    def reset(self, func: Any, *args: Any, **kwargs: Any) -> int:
        """Clear this call's policy state on this queue (the Go throttler's ``Reset``).

        Removes the identity's current (and next) throttle slot, its pending trailing job, its loner marker and its
        pending debounced job, all in one script. Pending jobs are deleted; a job already queued or running is left
        alone (only the marker naming it goes). ``policy=`` names the policies when they are not declared (the
        throttle's slot width is needed to find its slot keys).

        Returns:
            How many keys were removed (policy keys and the hashes of dropped pending jobs).
        """
        policy = kwargs.pop('policy', _DECLARED)
        spec = self._spec(policy, func)
        probe = self.job_class.create(func, args=args, kwargs=kwargs, connection=self.connection)
        digest = identity.digest(func_path(probe), self.name, args, kwargs, spec.unique_context if spec else None)
        return throttle.reset(self, spec, digest)

    # -- removal paths free the identity ----------------------------------------------------------------------

    def remove(self, job_or_id: Any, pipeline: Any = None) -> Any:
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        release_markers(pipeline if pipeline is not None else self.connection, self.job_class, [job_id])
        # By id: rq's remove() only unwraps instances of self.job_class; Job.fetch and registries hand out plain Jobs.
        return super().remove(job_id, pipeline=pipeline)

    def empty(self) -> Any:
        start = 0
        while True:
            chunk = self.connection.lrange(self.key, start, start + 999)
            if not chunk:
                break
            release_markers(self.connection, self.job_class, [c.decode() for c in chunk])
            start += len(chunk)
        return super().empty()

    # -- fetch ----------------------------------------------------------------------------------------------------

    @classmethod
    def dequeue_any(  # type: ignore[override]
        cls,
        queues: Iterable[Queue],
        timeout: int | None,
        connection: Any = None,
        job_class: type[Job] | None = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Job, Queue] | None:
        """Take the next job, clearing its loner marker and taking a slot on a capped queue, in one script.

        Queues are tried in order; a capped queue with no free slot is skipped. When nothing can be taken and
        ``timeout`` is not None, waits (woken by admissions and releases) until ``timeout`` seconds have passed, then
        raises DequeueTimeout, as rq's own dequeue does. With ``timeout=None`` (burst) it returns None once nothing
        is waiting, but keeps waiting while a full capped queue still has jobs: those are work not yet done.
        """
        queues = list(queues)
        fetcher = _fetcher.get()
        if fetcher is None:
            # Not a PolicyWorker (a stock worker given this queue class): it could never release a hold, so it
            # fetches exactly as stock rq does. Loner markers of the jobs it takes heal by themselves.
            return super().dequeue_any(
                queues, timeout, connection=connection, job_class=job_class, serializer=serializer,
                death_penalty_class=death_penalty_class,
            )
        job_cls = job_class or cls.job_class
        prefix = job_cls.redis_job_namespace_prefix
        names = [q.name for q in queues]
        script_keys = [keys.CAPACITY]
        for q in queues:
            script_keys += [q.key, q.intermediate_queue_key, keys.slots(q.name)]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            token = QueueSlot.claim_token()
            fetched_after = time.time()
            index, job_id, *rest = scripts.run(
                'dequeue_job', connection, script_keys, [prefix, token, fetcher.hold_ttl, *names]
            )
            if index:
                queue = queues[index - 1]
                job_id = job_id.decode() if isinstance(job_id, bytes) else job_id
                held = token if rest and rest[0] == 1 else None
                try:
                    job = job_cls.fetch(job_id, connection=connection, serializer=serializer)
                except NoSuchJobError:
                    # Deleted between the pop and the fetch: give the slot back and look again.
                    with connection.pipeline(transaction=False) as pipe:
                        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
                        if held:
                            QueueSlot.release(queue.name, held, connection=pipe)
                        pipe.execute()
                    continue
                except BaseException:
                    # An unreadable job: the hold goes back now, the id stays on the intermediate list for rq.
                    if held:
                        with contextlib.suppress(Exception):  # else it ages out; the fetch error is the news
                            QueueSlot.release(queue.name, held, connection=connection)
                    raise
                fetcher.on_claim(Claim(job_id, queue.name, held, fetched_after))
                return job, cls._rebuild(queue, connection, job_cls, serializer, death_penalty_class)
            waiting = job_id
            full = frozenset(names[i - 1] for i in rest)
            if deadline is None and not waiting:
                return None
            if fetcher.listen(connection, names):
                continue  # a wake-up published before the subscription landed is lost: look once more first
            if deadline is None:
                fetcher.wait(connection, names, IDLE_POLL_SECONDS, full)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DequeueTimeout(timeout, [q.key for q in queues])
            fetcher.wait(connection, names, remaining, full)

    @classmethod
    def _rebuild(
        cls, queue: Queue, connection: Any, job_class: Any, serializer: Any, death_penalty_class: Any
    ) -> Queue:
        kwargs: dict[str, Any] = {'connection': connection, 'job_class': job_class, 'serializer': serializer}
        if death_penalty_class is not None:
            kwargs['death_penalty_class'] = death_penalty_class
        return cls.from_queue_key(queue.key, **kwargs)
