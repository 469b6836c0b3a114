"""Durable admission: a door that waits for replicas (``wait_replicas=``, per queue and per call) sends ``WAIT`` right
after its admission script, in the same round trip on the same connection, and returns once the replicas have the
job; fewer within ``wait_timeout_ms`` raise ``NotReplicated``, the job admitted all the same (docs/guarantees.md).

On a server of its own with one replica (a real ``--replicaof``), and on the session's cluster (the prefix slot's
primary and its replica). The replica is stopped with SIGSTOP to make it miss the timeout.
"""

from __future__ import annotations

import datetime
import os
import signal
import time

import pytest
from rq import Queue
from rq.job import Job

from rq_policies import Loner, PolicyQueue
from rq_policies.engine import keys
from rq_policies.engine.exceptions import InvalidArgument, NotReplicated
from rq_policies.surfaces.aio import AsyncDoorError, AsyncPolicyQueue
from rq_policies.surfaces.testing import RedisServer
from tests.helpers import jobs
from tests.helpers.cluster import ON_CLUSTER, not_on_cluster


@pytest.fixture(scope='module')
def pair():
    """A primary and its replica, servers of this module's own (not on a cluster run: the cluster has its own)."""
    if ON_CLUSTER:
        pytest.skip('the cluster tests below use the session cluster')
    primary = RedisServer(extra_args=['--repl-diskless-sync-delay', '0']).start()
    replica = RedisServer(extra_args=['--replicaof', '127.0.0.1', str(primary.port)]).start()
    try:
        deadline = time.monotonic() + 30
        while replica.client().info('replication').get('master_link_status') != 'up':
            assert time.monotonic() < deadline, 'the replica never synced'
            time.sleep(0.05)
        yield primary, replica
    finally:
        replica.close()
        primary.close()


@pytest.fixture
def primary(pair):
    primary, replica = pair
    client = primary.client()
    client.flushall()
    try:
        yield client
    finally:
        client.close()


class _Stopped:
    """A server SIGSTOPped for the ``with`` block: it takes nothing, acknowledges nothing, answers nothing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def _every_door(q: PolicyQueue, tag: str, **wait):
    """One job through each door, waiting as ``wait`` says (the Loner identities are the tag's own); their ids."""
    now = datetime.datetime.now(datetime.timezone.utc)
    found = [
        q.enqueue(jobs.plain, 1, job_id=f'{tag}-plain', **wait),
        q.enqueue(jobs.plain, f'{tag}-2', policy=Loner(), job_id=f'{tag}-loner', **wait),
        q.enqueue_call(jobs.plain, args=(3,), job_id=f'{tag}-call', **wait),
        q.enqueue_at(now, jobs.plain, 4, job_id=f'{tag}-at', **wait),
        q.enqueue_in(datetime.timedelta(seconds=30), jobs.plain, f'{tag}-5', policy=Loner(), job_id=f'{tag}-in',
                     **wait),
        q.force(jobs.plain, f'{tag}-2', policy=Loner(), job_id=f'{tag}-force', **wait),
        q.enqueue(jobs.plain, 6, depends_on=f'{tag}-plain', job_id=f'{tag}-deferred', **wait),
    ]
    found += q.enqueue_many([Queue.prepare_data(jobs.plain, (7,), job_id=f'{tag}-many')], **wait)
    assert None not in found, found
    return [job.id for job in found]


@not_on_cluster('a server and a replica of its own; the cluster cases are below')
def test_every_door_returns_once_the_replica_has_the_job(primary, pair):
    """Per call and per queue: each door returns with the job already on the replica (read there at once), one
    WAIT per door in the same round trip; a drop raises nothing."""
    _, replica = pair
    q = PolicyQueue('durable', connection=primary)
    ids = _every_door(q, 'call', wait_replicas=1, wait_timeout_ms=5000)
    on_replica = replica.client()
    try:
        assert [on_replica.exists(Job.key_for(job_id)) for job_id in ids] == [1] * len(ids)
        by_queue = PolicyQueue('durable', connection=primary, wait_replicas=1, wait_timeout_ms=5000)
        ids = _every_door(by_queue, 'queue')
        assert [on_replica.exists(Job.key_for(job_id)) for job_id in ids] == [1] * len(ids)
        assert by_queue.enqueue(jobs.plain, 'queue-2', policy=Loner()) is None  # a drop: no error
    finally:
        on_replica.close()
    stats = primary.info('commandstats')
    assert int(stats['cmdstat_wait']['calls']) >= 2 * len(ids)


@not_on_cluster('a server and a replica of its own; the cluster cases are below')
def test_a_replica_that_does_not_acknowledge_raises_not_replicated_and_the_job_is_admitted(primary, pair):
    """The replica stopped: each door waits ``wait_timeout_ms`` and raises NotReplicated naming the job, which is
    admitted on the primary (queued, or scheduled) and reaches the replica once it runs again. 0 per call turns the
    queue's waiting off."""
    _, replica = pair
    q = PolicyQueue('durable', connection=primary, wait_replicas=1, wait_timeout_ms=200)
    with _Stopped(replica.process.pid):
        started = time.monotonic()
        with pytest.raises(NotReplicated) as caught:
            q.enqueue(jobs.plain, 1, job_id='late-1')
        assert time.monotonic() - started >= 0.2
        with pytest.raises(NotReplicated) as loner:
            q.enqueue(jobs.plain, 2, policy=Loner(), job_id='late-2')
        assert q.enqueue(jobs.plain, 3, wait_replicas=0, job_id='late-3') is not None  # not waited for
    error = caught.value
    assert (error.job.id, error.acknowledged, error.replicas, error.timeout_ms) == ('late-1', 0, 1, 200)
    assert 'late-1 is admitted' in str(error) and '0 of 1 replica(s)' in str(error)
    assert loner.value.job.id == 'late-2'
    assert q.job_ids == ['late-1', 'late-2', 'late-3']
    assert q.enqueue(jobs.plain, 2, policy=Loner()) is None  # late-2 holds its identity: it is admitted


def test_bad_wait_values_are_refused_naming_them_and_write_nothing(connection):
    for kwargs, name in (({'wait_replicas': -1}, 'wait_replicas'), ({'wait_replicas': True}, 'wait_replicas'),
                         ({'wait_replicas': '1'}, 'wait_replicas'), ({'wait_timeout_ms': 0}, 'wait_timeout_ms'),
                         ({'wait_timeout_ms': 1.5}, 'wait_timeout_ms')):
        with pytest.raises(InvalidArgument) as refused:
            PolicyQueue('durable', connection=connection, **kwargs)
        assert refused.value.argument == name and repr(next(iter(kwargs.values()))) in str(refused.value)
        q = PolicyQueue('durable', connection=connection)
        with pytest.raises(InvalidArgument) as refused:
            q.enqueue(jobs.plain, 1, **kwargs)
        assert refused.value.argument == name
        with pytest.raises(InvalidArgument):
            q.enqueue(jobs.plain, 1, policy=Loner(), **kwargs)
    assert q.count == 0 and not connection.keys(f'{keys.KEY_PREFIX}:job:*')


def test_the_asyncio_doors_refuse_waiting_for_replicas(connection):
    with pytest.raises(AsyncDoorError):
        AsyncPolicyQueue('durable', connection=_AsyncStub(), wait_replicas=1)
    q = AsyncPolicyQueue('durable', connection=_AsyncStub())
    import asyncio

    with pytest.raises(AsyncDoorError, match='wait_replicas='):
        asyncio.run(q.enqueue(jobs.plain, 1, wait_replicas=1))


class _AsyncStub:
    """What the asyncio doors check of a client before any round trip (they refuse the option before one)."""

    async def execute_command(self, *args, **kwargs):  # pragma: no cover - never reached
        raise AssertionError('no round trip expected')

    async def evalsha(self, *args, **kwargs):  # pragma: no cover
        raise AssertionError('no round trip expected')


# -- on the session's cluster ----------------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.skipif(not ON_CLUSTER, reason='on the session cluster: RQ_POLICIES_CLUSTER=1')
def test_on_a_cluster_the_wait_goes_to_the_prefix_slot_primary(connection, session_cluster):
    """The script, the SET and the WAIT go to the primary serving the prefix's slot (its node client: a cluster
    pipeline takes no WAIT); the door returns with the job on that primary's replica; with the replica stopped it
    raises NotReplicated and the job is on the primary."""
    primary, replica = session_cluster.owner_of(keys.PREFIX)
    deadline = time.monotonic() + 30
    while replica is None and time.monotonic() < deadline:  # a replica still syncing
        time.sleep(0.1)
        primary, replica = session_cluster.owner_of(keys.PREFIX)
    assert replica is not None
    q = PolicyQueue('durable', connection=connection, wait_replicas=1, wait_timeout_ms=5000)
    session_cluster.reset_stats()
    ids = _every_door(q, 'c')
    from redis import Redis

    on_replica = Redis(port=replica.port, single_connection_client=True)  # READONLY holds for its connection
    owner = session_cluster.node_client(primary.port)
    try:
        on_replica.execute_command('READONLY')
        assert [on_replica.exists(Job.key_for(job_id)) for job_id in ids] == [1] * len(ids)
        assert int(owner.info('commandstats')['cmdstat_wait']['calls']) >= len(ids)
    finally:
        on_replica.close()
        owner.close()
    quick = PolicyQueue('durable', connection=connection, wait_replicas=1, wait_timeout_ms=200)
    with _Stopped(replica.process.pid):
        with pytest.raises(NotReplicated) as caught:
            quick.enqueue(jobs.plain, 1, job_id='c-late')
    assert caught.value.acknowledged == 0
    assert Job.fetch('c-late', connection=connection).get_status() == 'queued'
