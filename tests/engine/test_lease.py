"""The doors' leased connection (rq_policies.engine.scripts.Lease): one connection of the pool a thread keeps for its
door scripts, from its second door call on a pool, given back when the thread ends; never taken from a pool that could
run out; never shared with a forked child; never left with a reply unread.

Each test counts the pool's connections in use (``_in_use_connections``, the set redis-py's pool keeps) or watches
the replies a door gets, with a real server and, for faults, the loopback proxy of tests/helpers/faultproxy.py.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest
from redis import BlockingConnectionPool, ConnectionPool, Redis

from rq_policies import PolicyQueue
from rq_policies.engine import scripts
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.surfaces.testing import RedisServer
from tests.helpers import jobs
from tests.helpers.cluster import not_on_cluster
from tests.helpers.faults import ADMIT_WRITE, FAULTS, burst, load, lose_reply, producer, queued, ran_ids
from tests.helpers.idle import HOW, close_idle_connections

# ``connection`` flushes the database before and after each test
pytestmark = pytest.mark.usefixtures('jobs_env', 'connection')


def in_use(client: Redis) -> int:
    return len(client.connection_pool._in_use_connections)


def in_thread(target) -> None:
    """Run ``target`` in a thread of its own, to its end, and collect what the thread left (its thread-local)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as error:  # handed to the test's thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    gc.collect()
    if errors:
        raise errors[0]


def test_a_thread_leases_from_its_second_door_call_and_gives_the_connection_back_when_it_ends(redis_url):
    client = Redis.from_url(redis_url)
    q = PolicyQueue('lease', connection=client)
    seen: list[int] = []

    def producer_thread() -> None:
        for n in range(4):
            assert q.enqueue(jobs.record, f'lease-{n}') is not None
            seen.append(in_use(client))
        assert q.enqueue(jobs.record, 'lease-0') is None  # a drop on the lease answers as a drop
        seen.append(in_use(client))

    in_thread(producer_thread)
    assert seen == [0, 1, 1, 1, 1]  # redis-py's own path first, then one leased connection, the same one
    assert in_use(client) == 0  # the thread ended: its lease went back to the pool
    assert len(queued(client, 'lease')) == 4
    client.close()


def test_a_thread_moving_between_pools_keeps_its_two_newest_leases(redis_url):
    clients = [Redis.from_url(redis_url) for _ in range(3)]
    queues = [PolicyQueue('lease', connection=client) for client in clients]
    seen: list[list[int]] = []

    def producer_thread() -> None:
        for n, q in enumerate(queues):
            q.enqueue(jobs.record, f'pools-{n}-a')
            q.enqueue(jobs.record, f'pools-{n}-b')  # the second call on this pool leases
        seen.append([in_use(client) for client in clients])

    in_thread(producer_thread)
    assert seen == [[0, 1, 1]]  # the oldest lease went back when the third pool's was taken
    assert [in_use(client) for client in clients] == [0, 0, 0]
    for client in clients:
        client.close()


def test_leases_hold_at_most_a_quarter_of_a_pools_max_connections(redis_url):
    client = Redis(connection_pool=ConnectionPool.from_url(redis_url, max_connections=8))
    q = PolicyQueue('lease', connection=client)
    ready, done = threading.Barrier(7), threading.Event()
    errors: list[BaseException] = []

    def producer_thread(n: int) -> None:
        try:
            for i in range(3):
                assert q.enqueue(jobs.record, f'cap-{n}-{i}') is not None
        except BaseException as error:
            errors.append(error)
        ready.wait(timeout=10)
        done.wait(timeout=10)

    threads = [threading.Thread(target=producer_thread, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=10)
    held = in_use(client)
    done.set()
    for thread in threads:
        thread.join(timeout=10)
    gc.collect()
    assert not errors
    assert held == 2  # 6 threads, but a quarter of 8: the other four took redis-py's path for every call
    assert in_use(client) == 0
    assert len(queued(client, 'lease')) == 18
    client.close()


def test_no_lease_is_taken_from_a_blocking_pool(redis_url):
    """A BlockingConnectionPool of one connection: a lease would make every other command wait for it forever."""
    client = Redis(connection_pool=BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=2))
    q = PolicyQueue('lease', connection=client)
    for n in range(3):
        assert q.enqueue(jobs.record, f'blocking-{n}') is not None
        # the pool's one connection is free for rq's own commands (a lease would make this wait 2 s and raise)
        assert client.llen(f'{RQ}:queue:lease') == n + 1
    client.close()


@pytest.mark.parametrize('fault', FAULTS)
def test_a_leased_admission_with_a_lost_reply_is_replayed_and_runs_once(connection, fault_proxy, fault):
    load(connection, 'admit')
    client = producer(fault_proxy)
    q = PolicyQueue('faults', connection=client)
    q.enqueue(jobs.record, 'warm-1')
    q.enqueue(jobs.record, 'warm-2')
    assert in_use(client) == 1  # the next call goes out on the lease
    lose_reply(fault_proxy, fault, ADMIT_WRITE)
    job = q.enqueue(jobs.record, 'leased-lost')
    assert job is not None
    assert fault_proxy.seen(ADMIT_WRITE) >= 4  # two warm-ups, the lost attempt and its replay
    assert queued(connection, 'faults')[2:] == [job.id]
    assert q.enqueue(jobs.record, 'leased-lost') is None  # the connection is in step again: a drop reads as one
    burst(connection, 'faults')
    assert ran_ids(connection, 'leased-lost') == [job.id]


def test_an_interrupted_leased_call_never_reads_its_late_reply_as_the_next_calls(connection, fault_proxy):
    """A call interrupted while it waits (a signal handler raising, as a request timeout does in a web server) leaves
    its reply on the way; the next door call must read its own reply, not that one."""
    load(connection, 'admit')
    client = Redis.from_url(fault_proxy.url, socket_timeout=5)
    q = PolicyQueue('faults', connection=client)
    first = q.enqueue(jobs.record, 'interrupt-held')
    q.enqueue(jobs.record, 'interrupt-warm')
    assert in_use(client) == 1

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        fault_proxy.delay_reply(0.6, match=ADMIT_WRITE)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted):
            q.enqueue(jobs.record, 'interrupt-lost')  # its reply (a job admitted) arrives 0.4 s after this gave up
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(0.6)  # the late reply has reached the client side of the proxy by now
    assert q.enqueue(jobs.record, 'interrupt-held') is None  # a drop: read from its own reply
    admitted = q.enqueue(jobs.record, 'interrupt-new')
    assert admitted is not None and admitted.id in queued(connection, 'faults')
    assert first is not None
    client.close()


@pytest.mark.skipif(not hasattr(os, 'fork'), reason='needs fork')
def test_a_forked_child_never_sends_on_its_parents_leased_connection(redis_url):
    # max_connections=4: a quarter is one lease, the parent's, which the child must not count as its own
    client = Redis(connection_pool=ConnectionPool.from_url(redis_url, max_connections=4))
    q = PolicyQueue('lease', connection=client)
    q.enqueue(jobs.record, 'fork-warm-1')
    q.enqueue(jobs.record, 'fork-warm-2')
    assert in_use(client) == 1
    pid = os.fork()
    if pid == 0:  # the child: its own door calls, while the parent makes its own on the lease
        code = 1
        try:
            ids = [q.enqueue(jobs.record, f'fork-child-{n}') for n in range(30)]
            dropped = q.enqueue(jobs.record, 'fork-child-0')
            code = 0 if all(ids) and dropped is None and len({job.id for job in ids}) == 30 else 2
            if code == 0 and in_use(client) != 1:  # the child leased a connection of its own
                code = 3
        finally:
            os._exit(code)
    ids = [q.enqueue(jobs.record, f'fork-parent-{n}') for n in range(30)]
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(ids) and q.enqueue(jobs.record, 'fork-parent-0') is None
    waiting = queued(client, 'lease')
    assert len(waiting) == len(set(waiting)) == 62
    assert {job.id for job in ids} <= set(waiting)
    client.close()


def test_a_pipeline_and_a_single_connection_client_take_redis_pys_own_path(redis_url):
    single = Redis.from_url(redis_url, single_connection_client=True)
    q = PolicyQueue('lease', connection=single)
    for n in range(3):
        assert q.enqueue(jobs.record, f'single-{n}') is not None
    assert scripts._lease(single) is None
    with single.pipeline() as pipe:
        assert scripts._lease(pipe) is None
    single.close()


def test_a_door_call_is_packed_as_redis_py_packs_it(redis_url):
    """``scripts.pack_command`` (the doors' one-pass packer) sends the bytes redis-py's packer would, for every type a
    door's call carries (rq's JobStatus is a str enum), and leaves any other type to redis-py (its error included)."""
    from redis.exceptions import DataError
    from rq.job import JobStatus

    client = Redis.from_url(redis_url, encoding='latin-1')
    connection = client.connection_pool.get_connection()
    try:
        args = ('EVALSHA', 'a' * 40, 3, 'rq:job:x', b'\x00\xffpickled', '', 'caf\xe9', JobStatus.QUEUED, -1, 2 ** 70,
                1.5, memoryview(b'mv'))
        for end in range(1, len(args) + 1):
            assert b''.join(scripts.pack_command(connection, args[:end])) == b''.join(
                connection.pack_command(*args[:end])), args[end - 1]
        with pytest.raises(DataError):
            scripts.pack_command(connection, ('EVALSHA', True))
    finally:
        client.connection_pool.release(connection)
        client.close()


# -- a leased connection the server closed while it sat idle ------------------------------------------------------

def _door(client: Redis, door: str, tag: str):
    """One enqueue through ``door``: the narrow admission (a job without a policy, and a Loner's, pushed or
    scheduled: ``lua/admit_narrow.lua``) or the wide one (a Fair job: ``lua/admit.lua``)."""
    from datetime import timedelta

    from tests.helpers import fair_jobs

    q = PolicyQueue('idle', connection=client)
    if door == 'enqueue':
        return q.enqueue(jobs.record, tag)
    if door == 'plain':
        return q.enqueue(jobs.record_plain, tag)
    if door == 'enqueue_in':
        return q.enqueue_in(timedelta(seconds=60), jobs.record, tag)
    assert door == 'fair'
    return q.enqueue(fair_jobs.work, tag, tenant='acme')


@not_on_cluster('a server of its own, restarted and told to close idle connections')
@pytest.mark.parametrize('how', HOW)
@pytest.mark.parametrize('make', ['from_url', 'host-port'])
@pytest.mark.parametrize('door', ['enqueue', 'plain', 'enqueue_in', 'fair'])
def test_the_first_door_call_after_the_server_closed_the_leased_connection_succeeds(door, make, how):
    """A connection the server closed while it sat in the lease (its ``timeout``, a restart, a proxy's idle cut) is
    found closed by the next send: the call goes out once more on a new connection and succeeds, as redis-py's own
    path does (its pool checks a connection on checkout; a ``Redis.from_url`` client has no Retry to fall back on),
    and writes the job once (the scripts are replay-safe; this one never ran)."""
    with RedisServer() as server:
        client = Redis.from_url(server.url) if make == 'from_url' else Redis(host='127.0.0.1', port=server.port)
        assert _door(client, door, 'warm-1') is not None
        assert _door(client, door, 'warm-2') is not None
        assert in_use(client) == 1  # the next call goes out on the lease
        close_idle_connections(server, how)
        job = _door(client, door, 'after-close')
        assert job is not None
        admin = server.client()
        assert admin.hget(f'{RQ}:job:{job.id}', 'created_at') is not None
        listed = {'enqueue_in': f'{RQ}:scheduled:idle', 'fair': f'{RQ}:deferred:idle'}.get(door)
        if listed is None:
            waiting = [item.decode() for item in admin.lrange(f'{RQ}:queue:idle', 0, -1)]
        else:
            waiting = [item.decode() for item in admin.zrange(listed, 0, -1)]
        assert waiting.count(job.id) == 1
        assert len(waiting) == (1 if how == 'restart' else 3)
        assert _door(client, door, 'after-close-2') is not None  # and the lease carries on
        assert in_use(client) == 1
        admin.close()
        client.close()


@not_on_cluster('a server of its own, stopped and started again')
def test_a_leased_door_call_to_a_server_that_is_down_raises_at_once_and_the_next_one_after_it_is_back_succeeds():
    """The send once more on a new connection is one attempt, not a loop: with the server down, a ``from_url``
    client (no Retry) raises ConnectionError after it, as redis-py's own path would."""
    from redis.exceptions import ConnectionError

    with RedisServer() as server:
        client = Redis.from_url(server.url, socket_connect_timeout=2)
        q = PolicyQueue('idle', connection=client)
        q.enqueue(jobs.record, 'warm-1')
        q.enqueue(jobs.record, 'warm-2')
        assert in_use(client) == 1
        server.stop()
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            q.enqueue(jobs.record, 'down')
        assert time.monotonic() - started < 5
        server.start()
        job = q.enqueue(jobs.record, 'back')
        assert job is not None and queued(client, 'idle') == [job.id]
        client.close()
