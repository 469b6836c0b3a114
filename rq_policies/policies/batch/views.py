"""Batch: what it shows (``explain`` of a member, which names its batch job, and of a batch job, which names its
members)."""

from __future__ import annotations

from typing import Any

from redis import Redis
from rq.job import Job

from rq_policies.engine import keys, views
from rq_policies.engine.ops import text

from .rules import BATCH_FIELD, FIELD, MEMBERS_FIELD, Batch


class BatchViews(views.PolicyViews):
    policy = Batch

    @classmethod
    def explain(cls, connection: Redis, job: dict[str, str], now: float) -> list[views.Explanation]:
        members = job.get(MEMBERS_FIELD)
        if members:
            ids = members.split(' ')
            return [views.Explanation(cls.name, f'a batch of {len(ids)} member(s), the first {ids[0]}', '',
                                      {'members': ids})]
        raw = job.get(FIELD)
        if not raw:
            return []
        size, max_wait, min_size, key_id = raw.split(' ', 3)
        scope, _, key = key_id.partition(':')
        entry: dict[str, Any] = {'scope': scope, 'key': key, 'size': int(size), 'max_wait': float(max_wait),
                                 'min_size': int(min_size)}
        prefix = Job.redis_job_namespace_prefix
        batch = connection.hget(prefix + job['id'], BATCH_FIELD)
        if batch is not None:
            batch_id = text(batch)
            status = connection.hget(prefix + batch_id, 'status')
            entry['batch'] = batch_id
            entry['batch_status'] = text(status) if status is not None else None
            state = f'status {entry["batch_status"]}' if status is not None else 'its hash gone (expired or deleted)'
            return [views.Explanation(cls.name, f'member of batch job {batch_id} ({state}), key {key!r} (scope '
                                                f'{scope})', '', entry)]
        parked = keys.KEY_PARKED_PREFIX(cls.name, key_id)
        with connection.pipeline(transaction=False) as pipe:
            pipe.lpos(parked, job['id'])
            pipe.llen(parked)
            pipe.zscore(keys.KEY_DUE, f'{cls.name}:{key_id}')
            position, waiting, due = pipe.execute()
        entry['waiting'] = int(waiting)
        entry['due'] = float(due) if due is not None else None
        if position is None:
            return [views.Explanation(cls.name, f'key {key!r} (scope {scope}): not waiting for a batch, and in none',
                                      '', entry)]
        entry['position'] = int(position)
        when = (f'its batch forms at the next fetch from {float(due) - now:.1f} s from now' if due is not None and
                float(due) > now else 'its batch forms at the next fetch' if due is not None else
                f'its batch forms when {int(min_size)} member(s) wait')
        return [views.Explanation(
            cls.name, f'waiting for its batch: member {int(position) + 1} of {int(waiting)} of key {key!r} (scope '
                      f'{scope}), size {size}, max_wait {float(max_wait):g} s', when, entry)]
