"""fakeredis (with Lua) is a supported backend for users' own unit tests: the policies work on it."""

from __future__ import annotations

import fakeredis
import jobs
import pytest

from rq_policies import PolicyQueue, PolicySimpleWorker, QueueSlot


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
    QueueSlot.set_capacity('unit', 1, connection=fake)
    assert QueueSlot.acquire('unit', capacity=1, token='a', connection=fake)
    assert not QueueSlot.acquire('unit', capacity=1, token='b', connection=fake)
    assert QueueSlot.release('unit', token='a', connection=fake)
    assert QueueSlot.acquire('unit', capacity=1, token='b', connection=fake)
