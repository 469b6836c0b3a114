"""What the dashboard shows, as plain data: read from Redis in a bounded number of commands.

The page is built from the registry, like ``rq-policies info``: per queue, each fetch policy's headline words (its
views' :meth:`~rq_policies.engine.views.PolicyViews.queue_info` section's ``headline``); then every registered policy's
panels (:meth:`~rq_policies.engine.views.PolicyViews.panels`), rendered generically; the drop counters of the last hour;
the LimitedCapacityWorker gauges; the server's eviction warning. Nothing here names a policy.

Bounds (a page must answer fast on a server with 100,000 identities): queues are those rq and the fetch policies
know (``rq:queues`` and the settings hashes), at most :data:`QUEUE_LIMIT` listed, with O(1) counts each; the drop
chart is one pipeline of 60 small hashes; each policy's panels list at most ``limit`` rows, and per-identity ones
come from a SCAN with a budget (:func:`rq_policies.engine.reading.sample_family`), never KEYS.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import datetime, timezone
from typing import Any

from rq.queue import Queue

from rq_policies.engine import health, reading, views
from rq_policies.engine.policy import FETCH
from rq_policies.engine.readable import local_iso, relative
from rq_policies.surfaces import state

logger = logging.getLogger('rq_policies')

#: The most queues the page lists (each costs a few O(1) commands); a search narrows them.
QUEUE_LIMIT = 200

#: Rows each panel lists by default.
ROW_LIMIT = 20


def cell(value: Any) -> dict[str, Any]:
    """A panel cell as the page renders it: ``{'text', 'job' (a job id to link, or None), 'warn' (highlighted),
    'expired' (greyed: a hold or marker past its time that no longer counts), 'title' (shown on hover), 'sub' (a
    second, small line: an identity's whole digest, to copy into a reset), 'time' (a moment's ISO text, or '')}``.

    A policy's panel gives a dict with ``text`` and any of ``job``, ``warn``, ``expired``, ``title``, ``sub``, and
    ``at``:
    a moment as seconds from now (negative: past), shown as :func:`rq_policies.engine.readable.in_seconds` shows it
    (local ISO time and ``in 5 s`` / ``12 s ago``) after the text and a ``;``, with the ``note`` words before it.

    A policy's panel is its own code; whatever it puts in a cell becomes text here (the template escapes it), so a
    malformed cell shows as what it is instead of breaking the page. A :class:`rq_policies.engine.views.Cell` reads as
    the dict of its fields.
    """
    if isinstance(value, views.Cell):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        job = value.get('job')
        text = '' if value.get('text') is None else str(value.get('text'))
        moment = ''
        at = value.get('at')
        if isinstance(at, (int, float)) and not isinstance(at, bool):
            moment = local_iso(time.time() + at)
            when = ' '.join(filter(None, [str(value.get('note') or ''), f'{moment} ({relative(at)})']))
            text = f'{text}; {when}' if text else when
        return {
            'text': text,
            'job': str(job) if job else None,
            'warn': bool(value.get('warn')),
            'expired': bool(value.get('expired')),
            'title': '' if value.get('title') is None else str(value.get('title')),
            'sub': '' if value.get('sub') is None else str(value.get('sub')),
            'time': moment,
        }
    blank = {'job': None, 'warn': False, 'expired': False, 'title': '', 'sub': '', 'time': ''}
    if value is None:
        return {'text': '', **blank}
    if isinstance(value, float):
        return {'text': f'{value:g}', **blank}
    return {'text': str(value), **blank}


def _panel(policy: str, panel: Any) -> dict[str, Any]:
    if isinstance(panel, views.Panel):
        panel = {'title': panel.title, 'columns': panel.columns, 'rows': panel.rows, 'note': panel.note}
    if not isinstance(panel, dict):
        return {
            'policy': policy,
            'title': f'{policy}: not a panel',
            'columns': [],
            'note': repr(panel)[:200],
            'rows': [],
        }
    return {
        'policy': policy,
        'title': str(panel.get('title', policy)),
        'columns': [str(c) for c in panel.get('columns', [])],
        'rows': [[cell(value) for value in row] for row in panel.get('rows', [])],
        'note': str(panel.get('note') or ''),
    }


def panels(connection: Any, now: float, limit: int, search: str | None) -> list[dict[str, Any]]:
    """Every registered policy's panels, normalised (see :func:`cell`). A policy whose hook raises shows one panel
    saying so, and the rest of the page still answers."""
    out = []
    # a queue's own panels (caps, holds, rates) first, then per-key and per-identity ones, each in rank order
    for cls in sorted(views.shown(), key=lambda cls: cls.policy.kind != FETCH):
        try:
            found = cls.panels(connection, now, limit, search)
        except Exception as exc:  # one policy's bug must not take the page down
            logger.exception('rq-policies dashboard: %s.panels failed', cls.__name__)
            found = [
                {
                    'title': f'{cls.name}: could not be read',
                    'columns': [],
                    'rows': [],
                    'note': f'{type(exc).__name__}: {exc}',
                }
            ]
        out.extend(_panel(cls.name, panel) for panel in found)
    return out


def _registry_keys(connection: Any, name: str) -> tuple[str, str, str, str]:
    queue = Queue(name, connection=connection)  # rq's own key names; building them sends no command
    return (
        queue.key,
        queue.scheduled_job_registry.key,
        queue.deferred_job_registry.key,
        queue.started_job_registry.key,
    )


def queues(connection: Any, now: float, search: str | None, history: dict[str, Any]) -> dict[str, Any]:
    """Per queue: waiting, scheduled, deferred and started counts, each fetch policy's headline words, and drops
    (last hour and all time). Read-only: rq's ``registry.count`` would clean the registry up, so ZCARD is used.

    A job parked by a per-key policy has status ``deferred`` and sits in rq's deferred registry of its queue, so the
    deferred count includes the queue's parked jobs (beside jobs waiting on a dependency), in the same O(1) ZCARD;
    the per-key panels say which keys they are parked on. A separate parked count per queue would mean reading
    every parked job (the parked lists are per key, not per queue), so the page does not keep one."""
    names = [name for name in reading.queue_names(connection) if not search or search in name]
    listed = names[:QUEUE_LIMIT]
    sections = state.queue_sections(connection, listed, now, 0)
    with connection.pipeline(transaction=False) as pipe:
        for name in listed:
            queue_key, scheduled, deferred, started = _registry_keys(connection, name)
            pipe.llen(queue_key)
            pipe.zcard(scheduled)
            pipe.zcard(deferred)
            pipe.zcard(started)
        counts = pipe.execute()
    totals: dict[str, dict[str, int]] = {}
    for row in state.drops(connection):
        totals.setdefault(row['queue'], {})[row['policy']] = row['count']
    recent: dict[str, dict[str, int]] = {}
    for series in history['series']:
        recent.setdefault(series['queue'], {})[series['policy']] = series['total']
    rows = []
    for i, name in enumerate(listed):
        words = state.headline(sections[name])
        rows.append(
            {
                'name': name,
                'waiting': counts[4 * i],
                'scheduled': counts[4 * i + 1],
                'deferred': counts[4 * i + 2],
                'started': counts[4 * i + 3],
                'policies': ', '.join(words),
                'drops_hour': sum(recent.get(name, {}).values()),
                'drops_total': sum(totals.get(name, {}).values()),
                'drops_by_policy': ', '.join(f'{p} {n}' for p, n in sorted(recent.get(name, {}).items())),
            }
        )
    return {'rows': rows, 'count': len(names), 'listed': len(listed)}


def chart(history: dict[str, Any], height: int = 36) -> dict[str, Any]:
    """The last hour's drops as bars per policy (summed over queues): what the page's SVG draws."""
    per_policy: dict[str, list[int]] = {}
    for series in history['series']:
        counts = per_policy.setdefault(series['policy'], [0] * len(history['minutes']))
        for i, value in enumerate(series['counts']):
            counts[i] += value
    peak = max((max(counts) for counts in per_policy.values()), default=0)
    out = []
    for policy, counts in sorted(per_policy.items()):
        bars = []
        for i, value in enumerate(counts):
            h = 0 if not value else max(1, round(value / peak * height))
            bars.append({'x': i * 5, 'y': height - h, 'h': h, 'value': value, 'ago': len(counts) - 1 - i})
        out.append({'policy': policy, 'total': sum(counts), 'bars': bars})
    return {'height': height, 'width': len(history['minutes']) * 5, 'series': out, 'peak': peak}


def overview(connection: Any, search: str | None = None, limit: int = ROW_LIMIT) -> dict[str, Any]:
    """Everything the main page shows (also what ``state.json`` answers)."""
    search = search or None
    now = state.server_now(connection)
    check = health.eviction_check(connection)
    history = state.drop_history(connection, now)
    return {
        'server_time': now,
        'server_time_text': datetime.fromtimestamp(now, timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC'),
        'local_time_text': local_iso(time.time()),
        'search': search or '',
        'limit': limit,
        'warning': check.warning,
        'maxmemory_policy': check.maxmemory_policy,
        'evicted_keys': check.evicted_keys,
        'queues': queues(connection, now, search, history),
        'drops_chart': chart(history),
        'panels': panels(connection, now, limit, search),
        'limited_capacity_workers': [{**row, 'reported_text': '' if row.get('reported_seconds_ago') is None else
                                      f'{local_iso(time.time() - row["reported_seconds_ago"])} '
                                      f'({relative(-row["reported_seconds_ago"])})'}
                                     for row in state.lcw_gauges(connection, now)],
    }
