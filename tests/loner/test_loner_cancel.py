"""Loner(until='finished', on_conflict='cancel'): a new admission stops the identity's running execution through rq's
stop-job command and waits behind it (Hatchet's CANCEL_IN_PROGRESS), with real forking PolicyWorkers."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from rq.job import Job, JobStatus
from rq.worker import Worker

from rq_policies import InvalidArgument, Loner, PolicyConfigurationError, PolicyQueue, Throttle, explain, policy
from rq_policies.engine import compat, keys
from tests.helpers import lock_jobs
from tests.helpers.cluster import connect
from tests.helpers.faults import ADMIT_WRITE, FAULTS, lose_reply, producer
from tests.helpers.workers import output, start_worker, stop, wait_for


def records(connection, account):
    """The start/tick/end records of ``account``'s runs: (kind, job id, payload, server time)."""
    found = []
    for line in connection.lrange(f'test:kl:{account}', 0, -1):
        kind, jid, payload, at = line.decode().split()
        found.append((kind, jid, payload, float(at)))
    return found


def spans(found):
    """Each run's (first, last) record time: a stopped run's last sign of life is its last tick."""
    runs: dict[str, list[float]] = {}
    for _, jid, _, at in found:
        runs.setdefault(jid, []).append(at)
    return {jid: (min(times), max(times)) for jid, times in runs.items()}


def overlaps(found):
    """Sweep over the runs' first and last records in server time order: the most runs of one identity at once."""
    events = sorted(event for first, last in spans(found).values() for event in ((first, 1), (last, -1)))
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def status(connection, jid):
    return Job.fetch(jid, connection=connection).get_status()


def started(connection, account, jid):
    return any(kind == 'start' and j == jid for kind, j, _, _ in records(connection, account))


# -- bad input --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(('kwargs', 'argument', 'value'), [
    ({'on_conflict': 'cancel'}, 'until', "'started'"),
    ({'until': 'started', 'on_conflict': 'cancel'}, 'until', "'started'"),
    ({'until': 'finished', 'on_conflict': 'cancel', 'ttl': 60}, 'ttl', '60'),
    ({'until': 'finished', 'on_conflict': 'cancel_in_progress'}, 'on_conflict', "'cancel_in_progress'"),
])
def test_cancel_with_an_option_it_cannot_work_with_is_refused_naming_it(connection, kwargs, argument, value):
    before = sorted(connection.keys('*'))
    with pytest.raises(InvalidArgument) as caught:
        Loner(**kwargs)
    assert caught.value.argument == argument and value in str(caught.value)
    assert sorted(connection.keys('*')) == before  # nothing written


def test_cancel_and_a_throttle_are_refused_naming_why(connection):
    before = sorted(connection.keys('*'))
    with pytest.raises(PolicyConfigurationError, match="'cancel'"):
        policy(Throttle(60), Loner(until='finished', on_conflict='cancel'))
    assert sorted(connection.keys('*')) == before


def test_repr_names_the_mode():
    assert repr(Loner(until='finished', on_conflict='cancel')) == "Loner(until='finished', on_conflict='cancel')"


# -- the admission script alone ---------------------------------------------------------------------------------------


def _runs(connection, job, worker):
    """Mark ``job`` started on a worker whose key lives, as rq writes it when a worker starts the job."""
    connection.set(Worker.redis_worker_namespace_prefix + worker, 1, ex=60)
    connection.hset(job.key, mapping={'status': 'started', 'worker_name': worker, 'policies_loner_taken': '1'})


def test_the_admission_publishes_rqs_stop_job_command_on_the_holders_worker_channel(connection, redis_url):
    """No worker: the admission behind a running holder publishes, in its own script, the message rq's
    send_stop_job_command would (parsed by rq's own parse_payload), on the holder's worker's channel, once; a
    replace of the waiting job sends none."""
    from rq.command import parse_payload
    q = PolicyQueue('cx-unit', connection=connection)
    first = q.enqueue(lock_jobs.cancelled, 'unit', 'p1')
    _runs(connection, first, 'cx-unit-worker')
    listener = connect(redis_url).pubsub()
    listener.subscribe(compat.STOP_CHANNEL_PREFIX + 'cx-unit-worker')
    assert listener.get_message(timeout=2)['type'] == 'subscribe'
    second = q.enqueue(lock_jobs.cancelled, 'unit', 'p2')
    assert second.id != first.id
    message = listener.get_message(timeout=5)
    assert message is not None and message['channel'].decode() == compat.STOP_CHANNEL_PREFIX + 'cx-unit-worker'
    assert parse_payload(message) == {'command': 'stop-job', 'job_id': first.id}
    assert connection.hget(first.key, 'policies_cancelled_by').decode() == second.id
    assert connection.hget(second.key, 'policies_loner_next').decode().split()[0] == first.id
    third = q.enqueue(lock_jobs.cancelled, 'unit', 'p3')  # the waiting one's payload, in place: no second stop
    assert third.id == second.id
    assert listener.get_message(timeout=1) is None
    listener.close()


# -- with real workers ------------------------------------------------------------------------------------------------


def test_a_new_enqueue_stops_the_running_job_and_runs_once_it_has_ended(connection, redis_url, worker_env):
    q = PolicyQueue('cx-basic', connection=connection)
    first = q.enqueue(lock_jobs.cancelled, 'basic', 'p1', seconds=60)
    workers = [start_worker(redis_url, ['cx-basic'], worker_env) for _ in range(2)]
    try:
        assert wait_for(lambda: started(connection, 'basic', first.id)), output(workers[0])
        second = q.enqueue(lock_jobs.cancelled, 'basic', 'p2', seconds=0.3)
        assert second is not None and second.id != first.id
        assert wait_for(lambda: status(connection, second.id) == JobStatus.FINISHED, timeout=20), output(workers[0])
        assert status(connection, first.id) == JobStatus.STOPPED
        assert connection.hget(first.key, 'policies_cancelled_by').decode() == second.id
        found = records(connection, 'basic')
        assert [(k, p) for k, _, p, _ in found if k != 'tick'] == [('start', 'p1'), ('start', 'p2'), ('end', 'p2')]
        assert overlaps(found) == 1
        assert connection.llen('test:overlap:basic') == 0
        gone = explain(first.id, connection=connection)['policies'][0]
        assert f'stopped in progress by the enqueue of job {second.id}' in gone['verdict'], gone
        assert gone['cancelled_by'] == second.id
        new = explain(second.id, connection=connection)['policies'][0]
        assert f'replaced job {first.id}, stopped in progress' in new['verdict'], new
        assert new['cancelled'] == first.id
    finally:
        stop(*workers)
