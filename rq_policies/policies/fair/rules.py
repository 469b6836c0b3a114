"""Fair: a queue's starts shared fairly among the keys (tenants) with waiting jobs, weighted; priority within a key;
per-key pause and backlog cap (``max_waiting``)::

    @policy(Fair(key=lambda args, kwargs: kwargs['tenant']))
    def sync(tenant, item): ...

    q.enqueue(sync, tenant='acme', item=7, priority=10)   # higher first within acme's line; FIFO among equals

A key's waiting jobs are ordinary rq jobs (status ``deferred``, in rq's deferred registry) filed in the key's line
(``rq:policies:fair:wait:<queue>:<scope>:<key>``) instead of on the queue's list; a fetch that finds the list empty
takes the next job of the key with the lowest virtual time (start-time fair queueing: a start moves it on by
``1 / weight``), in O(log keys) whatever the number of keys or jobs. The design, its bounds and what is not covered:
docs/fair.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry

from rq_policies.engine import compat, keys, reading
from rq_policies.engine.admin import FairPause, FairStatus, FairWeight, clear_setting, refusing, unknown_scope
from rq_policies.engine.exceptions import InvalidArgument, InvalidSetting, PolicyError
from rq_policies.engine.keyed import KeyedPolicy, check_scope, key_text, keyed_args
from rq_policies.engine.ops import Call, text
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.policy import FetchPolicy, declare_scope, positive_int, scope_declared

__all__ = ['BacklogFull', 'Fair', 'FairStatus', 'FairWeight']

logger = logging.getLogger('rq_policies')

#: The job hash field: ``'<weight> <priority> <scope>:<key>'``.
FIELD = 'policies_fair'
MAX_WEIGHT = 1000
#: Priorities run from -MAX_PRIORITY to MAX_PRIORITY (the line's score keeps them exact beside 2**40 admissions).
MAX_PRIORITY = 1000

#: Functions of ``(args, kwargs)``, as key functions get them.
ValueFunction = Callable[[tuple, dict], Any]


class BacklogFull(PolicyError):
    """``Fair(max_waiting=N, on_conflict='raise')``: the key already had N jobs waiting on the queue.

    Counted as a drop (``rq-policies info``, metrics), and nothing was written.

    Attributes:
        scope: the policy's scope (the function's import path unless given).
        queue: the queue name.
        waiting: how many jobs of the key were waiting.
        first: the id of the key's first waiting job (its hash names the key: ``Fair.explain``, ``explain``).
    """

    def __init__(self, scope: str, queue: str, waiting: int, first: str):
        self.scope, self.queue, self.waiting, self.first = scope, queue, waiting, first
        super().__init__(f'a key of scope {scope!r} already has {waiting} job(s) waiting on queue {queue!r} '
                         f'(max_waiting; its first is job {first})')


def _weight(value: Any, where: str = 'weight') -> int:
    return positive_int(where, value, MAX_WEIGHT)


def _priority(value: Any, where: str = 'priority') -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(
            where, message=f'{where} must be an int from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {value!r}')
    return value


def _key_id(scope: Any, key: Any) -> str:
    return keys.key_id(check_scope(scope), key_text(key))


class Fair(FetchPolicy):
    """Share a queue's starts fairly among the keys with waiting jobs, by weight (virtual time; see the module).

    Args:
        key: ``(args, kwargs) -> str | int``, the key (tenant) a job belongs to.
        weight: an int from 1 to 1000, or ``(args, kwargs) -> int``: a key's starts per round relative to others.
        max_waiting: at most this many jobs of one key waiting on a queue (None: no cap).
        on_conflict: ``'drop'`` (default) or ``'raise'`` (:class:`BacklogFull`) for an enqueue over ``max_waiting``.
        scope: the namespace keys are named in (no colon); default: the function's import path.
        priority: ``(args, kwargs) -> int`` (-1000 to 1000), the job's priority within its key when the enqueue
            gives no ``priority=``; default 0.
    """

    name: ClassVar[str] = 'fair'
    per_job: ClassVar[bool] = True
    admits: ClassVar[bool] = True
    rank: ClassVar[int] = 200
    call_options: ClassVar[tuple[str, ...]] = ('priority',)
    payload_fields: ClassVar[tuple[str, ...]] = (FIELD,)
    #: A queue's turns have nothing to hand out while its active-keys index is absent.
    fetch_state: ClassVar[tuple[str, ...] | None] = ('fair.active',)
    #: The per-key policies' key function handling (the admission never schedules a Fair job, and its check alone
    #: decides a backlog drop: the defaults of ``schedules`` and ``probes``).
    _key_of = KeyedPolicy.key_of

    def __init__(self, key: ValueFunction, weight: int | ValueFunction = 1, max_waiting: int | None = None,
                 on_conflict: str = 'drop', scope: str | None = None, priority: ValueFunction | None = None) -> None:
        if not callable(key):
            raise InvalidArgument('key', message=f'key must be a callable (args, kwargs) -> str | int, got {key!r}')
        if not callable(weight):
            _weight(weight)
        if max_waiting is not None:
            positive_int('max_waiting', max_waiting)
        if on_conflict not in ('drop', 'raise'):
            raise InvalidArgument('on_conflict', message=f"on_conflict must be 'drop' or 'raise', got {on_conflict!r}")
        if priority is not None and not callable(priority):
            raise InvalidArgument(
                'priority', message=f'priority must be a callable (args, kwargs) -> int (or give priority= on '
                                    f'enqueue), got {priority!r}')
        self.key, self.weight, self.max_waiting, self.on_conflict = key, weight, max_waiting, on_conflict
        self.scope = None if scope is None else check_scope(scope)
        if self.scope is not None:
            declare_scope(self.name, self.scope)
        self.priority = priority

    def __repr__(self) -> str:
        words = [f'key={getattr(self.key, "__name__", self.key)}']
        if self.weight != 1:
            words.append(f'weight={getattr(self.weight, "__name__", self.weight)}')
        if self.max_waiting is not None:
            words.append(f'max_waiting={self.max_waiting}')
        if self.on_conflict != 'drop':
            words.append(f'on_conflict={self.on_conflict!r}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        if self.priority is not None:
            words.append(f'priority={getattr(self.priority, "__name__", self.priority)}')
        return f'Fair({", ".join(words)})'

    # -- the enqueue ----------------------------------------------------------------------------------------------

    def _value(self, fn: ValueFunction, job: Any, what: str) -> Any:
        try:
            return fn(tuple(job.args), dict(job.kwargs))
        except Exception as exc:
            raise InvalidArgument(what, message=f'{self!r}: the {what} function failed on this call: {exc!r}') from exc

    def job_fields(self, job: Any, queue: str, digest: str) -> list[str]:
        from rq_policies.engine.queue import door_options

        scope, key = self._key_of(job, digest)
        weight = _weight(self._value(self.weight, job, 'weight') if callable(self.weight) else self.weight,
                         f'{self!r} weight (the value the weight function returned)')
        options = door_options()
        if 'priority' in options:
            priority = _priority(options['priority'], 'priority (on enqueue)')
        elif self.priority is not None:
            priority = _priority(self._value(self.priority, job, 'priority'),
                                 f'{self!r} priority (the value the priority function returned)')
        else:
            priority = 0
        return [FIELD, f'{weight} {priority} {keys.key_id(scope, key)}']

    def admit_part(self, call: Any, queue: Any, digest: str) -> dict[str, Any]:
        raw = call.job_field(FIELD)
        if raw is None:  # a probe (no job built yet): nothing to check
            return {}
        weight, priority, key_id = raw.split(' ', 2)
        call.key('fair.wait', keys.FAIR_WAIT(queue.name, key_id))
        call.key('fair.seq', keys.FAIR_SEQ(queue.name, key_id))
        call.key('fair.active', keys.FAIR_ACTIVE(queue.name))
        call.key('fair.paused', keys.FAIR_PAUSED)
        call.key('fair.pausedin', keys.FAIR_PAUSED_IN(key_id))
        call.key('fair.deferred', DeferredJobRegistry.key_template.format(queue.name))
        return {'key_id': key_id, 'priority': int(priority), 'max_waiting': self.max_waiting, 'queue': queue.name,
                'wake': keys.wake(queue.name)}

    def on_drop(self, func_name: str, queue: str, verdict: Any) -> None:
        if self.on_conflict == 'raise':
            raise BacklogFull(self.scope or func_name, queue, int(verdict.number), verdict.job_id)
        if logger.isEnabledFor(logging.INFO):
            logger.info('rq-policies: dropped %s on queue %r (fair): its key already has %d job(s) waiting '
                        '(max_waiting %s)', func_name, queue, int(verdict.number), self.max_waiting)

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        if verdict.code == 1 and job.get_status(refresh=False) == JobStatus.QUEUED:
            compat.set_local_status(job, JobStatus.DEFERRED)  # it waits in its key's line, as the script wrote it

    # -- the fetch ------------------------------------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key_list('fair.active', [keys.FAIR_ACTIVE(name) for name in queue_names])
        call.key('fair.waits', keys.FAIR_WAIT)
        call.key('fair.seqs', keys.FAIR_SEQ)
        call.key('fair.pausedins', keys.FAIR_PAUSED_IN)
        call.key('fair.paused', keys.FAIR_PAUSED)
        call.key('fair.weights', keys.FAIR_WEIGHTS)
        call.arg('keyed', keyed_args(call.args.get('job_prefix', Job.redis_job_namespace_prefix)))

    # -- run-time settings (the admin API: rq_policies.engine.admin) --------------------------------------------------

    @classmethod
    def set(cls, scope: str, key: Any, weight: int, connection: Any = None, force: bool = False) -> FairWeight:
        """Set the weight of one key of ``scope`` at run time (1 to 1000): it wins over the weight its jobs declare,
        from the key's next start on every queue.

        Raises:
            InvalidSetting: (an InvalidArgument) naming the argument and the value; nothing is written. A scope no
                Fair is known to use (:meth:`scope_known`) is refused as a typo unless ``force=True``.
        """
        with refusing():
            key_id = _key_id(scope, key)
            _weight(weight)
            conn = _need(connection)
        if not force:
            cls.require_known_scope(conn, scope, 'pass force=True to set its weight anyway')
        conn.hset(keys.FAIR_WEIGHTS, key_id, weight)
        return FairWeight(weight)

    @classmethod
    def get(cls, scope: str, key: Any, connection: Any = None) -> FairWeight | None:
        """The weight set at run time for one key of ``scope``, or None (its jobs' declared weight applies)."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        raw = conn.hget(keys.FAIR_WEIGHTS, key_id)
        return None if raw is None else FairWeight(int(raw))

    @classmethod
    def clear(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Remove the run-time weight of one key: its jobs' declared weight applies again. True when it had one."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        return clear_setting(conn, keys.FAIR_WEIGHTS, key_id)

    @classmethod
    def status(cls, scope: str, key: Any, queue: str = 'default', connection: Any = None) -> FairStatus:
        """One key's state on ``queue``: waiting jobs, active or paused, its run-time weight, the active keys."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        with conn.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.FAIR_WAIT(queue, key_id))
            pipe.zscore(keys.FAIR_ACTIVE(queue), key_id)
            pipe.hexists(keys.FAIR_PAUSED, key_id)
            pipe.hget(keys.FAIR_WEIGHTS, key_id)
            pipe.zcard(keys.FAIR_ACTIVE(queue))
            pipe.zrange(keys.FAIR_WAIT(queue, key_id), 0, 0)
            waiting, score, paused, weight, count, head = pipe.execute()
        set_at_run_time = weight is not None
        if weight is None and head:  # the weight its next job declares (the one the fetch reads for its turns)
            declared = conn.hget(Job.redis_job_namespace_prefix + text(head[0]), FIELD)
            weight = None if declared is None else text(declared).split(' ', 1)[0]
        return FairStatus(int(waiting), score is not None and not paused, bool(paused),
                          None if weight is None else int(weight),
                          int(count), set_at_run_time)

    @classmethod
    def pause(cls, scope: str, key: Any, connection: Any = None, force: bool = False) -> bool:
        """Pause one key of ``scope`` on every queue, until :meth:`resume`: its waiting jobs stay waiting (status
        deferred) and none starts; other keys are not touched. Survives worker restarts (it lives in Redis).
        Returns True when the key was not paused already.

        Raises:
            InvalidSetting: (an InvalidArgument) naming a bad scope, key or connection; a scope no Fair is known to
                use (:meth:`scope_known`: a typo?) unless ``force=True``. Nothing is written.
        """
        call = _pause_call(scope, key, True)
        with refusing():
            conn = _need(connection)
        if not force:
            cls.require_known_scope(conn, scope, 'pass force=True to pause it anyway')
        return call.answered().run(conn) == 1

    @classmethod
    def scope_known(cls, connection: Any, scope: str) -> bool:
        """Is ``scope`` one a Fair is known to use: declared in this process (a ``scope=``, a decorated function's
        path, an enqueue's), the import path of a function declaring a Fair, or named by Redis state (a run-time
        weight, a pause, a key taking turns on a queue)?"""
        if scope_declared(cls.name, scope):
            return True
        pattern = reading.glob_escape(scope) + ':*'
        if reading.any_field(connection, keys.FAIR_WEIGHTS, pattern) or \
                reading.any_field(connection, keys.FAIR_PAUSED, pattern):
            return True
        return any(reading.any_member(connection, keys.FAIR_ACTIVE(queue), pattern)
                   for queue in cls.queues(connection))

    @classmethod
    def require_known_scope(cls, connection: Any, scope: str, hint: str) -> None:
        """Refuse (:class:`InvalidSetting` naming ``scope``, with ``hint``) a scope :meth:`scope_known` denies."""
        if not cls.scope_known(connection, scope):
            raise InvalidSetting('scope', message=unknown_scope(cls.__name__, scope, hint))

    @classmethod
    def resume(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Resume a paused key: it takes turns again on every queue where it has waiting jobs, from that queue's
        current virtual time (a paused key earns no credit). Returns True when it was paused."""
        return _pause_call(scope, key, False).answered().run(_need(connection)) == 1

    @classmethod
    def pause_status(cls, scope: str, key: Any, connection: Any = None) -> FairPause:
        """Is one key of ``scope`` paused, and how many of its jobs wait on each queue (the queues with keys taking
        turns, one bounded SCAN as :meth:`queues`, and those the key left when paused): what the dashboard's
        confirmation of a pause or a resume shows.

        Raises:
            InvalidSetting: (an InvalidArgument) naming the argument and the value; nothing is read or written.
        """
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        left = {text(q) for q in conn.smembers(keys.FAIR_PAUSED_IN(key_id))}
        names = sorted(set(cls.queues(conn)) | left)
        with conn.pipeline(transaction=False) as pipe:
            pipe.hexists(keys.FAIR_PAUSED, key_id)
            for queue in names:
                pipe.zcard(keys.FAIR_WAIT(queue, key_id))
            paused, *counts = pipe.execute()
        return FairPause(bool(paused), {q: int(n) for q, n in zip(names, counts) if int(n)})

    @classmethod
    def waiting(cls, queue: str, scope: str, key: Any, connection: Any = None) -> list[str]:
        """The ids of one key's jobs waiting on ``queue``, in the order they start (priority, then FIFO)."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        return [text(j) for j in conn.zrange(keys.FAIR_WAIT(queue, key_id), 0, -1)]

    @classmethod
    def queues(cls, connection: Any, budget: int = 5000) -> list[str]:
        """Queues with keys taking turns (one bounded SCAN of the active sets)."""
        found: set[str] = set()
        cursor, examined = 0, 0
        while True:
            cursor, batch = keys.scanner(connection).scan(cursor=cursor, count=1000,
                                                          match=reading.glob_escape(keys.FAIR_ACTIVE) + '*')
            examined += 1000
            found.update(text(raw)[len(keys.FAIR_ACTIVE):] for raw in batch)
            if not cursor or examined >= budget:
                return sorted(found)

def _pause_call(scope: str, key: Any, pause: bool) -> Call:
    with refusing():
        key_id = _key_id(scope, key)
    call = Call('fair_pause', key_id=key_id, pause=pause, waits=keys.FAIR_WAIT, actives=keys.FAIR_ACTIVE,
                wake=keys.wake(''))
    call.key('paused', keys.FAIR_PAUSED)
    call.key('pausedin', keys.FAIR_PAUSED_IN(key_id))
    return call
