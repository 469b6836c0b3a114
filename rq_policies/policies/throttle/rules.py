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

A *window* is the throttle's unit of time (the public argument keeps its 0.1 name, ``slot``); a *hold* is
QueueSlot's unit of concurrency. The window's key is ``rq:policies:throttle:<queue>:<digest>:<window number>``.
The Lua part is ``lua/policies/throttle.lua``.
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
from rq_policies.engine.exceptions import PolicyConfigurationError
from rq_policies.engine.policy import (
    AdmissionPolicy,
    Policy,
    PolicySet,
    pending_lines,
    replaced_in_place,
    superseded_entry,
    whole_seconds,
)
from rq_policies.engine.views import Cell, Explanation, Panel, Row

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

    def job_fields(self, queue: str, digest: str) -> list[str]:
        # What `rq-policies explain` reads back: the window keys' prefix and width (and the trailing pointer).
        fields = [THROTTLE_FIELD, keys.throttle_prefix(queue, digest), WIDTH_FIELD, str(self.slot)]
        if self.trailing:
            fields += [TRAILING_FIELD, keys.trailing(queue, digest)]
        return fields

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[Explanation]:
        prefix, width = job.get(THROTTLE_FIELD), job.get(WIDTH_FIELD)
        if not prefix or not width or not width.isdigit():
            return []
        width_s, jid, queue = int(width), job['id'], job.get('origin', '')
        index = int(now // width_s)
        ends = (index + 1) * width_s
        trailing = job.get(TRAILING_FIELD)
        with connection.pipeline(transaction=False) as pipe:
            pipe.get(keys.numbered(prefix, index))
            pipe.get(trailing or prefix)
            pipe.zscore(ScheduledJobRegistry.key_template.format(queue), jid)
            owner, pending, run_at = pipe.execute()
        owner = owner.decode() if isinstance(owner, bytes) else owner
        pending = pending.decode() if isinstance(pending, bytes) else pending
        entry: dict[str, Any] = {'slot': width_s, 'window_ends_at': ends, 'owner': owner}
        if trailing and pending == jid and job.get('status') == 'scheduled' and run_at is not None:
            verdict = f'pending trailing job of the window ending at {_when(run_at)} (in {run_at - now:.1f} s)'
            change = ('runs at that time; a later extra of the window rewrites it in place (its payload; '
                      'same id)')
        elif owner == jid:
            verdict = f'owns the current {width_s} s slot, which ends at {_when(ends)} (in {ends - now:.1f} s)'
            change = 'an identical enqueue before then is dropped' + (
                ' (or kept as the trailing job)' if trailing else '')
        else:
            verdict = 'admitted in an earlier slot; the current one ' + (
                f'is held by job {owner}' if owner else 'is free') + f', ends at {_when(ends)}'
            change = ''
        return [Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def explain_gone(cls, connection: Any, job_id: str, records: dict[str, Any], now: float) -> list[Explanation]:
        dropped = records['dropped']
        superseded = superseded_entry(cls.name, connection, records,
                                      'a later extra of its window replaced this pending trailing job',
                                      'nothing: job {by} runs in its place, at the end of the window')
        if superseded:
            return superseded
        if dropped and dropped.get('policy') == cls.name:
            holder, ends = str(dropped.get('holder', '')), float(dropped.get('n', 0))
            return [Explanation(
                cls.name, f'dropped at enqueue: held by job {holder}, which owned the slot ending at {_when(ends)}',
                'an identical enqueue after ' + (
                    'that is admitted' if ends > now else f'{_when(ends)} is admitted (that time has passed)'),
                {'holder': holder, 'queue': dropped.get('queue', ''), 'window_ends_at': ends,
                 'dropped_at': dropped.get('at')},
            )]
        return []

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
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    'rq-policies: %s on queue %r (throttle): replaced the payload of pending trailing job %s in place '
                    '(this call was job %s), runs at %s', job.func_name, queue, verdict.job_id, job.id,
                    _when(verdict.number),
                )
            replaced_in_place(job, verdict)
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
    def identity_families(cls) -> tuple[keys.Family, ...]:
        return (keys.THROTTLE_KEYS, keys.TRAILING_KEYS)

    @classmethod
    def describe(cls, family: keys.Family, block: dict[str, Any], digests: bool = False,
                 width: int = 40) -> list[Row | str]:
        from rq_policies.engine.readable import identity

        if family.windowed:
            return [Row('throttle', f'{block["count"]} live window(s)',
                        tuple(f'{identity(row, width, digests)}  job {row["job_id"]}  {window_words(row)}'
                              for row in block['entries']))]
        return pending_lines(family, block, lambda row: f'job {row["job_id"]}', digests, width)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """The dashboard's throttle windows (the job that won each live window, and when the window ends) and
        pending trailing jobs (the job that runs when its window ends)."""
        from rq_policies.engine.readable import identity_cell
        from rq_policies.surfaces import state

        out = []
        windows = state.sample_family(connection, keys.THROTTLE_KEYS, limit, search)
        rows = [[row['queue'], identity_cell(row), _window_cell(row), _job_cell(row['job_id']),
                 _at(row['expires_in'])] for row in windows['rows']]
        if rows:
            out.append(Panel('Throttle windows (Throttle)', ['queue', 'identity', 'window', 'job', 'ends'], rows,
                             state.sample_note(windows, 'windows')))
        trailing = state.sample_family(connection, keys.TRAILING_KEYS, limit, search)
        rows = [[row['queue'], identity_cell(row), _job_cell(row['job_id']), row['job_status'] or 'gone',
                 _at(row['expires_in'])] for row in trailing['rows']]
        if rows:
            out.append(Panel('Pending trailing jobs (Throttle)', ['queue', 'identity', 'job', 'job status', 'runs'],
                             rows, state.sample_note(trailing, 'pending jobs')))
        return out

    @classmethod
    def reset_part(cls, call: Any, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        call.key('throttle.prefix', keys.throttle_prefix(queue, digest))
        call.key('throttle.trailing', keys.trailing(queue, digest))
        return {'width': declared.slot if isinstance(declared, Throttle) else 0}


def _at(seconds: float | None) -> Cell | None:
    """A page cell of the moment ``seconds`` from now (local time, ``in 5 s``), or None."""
    return None if seconds is None else Cell(at=seconds)


def _window_cell(row: dict[str, Any]) -> Cell:
    """A page cell of a throttle window: its start and end in local time, the window number on hover."""
    from rq_policies.engine.readable import local_iso

    if row.get('window_start') is None:
        return Cell(f'window {row.get("slot")}', title='the window number (epoch seconds // width)')
    start, end = local_iso(row['window_start']), local_iso(row['window_end'])
    return Cell(f'{start} to {end[11:19] if start[:10] == end[:10] else end}',
                title=f'window {row["slot"]} of {row["window_end"] - row["window_start"]} s')


def _job_cell(job_id: str | None) -> Cell | None:
    """A dashboard cell linking to ``job_id``'s page, or None."""
    return Cell(job_id, job=job_id) if job_id else None


def _declared_spec(job: Job) -> PolicySet | None:
    """The policies declared on ``job``'s function; None when there are none or its path cannot be imported here,
    which PolicyQueue warns about (once per path), as it does at the door: a typo must not switch a policy off in
    silence."""
    from rq_policies.engine.queue import PolicyQueue  # the glue imports the policies: at call time only

    return PolicyQueue._declared_for(job)


def window_words(row: dict[str, Any]) -> str:
    """A throttle window as a person reads it: ``window 13:45:00 to 13:46:00 (ends in 12 s)`` in local time, from
    the row's ``window_start``/``window_end`` (its winner job's width); the ends alone when the width is unknown."""
    from rq_policies.engine.readable import local_iso, relative

    left = row.get('expires_in')
    ends = f'ends {relative(left)}' if left is not None else 'no expiry'
    if row.get('window_start') is None:
        return f'window {row.get("slot")} ({ends})'
    start, end = local_iso(row['window_start']), local_iso(row['window_end'])
    same_day = start[:10] == end[:10]
    return f'window {start} to {end[11:19] if same_day else end} ({ends})'
