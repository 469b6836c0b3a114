"""Throttle: at most one job per identity per epoch-aligned slot of wall-clock time.

Three answers to "this was enqueued more often than it needs to run", each kept in its own module:

* :class:`~rq_policies.Loner` rejects the duplicate and keeps the first, while it waits;
* :class:`Throttle` drops the extra and keeps the first, once per slot (or, with ``trailing=True``, also keeps the
  last extra of the slot and runs it when the slot ends);
* :class:`~rq_policies.Debounce` replaces the pending job and keeps the last, firing after a quiet period.

Slots are aligned to the Unix epoch and computed from the Redis server's clock: with ``Throttle(60)`` the boundaries
are the calendar minutes, and every producer means the same minute by "this slot" whatever its own clock says. That
is what separates a slot from a cooldown (a cooldown measured from first use is a rolling rate limit). One key per
identity per slot holds only the winner's job id and expires by itself when the slot ends: no reaper, no growth.

An admitted job is an ordinary rq job. A dropped enqueue returns ``None``, not the winner's job: a returned job is
the caller's to poll, cancel or hang dependents off, and the winner's is not. The winner is named in the INFO log
line and by :meth:`Throttle.admit`, the low-level door, which returns an :class:`Outcome`.

The throttle spaces *submissions*, not executions: if jobs wait in the queue, two can start closer together than the
slot. ``enqueue_at``/``enqueue_in`` are submissions too: they claim the slot current at the call, and a winner runs
at the time it asked for.

This module also carries :meth:`PolicyQueue.force` and :meth:`PolicyQueue.reset`'s scripts (the Go throttler's
``Force`` and ``Reset``), which act on every policy's state of one identity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from rq.job import Job, JobStatus
from rq.registry import ScheduledJobRegistry
from rq.utils import import_attribute

from . import identity, keys, scripts
from .exceptions import PolicyConfigurationError
from .hints import Hints
from .policy import AdmissionPolicy, Policy, PolicySet, declared, whole_seconds

if TYPE_CHECKING:
    from .queue import JobWrite, PolicyQueue

logger = logging.getLogger('rq_policies')



def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


@dataclass(frozen=True)
class Outcome:
    """What :meth:`Throttle.admit` decided.

    Attributes:
        admitted: True when the job owns the slot (it won it now, or had won it already: a replay).
        jid: the id of the job that owns the slot: the caller's own when admitted, the incumbent's when not.
        slot_ends_at: epoch seconds (server clock) the slot ends, when a new one can be won.
    """

    admitted: bool
    jid: str
    slot_ends_at: float


class Throttle(AdmissionPolicy):
    """At most one job per identity per ``slot`` seconds, slots aligned to the Unix epoch (server clock).

    Example::

        @policy(Throttle(60))                  # at most one job per account per calendar minute
        def poll_account(account_id): ...

        @policy(Throttle(60, trailing=True))   # ... and the last request of each minute runs at its end
        def publish_progress(task_id): ...

    With :class:`~rq_policies.Loner` as well, both are checked in one script: the slot first, then the marker, so a
    job still waiting for a worker also drops the next slot's job instead of letting runs pile up behind it (with
    ``trailing=True`` the pending trailing job holds the marker and later extras replace it).

    Args:
        slot: slot width, a whole number of seconds >= 1.
        trailing: keep the latest extra of a held slot and run it when the slot ends (through rq's scheduled-job
            registry: run workers with ``--with-scheduler``). The trailing job counts as the next slot's run.
    """

    name: ClassVar[str] = 'throttle'
    rank: ClassVar[int] = 20

    def __init__(self, slot: int, trailing: bool = False) -> None:
        self.slot = whole_seconds('slot', slot)
        if not isinstance(trailing, bool):
            raise TypeError(f'trailing must be True or False, got {trailing!r}')
        self.trailing = trailing

    def __repr__(self) -> str:
        return f'Throttle({self.slot}{", trailing=True" if self.trailing else ""})'

    def conflicts(self, others: tuple[Policy, ...]) -> str | None:
        if any(other.name == 'debounce' for other in others):
            return (
                'Throttle and Debounce cannot be combined: a throttle keeps the first job of each slot and a debounce '
                'the last of each burst. Pick one; Throttle(slot, trailing=True) keeps the last of each slot as well.'
            )
        return None

    @classmethod
    def admit(cls, job: Job, slot: int, connection: Any = None) -> Outcome:
        """Claim this job's slot, or report who already holds it. Writes no job: only the slot key.

        Replay-safe: a re-run with the same job id (a retried call whose reply was lost) finds its own id in the slot
        and reports admitted again, instead of a drop the caller never suffered.

        Args:
            job: the job; only its function, arguments, origin queue and id are read (its identity is the same one
                PolicyQueue uses, narrowed by the function's declared ``unique_context``).
            slot: slot width, a whole number of seconds >= 1.
            connection: the Redis connection; defaults to the job's.

        Returns:
            An Outcome naming the slot's owner and when the slot ends.
        """
        width = whole_seconds('slot', slot)
        if not isinstance(job, Job):
            raise TypeError(f'job must be an rq Job, got {job!r}')
        if not job.origin:
            raise ValueError(f'job {job.id} has no origin queue: create it with Queue.create_job() or set job.origin')
        conn = connection if connection is not None else job.connection
        if conn is None:
            raise ValueError('connection: give a Redis connection (the job has none)')
        from .queue import func_path  # the rq glue imports this module

        spec = _declared_spec(job)
        context = spec.unique_context if spec else None
        digest = identity.digest(func_path(job), job.origin, job.args, job.kwargs, context)
        code, jid, ends, _ = scripts.run(
            'throttle_slot',
            conn,
            [keys.throttle_prefix(job.origin, digest), job.key, '', '', '', keys.DROPS],
            [job.id, width, 'N', 0, -1, '', '', 0, keys.drop_field('throttle', job.origin), '', ''],
        )
        return Outcome(code == 1, _text(jid), float(ends))


def _declared_spec(job: Job) -> PolicySet | None:
    try:
        target = job.func
    except (ImportError, AttributeError, ValueError):
        return None
    if isinstance(target, str):
        try:
            target = import_attribute(target)
        except (ImportError, AttributeError, ValueError):
            return None
    return declared(target)


# -- the fast path for an extra that is expected to lose -----------------------------------------------------------

#: What this process last saw of slots (see rq_policies.hints): a hint lasts until the slot it saw ends.
_hints = Hints()


def _remember(key: tuple | None, digest: str, ends: Any, server_now: Any) -> None:
    _hints.remember(key, digest, float(ends) - float(_text(server_now)))


def quick_drop(queue: PolicyQueue, spec: PolicySet | None, f: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """Drop an extra of a leading-edge throttle before rq builds its job, when this process saw its slot held.

    Building and serializing a job costs more than the decision. A process that has seen this call's current slot
    taken (it won or lost it earlier) first asks ``throttle_check.lua``, which drops the extra when the slot is still
    held, as one complete atomic decision (a held slot stays held until it ends; force and reset only ever hand it to
    a job that is written in the same step). Anything else (no hint, the slot free after all, a replayed job id,
    options the full path must refuse) returns False and the enqueue takes the full path, which checks again and
    writes in one script. A hint only chooses which script runs first; it never decides.

    Returns:
        (dropped, hint key): dropped is True when the enqueue was dropped (and logged and counted); the hint key is
        for the full path to remember what it saw.
    """
    throttle = spec.get(Throttle) if spec else None
    if throttle is None or throttle.trailing or not queue._is_async:
        return False, None
    key, call = _hints.confirmed(queue, throttle.slot, spec.unique_context, f, args, kwargs)
    if call is None:
        return False, key
    func_name, digest, job_id = call
    dropped, owner, ends, _ = scripts.run(
        'throttle_check',
        queue.connection,
        [keys.throttle_prefix(queue.name, digest), keys.DROPS],
        [job_id, throttle.slot, keys.drop_field('throttle', queue.name)],
    )
    if not dropped:
        return False, key
    _log_drop(func_name, queue.name, _text(owner), float(ends))
    return True, key


def _log_drop(func_name: str, queue: str, owner: str, ends: float) -> None:
    if logger.isEnabledFor(logging.INFO):  # formatting the time costs as much as a tenth of a drop
        logger.info(
            'rq-policies: dropped %s on queue %r (throttle): slot held by job %s, slot ends at %s',
            func_name, queue, owner, _when(ends),
        )


# -- the enqueue doors -----------------------------------------------------------------------------------------------


def enqueue(queue: PolicyQueue, throttle: Throttle, digest: str, write: JobWrite, hint: tuple | None = None) -> bool:
    """Admit one job through its Throttle (and its Loner, when it has one). Returns True when the job was written.

    ``hint`` is the call's hint key (see :func:`quick_drop`), remembered with the slot this admission saw.
    """
    job = write.job
    if throttle.trailing:
        return _enqueue_trailing(queue, throttle, digest, write)
    code, holder, ends, server_now = scripts.run(
        'throttle_slot',
        queue.connection,
        [keys.throttle_prefix(queue.name, digest), job.key, write.dest, queue.redis_queues_keys, write.marker,
         keys.DROPS],
        [job.id, throttle.slot, write.mode, write.score, write.ttl, queue.key,
         queue.job_class.redis_job_namespace_prefix, 1 if write.loner else 0, keys.drop_field('throttle', queue.name),
         keys.drop_field('loner', queue.name), keys.wake(queue.name), *write.fields],
    )
    holder = _text(holder)
    if code == 1:
        _remember(hint, digest, ends, server_now)
        return True
    if code == 0:
        _remember(hint, digest, ends, server_now)
        _log_drop(job.func_name, queue.name, holder, float(ends))
    else:
        logger.info(
            'rq-policies: dropped %s on queue %r (loner): identity held by job %s', job.func_name, queue.name, holder
        )
    return False


def _enqueue_trailing(queue: PolicyQueue, throttle: Throttle, digest: str, write: JobWrite) -> bool:
    job = write.job
    if write.mode == 'D':
        raise PolicyConfigurationError(
            f'depends_on= cannot be combined with Throttle(trailing=True) (job {job.func_name!r}): an extra is '
            'scheduled for the end of its slot, and a scheduled job does not wait for dependencies'
        )
    registry = ScheduledJobRegistry(queue=queue).key
    code, jid, at, _, superseded = scripts.run(
        'throttle_trailing',
        queue.connection,
        [keys.throttle_prefix(queue.name, digest), keys.trailing(queue.name, digest), job.key, queue.key, registry,
         queue.redis_queues_keys, write.marker, keys.DROPS],
        [job.id, throttle.slot, write.mode, write.score, write.ttl, queue.key,
         queue.job_class.redis_job_namespace_prefix, 1 if write.loner else 0, keys.drop_field('loner', queue.name),
         keys.wake(queue.name), *write.fields],
    )
    if code == -1:
        logger.info(
            'rq-policies: dropped %s on queue %r (loner): identity held by job %s', job.func_name, queue.name,
            _text(jid),
        )
        return False
    if code == 2:
        job._status = JobStatus.SCHEDULED
        job.enqueued_at = None
        superseded = _text(superseded)
        if superseded and superseded != job.id:
            logger.info(
                'rq-policies: %s on queue %r (throttle): job %s replaces pending trailing job %s, runs at %s',
                job.func_name, queue.name, job.id, superseded, _when(float(at)),
            )
        else:
            logger.debug(
                'rq-policies: %s on queue %r (throttle): job %s is the slot\'s trailing job, runs at %s',
                job.func_name, queue.name, job.id, _when(float(at)),
            )
    return True


def force(queue: PolicyQueue, spec: PolicySet, digest: str, write: JobWrite) -> bool:
    """Write a job now whatever its policies say: it takes the current slot, pending trailing/debounced jobs go."""
    job = write.job
    if write.mode == 'S':
        raise PolicyConfigurationError('force() enqueues now; it cannot be scheduled')
    throttle = spec.get(Throttle)
    _, trailing, debounced = scripts.run(
        'force_job',
        queue.connection,
        [keys.throttle_prefix(queue.name, digest), keys.trailing(queue.name, digest), keys.debounce(queue.name, digest),
         job.key, write.dest, ScheduledJobRegistry(queue=queue).key, queue.redis_queues_keys, write.marker],
        [job.id, throttle.slot if throttle else 0, write.mode, write.ttl, queue.key,
         queue.job_class.redis_job_namespace_prefix, 1 if write.loner else 0, keys.wake(queue.name), *write.fields],
    )
    for kind, dropped in (('trailing', _text(trailing)), ('debounced', _text(debounced))):
        if dropped:
            logger.info(
                'rq-policies: forced %s on queue %r as job %s; dropped pending %s job %s', job.func_name, queue.name,
                job.id, kind, dropped,
            )
    return True


def reset(queue: PolicyQueue, spec: PolicySet | None, digest: str) -> int:
    """Clear one identity's policy state on ``queue``. Returns how many keys were removed."""
    throttle = spec.get(Throttle) if spec else None
    removed = scripts.run(
        'reset_identity',
        queue.connection,
        [keys.throttle_prefix(queue.name, digest), keys.trailing(queue.name, digest), keys.loner(queue.name, digest),
         keys.debounce(queue.name, digest), ScheduledJobRegistry(queue=queue).key],
        [throttle.slot if throttle else 0, queue.job_class.redis_job_namespace_prefix],
    )
    return int(removed)

