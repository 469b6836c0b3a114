"""Throttle: at most one job per identity per epoch-aligned slot of wall-clock time (server clock).

Loner rejects the duplicate and keeps the first while it waits; Throttle drops the extra and keeps the first, once per
slot (with ``trailing=True`` also the last extra of the slot, run when the slot ends); Debounce keeps the last, after a
quiet period. A slot is aligned to the Unix epoch (``Throttle(60)``: the calendar minutes), so every producer means
the same slot; one key per identity per slot (``rq:policies:throttle:<queue>:<digest>:<window number>``) holds only
the winner's job id and expires with the slot. It spaces submissions, not executions. docs/throttle-debounce.md.
The public argument keeps its 0.1 name, ``slot``, for what the code calls a *window*.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import ScheduledJobRegistry

from rq_policies.engine import admission, compat, identity, keys
from rq_policies.engine.exceptions import InvalidArgument, PolicyConfigurationError
from rq_policies.engine.policy import AdmissionPolicy, PolicySet, replaced_in_place, whole_seconds

logger = logging.getLogger('rq_policies')

#: Job hash fields a throttled job carries for ``rq-policies explain``: its window keys' prefix, the window width,
#: and with trailing=True the identity's trailing pointer.
THROTTLE_FIELD = 'policies_throttle'
WIDTH_FIELD = 'policies_throttle_slot'
TRAILING_FIELD = 'policies_trailing'


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
            registry, promoted by the fetch of a PolicyWorker serving the queue). The trailing job counts as the
            next slot's run. A later extra of the slot rewrites the pending trailing job in place (its payload: args,
            kwargs, description, meta; and its run time when asked later), in the admission script, and returns it:
            the same id, so every handle the app kept reads the job that will run (as Debounce does; a resend of the
            call is a replay, and ``explain`` on an extra's ``job_id=`` names the pending job).
    """

    name: ClassVar[str] = 'throttle'
    rank: ClassVar[int] = 20
    identity_families: ClassVar[tuple[keys.Family, ...]] = (keys.THROTTLE_KEYS, keys.TRAILING_KEYS)
    excludes: ClassVar[dict[str, str]] = {'debounce': (
        'Throttle and Debounce cannot be combined: a throttle keeps the first job of each slot and a debounce the last '
        'of each burst. Pick one; Throttle(slot, trailing=True) keeps the last of each slot as well.'
    )}

    def __init__(self, slot: int, trailing: bool = False) -> None:
        self.slot = whole_seconds('slot', slot)
        if not isinstance(trailing, bool):
            raise InvalidArgument('trailing', message=f'trailing must be True or False, got {trailing!r}')
        self.trailing = trailing

    def __repr__(self) -> str:
        return f'Throttle({self.slot}{", trailing=True" if self.trailing else ""})'

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
            raise InvalidArgument('job', message=f'job must be an rq Job, got {job!r}')
        if not job.origin:
            raise InvalidArgument(
                'job', message=f'job {job.id} has no origin queue: create it with Queue.create_job() or set job.origin')
        conn = connection if connection is not None else job.connection
        if conn is None:
            raise InvalidArgument('connection', message='connection: give a Redis connection (the job has none)')
        spec = _declared_spec(job)
        context = spec.unique_context if spec else None
        digest = identity.digest(identity.func_path(job), job.origin, job.args, job.kwargs, context,
                                 spec.policies if spec else None)
        queue = Queue(job.origin, connection=conn, job_class=type(job))
        verdict = admission.claim(queue, PolicySet((cls(width),)), digest, job)
        return Outcome(verdict.code == 1, verdict.job_id, verdict.number)

    # -- the admission framework's hooks --------------------------------------------------------------------------

    @property
    def probes(self) -> bool:
        # A trailing extra is never dropped (it becomes the pending trailing job), so only the leading edge probes.
        return not self.trailing

    def admit_part(self, call: Any, queue: Any, digest: str) -> dict[str, Any]:
        call.key('throttle.prefix', keys.throttle_prefix(queue.name, digest))
        if self.trailing:
            call.key('throttle.trailing', keys.trailing(queue.name, digest))
            call.key('registry', ScheduledJobRegistry(queue=queue).key)
        return {'width': self.slot, 'trailing': self.trailing}

    def job_fields(self, job: Any, queue: str, digest: str) -> list[str]:
        # What `rq-policies explain` reads back: the window keys' prefix and width (and the trailing pointer).
        fields = [THROTTLE_FIELD, keys.throttle_prefix(queue, digest), WIDTH_FIELD, str(self.slot)]
        if self.trailing:
            fields += [TRAILING_FIELD, keys.trailing(queue, digest)]
        return fields

    def validate(self, job: Any, mode: str, force: bool) -> None:
        if self.trailing and mode == 'D' and not force:
            raise PolicyConfigurationError(
                f'depends_on= cannot be combined with Throttle(trailing=True) (job {job.func_name!r}): an extra is '
                'scheduled for the end of its slot, and a scheduled job does not wait for dependencies'
            )

    def hint_seconds(self, verdict: Any) -> float:
        if self.trailing or verdict.policy not in ('', self.name) or verdict.code not in (0, 1):
            return 0.0
        return verdict.number - verdict.server_now

    def on_drop(self, func_name: str, queue: str, verdict: Any) -> None:
        if logger.isEnabledFor(logging.INFO):  # formatting the time costs as much as a tenth of a drop
            logger.info(
                'rq-policies: dropped %s on queue %r (throttle): slot held by job %s, slot ends at %s',
                func_name, queue, verdict.job_id, _when(verdict.number),
            )

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        if verdict.code == 3 and verdict.policy == self.name:
            # The pending trailing job took this call's payload (and run time) in place: the Job returned is it.
            replaced_in_place(job, queue, verdict, self.name, 'pending trailing job')
            return
        if verdict.code != 2:
            return
        compat.set_local_status(job, JobStatus.SCHEDULED)
        job.enqueued_at = None
        if verdict.superseded and verdict.superseded != job.id:
            logger.info(
                'rq-policies: %s on queue %r (throttle): job %s replaces pending trailing job %s, runs at %s',
                job.func_name, queue, job.id, verdict.superseded, _when(verdict.number),
            )
        else:
            logger.debug(
                "rq-policies: %s on queue %r (throttle): job %s is the slot's trailing job, runs at %s",
                job.func_name, queue, job.id, _when(verdict.number),
            )

    @classmethod
    def reset_part(cls, call: Any, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        call.key('throttle.prefix', keys.throttle_prefix(queue, digest))
        call.key('throttle.trailing', keys.trailing(queue, digest))
        return {'width': declared.slot if isinstance(declared, Throttle) else 0}


def _declared_spec(job: Job) -> PolicySet | None:
    """The policies declared on ``job``'s function; None when there are none or its path cannot be imported here,
    which PolicyQueue warns about (once per path), as it does at the door: a typo must not switch a policy off in
    silence."""
    from rq_policies.engine.queue import PolicyQueue  # the glue imports the policies: at call time only

    return PolicyQueue._declared_for(job)
