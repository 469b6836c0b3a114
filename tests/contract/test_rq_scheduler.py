"""rq-scheduler (the separate package, ``rqscheduler``) puts a due job on its queue through its Scheduler's queue class
(``Scheduler(queue_class=...)``, ``rqscheduler --queue-class``): given ``PolicySchedulerQueue``, its due jobs pass
the policies' door like any enqueue; given rq's ``Queue`` or a plain ``PolicyQueue`` (which take ``enqueue_job`` as
rq's own re-enqueue), they bypass every policy (docs/drop-in.md)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from rq import Queue

from rq_policies import PolicyQueue
from rq_policies.surfaces.contrib.rq_scheduler import PolicySchedulerQueue
from tests.helpers import jobs

rq_scheduler = pytest.importorskip('rq_scheduler')


def _due(scheduler) -> list:
    past = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(seconds=5)  # rq-scheduler's naive UTC
    return [scheduler.enqueue_at(past, jobs.slow_loner, 'same', 0) for _ in range(2)]


@pytest.mark.parametrize('by_name', [False, True])
def test_with_policy_scheduler_queue_its_due_jobs_pass_the_door(connection, by_name):
    queue_class = 'rq_policies.surfaces.contrib.rq_scheduler.PolicySchedulerQueue' if by_name else PolicySchedulerQueue
    scheduler = rq_scheduler.Scheduler(queue_name='sched', connection=connection, queue_class=queue_class)
    first, second = _due(scheduler)
    scheduler.enqueue_jobs()
    # slow_loner is a Loner: of two due calls of the same identity, the scheduler's first passes, the other is dropped
    queued = PolicyQueue('sched', connection=connection).job_ids
    assert len(queued) == 1 and queued[0] in (first.id, second.id)
    assert connection.zcard(scheduler.scheduled_jobs_key) == 0


@pytest.mark.parametrize('queue_class', [None, PolicyQueue])
def test_with_rqs_queue_or_a_plain_policy_queue_its_due_jobs_bypass_every_policy(connection, queue_class):
    scheduler = rq_scheduler.Scheduler(queue_name='sched', connection=connection, queue_class=queue_class)
    first, second = _due(scheduler)
    scheduler.enqueue_jobs()
    assert sorted(Queue('sched', connection=connection).job_ids) == sorted([first.id, second.id])
