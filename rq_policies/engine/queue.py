"""PolicyQueue: an rq Queue whose enqueue doors apply the job's policies, and whose fetch applies the fetch policies.

Every public enqueue door (``enqueue``, ``enqueue_call``, ``enqueue_at``, ``enqueue_in``, ``enqueue_many`` and the
``@job`` decorator's ``.delay()``) admits the job through one Lua script that checks the policy and writes the job
in the same round trip. An admitted job is an ordinary rq job; a dropped one returns ``None`` and is logged at INFO
with the id of the job that holds its identity.

A job without a policy goes through the same script with no policy (no check, no identity): written exactly as rq
writes it, in one round trip, and a resend of the call writes nothing (see ``PolicyQueue._writes_plain`` for what
stays on rq's own pipeline).

Retries, the release of dependents and requeues reach ``enqueue_job``/``schedule_job`` from inside rq rather than
through a door, so they are the same job and are not checked again. ``enqueue_job`` called directly is likewise
unchecked: it is rq's internal re-enqueue path.

A door builds its job through rq's own code and plans its round trip with the door core
(:func:`rq_policies.engine.admission.plan`); this queue is that core's synchronous driver (:meth:`PolicyQueue._send`).
Inside :func:`planning` the same doors hand their plans back unsent, which is how the asyncio doors
(:mod:`rq_policies.surfaces.aio`) build theirs.
"""

from __future__ import annotations

import calendar
import contextlib
import logging
import os
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.utils import import_attribute, now

from . import admission, compat, identity, keys
from .admission import JobWrite, Plan
from .exceptions import InvalidArgument, NotReplicated, PipelineNotSupported, PolicyConfigurationError
from .fetch import current_fetcher, dequeue
from .job import PolicyJob, rq_class_name
from .ops import Call
from .policy import PolicySet, by_name, declared, make_set
from .reading import declare_queue

logger = logging.getLogger('rq_policies')

#: The ``policy=`` default of every door: apply the policies declared on the function.
DECLARED: Any = object()

#: Function paths :func:`declared_for` could not import and has warned about (once per path and process).
_UNIMPORTABLE_WARNED: set[str] = set()

#: Seconds a deferred (depends_on) job's hash and marker live before rq has finished setting up its dependencies;
#: if the producer dies in that window the hold lapses by itself.
DEFERRED_LEASE_SECONDS = 300


@dataclass
class _Door:
    """The policy override of the public enqueue call in progress (``DECLARED``, None or a PolicySet)."""

    override: Any
    used: bool = False
    force: bool = False
    hint: Any = None  # what the call's hint probe saw, for its verdict to feed (rq_policies.engine.admission.Seen)
    options: Any = None  # the enqueue options the call's policies took (Policy.call_options), or None
    replicated: tuple[int, int] | None = None  # (replicas, timeout_ms) the door waits for (wait_replicas=), or None


_door: ContextVar[_Door | None] = ContextVar('rq_policies_door', default=None)

def door_override(default: Any = DECLARED) -> Any:
    """The ``policy=`` of the enqueue call in progress in this context (a subclass's door, such as django-rq's
    deferred enqueue, carries it to where the job is written), or ``default`` outside any call."""
    door = _door.get()
    return door.override if door is not None else default


def door_options() -> dict[str, Any]:
    """The enqueue keyword options the call in progress gave its policies (each policy's ``call_options``, taken
    out of the call before rq parsed it, so the function never gets them), for their ``job_fields``."""
    door = _door.get()
    return (door.options if door is not None else None) or {}


def take_options(spec: PolicySet | None, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Take the keyword options ``spec``'s policies consume (``Policy.call_options``) out of a door's ``kwargs``."""
    if not spec or not kwargs:
        return None
    names = spec.memo.get('call_options')
    if names is None:  # once per set: this runs on every enqueue
        names = spec.memo['call_options'] = tuple(name for item in spec.policies for name in item.call_options)
    if not names:
        return None
    found = {name: kwargs.pop(name) for name in names if name in kwargs}
    return found or None


#: The plans the doors called inside :func:`planning` handed back (None outside: the doors send theirs).
_planning: ContextVar[list[Plan] | None] = ContextVar('rq_policies_planning', default=None)


@contextlib.contextmanager
def planning() -> Iterator[list[Plan]]:
    """Inside, every door of a PolicyQueue builds its job exactly as it does outside (rq's own build, the policies,
    the door core's plan) and appends its plan to the list yielded, sending nothing: no admission, no hint probe (an
    asyncio door, :mod:`rq_policies.surfaces.aio`, sends the plans itself). A door that would take rq's own
    synchronous path instead meets the queue's connection, which for such a builder refuses it."""
    plans: list[Plan] = []
    token = _planning.set(plans)
    try:
        yield plans
    finally:
        _planning.reset(token)


def declared_for(func_or_job: Any) -> PolicySet | None:
    """The policies declared on a job's function, or on a function given itself or by its import path; None when
    there are none, or when the path cannot be imported here (warned once per path: a producer may enqueue by path
    without having the code, but a typo in the path must not switch a policy off in silence)."""
    try:
        if isinstance(func_or_job, Job):
            target = func_or_job.func
        elif isinstance(func_or_job, str):
            target = import_attribute(func_or_job)
        else:
            target = func_or_job
    except (ImportError, AttributeError, ValueError) as error:
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


def door_spec(policy: Any, func: Any) -> PolicySet | None:
    """The PolicySet a door applies to ``func``: the declared one (``policy=DECLARED``), or the caller's ``policy=``."""
    return declared_for(func) if policy is DECLARED else make_set(policy)


def call_digest(queue: Queue, func: Any, args: tuple, kwargs: dict[str, Any], spec: PolicySet | None) -> str:
    """The identity of a call of ``func`` on ``queue`` under ``spec``, as its door computes it (``holder``,
    ``reset``), from a job never written: no description (rq's repr of every argument, which would raise
    RecursionError on an argument nested too deep before the identity could name it)."""
    probe = queue.job_class.create(func, args=args, kwargs=kwargs, connection=queue.connection, description='-')
    return identity.digest(identity.func_path(probe), queue.name, args, kwargs, spec.unique_context if spec else None,
                           spec.policies if spec else None)


def replication(wait_replicas: Any, wait_timeout_ms: Any) -> tuple[int, int]:
    """``(wait_replicas, wait_timeout_ms)`` checked: a whole number of replicas >= 0 (0: do not wait) and a positive
    whole number of milliseconds.

    Raises:
        InvalidArgument: either is not, naming it and the value (nothing is written).
    """
    if isinstance(wait_replicas, bool) or not isinstance(wait_replicas, int) or wait_replicas < 0:
        raise InvalidArgument('wait_replicas', f'must be a whole number of replicas, 0 or more (0: do not wait), got '
                                               f'{wait_replicas!r}')
    if isinstance(wait_timeout_ms, bool) or not isinstance(wait_timeout_ms, int) or wait_timeout_ms < 1:
        raise InvalidArgument('wait_timeout_ms', f'must be a positive whole number of milliseconds (WAIT\'s 0, '
                                                 f'forever, is refused), got {wait_timeout_ms!r}')
    return wait_replicas, wait_timeout_ms


#: What ``_take_door`` answers for a new job of a public door that no policy applies to.
_PLAIN: Any = object()

_TEXT = frozenset((str, bytes))


def _flatten(mapping: dict[str, Any]) -> list[Any]:
    """A job's ``to_dict()`` as the flat field/value list HSET takes (None values skipped, as rq's scripts do)."""
    flat: list[Any] = []
    append = flat.append
    for field_name, value in mapping.items():
        if value is not None:
            append(field_name)
            # the exact-type test first: nearly every value is a str or bytes, and it is the cheaper one
            append(value if type(value) in _TEXT or isinstance(value, (bytes, str)) else str(value))
    return flat


def _call_of(args: tuple, kwargs: dict[str, Any]) -> tuple[str, tuple, dict[str, Any]]:
    """``(function name, args, kwargs)`` of a ``create_job`` call, as rq takes them (positional or by name)."""
    func = args[0] if args else kwargs.get('func')
    fargs = args[1] if len(args) > 1 else kwargs.get('args')
    fkwargs = args[2] if len(args) > 2 else kwargs.get('kwargs')
    try:
        name = identity.function_name(func)
    except AttributeError:  # a callable object: rq names it its own way
        name = repr(func)
    return name, tuple(fargs or ()), dict(fkwargs or {})


def _undescribable(exc: BaseException, args: tuple, kwargs: dict[str, Any]) -> InvalidArgument | None:
    """The argument rq's ``create_job`` could not describe (its repr raised ``exc``: nested too deeply, an int past
    Python's digit limit), named; None when no argument is to blame (rq's own ValueErrors, already clear)."""
    if kwargs.get('description') is not None:
        return None
    func, fargs, fkwargs = _call_of(args, kwargs)
    for name, value in [*((f'args[{i}]', v) for i, v in enumerate(fargs)),
                        *((f'kwargs[{k!r}]', v) for k, v in fkwargs.items())]:
        try:
            repr(value)
        except RecursionError:
            return InvalidArgument(name, 'nested too deeply for rq to describe the job (repr() exceeded the maximum '
                                   'recursion depth)', func)
        except ValueError as err:
            return InvalidArgument(name, f'rq cannot describe the job: repr() raised {err}', func)
    return None


def _check_text(description: str, args: tuple, kwargs: dict[str, Any]) -> None:
    """InvalidArgument when the job's description is not text Redis can store (a lone surrogate, which UTF-8 cannot
    encode): rq writes a keyword argument's name into it as is; other values go in as their repr, escaped."""
    try:
        description.encode('utf-8')
    except UnicodeEncodeError as exc:
        func, _, fkwargs = _call_of(args, kwargs)
        for key in fkwargs:
            if not _encodable(key):
                raise InvalidArgument(f'the name of keyword argument {key!r}', _SURROGATE, func) from exc
        raise InvalidArgument('description=', _SURROGATE, func) from exc


#: Why text with a lone surrogate is refused.
_SURROGATE = 'contains a lone surrogate (such as \\ud800), which UTF-8 cannot encode, and Redis stores text as UTF-8'


def _encodable(text: str) -> bool:
    try:
        text.encode('utf-8')
    except UnicodeEncodeError:
        return False
    return True


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

    #: Replicas every door of this queue waits for before it returns (``PolicyQueue(..., wait_replicas=1)``; 0, the
    #: default: none), and the most milliseconds it waits (``wait_timeout_ms``); a door's own ``wait_replicas=`` and
    #: ``wait_timeout_ms=`` win. See :meth:`enqueue` and docs/guarantees.md.
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000

    def __init__(self, *args: Any, wait_replicas: int = 0, wait_timeout_ms: int = 1000, **kwargs: Any) -> None:
        self.wait_replicas, self.wait_timeout_ms = replication(wait_replicas, wait_timeout_ms)
        super().__init__(*args, **kwargs)
        keys.check_connection(self.connection)  # a cluster needs a hash-tagged RQ_KEY_PREFIX: said here, not CROSSSLOT
        declare_queue(self.name)  # a cap set on it before its first enqueue is no typo (UnknownQueueWarning)
        compat.adopt_cluster(self.connection)

    def _replicated(self, kwargs: dict[str, Any]) -> tuple[int, int] | None:
        """Take a door's ``wait_replicas=`` and ``wait_timeout_ms=`` out of its ``kwargs`` (the job's function never
        gets them), the queue's own where not given: ``(replicas, timeout_ms)`` to wait for, or None."""
        wanted = kwargs.pop('wait_replicas', None)
        timeout = kwargs.pop('wait_timeout_ms', None)
        if wanted is None and timeout is None and not self.wait_replicas:
            return None
        replicas, timeout_ms = replication(self.wait_replicas if wanted is None else wanted,
                                           self.wait_timeout_ms if timeout is None else timeout)
        return (replicas, timeout_ms) if replicas else None

    def _check_replicated(self, found: Any, acknowledged: int, replicated: tuple[int, int] | None) -> None:
        """Raise :class:`~rq_policies.engine.exceptions.NotReplicated` when fewer replicas than asked had what the door
        wrote (``acknowledged``, -1 for not asked yet: :func:`rq_policies.engine.admission.replicated` asks now)."""
        if replicated is None:
            return
        replicas, timeout_ms = replicated
        if acknowledged < 0:
            acknowledged = admission.replicated(self.connection, replicas, timeout_ms)
        if acknowledged < replicas:
            raise NotReplicated(found, acknowledged, replicas, timeout_ms)

    def __repr__(self) -> str:
        return f'{rq_class_name(type(self))}({self.name!r})'

    def __str__(self) -> str:
        return f'<{rq_class_name(type(self))} {self.name}>'

    # -- the doors ------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _door(self, policy: Any, force: bool = False, hint: Any = None, options: Any = None,
              replicated: tuple[int, int] | None = None) -> Iterator[None]:
        if _door.get() is not None:  # an inner door of the same call (enqueue_at -> enqueue_call): the outer one rules
            yield
            return
        override = policy if policy is DECLARED else make_set(policy)
        token = _door.set(_Door(override, force=force, hint=hint, options=options, replicated=replicated))
        try:
            yield
        finally:
            _door.reset(token)

    def enqueue(self, f: Any, *args: Any, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue``, plus ``policy=`` (a Policy, a list of them, or None to switch the declared ones off) and
        ``wait_replicas=``, ``wait_timeout_ms=`` (as the queue's, for this call: 0 does not wait).

        With ``wait_replicas=N`` (here or on the queue) the door sends ``WAIT N wait_timeout_ms`` right after its
        admission, in the same round trip and on the same connection (on a cluster, the prefix slot's primary), and
        returns once N replicas have the job: "acknowledged" then means "on N replicas too", which a failover of the
        primary does not undo (docs/guarantees.md). A drop waits for nothing.

        Returns:
            The Job, or None when a policy dropped it.

        Raises:
            NotReplicated: fewer than N replicas had the job after ``wait_timeout_ms``: the job *is* admitted (see
                :class:`~rq_policies.engine.exceptions.NotReplicated`).
            InvalidArgument: a bad ``wait_replicas`` or ``wait_timeout_ms``, named (nothing is written).
        """
        policy = kwargs.pop('policy', DECLARED)
        if _door.get() is not None:  # an inner door of the same call: the outer one rules
            return super().enqueue(f, *args, **kwargs)
        replicated = self._replicated(kwargs)
        spec = door_spec(policy, f)
        options = take_options(spec, kwargs)
        dropped, hint = self._quick_drop(spec, f, args, kwargs)
        if dropped:
            return None
        # The door is set by hand rather than through ``_door()``: this is the hottest door, and a generator-based
        # context manager costs more than the rest of the door's own bookkeeping.
        token = _door.set(_Door(spec, hint=hint, options=options, replicated=replicated))
        try:
            return super().enqueue(f, *args, **kwargs)
        finally:
            _door.reset(token)

    def enqueue_call(self, func: Any, *args: Any, policy: Any = DECLARED, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue_call``, plus ``policy=``, ``wait_replicas=`` and ``wait_timeout_ms=`` (as :meth:`enqueue`).
        Returns None when a policy dropped the job."""
        if _door.get() is not None:  # an inner door (enqueue arrives here): the outer one rules
            return super().enqueue_call(func, *args, **kwargs)
        replicated = self._replicated(kwargs)
        hint = None
        if not args:  # the @job decorator's .delay() arrives here
            call = {name: kwargs[name] for name in ('args', 'kwargs', 'job_id', 'pipeline', 'unique', 'rate_limit')
                    if kwargs.get(name) is not None}
            dropped, hint = self._quick_drop(door_spec(policy, func), func, (), call)
            if dropped:
                return None
        with self._door(policy, hint=hint, replicated=replicated):
            return super().enqueue_call(func, *args, **kwargs)

    def enqueue_at(self, datetime: datetime, f: Any, *args: Any, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue_at``, plus ``policy=``, ``wait_replicas=`` and ``wait_timeout_ms=`` (as :meth:`enqueue`). A
        scheduled job holds its loner identity until a worker takes it."""
        policy = kwargs.pop('policy', DECLARED)
        replicated = None if _door.get() is not None else self._replicated(kwargs)
        with self._door(policy, options=take_options(door_spec(policy, f), kwargs), replicated=replicated):
            return super().enqueue_at(datetime, f, *args, **kwargs)

    def enqueue_in(self, time_delta: timedelta, func: Any, *args: Any, **kwargs: Any) -> Job | None:  # type: ignore[override]
        """rq's ``enqueue_in``, plus ``policy=``, ``wait_replicas=`` and ``wait_timeout_ms=`` (as :meth:`enqueue`)."""
        policy = kwargs.pop('policy', DECLARED)
        replicated = None if _door.get() is not None else self._replicated(kwargs)
        with self._door(policy, options=take_options(door_spec(policy, func), kwargs), replicated=replicated):
            return super().enqueue_in(time_delta, func, *args, **kwargs)

    def enqueue_many(self, job_datas: Iterable[Any], pipeline: Any = None, group_id: str | None = None,  # type: ignore[override]
                     wait_replicas: int | None = None, wait_timeout_ms: int | None = None) -> list:
        """rq's ``enqueue_many`` with each job's declared policies applied; with ``wait_replicas`` (or the queue's),
        one ``WAIT`` once every job is written (not with a caller's ``pipeline=``, which is not sent yet).

        Returns:
            A list as long as ``job_datas``, with None where a policy dropped the job.

        Raises:
            PipelineNotSupported: ``pipeline=`` was given and some job has a policy.
            NotReplicated: fewer replicas than asked had the jobs (they *are* admitted; its ``job`` is the list).
        """
        options: dict[str, Any] = {}
        if wait_replicas is not None:
            options['wait_replicas'] = wait_replicas
        if wait_timeout_ms is not None:
            options['wait_timeout_ms'] = wait_timeout_ms
        replicated = self._replicated(options)
        if replicated is not None and pipeline is not None:
            raise InvalidArgument('wait_replicas', 'cannot wait for replicas with pipeline=: the pipeline is the '
                                                   "caller's to send; call replicas.wait_for_replicas after it")
        results = self._enqueue_many(job_datas, pipeline, group_id)
        if any(job is not None for job in results):
            self._check_replicated(results, -1, replicated)
        return results

    def _enqueue_many(self, job_datas: Iterable[Any], pipeline: Any, group_id: str | None) -> list:
        datas = list(job_datas)
        specs = [declared_for(data.func) for data in datas]
        if not any(specs) and _planning.get() is None:  # planning: each job is planned as the plain write
            return super().enqueue_many(datas, pipeline=pipeline, group_id=group_id)
        if pipeline is not None:
            first = next(data for data, spec in zip(datas, specs) if spec)
            raise PipelineNotSupported(self.name, str(getattr(first.func, '__name__', first.func)))
        seen: set[str] = set()
        for data in datas:
            if data.job_id is not None:
                if data.job_id in seen:
                    raise InvalidArgument(
                        'job_id', message=f"Job ID '{data.job_id}' appears more than once in enqueue_many()")
                seen.add(data.job_id)
        results: list[Job | None] = []
        for data in datas:
            fields = compat.create_job_kwargs(data._asdict())
            fields['status'] = JobStatus.QUEUED
            if group_id is not None:
                fields['group_id'] = group_id
            job = self.create_job(**fields)
            with self._door(DECLARED):
                results.append(self.enqueue_job(job, at_front=bool(data.at_front)))
        return results

    # -- where the doors arrive -----------------------------------------------------------------------------------

    def create_job(self, *args: Any, **kwargs: Any) -> Job:  # type: ignore[override]
        """rq's ``create_job`` (every door builds its job here); a job whose id the caller chose (``job_id=``) is
        marked, so that a policy's drop of it leaves the record ``explain`` reads (``keys.dropped``)."""
        try:
            job = super().create_job(*args, **kwargs)
        except (RecursionError, ValueError) as exc:  # rq's description: repr() of every argument
            culprit = _undescribable(exc, args, kwargs)
            if culprit is None:
                raise
            raise culprit from exc
        description = job.description
        if description is not None and not description.isascii():  # O(1): CPython flags ASCII strings
            _check_text(description, args, kwargs)
        if kwargs.get('job_id') is not None:
            admission.mark_chosen_id(job)
        return job

    def push_job_id(self, job_id: str, pipeline: Any = None, at_front: bool = False) -> None:
        """rq's push, made safe to send twice, plus a wake-up for idle PolicyWorkers: one script (``lua/push.lua``)
        riding the same pipeline, or a call of its own.

        Every push rq makes through this queue passes here: jobs without a policy that stay on rq's pipeline
        (``_writes_plain``), ``enqueue_many``, retries, released dependents on rq 2.12. rq 3 pushes a released
        dependent from its ``ReadyJobRegistry``, through a ``Queue`` of its own: a stock push (below).
        rq sends it inside a transaction with the job's hash, and redis-py resends the whole transaction after a lost
        reply; each call carries a fresh token that the first attempt records in the job's hash, so a resent one
        pushes nothing (a plain RPUSH pushed the id twice, and the job ran twice). Pushes by stock ``rq.Queue``
        producers (and rq's scheduler, requeues from a registry) are rq's own: they do not publish (idle PolicyWorkers
        see those within ``IDLE_POLL_SECONDS``, the idle probe) and are not guarded.
        """
        call = self._push_call(job_id, 'L' if at_front else 'R', self.key, wake=keys.wake(self.name))
        if pipeline is not None:
            call.run(pipeline)
        else:
            call.run(self.connection)

    def _push_call(self, job_id: str, mode: str, dest: str, score: int = 0, wake: str | None = None) -> Call:
        """The ``lua/push.lua`` call that pushes ``job_id`` once (mode R, L or S), with this call's own token."""
        call = Call('push', jid=job_id, token=os.urandom(6).hex(), mode=mode, wake=wake, record_ttl=keys.PUSHED_SECONDS)
        if mode == 'S':
            call.arg('score', score)
        call.key('job', self.job_class.redis_job_namespace_prefix + job_id).key('dest', dest)
        return call.key('record', keys.pushed(job_id))

    def _schedule_once(self, job: Job, when: datetime, pipeline: Any) -> Job:
        """rq's ``schedule_job`` (the hash, then the scheduled registry's entry, in one transaction) with the entry
        written by ``lua/push.lua``: a ZADD is idempotent only while the entry is there, and a resend that arrived after
        rq's scheduler had moved the due job to its queue put it back, to be pushed and run a second time."""
        from rq.registry import ScheduledJobRegistry

        pipe = pipeline if pipeline is not None else self.connection.pipeline()
        pipe.sadd(self.redis_queues_keys, self.key)
        compat.persist_job(self, job, pipe, JobStatus.SCHEDULED)
        self._push_call(job.id, 'S', ScheduledJobRegistry(queue=self).key, score=_score(when),
                        wake=keys.wake(self.name)).run(pipe)
        if pipeline is None:
            pipe.execute()
        return job

    def enqueue_job(self, job: Job, pipeline: Any = None, at_front: bool = False, **kwargs: Any) -> Job | None:  # type: ignore[override]
        job = compat.adopt_job(job, self.job_class)  # a stock rq Job too (Job.fetch, registries, admin views)
        door = _door.get()
        spec = self._take_door(job)
        replicated = door.replicated if door is not None and spec is not None else None
        if spec is _PLAIN:
            if self._writes_plain(job, pipeline, kwargs) and self.is_async and not compat.has_dependencies(job):
                write = self._plain_write(job, at_front, None)
                write.replicas = replicated
                return self._send(admission.plan(self, None, '', write))
            spec = None
        if spec is None:
            found = super().enqueue_job(job, pipeline=pipeline, at_front=at_front, **kwargs)
            if pipeline is None:  # rq's own path wrote it: one WAIT of its own (a caller's pipeline is not sent yet)
                self._check_replicated(found, -1, replicated)
            return found
        return self._admit(job, spec, pipeline, at_front=at_front, when=None, **kwargs)

    def schedule_job(self, job: Job, datetime: datetime, pipeline: Any = None, **kwargs: Any) -> Job | None:  # type: ignore[override]
        job = compat.adopt_job(job, self.job_class)
        door = _door.get()
        spec = self._take_door(job)
        replicated = door.replicated if door is not None and spec is not None else None
        if spec is _PLAIN:
            if self._writes_plain(job, pipeline, kwargs):
                write = self._plain_write(job, False, datetime)
                write.replicas = replicated
                return self._send(admission.plan(self, None, '', write))
            spec = None
        if spec is None:
            if kwargs.get('unique') or compat.has_rate_limit(job):  # rq's own script, or rq 3's rate-limit checks
                found = super().schedule_job(job, datetime, pipeline=pipeline, **kwargs)
            else:
                found = self._schedule_once(job, datetime, pipeline)
            if pipeline is None and found is not None:
                self._check_replicated(found, -1, replicated)
            return found
        return self._admit(job, spec, pipeline, at_front=bool(job.enqueue_at_front), when=datetime, **kwargs)

    def _enqueue_job(self, job: Job, *args: Any, **kwargs: Any) -> Job:
        """rq's enqueue without a dependency check (rq's re-enqueue paths, django-rq's admin "Enqueue"), taking a stock
        rq ``Job`` too: rq removes a deferred job from its registry by object, which only works for the queue's
        ``job_class`` (:func:`rq_policies.engine.compat.adopt_job`)."""
        return super()._enqueue_job(compat.adopt_job(job, self.job_class), *args, **kwargs)

    def get_job_position(self, job_or_id: Any) -> int | None:
        """rq's ``get_job_position``, taking a stock rq ``Job`` too (by id)."""
        return super().get_job_position(job_or_id.id if isinstance(job_or_id, Job) else job_or_id)

    def _take_door(self, job: Job) -> Any:
        """The PolicySet the open door applies to ``job``; ``_PLAIN`` when a door is open but no policy applies (a
        new job of a public door); None when no door is open (rq's own re-enqueue: a retry, a released dependent)."""
        door = _door.get()
        if door is None or door.used:
            return None
        door.used = True
        spec = declared_for(job) if door.override is DECLARED else door.override
        return _PLAIN if spec is None else spec

    @staticmethod
    def _writes_plain(job: Job, pipeline: Any, kwargs: dict[str, Any]) -> bool:
        """Can the admission script write this new job without a policy (the door core's plain write)? Not what rq's
        own path does more than write the job and push it: a caller's pipeline (the write must ride it), a
        ``unique=True`` enqueue (rq's own script), rq 3's rate-limited jobs (their registry), ``ttl=0`` (rq deletes
        the job at once), or an option this code does not know; the callers add a synchronous queue and
        dependencies (rq's dependency handling) for a job enqueued now."""
        return (pipeline is None and not any(kwargs.values()) and not compat.has_rate_limit(job)
                and job.ttl != 0)

    def _plain_write(self, job: Job, at_front: bool, when: datetime | None) -> JobWrite:
        """A job without a policy, prepared and flattened exactly as rq's ``enqueue_job`` (``when`` None) or
        ``schedule_job`` writes it: the scheduled one gets its status only, as rq's does."""
        if when is None:
            mode, score, dest = self._prepare(job, None, at_front)
        else:
            from rq.registry import ScheduledJobRegistry

            compat.set_local_status(job, JobStatus.SCHEDULED)
            mode, score, dest = 'S', _score(when), ScheduledJobRegistry(queue=self).key
        mapping = job.to_dict()
        ttl = job.ttl if job.ttl and job.ttl > 0 else -1
        return JobWrite(job, mode, score, dest, ttl, _flatten(mapping), created=mapping.get('created_at'))

    def _quick_drop(self, spec: PolicySet | None, f: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        """Drop an expected duplicate before its job is built, with a probe (the door core's
        :func:`~rq_policies.engine.admission.probe_plan`); (dropped, what the full path is to remember)."""
        if spec is None or _planning.get() is not None:  # nothing to drop; a builder sends no probe
            return False, None
        plan, hint = admission.probe_plan(self, spec, f, args, kwargs)
        if plan is None:
            return False, hint
        return admission.probed(plan, admission.read(plan, self._reply(plan))), plan.hint

    #: :func:`declared_for`, kept for the code that calls it on the class.
    _declared_for = staticmethod(declared_for)

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
                f'rate_limit= cannot be combined with a policy on enqueue (job {job.func_name!r}); cap the queue '
                '(rq-policies cap QUEUE N) instead, or enqueue with policy=None'
            )
        if not self.is_async:
            # A synchronous queue runs the job at once: nothing ever waits, so there is nothing to hold.
            return super().enqueue_job(job, at_front=at_front, **kwargs)
        digest = identity.digest(identity.func_path(job), self.name, job.args, job.kwargs, spec.unique_context,
                                 spec.policies)
        door = _door.get()
        force = door is not None and door.force
        write = self.job_write(job, spec, digest, at_front, when, schedule=not force)
        if door is not None:
            write.replicas = door.replicated
        return self._send(admission.plan(self, spec, digest, write, force, door.hint if door is not None else None),
                          at_front)

    # -- the synchronous driver of the door core ------------------------------------------------------------------

    def _send(self, plan: Plan, at_front: bool = False) -> Job | None:
        """Send ``plan`` (:func:`rq_policies.engine.admission.plan`) and return what the door returns: the job, or
        None when a policy dropped it; a deferred job admitted is handed to rq's dependency handling, and a door that
        waits for replicas (``wait_replicas=``) has waited. Inside :func:`planning`, the plan is handed back instead
        and nothing is sent."""
        kept = _planning.get()
        if kept is not None:
            kept.append(plan)
            return plan.write.job
        write = plan.write
        replicated = write.replicas
        if replicated is not None and write.mode == 'D':  # rq's dependency handling writes after it: one WAIT then
            write.replicas = None
        job = admission.settle(plan, admission.read(plan, self._reply(plan)))
        if job is None:
            return None
        if write.mode == 'D' and admission.hands_over(plan):
            job = self._finish_deferred(job, plan.spec, plan.digest, at_front)
        if replicated is not None:
            self._check_replicated(job, write.acknowledged, replicated)
        return job

    def _reply(self, plan: Plan) -> Any:
        """The reply to ``plan``'s call, sent on this thread's leased connection (``scripts.run_leased``), or, for a
        door that waits for replicas (``write.replicas``), with ``WAIT`` right after it in the same round trip on the
        same connection (:func:`rq_policies.engine.admission.run_replicated`; the count lands in
        ``write.acknowledged``). An error is the plan's observers' to hear of too."""
        write = plan.write
        try:
            if write is None or write.replicas is None:
                return plan.call.run_door(self.connection)
            call = plan.call
            reply, write.acknowledged = admission.run_replicated(call.script, self.connection, list(call.keys),
                                                                 list(call.argv()), *write.replicas)
            return reply
        except BaseException as exc:
            admission.failed(plan, exc)
            raise

    def _prepare(
        self, job: Job, when: datetime | None, at_front: bool, schedule: bool = False
    ) -> tuple[str, int, str]:
        """Set what rq's own enqueue sets on the job; return (mode, score, destination key).

        ``schedule`` writes the job as a scheduled one even without a time (the policy's script sets the time).
        """
        job.origin = self.name
        job.redis_server_version = self.get_redis_server_version()
        if job.timeout is None:
            job.timeout = compat.default_timeout(self)
        if when is not None or schedule:
            compat.set_local_status(job, JobStatus.SCHEDULED)
            from rq.registry import ScheduledJobRegistry

            return 'S', _score(when) if when is not None else 0, ScheduledJobRegistry(queue=self).key
        if compat.has_dependencies(job):
            compat.set_local_status(job, JobStatus.DEFERRED)
            return 'D', 0, self.key
        job.enqueued_at = now()
        compat.set_local_status(job, JobStatus.QUEUED)
        return ('L' if at_front else 'R'), 0, self.key

    def job_write(
        self, job: Job, spec: PolicySet | None = None, digest: str = '', at_front: bool = False,
        when: datetime | None = None, schedule: bool = True,
    ) -> JobWrite:
        """Prepare ``job`` exactly as rq's own enqueue would and flatten it for a script that writes it (the
        admission script, or LimitedCapacityWorker's), with each policy of ``spec`` adding its own fields.

        With ``schedule``, a policy that schedules its jobs (a debounce) gets a scheduled job to time (a forced enqueue
        runs now instead).
        """
        policies = spec.policies if spec is not None else ()
        mode, score, dest = self._prepare(job, when, at_front, schedule and any(p.schedules for p in policies))
        mapping = job.to_dict()
        fields = _flatten(mapping)
        for item in policies:
            fields += item.job_fields(job, self.name, digest)
        ttl = job.ttl if job.ttl and job.ttl > 0 else -1
        if mode == 'D' and ttl < 0:
            ttl = DEFERRED_LEASE_SECONDS
        return JobWrite(job, mode, score, dest, ttl, fields, created=mapping.get('created_at'))

    def _finish_deferred(self, job: Job, spec: PolicySet, digest: str, at_front: bool) -> Job:
        """Hand an admitted job with dependencies to rq's own dependency handling, then drop the lease."""
        try:
            job = super().enqueue_job(job, at_front=at_front)
        except BaseException:
            admission.release(self.connection, self.job_class.redis_job_namespace_prefix, [job.id])
            raise
        with self.connection.pipeline(transaction=False) as pipe:
            if job.ttl and job.ttl > 0:
                pipe.expire(job.key, job.ttl)
            else:
                pipe.persist(job.key)
                for item in spec.policies:
                    if item.leased is not None:
                        pipe.persist(item.leased.prefix(self.name, digest))
            pipe.execute()
        return job

    # -- asking -----------------------------------------------------------------------------------------------

    def holder(self, func: Any, *args: Any, **kwargs: Any) -> str | None:
        """The id of the waiting job holding this call's loner identity on this queue, or None."""
        digest = call_digest(self, func, args, kwargs, declared_for(func))
        return by_name('loner').holder(self.connection, self.name, digest, self.job_class.redis_job_namespace_prefix)

    def enqueued(self, func: Any, *args: Any, **kwargs: Any) -> bool:
        """resque-loner's ``enqueued?``: is a job of this call waiting on this queue (queued, scheduled, deferred)?"""
        return self.holder(func, *args, **kwargs) is not None

    # -- force and reset ------------------------------------------------------------------------------------------

    def force(self, f: Any, *args: Any, **kwargs: Any) -> Job:
        """Enqueue now, whatever the policies say (the Go throttler's ``Force``). Takes rq's ``enqueue`` options.

        The job takes this identity's current throttle slot, and a pending trailing job or pending debounced job of
        the identity is dropped (deleted). With a unique-job policy, the job takes the identity's marker when no other
        job holds it.

        Returns:
            The Job, always.
        """
        policy = kwargs.pop('policy', DECLARED)
        with self._door(policy, force=True, replicated=self._replicated(kwargs)):
            return super().enqueue(f, *args, **kwargs)

    def reset(self, func: Any, *args: Any, **kwargs: Any) -> int:
        """Clear this call's policy state on this queue (the Go throttler's ``Reset``).

        Removes what every admission policy holds for the identity (its current and next throttle slot, its pending
        trailing job, its loner marker and its pending debounced job), all in one script (``lua/reset.lua``).
        Pending jobs are deleted; a job already queued or running is left alone (only the marker naming it goes).
        ``policy=`` names the policies when they are not declared (the throttle's slot width is needed to find its slot
        keys).

        Returns:
            How many keys were removed (policy keys and the hashes of dropped pending jobs).
        """
        spec = door_spec(kwargs.pop('policy', DECLARED), func)
        return admission.reset(self, spec, call_digest(self, func, args, kwargs, spec))

    # -- removal paths free the identity ----------------------------------------------------------------------

    def remove(self, job_or_id: Any, pipeline: Any = None) -> Any:
        job_id = job_or_id.id if isinstance(job_or_id, Job) else job_or_id
        admission.release(pipeline if pipeline is not None else self.connection,
                          self.job_class.redis_job_namespace_prefix, [job_id])
        # By id: rq's remove() only unwraps instances of self.job_class; Job.fetch and registries hand out plain Jobs.
        return super().remove(job_id, pipeline=pipeline)

    def empty(self) -> Any:
        start = 0
        while True:
            chunk = self.connection.lrange(self.key, start, start + 999)
            if not chunk:
                break
            admission.release(self.connection, self.job_class.redis_job_namespace_prefix, [c.decode() for c in chunk])
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
        """Take the next job through the fetch policies, in one script (:func:`rq_policies.engine.fetch.dequeue`).

        Queues are tried in order; a capped queue at its cap is skipped. When nothing can be taken and
        ``timeout`` is not None, waits (woken by admissions and releases) until ``timeout`` seconds have passed, then
        raises DequeueTimeout, as rq's own dequeue does. With ``timeout=None`` (burst) it returns None once nothing
        is waiting, but keeps waiting while a full capped queue still has jobs: those are work not yet done.
        """
        queues = list(queues)
        fetcher = current_fetcher.get()
        if fetcher is None:
            # Not a PolicyWorker (a stock worker given this queue class): it could never release a hold, so it
            # fetches exactly as stock rq does. The loner markers of the jobs it takes heal by themselves.
            return super().dequeue_any(
                queues, timeout, connection=connection, job_class=job_class, serializer=serializer,
                death_penalty_class=death_penalty_class,
            )
        return dequeue(
            cls, fetcher, queues, timeout, connection, job_class or cls.job_class, serializer, death_penalty_class
        )
