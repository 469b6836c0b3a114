"""A forking PolicyWorker's work horses share one connection that the worker keeps for them (issue 34: a connect
and redis-py's handshake per job were about 100 us of the server's CPU), and the worker hands it on only when the
last horse left it clean: a horse that exited normally with nothing left to read on it. A reply left unread, a horse
killed in the middle of a command, the server closing the connection: the next horse gets a new one, and its
commands get their own replies.
"""

from __future__ import annotations

import pytest
import redis
from rq.job import Job, JobStatus

from rq_policies import PolicyQueue, PolicyWorker
from rq_policies.engine import compat
from tests.helpers import jobs

pytestmark = pytest.mark.usefixtures('jobs_env')


@pytest.fixture
def plain_pool(connection):
    made = compat.horse_connection(connection)
    if made is None:
        pytest.skip("the horses connect as rq's do on this connection's pool (a cluster's, Sentinel's, TLS)")
    made.disconnect()
    return connection


def _run(connection, *calls):
    queue = PolicyQueue('horses', connection=connection)
    enqueued = [queue.enqueue(func, *args) for func, *args in calls]
    before = connection.info('stats')['total_connections_received']
    PolicyWorker([queue], connection=connection).work(burst=True)
    made = connection.info('stats')['total_connections_received'] - before
    return [Job.fetch(job.id, connection=connection) for job in enqueued], made


def test_the_horses_share_one_connection(plain_pool):
    done, made = _run(plain_pool, *[(jobs.horse_client, f'h{n}') for n in range(6)])
    assert [job.get_status() for job in done] == [JobStatus.FINISHED] * 6
    assert len({job.return_value() for job in done}) == 1, [job.return_value() for job in done]
    assert made <= 3, made  # the horses' one, and the worker's own (its command channel, its hold guard)


def test_a_reply_left_unread_is_not_handed_on(plain_pool):
    done, _ = _run(plain_pool, (jobs.horse_client, 'a'), (jobs.horse_leaves_a_reply_unread, 'b'),
                   (jobs.horse_client, 'c'), (jobs.horse_client, 'd'))
    assert [job.get_status() for job in done] == [JobStatus.FINISHED] * 4
    first, _, third, fourth = (job.return_value() for job in done)
    assert third != first  # a new connection: the PONG left on the old one is no one's reply
    assert fourth == third  # and that one is handed on again


def test_a_horse_killed_mid_command_does_not_hand_on_its_connection(plain_pool):
    done, _ = _run(plain_pool, (jobs.horse_client, 'a'), (jobs.horse_dies_mid_command, 'b'),
                   (jobs.horse_client, 'c'))
    assert done[1].get_status() == JobStatus.FAILED
    # Handed on, the half-sent SET would take the next horse's first command as its last part (a protocol error).
    assert done[2].get_status() == JobStatus.FINISHED, done[2].latest_result().exc_string
    assert done[2].return_value() != done[0].return_value()
    assert plain_pool.get('test:cut') is None


def test_a_connection_the_server_closed_is_not_handed_on(plain_pool):
    done, _ = _run(plain_pool, (jobs.horse_client, 'a'), (jobs.horse_closes_its_connection, 'b'),
                   (jobs.horse_client, 'c'))
    assert [job.get_status() for job in done] == [JobStatus.FINISHED] * 3
    assert done[2].return_value() != done[0].return_value()


@pytest.mark.parametrize('pool', [
    redis.BlockingConnectionPool(host='127.0.0.1', port=1),
    redis.ConnectionPool(host='127.0.0.1', port=1, connection_class=redis.SSLConnection),
], ids=['blocking pool', 'tls'])
def test_other_pools_and_tls_connect_as_rqs_horses_do(pool):
    assert compat.horse_connection(redis.Redis(connection_pool=pool)) is None  # decided before any connect
