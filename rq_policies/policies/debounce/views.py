"""Debounce: what it shows (``explain``, its pending jobs in ``info`` and on the dashboard)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from rq.registry import ScheduledJobRegistry

from rq_policies.engine import keys, reading, views
from rq_policies.engine.readable import relative

from .rules import DEBOUNCE_FIELD, Debounce


class DebounceViews(views.PolicyViews):
    policy = Debounce

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
        state = job.get(DEBOUNCE_FIELD)
        if not state:
            return []
        with connection.pipeline(transaction=False) as pipe:
            pipe.hget(state, 'job')
            pipe.zscore(ScheduledJobRegistry.key_template.format(job.get('origin', '')), job['id'])
            pending, run_at = pipe.execute()
        pending = pending.decode() if isinstance(pending, bytes) else pending
        entry: dict[str, Any] = {'pending': pending, 'run_at': run_at}
        when = datetime.fromtimestamp(run_at, timezone.utc).isoformat() if run_at is not None else None
        if pending == job['id'] and run_at is not None and run_at > now:
            verdict = f'pending debounced job, runs at {when} (in {run_at - now:.1f} s)'
            change = ('an identical enqueue before then rewrites it in place (its payload and run time; '
                      'same id)')
        elif run_at is not None:
            verdict = (f'its quiet period is over: the next fetch of a PolicyWorker of its queue moves it to '
                       f'the queue (due {when})')
            change = 'run a PolicyWorker on its queue (or stock workers with --with-scheduler)'
        else:
            verdict = 'its debounce period is over'
            change = ''
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def explain_gone(cls, connection: Any, job_id: str, records: dict[str, Any], now: float) -> list[views.Explanation]:
        return views.superseded_entry(cls.name, connection, records,
                                      'a later enqueue of its identity replaced this pending debounced job',
                                      'nothing: job {by} runs in its place, with the latest payload')


    @classmethod
    def describe(cls, family: keys.Family, block: dict[str, Any], digests: bool = False,
                 width: int = 40) -> list[views.Row | str]:
        def detail(row: dict[str, Any]) -> str:
            job, first = row['fields'].get('job'), row['fields'].get('first')
            since = ''
            if first and block.get('server_time'):
                since = f', pending since {relative(float(first) - block["server_time"])}'
            return f'job {job}{since}' if job else ''

        return views.pending_lines(family, block, detail, digests, width)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[views.Panel]:
        """The dashboard's pending debounced jobs: the job that runs once its identity is quiet, when the pending
        period started, and when the job runs."""
        sample = reading.sample_family(connection, keys.DEBOUNCE_KEYS, limit, search)
        rows = []
        for row in sample['rows']:
            job_id = row['fields'].get('job')
            first = row['fields'].get('first')
            rows.append([row['queue'], views.identity_cell(row), views.Cell(job_id, job=job_id) if job_id else None,
                         views.Cell(at=float(first) - now) if first else None,
                         None if row['expires_in'] is None else views.Cell(at=row['expires_in'])])
        if not rows:
            return []
        return [views.Panel('Pending debounced jobs (Debounce)', ['queue', 'identity', 'job', 'pending since', 'runs'],
                            rows, reading.sample_note(sample, 'pending jobs'))]
