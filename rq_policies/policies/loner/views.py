"""Loner: what it shows (``explain``, the identities ``info`` lists, the dashboard's panel)."""

from __future__ import annotations

from typing import Any

from rq.job import Job
from rq.worker import Worker

from rq_policies.engine import compat, keys, reading, views
from rq_policies.engine.ops import text
from rq_policies.engine.readable import identity

from .rules import CANCELLED_FIELD, NEXT_FIELD, NEXT_POLL, UNTIL_FIELD, Loner


class LonerViews(views.PolicyViews):
    policy = Loner

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
        marker = job.get(keys.LONER_FIELD)
        parsed = keys.LONER_KEYS.parse(marker) if marker else None
        if parsed is None:
            return []
        digest, until, status, jid = parsed[1], job.get(UNTIL_FIELD, 'started'), job.get('status', ''), job['id']
        worker = job.get('worker_name') or ''
        with connection.pipeline(transaction=False) as pipe:
            pipe.get(marker)
            pipe.ttl(marker)
            pipe.exists(Worker.redis_worker_namespace_prefix + worker)
            pipe.exists(keys.alive(jid))  # the horse outliving its worker (lua/lib/holder_running.lua reads it too)
            holder, ttl, worker_alive, horse_alive = pipe.execute()
        worker_alive = worker_alive or horse_alive
        holder = text(holder) if holder is not None else None
        entry: dict[str, Any] = {'identity': digest, 'until': until, 'marker': marker,
                                 'holder': holder, 'expires_in': ttl if ttl and ttl > 0 else None}
        short = digest[:12]
        waiting = status in compat.WAITING_STATUSES
        running = status == 'started' and until == 'finished'
        if holder == jid and (waiting or (running and worker_alive)):
            entry['holds'] = True
            verdict = f'holds identity {short} (Loner until {until})' + (
                f', marker expires in {ttl} s with the job' if ttl and ttl > 0 else '')
            change = ('freed when a worker takes the job, or it is deleted, cancelled or removed'
                      if until == 'started' else
                      'freed when the job ends: success, failure with no retry left, stop, timeout, cancel, '
                      'delete')
        elif holder == jid and running:
            entry['holds'] = False
            verdict = (f'identity {short} is free: its worker {worker} is gone (no heartbeat), so the '
                       'marker no longer blocks')
            change = "rq's maintenance marks the job failed (abandoned)"
        elif holder and running and worker_alive and cls._behind_of(connection, holder) == jid:
            entry['holds'] = True
            entry['waiting_behind'] = holder
            verdict = (f'runs holding identity {short} (Loner keep_last); job {holder} waits behind it with the '
                       'latest payload')
            change = f'when this job ends, job {holder} starts; an identical enqueue meanwhile replaces its payload'
        elif holder:
            entry['holds'] = False
            verdict = f'identity {short} is held by job {holder}, not this one'
            change = f'an identical enqueue is handled as a duplicate of {holder} while it holds'
        else:
            entry['holds'] = False
            why = 'a worker took it' if status == 'started' else f'it is {status or "gone"}'
            verdict = f'holds nothing: identity {short} is free ({why})'
            change = 'the next identical enqueue is admitted'
        behind = (job.get(NEXT_FIELD) or '').split(' ', 1)[0]
        if behind and waiting:
            verdict, change = cls._waits_behind(connection, behind, verdict, change)
            entry['waits_behind'] = behind
        if behind and cls._cancelled_by(connection, behind) == jid:
            entry['cancelled'] = behind
            verdict += f'; replaced job {behind}, stopped in progress by this job\'s enqueue (Loner cancel)'
        cancelled_by = job.get(CANCELLED_FIELD)
        if cancelled_by:
            entry['cancelled_by'] = cancelled_by
            if status == 'stopped':
                verdict += (f'; stopped in progress by the enqueue of job {cancelled_by} (Loner cancel), which runs '
                            'in its place once this run has ended')
            else:
                verdict += (f'; the enqueue of job {cancelled_by} asked its worker to stop it (Loner cancel: rq\'s '
                            f'stop-job command); job {cancelled_by} runs once this run has ended')
        if job.get('policies_replaced_by'):
            entry['replaced_by'] = job['policies_replaced_by']
            verdict += f'; its payload was replaced in place by the enqueue of job {entry["replaced_by"]}'
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def _behind_of(cls, connection: Any, jid: str) -> str:
        """The id of the job that keep_last job ``jid`` waits behind ('' for none)."""
        raw = connection.hget(Job.redis_job_namespace_prefix + jid, NEXT_FIELD)
        return text(raw).split(' ', 1)[0] if raw else ''

    @classmethod
    def _cancelled_by(cls, connection: Any, jid: str) -> str:
        """The id of the job whose enqueue stopped job ``jid`` (Loner cancel; '' for none)."""
        raw = connection.hget(Job.redis_job_namespace_prefix + jid, CANCELLED_FIELD)
        return text(raw) if raw else ''

    @classmethod
    def _waits_behind(cls, connection: Any, behind: str, verdict: str, change: str) -> tuple[str, str]:
        """What a keep_last job waiting behind job ``behind`` waits for (lua/policies/loner_next.lua decides the
        same at fetch: while ``behind`` waits or runs on a live worker, this one is not started)."""
        status, _ = reading.job_status(connection, Job.redis_job_namespace_prefix, behind)
        worker = text(connection.hget(Job.redis_job_namespace_prefix + behind, 'worker_name') or b'')
        live = status == 'started' and (
            connection.exists(Worker.redis_worker_namespace_prefix + worker) or connection.exists(keys.alive(behind)))
        if live or status in compat.WAITING_STATUSES:
            what = f'running on worker {worker}' if live else status
            return (f'{verdict}; waits behind job {behind} ({what}, Loner keep_last): it never starts beside it',
                    f'starts once job {behind} ends (its end gives this one back to its queue at once; the job of a '
                    f'dead worker stops blocking within its heartbeat bound, looked at every {NEXT_POLL} s)')
        return (f'{verdict}; waited behind job {behind}, which no longer holds ({status or "gone"})',
                change + '; the next fetch of its queue starts it')

    @classmethod
    def explain_gone(cls, connection: Any, job_id: str, records: dict[str, Any], now: float) -> list[views.Explanation]:
        dropped = records['dropped']
        if not dropped or dropped.get('policy') != cls.name:
            return []
        holder = str(dropped.get('holder', ''))
        status, _ = reading.job_status(connection, records['job_prefix'], holder)
        at = dropped.get('at')
        ago = f' ({max(now - at, 0.0):.0f} s ago)' if at is not None else ''
        return [views.Explanation(
            cls.name, f'dropped at enqueue{ago}: held by job {holder} ({status or "gone"} now)',
            'an identical enqueue is admitted once no job holds the identity; force() enqueues it anyway',
            {'holder': holder, 'queue': dropped.get('queue', ''), 'dropped_at': at},
        )]

    @classmethod
    def describe(cls, family: keys.Family, block: dict[str, Any], digests: bool = False,
                 width: int = 40) -> list[views.Row | str]:
        stale = block['count'] - block['waiting']
        items = []
        for row in block['entries']:
            holds = '' if row.get('waiting') else ', stale: no longer holds'
            items.append(f'{identity(row, width, digests)}  job {row["job_id"]} ({row["job_status"] or "gone"}{holds})')
        return [views.Row('loner', f'{block["waiting"]} waiting' + (f', {stale} stale' if stale else ''), tuple(items))]

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[views.Panel]:
        """The dashboard's unique identities: each marker's queue, identity, holder job and whether it still holds
        (a marker whose job no longer waits, and is not running under ``until='finished'``, is stale: the next
        enqueue of the identity replaces it)."""
        sample = reading.sample_family(connection, keys.LONER_KEYS, limit, search)
        rows = []
        for row in sample['rows']:
            job_id = row['job_id']
            holds = 'yes' if row['waiting'] else views.Cell('no (stale: the next enqueue replaces it)', expired=True)
            rows.append([row['queue'], views.identity_cell(row), views.Cell(job_id, job=job_id) if job_id else None,
                         row['job_status'] or 'gone', holds,
                         None if row['expires_in'] is None else views.Cell(at=row['expires_in'])])
        if not rows:
            return []
        return [views.Panel('Unique identities (Loner)', ['queue', 'identity', 'job', 'job status', 'holds', 'expires'],
                            rows, reading.sample_note(sample, 'markers'))]
