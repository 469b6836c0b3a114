"""Loner: one job per identity per queue while it waits (resque-loner's unique jobs), or until it ends.

The marker ``rq:policies:loner:<queue>:<digest>`` names the job holding the identity; it is taken in the admission
script (``lua/admit.lua`` with this policy's part, ``lua/policies/loner.lua``). With ``until='started'`` it is freed
in the same script that takes the job off the queue; with ``until='finished'`` in the pipeline that records the job's
ending (the worker's ``cleanup_execution``: success, failure with no retry left, stop-job, timeout, a killed work
horse). Either way it is freed when the job is deleted, cancelled or removed (``lua/release_markers.lua``). A marker
whose job no longer holds (no longer waits, or for ``until='finished'`` no longer runs on a live worker) is free, so no
reaper is needed and no marker blocks forever.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

from rq.worker import Worker

from rq_policies.engine import compat, keys
from rq_policies.engine.exceptions import DuplicateJob, InvalidArgument
from rq_policies.engine.ops import Call
from rq_policies.engine.policy import MAX_SECONDS, AdmissionPolicy

logger = logging.getLogger('rq_policies')

#: The job hash field that says the job holds its identity until it ends (``until='finished'``).
UNTIL_FIELD = 'policies_loner_until'
#: The job hash field of a job admitted under ``Loner(ttl=N)``: N (seconds), so the fetch keeps the marker's cap.
TTL_FIELD = 'policies_loner_ttl'
#: When the identity is let go: when a worker takes the job, or when the job ends.
UNTIL = ('started', 'finished')
#: What a duplicate enqueue does: return None, raise DuplicateJob, replace the waiting holder's payload, or (with
#: until='finished') keep the last: wait behind a running holder, replacing the payload of the one already waiting;
#: or cancel: keep the last and stop the running holder through rq's stop-job command.
ON_CONFLICT = ('drop', 'raise', 'replace', 'keep_last', 'cancel')
#: The modes that admit a job to wait behind a running holder (its fetch side: lua/policies/loner_next.lua).
BEHIND = ('keep_last', 'cancel')
#: The job hash field of a running job a Loner(on_conflict='cancel') admission stopped: the id of the job that
#: replaced it (waiting behind it, run once it has ended). The engine's field for a stop asked before the start.
CANCELLED_FIELD = keys.STOP_ASKED_FIELD
#: The job hash field of a job admitted behind its identity's running holder (keep_last): '<holder id> <queue>:<digest>'
#: (lua/policies/loner_next.lua parks the job at fetch while that holder still holds).
NEXT_FIELD = 'policies_loner_next'
#: Seconds a parked keep_last job waits before the fetch looks at its holder again when no end made it due (its
#: worker died): LONER_NEXT_POLL in lua/policies/loner_next.lua.
NEXT_POLL = 5

REPLACE_THROTTLE = (
    "Throttle and Loner(on_conflict='replace') cannot be combined: the throttle already decides what an extra in a "
    'held slot does (it is dropped, or with trailing=True kept as the trailing job); a replacing Loner would rewrite '
    "the slot winner's payload after the slot was decided."
)
KEEP_LAST_THROTTLE = REPLACE_THROTTLE.replace("'replace'", "'keep_last'")
CANCEL_THROTTLE = REPLACE_THROTTLE.replace("'replace'", "'cancel'")

#: Seconds a "seen held" hint is trusted to pick the probe first (a marker can be freed at any moment, when a worker
#: takes the job, so a loner hint is kept only briefly; a stale one costs one extra round trip before the full path).
HINT_SECONDS = 5.0


def _lock_ttl(value: Any) -> float | int | None:
    """``Loner(ttl=...)`` checked: None, or a finite number of seconds > 0 and at most ten years."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgument(
            'ttl', message=f'ttl must be a number of seconds > 0 (int or float), or None, got {value!r}')
    if value > MAX_SECONDS:
        raise InvalidArgument('ttl', message=f'ttl must be at most {MAX_SECONDS} seconds (ten years), got {value!r}')
    if value * 1000 < 1:
        raise InvalidArgument(
            'ttl', message=f'ttl must be at least 0.001 seconds (the marker is kept to the millisecond), got {value!r}')
    return value


class Loner(AdmissionPolicy):
    """One job per identity per queue (resque-loner's and sidekiq-unique-jobs' unique jobs). docs/loner.md.

    Example::

        @policy(Loner())                          # held while the job waits (until='started', the default)
        @policy(Loner(until='finished'))          # held from the enqueue until the job ends, whatever the ending
        @policy(Loner(on_conflict='raise'))       # a duplicate raises DuplicateJob(holder=, queue=, identity=)
        @policy(Loner(on_conflict='replace'), unique_context=lambda a, k: a[0])
        def sync_account(account_id, reason): ...  # a duplicate rewrites the waiting job's payload in place
        @policy(Loner(until='finished', on_conflict='keep_last'), unique_context=lambda a, k: a[0])
        def rebuild_index(account_id, reason): ...  # one runs, one waits behind it with the latest payload
        @policy(Loner(until='finished', on_conflict='cancel'), unique_context=lambda a, k: a[0])
        def render_preview(doc_id, text): ...  # a new enqueue stops the running one, and runs once it has ended

    Args:
        until: ``'started'``: held from the enqueue until a PolicyWorker takes the job (or it is deleted, cancelled
            or removed): no duplicate *waiting* work, not no concurrent runs. ``'finished'``: until the job ends
            (success, failure with no retry left, stop, timeout, cancel, delete, its horse killed); a job whose worker
            died holds only while its worker's key lives (``job_monitoring_interval + 60`` s after its last
            heartbeat, 90 s by default), so no reaper is needed.
        on_conflict: ``'drop'`` returns None (logged, counted); ``'raise'`` raises :class:`DuplicateJob` (counted as a
            drop; nothing written); ``'replace'`` rewrites the waiting holder's payload (args, kwargs, meta,
            description) in place, in the admission script, and returns it (same id, same place in its queue). A
            holder already running is never replaced: with ``until='started'`` the new job is admitted (a running job
            holds nothing), with ``until='finished'`` it is dropped. ``'keep_last'`` (``until='finished'`` only;
            BullMQ's ``keepLastIfActive``): at most one running and one waiting job per identity. A duplicate while
            the holder runs is admitted as the waiting job, which the fetch never starts while the running one
            holds (its end gives it back at once; a dead worker's holder stops holding within the liveness bound
            above); a duplicate while a job waits replaces that job's payload in place, as ``'replace'`` does. Every
            enqueue after the last start is reflected in a later run. ``'cancel'`` (``until='finished'`` only;
            Hatchet's ``CANCEL_IN_PROGRESS``): ``'keep_last'``, and the admission that puts a job behind the running
            holder also stops that holder through rq's stop-job command (published in the admission script on its
            worker's channel), and names the new job in the holder's ``policies_cancelled_by``. The holder ends
            ``stopped``; the new job starts once its end has given back its holds. A holder taken but not yet
            started is not run: its start reads the mark and ends it ``stopped``. A stop that cannot arrive (its
            worker SIGSTOPped, its horse orphaned) leaves the keep_last bound: the new job waits for the holder's
            end or its liveness bound, never runs beside it.
        ttl: optional cap in seconds on how long the identity is held whatever the holder does (sidekiq-unique-jobs'
            ``lock_ttl``), a number > 0 kept to the millisecond, at most ten years: the marker expires in Redis.
    """

    name: ClassVar[str] = 'loner'
    rank: ClassVar[int] = 50
    identity_families: ClassVar[tuple[keys.Family, ...]] = (keys.LONER_KEYS,)

    def __init__(self, until: str = 'started', on_conflict: str = 'drop', ttl: float | None = None) -> None:
        if until not in UNTIL:
            raise InvalidArgument('until', message=f"until must be 'started' or 'finished', got {until!r}")
        if on_conflict not in ON_CONFLICT:
            raise InvalidArgument(
                'on_conflict',
                message=f"on_conflict must be 'drop', 'raise', 'replace', 'keep_last' or 'cancel', got {on_conflict!r}")
        if on_conflict in BEHIND and until != 'finished':
            raise InvalidArgument('until', message=(
                f"on_conflict={on_conflict!r} needs until='finished' (the running job must hold its identity for a "
                f"later one to wait behind it), got until={until!r}"))
        if on_conflict in BEHIND and ttl is not None:
            raise InvalidArgument('ttl', message=(
                f"on_conflict={on_conflict!r} cannot be combined with a ttl (an expired marker would admit a job "
                f"beside the running and the waiting one), got ttl={ttl!r}"))
        self.until = until
        self.on_conflict = on_conflict
        self.ttl = _lock_ttl(ttl)

    def __repr__(self) -> str:
        words = [f'until={self.until!r}'] if self.until != 'started' else []
        words += [f'on_conflict={self.on_conflict!r}'] if self.on_conflict != 'drop' else []
        words += [f'ttl={self.ttl!r}'] if self.ttl is not None else []
        return f'Loner({", ".join(words)})'

    @property
    def excludes(self) -> dict[str, str]:  # type: ignore[override]
        if self.on_conflict == 'keep_last':
            return {'throttle': KEEP_LAST_THROTTLE}
        if self.on_conflict == 'cancel':
            return {'throttle': CANCEL_THROTTLE}
        return {'throttle': REPLACE_THROTTLE} if self.on_conflict == 'replace' else {}

    @property
    def leased(self) -> keys.Family | None:  # type: ignore[override]
        # A capped marker keeps its cap (lua/lib/take_marker.lua gave a deferred job's marker the cap, not the lease).
        return keys.LONER_KEYS if self.ttl is None else None

    def admit_part(self, call: Call, queue: Any, digest: str) -> dict[str, Any]:
        call.key('loner.marker', keys.loner(queue.name, digest))
        # The worker and liveness prefixes go with every part: the holder's own hash may ask for until='finished'
        # whatever this call declares, and the Lua side cannot know rq's key prefix (RQ_KEY_PREFIX) by itself.
        part: dict[str, Any] = {
            'worker_prefix': Worker.redis_worker_namespace_prefix, 'alive_prefix': keys.ALIVE_PREFIX,
        }
        if self.until == 'finished':
            part['finished'] = True
        if self.on_conflict != 'drop':
            part['conflict'] = self.on_conflict
        if self.on_conflict in BEHIND:
            part['next_key'] = f'{queue.name}:{digest}'
        if self.on_conflict == 'cancel':
            # rq's stop-job command goes to the running holder's worker on its pubsub channel (a channel, not a key)
            part['stop_channel'], part['stop_command'] = compat.STOP_CHANNEL_PREFIX, compat.STOP_JOB_COMMAND
        if self.ttl is not None:
            part['ttl_ms'] = math.ceil(self.ttl * 1000)
        return part

    def narrow_part(self, queue: Any, digest: str) -> tuple[str, list[str]] | None:
        # lua/admit_narrow.lua decides a drop or a raise as loner's part of admit.lua does; a replace, a keep_last
        # or a cancel goes there.
        if self.on_conflict in ('replace', *BEHIND):
            return None
        options = ['loner', keys.drop_field(self.name, queue.name),
                   'job_prefix', queue.job_class.redis_job_namespace_prefix,
                   'worker', Worker.redis_worker_namespace_prefix, 'alive', keys.ALIVE_PREFIX]
        if self.until == 'finished':
            options += ['finished', '1']
        if self.ttl is not None:
            options += ['ttl_ms', str(math.ceil(self.ttl * 1000))]
        return keys.loner(queue.name, digest), options

    def job_fields(self, job: Any, queue: str, digest: str) -> list[str]:
        fields = [keys.LONER_FIELD, keys.loner(queue, digest)]
        if self.until == 'finished':
            fields += [UNTIL_FIELD, 'finished']
        if self.ttl is not None:
            fields += [TTL_FIELD, repr(self.ttl)]
        return fields

    #: Only a job held until it ends has a marker to free then: until='started' freed it in the fetch that took the
    #: job (lua/policies/loner.lua's taken), and a job without the field holds none.
    ended_when = (UNTIL_FIELD, 'finished')

    def on_drop(self, func_name: str, queue: str, verdict: Any) -> None:
        if self.on_conflict == 'raise':
            raise DuplicateJob(holder=verdict.job_id, queue=queue, identity=verdict.digest)
        super().on_drop(func_name, queue, verdict)

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        if verdict.code == 3 and verdict.policy == self.name:
            if logger.isEnabledFor(logging.INFO):
                logger.info('rq-policies: %s on queue %r (loner): replaced the payload of waiting job %s',
                            job.func_name, queue, verdict.job_id)
            job.id = verdict.job_id

    @classmethod
    def release(cls, connection: Any, job_prefix: str, job_ids: list[str], ended: bool = False) -> None:
        release_markers(connection, job_prefix, job_ids, ended)

    @classmethod
    def holder(cls, connection: Any, queue: str, digest: str, job_prefix: str) -> str | None:
        """The id of the waiting job holding ``digest``'s marker on ``queue``, or None."""
        return holder(connection, queue, digest, job_prefix)

    def hint_seconds(self, verdict: Any) -> float:
        # Every mode: a drop, a raise (a drop too) and a running holder under until='finished' (which a 'replace'
        # cannot replace) are decided by the checks alone, so the probe serves them.
        return HINT_SECONDS if verdict.code == 0 and verdict.policy == self.name else 0.0

    @classmethod
    def reset_part(cls, call: Call, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        call.key('loner.marker', keys.loner(queue, digest))
        return {}


def holder(connection: Any, queue: str, digest: str, job_prefix: str) -> str | None:
    """The id of the job holding ``digest``'s marker on ``queue`` (waiting; or running, for a job admitted with
    ``until='finished'``), or None."""
    found = holder_call(queue, digest, job_prefix).run(connection)
    if isinstance(found, bytes):
        return found.decode()
    return found if isinstance(found, str) else None  # on a pipeline the answer arrives with its execute()


def holder_call(queue: str, digest: str, job_prefix: str) -> Call:
    """The ``lua/loner_holder.lua`` call of :func:`holder` (the asyncio doors send it themselves)."""
    call = Call('loner_holder', job_prefix=job_prefix, worker_prefix=Worker.redis_worker_namespace_prefix,
                alive_prefix=keys.ALIVE_PREFIX)
    return call.key('marker', keys.loner(queue, digest))


def release_markers(connection: Any, job_prefix: str, job_ids: list[str], ended: bool = False) -> int:
    """Delete the loner markers that still name these jobs (with ``ended``: the job ended, so a marker held until
    it finished goes too). Returns how many were deleted.

    On a pipeline the release rides it (the count arrives with its ``execute()``, and 0 is returned here).
    """
    if not job_ids:
        return 0
    # The job hashes go in KEYS too (the script reads them by prefix and id): a Redis Cluster routes a script by its
    # keys, and a script with none would go to any node.
    call = Call('release_markers', job_prefix=job_prefix, jobs=list(job_ids)).key_list(
        'jobs', [job_prefix + job_id for job_id in job_ids])
    if ended:
        # A keep_last job waiting behind one that ended is made due at once in the due index, its queue woken.
        call.arg('ended', True).arg('wake', keys.wake('')).key('keydue', keys.KEY_DUE)
    result = call.run(connection)
    return result if isinstance(result, int) else 0
