"""Every difference between the rq versions rq-policies supports (2.12 and 3.x), in one place."""

from __future__ import annotations

import inspect
from typing import Any

import rq
from rq.queue import Queue
from rq.worker import Worker

RQ_VERSION: tuple[int, ...] = tuple(int(part) for part in rq.__version__.split('.')[:2] if part.isdigit())
RQ3 = RQ_VERSION >= (3, 0)

_CREATE_JOB_PARAMS = frozenset(inspect.signature(Queue.create_job).parameters) - {'self'}


def create_job_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    """Keep the fields of an ``EnqueueData`` that this rq's ``Queue.create_job`` accepts."""
    return {key: value for key, value in data.items() if key in _CREATE_JOB_PARAMS}


def has_rate_limit(job: Any) -> bool:
    """rq 3 added ``RateLimit`` (``job.has_rate_limit``); rq 2.12 jobs never have one."""
    return bool(getattr(job, 'has_rate_limit', False))


#: rq 3 ends a job that raised in ``Worker._finalize_failure`` (failure callback, exception handlers, failure
#: handling); rq 2.12 has no such method and does the same steps inline in ``perform_job``.
LEGACY_FAILURE = not hasattr(Worker, '_finalize_failure')


#: rq 3's scheduler enqueues a due job under a ``RateLimit`` through rq's rate-limit registry
#: (``Queue._enqueue_rate_limited_job``); rq 2.12 has no rate limits. The fetch's promotion leaves such a job for rq's
#: scheduler (lua/lib/promote.lua).
SCHEDULER_RATE_LIMITS = RQ3
