"""``explain``: why is this job where it is? Its status and queue, and each policy's verdict on it now.

Answers from Redis alone (no application import): the job hash says which policies it was admitted under, because each
admission policy stores what it needs there (its ``job_fields``: the key of its state, a setting such as a throttle's
width). Every registered policy contributes its own part through its views
(:meth:`rq_policies.engine.views.PolicyViews.explain`), so a new policy explains itself in its own folder. Every key
read is built from the job hash, never found by SCAN, so the answer costs a few round trips however many identities are
live.

A job id with no job hash may still have an answer: a pending job that was deleted (by a force; before 0.3, by a later
enqueue) leaves a tombstone naming its replacement (``keys.superseded``), which ``explain`` follows from tombstone to
tombstone to the job that will run (:func:`rq_policies.engine.reading.follow`); an enqueue merged into a pending job in
place leaves a merge record naming that job under the same key; and an enqueue a policy dropped leaves a drop record
naming the holder (``keys.dropped``), but only when the caller chose the job id (``job_id=``): a dropped enqueue returns
None, so an id rq drew is never seen by anyone, and the common path writes nothing more. Each policy reads the records
that are its own (:meth:`rq_policies.engine.views.PolicyViews.explain_gone`).
"""

from __future__ import annotations

import json
from typing import Any

from rq.job import Job
from rq.queue import Queue

from rq_policies.engine import keys, views
from rq_policies.engine.exceptions import InvalidArgument, PolicyError
from rq_policies.engine.ops import text, time_in
from rq_policies.engine.reading import read_tombstone

#: Job hash fields read (the payload itself, ``data``, is never read).
_FIELDS = ('status', 'origin', 'description', 'enqueued_at', 'created_at', 'started_at', 'ended_at', 'worker_name')


#: How far into its queue ``explain`` looks for a queued job's position (LPOS is linear): beyond it, no position.
POSITION_SCAN = 100_000


class UnknownJob(PolicyError, LookupError):
    """``explain`` was given a job id Redis has no job hash for."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        super().__init__(
            f'no job {job_id!r} in Redis ({Job.redis_job_namespace_prefix}{job_id} does not exist): it was never '
            'admitted (a dropped enqueue writes no job), or it was deleted, superseded, or its result expired'
        )


def job_state(connection: Any, job_id: str, job_prefix: str = Job.redis_job_namespace_prefix) -> dict[str, str]:
    """The job hash without its payload, as str -> str (policy fields included); UnknownJob when there is none."""
    if not isinstance(job_id, str) or not job_id or any(c.isspace() for c in job_id):
        raise InvalidArgument(
            'job_id', message=f'job_id must be a job id (a non-empty string without spaces), got {job_id!r}')
    key = job_prefix + job_id
    with connection.pipeline(transaction=False) as pipe:
        pipe.hkeys(key)
        pipe.hmget(key, _FIELDS)
        time_in(pipe)
        names, values, (seconds, micros) = pipe.execute()
    if not names:
        raise UnknownJob(job_id)
    fields = {f: text(v) for f, v in zip(_FIELDS, values) if v is not None}
    extra = [text(n) for n in names if text(n).startswith('policies_')]
    if extra:
        fields.update({f: text(v) for f, v in zip(extra, connection.hmget(key, extra)) if v is not None})
    fields['id'] = job_id
    fields['now'] = f'{seconds + micros / 1e6:.6f}'
    return fields


def explain(job_id: str, connection: Any, job_prefix: str = Job.redis_job_namespace_prefix) -> dict[str, Any]:
    """Why job ``job_id`` is where it is: its status and queue, and each policy's verdict on it now.

    Args:
        job_id: the job's id.
        connection: a Redis connection.
        job_prefix: the job key prefix (``rq:job:``; a custom job class's own).

    Returns:
        ``{'job', 'exists', 'status', 'queue', 'position', 'worker', 'policies': [{'policy', 'verdict', 'change',
        ...}, ...]}``: ``position`` is the job's 0-based place in its queue while it is queued (None otherwise, or
        when it is beyond the first :data:`POSITION_SCAN` ids); each policy entry names the policy, what it says now
        (``verdict``), what would change that (``change``) and its own details. ``exists`` is False for an id with
        no job hash that a policy still explains: "superseded by job ..." (a pending Debounce or trailing Throttle
        job a force deleted, or, before 0.3, a later enqueue replaced, for ``keys.SUPERSEDED_SECONDS``: the chain of
        replacements is followed to the job that will run, ``runs_as``, ``chain``), "merged into pending job ..."
        (an enqueue given ``job_id=`` whose payload a Debounce or trailing Throttle wrote into the pending job in
        place: that id was never a job) or "dropped at enqueue: held by ..." (an
        enqueue given ``job_id=`` that a policy dropped, for ``keys.DROPPED_SECONDS``; an enqueue without
        ``job_id=`` leaves no record, as nobody knows its id); ``status`` is then ''.

    Raises:
        UnknownJob: no job hash has this id, and no policy has a record of it.
        ValueError: ``job_id`` is not a job id.
    """
    try:
        job = job_state(connection, job_id, job_prefix)
    except UnknownJob:
        return _gone(connection, job_id, job_prefix)
    queue = job.get('origin', '')
    position = None
    if job.get('status') == 'queued' and queue:
        found = connection.lpos(Queue.redis_queue_namespace_prefix + queue, job_id, maxlen=POSITION_SCAN)
        position = int(found) if found is not None else None
    now = float(job['now'])
    parts: list[dict[str, Any]] = []
    for cls in views.shown():
        parts += [_entry(part) for part in cls.explain(connection, job, now)]
    return {'job': job_id, 'exists': True, 'status': job.get('status', ''), 'queue': queue, 'position': position,
            'worker': job.get('worker_name') or None, 'policies': parts}


def _entry(part: views.Explanation | dict[str, Any]) -> dict[str, Any]:
    """A policy's :class:`~rq_policies.engine.views.Explanation` as the answer's entry (a dict, from a policy written
    before the type, as it is)."""
    return part.as_dict() if isinstance(part, views.Explanation) else part


def _drop_record(raw: str, now: float, left_ms: int) -> dict[str, Any]:
    """A drop record (lib/drop_record.lua) with its queue as a name, not a key, and ``at``, when the drop happened
    (the record's ttl started then)."""
    record = json.loads(raw)
    queue = str(record.get('queue', ''))
    if queue.startswith(Queue.redis_queue_namespace_prefix):
        record['queue'] = queue[len(Queue.redis_queue_namespace_prefix):]
    record['at'] = now - keys.DROPPED_SECONDS + left_ms / 1000 if left_ms > 0 else None
    return record


def _gone(connection: Any, job_id: str, job_prefix: str) -> dict[str, Any]:
    """The answer for an id with no job hash, from its tombstone and drop record; UnknownJob when a policy has none."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.get(keys.superseded(job_id))
        pipe.get(keys.dropped(job_id))
        pipe.pttl(keys.dropped(job_id))
        time_in(pipe)
        tombstone, dropped, left_ms, (seconds, micros) = pipe.execute()
    if tombstone is None and dropped is None:
        raise UnknownJob(job_id)
    now = seconds + micros / 1e6
    superseded = read_tombstone(tombstone)
    if superseded is None and dropped is None:
        raise UnknownJob(job_id)
    records: dict[str, Any] = {
        'superseded': superseded,
        'dropped': _drop_record(text(dropped), now, left_ms) if dropped is not None else None,
        'job_prefix': job_prefix,
    }
    parts: list[dict[str, Any]] = []
    for cls in views.shown():
        parts += [_entry(part) for part in cls.explain_gone(connection, job_id, records, now)]
    if not parts:
        raise UnknownJob(job_id)
    queue = next((part['queue'] for part in parts if part.get('queue')), '')
    return {'job': job_id, 'exists': False, 'status': '', 'queue': queue, 'position': None, 'worker': None,
            'policies': parts}


def lines(answer: dict[str, Any]) -> list[str]:
    """``explain``'s answer as the lines ``rq-policies explain`` prints."""
    position = answer['position']
    where = f'queue {answer["queue"]!r}' + (f', position {position}' if position is not None else '')
    worker = f' on worker {answer["worker"]}' if answer['worker'] and answer['status'] == 'started' else ''
    if answer.get('exists', True):
        out = [f'job {answer["job"]}: {answer["status"] or "no status"}{worker}, {where}']
    else:
        out = [f'job {answer["job"]}: not in Redis' + (f', queue {answer["queue"]!r}' if answer['queue'] else '')]
    if not answer['policies']:
        out.append('  no policy applies to this job')
    for part in answer['policies']:
        out.append(f'  {part["policy"]:<10} {part["verdict"]}')
        if part.get('change'):
            out.append(f'  {"":<10} -> {part["change"]}')
    return out
