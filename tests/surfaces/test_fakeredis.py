"""fakeredis (with Lua) is a supported backend for users' own unit tests: the policies work on it."""

from __future__ import annotations

import logging
import warnings

import fakeredis
import pytest

from rq_policies import PolicyQueue, PolicySimpleWorker, QueueRate, QueueSlot
from tests.helpers import jobs


@pytest.fixture
def fake():
    server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server)


def test_loner_on_fakeredis(fake):
    q = PolicyQueue('unit', connection=fake)
    assert q.enqueue(jobs.sweep_cache, 1) is not None
    assert q.enqueue(jobs.sweep_cache, 1) is None
    assert q.enqueued(jobs.sweep_cache, 1)
    PolicySimpleWorker([q], connection=fake).work(burst=True)
    assert not q.enqueued(jobs.sweep_cache, 1)
    assert q.enqueue(jobs.sweep_cache, 1) is not None


def test_queue_slot_on_fakeredis(fake):
    QueueSlot.set('unit', 1, connection=fake)
    assert QueueSlot.acquire('unit', capacity=1, token='a', connection=fake)
    assert not QueueSlot.acquire('unit', capacity=1, token='b', connection=fake)
    assert QueueSlot.release('unit', token='a', connection=fake)
    assert QueueSlot.acquire('unit', capacity=1, token='b', connection=fake)


def test_jobs_without_a_policy_on_fakeredis(fake):
    """The replay-safe push (lua/push.lua, riding rq's pipelines with the full source: fakeredis has no cmsgpack) on
    every door a job without a policy takes, and a retry's push from the worker."""
    from datetime import timedelta

    from rq.job import Retry

    q = PolicyQueue('unit', connection=fake)
    one = q.enqueue(jobs.plain, 1)
    many = q.enqueue_many([PolicyQueue.prepare_data(jobs.plain, (n,)) for n in (2, 3)])
    assert q.job_ids == [one.id] + [job.id for job in many]
    later = q.enqueue_in(timedelta(seconds=60), jobs.plain, 4)
    assert q.scheduled_job_registry.get_job_ids() == [later.id]
    failing = q.enqueue(jobs.fail, 5, retry=Retry(max=1))
    PolicySimpleWorker([q], connection=fake).work(burst=True)
    assert [job.return_value() for job in (one, *many)] == [1, 2, 3]
    failing.refresh()
    assert failing.get_status() == 'failed' and failing.retries_left == 0  # retried once: pushed again, ran again


def test_a_cap_or_rate_before_the_first_enqueue_does_not_warn_on_fakeredis(fake):
    """A unit test's server starts empty: every queue is new there, so no UnknownQueueWarning (a real server's is
    tested in tests/surfaces/test_admin.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        QueueSlot.set('never-built', 2, connection=fake)
        QueueRate.set('never-built', 5, 60, connection=fake)


def test_fakeredis_workers_say_nothing_of_maxmemory_above_debug(fake, caplog, monkeypatch):
    """fakeredis has no CONFIG: a worker there said 'could not read maxmemory-policy' at INFO, each one; now once per
    process, at DEBUG."""
    from rq_policies.engine import health

    monkeypatch.setattr(health, '_FAKE_NOTED', False, raising=False)
    q = PolicyQueue('unit', connection=fake)
    q.enqueue(jobs.plain, 1)
    with caplog.at_level(logging.DEBUG):
        for _ in range(2):
            PolicySimpleWorker([q], connection=fake).work(burst=True, logging_level='DEBUG')
    said = [record for record in caplog.records if 'maxmemory' in record.getMessage()]
    assert [record.levelno for record in said] == [logging.DEBUG], [r.getMessage() for r in said]
