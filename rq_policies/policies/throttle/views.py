"""Throttle: what it shows (``explain``, its windows and pending trailing jobs in ``info`` and on the dashboard)."""

from __future__ import annotations

from typing import Any

from rq.registry import ScheduledJobRegistry

from rq_policies.engine import keys, reading, views
from rq_policies.engine.readable import identity, local_iso, relative

from .rules import THROTTLE_FIELD, TRAILING_FIELD, WIDTH_FIELD, Throttle, _when


class ThrottleViews(views.PolicyViews):
    policy = Throttle

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
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
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def explain_gone(cls, connection: Any, job_id: str, records: dict[str, Any], now: float) -> list[views.Explanation]:
        dropped = records['dropped']
        superseded = views.superseded_entry(cls.name, connection, records,
                                            'a later extra of its window replaced this pending trailing job',
                                            'nothing: job {by} runs in its place, at the end of the window')
        if superseded:
            return superseded
        if dropped and dropped.get('policy') == cls.name:
            holder, ends = str(dropped.get('holder', '')), float(dropped.get('n', 0))
            return [views.Explanation(
                cls.name, f'dropped at enqueue: held by job {holder}, which owned the slot ending at {_when(ends)}',
                'an identical enqueue after ' + (
                    'that is admitted' if ends > now else f'{_when(ends)} is admitted (that time has passed)'),
                {'holder': holder, 'queue': dropped.get('queue', ''), 'window_ends_at': ends,
                 'dropped_at': dropped.get('at')},
            )]
        return []


    @classmethod
    def describe(cls, family: keys.Family, block: dict[str, Any], digests: bool = False,
                 width: int = 40) -> list[views.Row | str]:
        if family.windowed:
            return [views.Row('throttle', f'{block["count"]} live window(s)',
                              tuple(f'{identity(row, width, digests)}  job {row["job_id"]}  {window_words(row)}'
                                    for row in block['entries']))]
        return views.pending_lines(family, block, lambda row: f'job {row["job_id"]}', digests, width)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[views.Panel]:
        """The dashboard's throttle windows (the job that won each live window, and when the window ends) and
        pending trailing jobs (the job that runs when its window ends)."""
        out = []
        windows = reading.sample_family(connection, keys.THROTTLE_KEYS, limit, search)
        rows = [[row['queue'], views.identity_cell(row), _window_cell(row), _job_cell(row['job_id']),
                 _at(row['expires_in'])] for row in windows['rows']]
        if rows:
            out.append(views.Panel('Throttle windows (Throttle)', ['queue', 'identity', 'window', 'job', 'ends'], rows,
                                   reading.sample_note(windows, 'windows')))
        trailing = reading.sample_family(connection, keys.TRAILING_KEYS, limit, search)
        rows = [[row['queue'], views.identity_cell(row), _job_cell(row['job_id']), row['job_status'] or 'gone',
                 _at(row['expires_in'])] for row in trailing['rows']]
        if rows:
            out.append(views.Panel('Pending trailing jobs (Throttle)',
                                   ['queue', 'identity', 'job', 'job status', 'runs'], rows,
                                   reading.sample_note(trailing, 'pending jobs')))
        return out


def _at(seconds: float | None) -> views.Cell | None:
    """A page cell of the moment ``seconds`` from now (local time, ``in 5 s``), or None."""
    return None if seconds is None else views.Cell(at=seconds)


def _window_cell(row: dict[str, Any]) -> views.Cell:
    """A page cell of a throttle window: its start and end in local time, the window number on hover."""
    if row.get('window_start') is None:
        return views.Cell(f'window {row.get("slot")}', title='the window number (epoch seconds // width)')
    start, end = local_iso(row['window_start']), local_iso(row['window_end'])
    return views.Cell(f'{start} to {end[11:19] if start[:10] == end[:10] else end}',
                      title=f'window {row["slot"]} of {row["window_end"] - row["window_start"]} s')


def _job_cell(job_id: str | None) -> views.Cell | None:
    """A dashboard cell linking to ``job_id``'s page, or None."""
    return views.Cell(job_id, job=job_id) if job_id else None



def window_words(row: dict[str, Any]) -> str:
    """A throttle window as a person reads it: ``window 13:45:00 to 13:46:00 (ends in 12 s)`` in local time, from
    the row's ``window_start``/``window_end`` (its winner job's width); the ends alone when the width is unknown."""
    left = row.get('expires_in')
    ends = f'ends {relative(left)}' if left is not None else 'no expiry'
    if row.get('window_start') is None:
        return f'window {row.get("slot")} ({ends})'
    start, end = local_iso(row['window_start']), local_iso(row['window_end'])
    same_day = start[:10] == end[:10]
    return f'window {start} to {end[11:19] if same_day else end} ({ends})'
