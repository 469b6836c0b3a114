"""Reading every policy's state from Redis, for the metrics collector and ``rq-policies info``.

Two levels of cost. The gauges (each fetch policy's, :func:`lcw_gauges`, :func:`drops`) read a bounded set of keys
named by two small indexes (the capacity hash and ``rq:queues``; the LimitedCapacityWorker index) in a few pipelined
round trips, so a scrape stays cheap however many identities are live. :func:`snapshot` lists per-identity state
(loner markers, throttle slots, trailing and debounced jobs), which is only findable by SCAN
(:mod:`rq_policies.engine.reading`); it is for a human asking, never for a scrape. SCAN runs in Python, never inside a
Lua script.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry

from rq_policies.engine import keys
from rq_policies.engine.exceptions import InvalidArgument
from rq_policies.engine.ops import server_now, text
from rq_policies.engine.policy import FETCH
from rq_policies.engine.readable import cut, in_seconds
from rq_policies.engine.reading import (
    configured_queues,
    families,
    glob_escape,
    identity_rows,
    queue_names,
    scan_identity_keys,
)
from rq_policies.engine.views import Heading, Row, Section, Shown, shown

# -- gauges (cheap: what a scrape reads) ----------------------------------------------------------------------------


def lcw_gauges(connection: Redis, now: float | None = None) -> list[dict[str, Any]]:
    """Per LimitedCapacityWorker class seen in the last day: running, queued, and its last reported gauges."""
    now = server_now(connection) if now is None else now
    classes = [text(c) for c in connection.zrangebyscore(keys.LCW_INDEX, '-inf', '+inf')]
    with connection.pipeline(transaction=False) as pipe:
        for path in classes:
            pipe.hgetall(keys.lcw_state(path))
            pipe.zcount(keys.lcw_running(path), f'({now:.6f}', '+inf')
            pipe.zcard(keys.lcw_queued(path))
        replies = pipe.execute()
    rows = []
    for i, path in enumerate(classes):
        state, running, queued = replies[3 * i: 3 * i + 3]
        if not state:
            continue  # expired between the index read and this one
        state = {text(k): text(v) for k, v in state.items()}
        rows.append({
            'class': path,
            'queue': state.get('queue'),
            'running_jobs': int(running),
            'queued_jobs': int(queued),
            'max_running_jobs': int(state['max']) if 'max' in state else None,
            'remaining_work_count': int(state['remaining']) if 'remaining' in state else None,
            'reported_seconds_ago': round(now - float(state['updated']), 3) if 'updated' in state else None,
        })
    return rows


def drops(connection: Redis) -> list[dict[str, Any]]:
    """Dropped enqueues counted by the admission scripts: ``{'policy', 'queue', 'count'}`` per field of DROPS."""
    rows = []
    for field, value in connection.hgetall(keys.DROPS).items():
        policy, _, queue = text(field).partition(':')  # policy names have no colon; queue names may
        rows.append({'policy': policy, 'queue': queue, 'count': int(value)})
    return sorted(rows, key=lambda row: (row['queue'], row['policy']))


def drop_history(connection: Redis, now: float, minutes: int = keys.DROPS_MINUTE_KEEP) -> dict[str, Any]:
    """Dropped enqueues per minute over the last ``minutes`` minutes of the server's clock, from the per-minute
    counters the admission script keeps (``lua/lib/count_drop.lua``): one pipelined round trip of ``minutes``
    HGETALLs, however many enqueues there were.

    Returns:
        ``{'minutes': [epoch minute, ...] (oldest first), 'series': [{'policy', 'queue', 'counts': [per minute],
        'total'}, ...]}``, series sorted by queue then policy.
    """
    current = int(now // 60)
    span = list(range(current - minutes + 1, current + 1))
    with connection.pipeline(transaction=False) as pipe:
        for minute in span:
            pipe.hgetall(keys.numbered(keys.DROPS_MINUTE_PREFIX, minute))
        replies = pipe.execute()
    series: dict[tuple[str, str], list[int]] = {}
    for i, reply in enumerate(replies):
        for field, value in reply.items():
            policy, _, queue = text(field).partition(':')
            series.setdefault((queue, policy), [0] * len(span))[i] = int(value)
    return {
        'minutes': span,
        'series': [{'policy': policy, 'queue': queue, 'counts': counts, 'total': sum(counts)}
                   for (queue, policy), counts in sorted(series.items())],
    }


def policies_state(connection: Redis, now: float, limit: int | None) -> dict[str, Section]:
    """Each policy's state that belongs to no queue (its views' ``cluster_info``), by name."""
    out = {}
    for cls in shown():
        found = cls.cluster_info(connection, now, limit)
        if found is not None:
            out[cls.name] = found
    return out


def queue_sections(connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, list[Section]]:
    """Per queue name, every fetch policy's :class:`~rq_policies.engine.views.Section` of it, in registry order (what
    ``info`` and the dashboard show of the queue's settings: the headline's words, the rows, the ``--json`` fields)."""
    out: dict[str, list[Section]] = {name: [] for name in names}
    for cls in shown(FETCH):
        for name, found in cls.queue_info(connection, names, now, limit).items():
            if name in out:
                out[name].append(found)
    return out


def headline(sections: list[Section]) -> list[str]:
    """A queue's headline words: each section's that has some."""
    return [words for found in sections if (words := found.headline())]


@dataclass(frozen=True)
class IdentityFamily(Section):
    """One per-identity key family of an admission policy on one queue (loner markers, throttle windows, pending
    trailing and debounced jobs), read generically: ``--json`` shows it under the family's name as ``count``, the
    listed ``entries`` (at most ``--limit``) and, for a family that holds only while its job waits, ``waiting``; its
    words are its policy's views' ``describe``, which the renderer (:mod:`rq_policies.surfaces.cli`) asks for."""

    family: keys.Family
    count: int
    entries: list[dict[str, Any]]
    waiting: int = 0

    def as_json(self) -> dict[str, object]:
        block: dict[str, object] = {'count': self.count, 'entries': self.entries}
        if self.family.while_waiting:
            block['waiting'] = self.waiting
        return {self.family.name: block}


@dataclass(frozen=True)
class Jobs(Section):
    """A queue's jobs admitted and not yet started, wherever they are kept (``jobs`` in ``--json``): ``queued`` on
    rq's queue list (the only number ``rq info`` counts), ``deferred`` in rq's deferred registry (a job waiting for
    its key's turn or parked at its key's limit, and rq's own jobs waiting for a dependency), ``scheduled`` in rq's
    scheduled registry (a debounced, trailing or snoozed job, rq's ``enqueue_in``/``_at``),
    ``total`` their sum; ``due`` lists the scheduled jobs whose time has come that no worker has moved to the queue
    yet (no PolicyWorker and no rq scheduler serves the queue), at most ``--limit``, each ``{'id', 'due',
    'description'}``."""

    queued: int
    deferred: int
    scheduled: int
    total: int
    due: list[dict[str, Any]]

    def as_json(self) -> dict[str, object]:
        return {'jobs': super().as_json()}

    def rows(self, shown: Shown) -> list[Row | str]:
        if not self.total:
            return []
        found = [Row('jobs', f'{self.total} waiting in all; rq info counts {self.queued} (queued {self.queued}, '
                             f'deferred {self.deferred}, scheduled {self.scheduled})')]
        if self.due:
            found.append(Row('due', f'{len(self.due)} scheduled job(s) due, not yet moved to the queue (no '
                                    'PolicyWorker or rq scheduler has served it since)',
                             [f'job {row["id"]} due {in_seconds(row["due"] - shown.now)}'
                              + (f'  {cut(row["description"], shown.width)}' if row['description'] else '')
                              for row in self.due]))
        return found


def job_counts(connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, Jobs]:
    """Per queue name, its :class:`Jobs`: three counts and the due scheduled jobs, in two pipelined round trips."""
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(Queue.redis_queue_namespace_prefix + name)
            pipe.zcard(DeferredJobRegistry.key_template.format(name))
            pipe.zcard(ScheduledJobRegistry.key_template.format(name))
            pipe.zrangebyscore(ScheduledJobRegistry.key_template.format(name), '-inf', f'{now:.6f}',
                               start=0, num=limit or -1, withscores=True)
        replies = pipe.execute()
    due_ids = [(i, text(jid), score) for i in range(len(names)) for jid, score in replies[4 * i + 3]]
    descriptions: list[Any] = []
    if due_ids:
        with connection.pipeline(transaction=False) as pipe:
            for _, jid, _ in due_ids:
                pipe.hget(Job.redis_job_namespace_prefix + jid, 'description')
            descriptions = pipe.execute()
    out = {}
    for i, name in enumerate(names):
        queued, deferred, scheduled = (int(value) for value in replies[4 * i: 4 * i + 3])
        due = [{'id': jid, 'due': float(score), 'description': text(description) if description else None}
               for (j, jid, score), description in zip(due_ids, descriptions) if j == i]
        out[name] = Jobs(queued, deferred, scheduled, queued + deferred + scheduled, due)
    return out


@dataclass(frozen=True)
class Drops(Section):
    """A queue's dropped enqueues per policy (``drops`` in ``--json``; a ``dropped`` row when there are some)."""

    drops: dict[str, int]

    def rows(self, shown: Shown) -> list[Row | str]:
        if not self.drops:
            return []
        return [Row('dropped', ', '.join(f'{policy} {count}' for policy, count in sorted(self.drops.items())))]


@dataclass(frozen=True)
class WorkerGauges(Section):
    """The LimitedCapacityWorker classes seen in the last day and their gauges (:func:`lcw_gauges`'s rows;
    ``limited_capacity_workers`` in ``--json``)."""

    limited_capacity_workers: list[dict[str, Any]]

    def rows(self, shown: Shown) -> list[Row | str]:
        if not self.limited_capacity_workers:
            return []
        lines: list[Row | str] = [Heading('limited-capacity workers')]
        for row in self.limited_capacity_workers:
            lines.append(
                f'  {row["class"]}  queue {row["queue"]}  running {row["running_jobs"]}/{row["max_running_jobs"]}'
                f'  queued {row["queued_jobs"]}  remaining {row["remaining_work_count"]}'
                + (f'  (reported {in_seconds(-row["reported_seconds_ago"])})'
                   if row['reported_seconds_ago'] is not None else '')
            )
        return lines


@dataclass
class Survey:
    """Everything ``rq-policies info`` shows, typed: per queue its sections (each fetch policy's, each identity
    family's, its drops), each policy's section that belongs to no queue, and the limited-capacity workers. Its text
    is rendered from this object (:mod:`rq_policies.surfaces.cli`) and its ``--json`` is :meth:`as_json` of it
    (:func:`snapshot`).
    """

    server_time: float
    queues: dict[str, list[Section]]
    policies: dict[str, Section]
    workers: WorkerGauges

    def as_json(self) -> dict[str, Any]:
        """``info --json``'s document (without ``server``, which the command adds): a queue's entry is its sections'
        fields merged, in order."""
        queues: dict[str, Any] = {}
        for name, sections in self.queues.items():
            entry: dict[str, Any] = {}
            for found in sections:
                entry.update(found.as_json())
            queues[name] = entry
        return {
            'server_time': self.server_time,
            'queues': queues,
            'limited_capacity_workers': self.workers.limited_capacity_workers,
            'policies': {name: found.as_json() for name, found in self.policies.items()},
        }


def survey(connection: Redis, queues: list[str] | None = None, limit: int | None = None) -> Survey:
    """Everything ``rq-policies info`` shows, as typed sections (:class:`Survey`; :func:`snapshot` is its data).

    Args:
        connection: the Redis connection.
        queues: the queues to show; None for every queue that has a cap, a hold or a policy key.
        limit: list at most this many entries per queue and family (the counts stay exact); None for all.
    """
    now = server_now(connection)
    kinds = families()
    identity = scan_identity_keys(connection, queues, kinds)
    if queues is None:
        names = configured_queues(connection)
        for per_queue in identity.values():
            names.update(per_queue)
        # queues with live fetch state (a hold) but no setting any more
        for name, sections in queue_sections(connection, queue_names(connection), now, 0).items():
            if any(value for found in sections for value in found.as_json().values()):
                names.add(name)
        names.update(row['queue'] for row in drops(connection))
        # a queue with jobs rq info does not count (waiting for a turn, parked, debounced; a scheduled job whose time
        # has come that nothing moved, as a debounced job whose pointer expired on a queue no PolicyWorker serves):
        # it may have nothing else to show, but its jobs wait
        counts = job_counts(connection, queue_names(connection), now, 1)
        names.update(name for name, found in counts.items() if found.total != found.queued)
        selected = sorted(names)
    else:
        selected = list(queues)
    drop_rows = drops(connection)
    sections = queue_sections(connection, selected, now, limit)
    for name, found in job_counts(connection, selected, now, limit).items():
        sections[name].insert(0, found)
    for name in selected:
        for family in kinds:
            family_rows = identity_rows(connection, family, identity.get(family.name, {}).get(name, []))
            sections[name].append(IdentityFamily(
                family, len(family_rows), family_rows[:limit] if limit else family_rows,
                sum(1 for row in family_rows if row.get('waiting')) if family.while_waiting else 0))
        sections[name].append(Drops({row['policy']: row['count'] for row in drop_rows if row['queue'] == name}))
    return Survey(now, sections, policies_state(connection, now, limit), WorkerGauges(lcw_gauges(connection, now)))


def snapshot(connection: Redis, queues: list[str] | None = None, limit: int | None = None) -> dict[str, Any]:
    """Everything ``rq-policies info`` shows, as plain data (what ``--json`` prints): :func:`survey`'s data.

    Args:
        connection: the Redis connection.
        queues: the queues to show; None for every queue that has a cap, a hold or a policy key.
        limit: list at most this many entries per queue and family (the counts stay exact); None for all.
    """
    return survey(connection, queues, limit).as_json()


# -- changing state -------------------------------------------------------------------------------------------------


def reset_identity(
    connection: Redis,
    queue: str,
    func_name: str,
    args: Iterable[Any] = (),
    kwargs: dict[str, Any] | None = None,
    unique_context: Any = None,
    spec: Any = None,
) -> dict[str, Any]:
    """Clear one identity's state on one queue, as ``PolicyQueue.reset`` does, for a function given by path.

    Runs the same script (``lua/reset.lua``): every admission policy's state of the identity (loner marker,
    throttle windows, pending trailing and debounced jobs). Keys whose name needs a setting that is not known (the
    function could not be imported, so ``spec`` is None) are found by SCAN first, through each policy's key
    families; a key written between that SCAN and the script survives, which is the same as one written just after
    the reset.

    Args:
        connection: the Redis connection.
        queue: the queue name.
        func_name: the function's import path as rq stores it (``module.qualname``).
        args: positional arguments of the call.
        kwargs: keyword arguments of the call.
        unique_context: the function's ``unique_context``, when it declares one.
        spec: the function's declared PolicySet, when it could be imported.

    Returns:
        ``{'digest', 'removed'}``: the identity and how many keys were removed.
    """
    from rq_policies.engine import identity

    digest = identity.digest(func_name, queue, tuple(args), dict(kwargs or {}), unique_context,
                             spec.policies if spec else None)
    return {'digest': digest, 'removed': reset_digest(connection, queue, digest, spec)}


def identity_keys(connection: Redis, queue: str, digest: str) -> list[str]:
    """Every key identity ``digest`` has on ``queue`` now, in every registered family (SCAN of its own prefix)."""
    found = []
    for family in families():
        pattern = glob_escape(family.prefix(queue, digest)) + ('*' if family.windowed else '')
        found += sorted(text(k) for k in keys.scanner(connection).scan_iter(match=pattern, count=1000))
    return found


def reset_digest(connection: Redis, queue: str, digest: str, spec: Any = None) -> int:
    """Clear the state of identity ``digest`` on ``queue`` (what :func:`reset_identity` does once it has the
    digest; the dashboard's reset, which lists digests). Returns how many keys were removed."""
    from rq_policies.engine import admission

    if not isinstance(digest, str) or len(digest) != 64 or any(c not in '0123456789abcdef' for c in digest):
        raise InvalidArgument(
            'digest', message=f'digest must be an identity digest (64 lowercase hex characters), got {digest!r}')
    declared_names = {item.name for item in (spec.policies if spec else ())}
    scanned: list[str] = []
    for family in keys.FAMILIES:
        if family.needs_setting and family.policy not in declared_names:
            pattern = glob_escape(family.prefix(queue, digest)) + '*'
            scanned += sorted(text(k) for k in keys.scanner(connection).scan_iter(match=pattern, count=1000))
    return admission.reset(Queue(queue, connection=connection), spec, digest, scanned)
