"""rq-scheduler: a queue class whose due jobs pass the policies' door.

rq-scheduler (the separate package, ``rqscheduler``) puts a due job on its queue with ``queue.enqueue_job(job)``,
through its Scheduler's queue class. rq's ``Queue`` and a plain ``PolicyQueue`` take that as rq's own re-enqueue (a
retry, a released dependent): the job bypasses every policy. :class:`PolicySchedulerQueue` takes it as a new arrival:
the policies its function declares (``@policy``) apply, as to an ``enqueue``::

    rqscheduler --queue-class rq_policies.surfaces.contrib.rq_scheduler.PolicySchedulerQueue
    Scheduler(queue_name='default', connection=redis, queue_class=PolicySchedulerQueue)

The job arrives with the hash rq-scheduler wrote when it scheduled it; it is admitted as a new call made now (its
``created_at`` is the moment the scheduler put it on its queue, which tells this call from a replay of an earlier
one). A due job a policy drops is not put on its queue and its hash stays as rq-scheduler wrote it, so a repeating
job (``interval=``, ``cron_string=``) keeps its series: its next run is admitted again.
"""

from __future__ import annotations

from typing import Any

from rq.job import Job
from rq.utils import now

from rq_policies.engine.queue import DECLARED, PolicyQueue

__all__ = ['PolicySchedulerQueue']


class PolicySchedulerQueue(PolicyQueue):
    """rq-scheduler's queue class with rq-policies' admission: a due job is admitted through the policies its
    function declares, as ``enqueue`` admits a call."""

    def enqueue_job(self, job: Job, pipeline: Any = None, at_front: bool = False, **kwargs: Any) -> Job | None:  # type: ignore[override]
        job.created_at = now()  # a new call: the admission tells a replay by the job's created_at
        with self._door(DECLARED):
            return super().enqueue_job(job, pipeline=pipeline, at_front=at_front, **kwargs)
