"""The asyncio doors (rq_policies.surfaces.aio.AsyncPolicyQueue) against the real server: the same verdicts as the
synchronous doors, one job per identity under 1,000 concurrent tasks, a free event loop, whole-or-nothing under
cancellation, and one job after lost replies. Loops run with asyncio.run in plain tests (no pytest-asyncio)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

import pytest
from redis.asyncio import BlockingConnectionPool
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from rq.job import Job
from rq.registry import ScheduledJobRegistry

from rq_policies import Concurrency, Loner, PolicyQueue
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.surfaces.aio import AsyncDoorError, AsyncPolicyQueue
from tests.helpers import jobs, with_root
from tests.helpers.cluster import ON_CLUSTER, aconnect, not_on_cluster


def _run(coro):
    return asyncio.run(coro)


def _client(url, **kwargs):
    return aconnect(url, **kwargs)


def test_enqueue_admits_then_drops_like_the_sync_door(connection, redis_url):
    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio', connection=client)
        first = await q.enqueue(jobs.record, 'a')
        second = await q.enqueue(jobs.record, 'a')
        holder = await q.holder(jobs.record, 'a')
        waiting = await q.enqueued(jobs.record, 'a')
        other = await q.enqueued(jobs.record, 'b')
        await client.aclose()
        return first, second, holder, waiting, other

    first, second, holder, waiting, other = _run(main())
    assert first is not None and second is None
    assert holder == first.id and waiting is True and other is False
    # an ordinary rq job, and the sync door sees the same identity held
    fetched = Job.fetch(first.id, connection=connection)
    assert fetched.func_name == 'tests.helpers.jobs.record' and fetched.args == ('a',) \
        and fetched.get_status() == 'queued'
    sync = PolicyQueue('aio', connection=connection)
    assert sync.job_ids == [first.id]
    assert sync.enqueue(jobs.record, 'a') is None
    assert sync.holder(jobs.record, 'a') == first.id


def test_plain_job_and_policy_override(connection, redis_url):
    async def main():
        client = _client(redis_url, decode_responses=True)  # the doors read str replies as well
        q = AsyncPolicyQueue('aio', connection=client)
        plain = await q.enqueue(jobs.plain, 1)
        again = await q.enqueue(jobs.plain, 1)  # no policy: two jobs
        loner = await q.enqueue(jobs.plain, 2, policy=Loner())
        loner2 = await q.enqueue(jobs.plain, 2, policy=Loner())
        unpoliced = await q.enqueue(jobs.record, 'x', policy=None)
        unpoliced2 = await q.enqueue(jobs.record, 'x', policy=None)
        await client.aclose()
        return plain, again, loner, loner2, unpoliced, unpoliced2

    plain, again, loner, loner2, unpoliced, unpoliced2 = _run(main())
    assert plain.id != again.id and loner is not None and loner2 is None
    assert unpoliced is not None and unpoliced2 is not None
    assert PolicyQueue('aio', connection=connection).job_ids == [plain.id, again.id, loner.id, unpoliced.id,
                                                                unpoliced2.id]


def test_enqueue_at_in_force_reset_many_and_explain(connection, redis_url):
    from rq import Queue

    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio', connection=client)
        when = datetime.now(timezone.utc) + timedelta(hours=1)
        at = await q.enqueue_at(when, jobs.record, 'sched')
        at_again = await q.enqueue_in(timedelta(hours=2), jobs.record, 'sched')
        forced = await q.force(jobs.record, 'f')
        forced_again = await q.force(jobs.record, 'f')
        many = await q.enqueue_many([Queue.prepare_data(jobs.record, args=('m',)),
                                     Queue.prepare_data(jobs.record, args=('m',)),
                                     Queue.prepare_data(jobs.plain, args=(3,), job_id='chosen')])
        removed = await q.reset(jobs.record, 'sched')
        after_reset = await q.enqueued(jobs.record, 'sched')
        why = await q.explain(many[0].id)
        await client.aclose()
        return at, at_again, forced, forced_again, many, removed, after_reset, why

    at, at_again, forced, forced_again, many, removed, after_reset, why = _run(main())
    assert at is not None and at_again is None
    assert at.id in ScheduledJobRegistry('aio', connection=connection).get_job_ids()
    assert forced is not None and forced_again is not None  # force writes whatever the policy says
    assert many[0] is not None and many[1] is None and many[2].id == 'chosen'
    assert removed >= 1 and after_reset is False
    assert why['status'] == 'queued' and why['queue'] == 'aio'


def test_the_async_door_sends_the_narrow_script_where_the_sync_door_does(connection, redis_url, monkeypatch):
    """The same script for the same call as the synchronous door: ``lua/admit_narrow.lua`` for a job without a policy
    and a Loner alone that drops or raises, ``lua/admit.lua`` for the rest (a Loner that replaces, a force)."""
    from rq_policies.engine import scripts
    from rq_policies.surfaces import aio

    sent: list[str] = []
    real_async, real_sync = aio.run_call, scripts.run_leased

    async def spy(call, client):
        sent.append(call.script)
        return await real_async(call, client)

    monkeypatch.setattr(aio, 'run_call', spy)
    monkeypatch.setattr(scripts, 'run_leased', lambda name, *a, **k: sent.append(name) or real_sync(name, *a, **k))

    def calls(q):
        return [(q.enqueue, (jobs.record_plain, 'a')), (q.enqueue, (jobs.record_plain, 'b'), {'policy': Loner()}),
                (q.enqueue, (jobs.record_plain, 'c'), {'policy': Loner(on_conflict='raise')}),
                (q.enqueue, (jobs.record_plain, 'd'), {'policy': Loner(on_conflict='replace')}),
                (q.force, (jobs.record_plain, 'b'), {'policy': Loner()})]

    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio-narrow', connection=client)
        for door, args, *kwargs in calls(q):
            assert await door(*args, **(kwargs[0] if kwargs else {})) is not None
        await client.aclose()

    _run(main())
    async_sent = list(sent)
    sent.clear()
    connection.flushdb()
    q = PolicyQueue('aio-narrow', connection=connection)
    for door, args, *kwargs in calls(q):
        assert door(*args, **(kwargs[0] if kwargs else {})) is not None
    assert async_sent == sent == ['admit_narrow'] * 3 + ['admit'] * 2


def test_refused_options_name_the_sync_path(connection, redis_url):
    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio', connection=client)
        errors = []
        for kwargs in ({'depends_on': 'x'}, {'job_id': 'u', 'unique': True}):
            try:
                await q.enqueue(jobs.plain, 1, **kwargs)
            except AsyncDoorError as exc:
                errors.append(str(exc))
        try:
            await q.enqueue(jobs.record, 'd', depends_on='x')
        except AsyncDoorError as exc:
            errors.append(str(exc))
        await client.aclose()
        return errors

    errors = _run(main())
    assert len(errors) == 3 and all('PolicyQueue' in e for e in errors)
    assert connection.keys(f'{RQ}:job:*') == []  # nothing was written
    with pytest.raises(ValueError, match='connection'):
        AsyncPolicyQueue('aio')
    with pytest.raises(TypeError, match='redis.asyncio'):
        AsyncPolicyQueue('aio', connection=connection)


def test_thousand_concurrent_tasks_make_one_job(connection, redis_url):
    async def main():
        if ON_CLUSTER:
            # redis-py's asyncio cluster client has a pool per node of up to max_connections, and raises
            # MaxConnectionsError past it (retried a few times) instead of waiting as a BlockingConnectionPool
            # does: 1000 sends at once failed so under CI's load. Its users bound what is in flight, as here.
            pool, client = None, aconnect(redis_url, max_connections=64)
            bound = asyncio.Semaphore(48)
        else:
            pool = BlockingConnectionPool.from_url(redis_url, max_connections=64)
            client = AsyncRedis(connection_pool=pool)
            bound = None
        q = AsyncPolicyQueue('aio', connection=client)

        async def enqueue():
            if bound is None:
                return await q.enqueue(jobs.record, 'same')
            async with bound:
                return await q.enqueue(jobs.record, 'same')

        try:
            return await asyncio.gather(*(enqueue() for _ in range(1000)))
        finally:
            await client.aclose()
            if pool is not None:
                await pool.disconnect()  # a pool the client was given is the caller's to close

    if not ON_CLUSTER:
        connection.config_resetstat()
    results = _run(main())
    admitted = [job for job in results if job is not None]
    assert len(results) == 1000 and len(admitted) == 1
    if not ON_CLUSTER:  # the server's version, which rq stamps on each job, is read once for all 1000 first calls
        assert connection.info('commandstats')['cmdstat_info']['calls'] == 1
    assert PolicyQueue('aio', connection=connection).job_ids == [admitted[0].id]
    assert len(connection.keys(f'{RQ}:job:*')) == 1


def _counting(client):
    """``client``'s pool, counting the connections taken from it (``pool.taken``)."""
    pool = client.connection_pool
    take = pool.get_connection
    pool.taken = 0

    async def counted(*args, **kwargs):
        pool.taken += 1
        return await take(*args, **kwargs)

    pool.get_connection = counted
    return pool


async def _lookup_in_flight(q, connection, fault_proxy):
    """A holder lookup on ``q`` that the server has run and whose reply ``fault_proxy`` holds for a second: while it
    is in flight, the calls that follow go in a pipeline (none goes alone). Returns its task. (The caller has made
    one lookup before, which loaded the script: the held one runs as sent.)"""
    fault_proxy.delay_reply(1.0, match=b'EVALSHA')
    connection.config_resetstat()
    lookup = asyncio.create_task(q.holder(jobs.plain, 0))
    deadline = time.monotonic() + 10
    while 'cmdstat_evalsha' not in connection.info('commandstats') and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return lookup


@not_on_cluster('a cluster client has a pool per node and takes redis-py\'s own send')
def test_calls_of_one_loop_turn_share_one_connection_and_each_gets_its_own_reply(connection, redis_url):
    """The calls the tasks of a loop make in one turn go in one pipelined write on one pooled connection (each task
    took a connection of its own for its call, 40 for 40), and each caller gets its own reply, in order: 40 holder
    lookups at once, 30 of held identities and 10 of free ones, answer each its own. Two connections: the first
    call, alone in flight, goes at once on its own; the 39 that follow it in the same turn, in one pipeline."""
    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio-pipe', connection=client)
        held = [await q.enqueue(jobs.record, f'p{i}') for i in range(30)]
        pool = _counting(client)
        holders = await asyncio.gather(*(q.holder(jobs.record, f'p{i}') for i in range(40)))
        taken = pool.taken
        await client.aclose()
        return held, holders, taken

    held, holders, taken = _run(main())
    assert holders == [job.id for job in held] + [None] * 10
    assert taken == 2, taken


@not_on_cluster('a cluster client has a pool per node and takes redis-py\'s own send')
def test_the_doors_build_one_slice_a_turn_of_the_loop(connection, redis_url, monkeypatch):
    """The loop turns between the doors' steps: 200 tasks enqueueing at once built their 200 jobs in one turn of the
    loop (every ready task runs before the loop looks at anything else), so any other coroutine waited for all 200
    builds. Each door's build now waits for room in the turn's slice (``aio.SLICE_SECONDS``): with a slice of 0, one
    build a turn, and a coroutine that counts the turns sees every build in a turn of its own. The jobs are the
    same: 200 admitted, one per identity, and the 200 repeats dropped."""
    from rq_policies.surfaces import aio

    monkeypatch.setattr(aio, 'SLICE_SECONDS', 0.0)
    turns, built = [0], []
    real = aio.planning

    @contextlib.contextmanager
    def planning():
        built.append(turns[0])
        with real() as plans:
            yield plans

    monkeypatch.setattr(aio, 'planning', planning)

    async def main():
        pool = BlockingConnectionPool.from_url(redis_url, max_connections=64)
        client = AsyncRedis(connection_pool=pool)
        q = AsyncPolicyQueue('aio-turns', connection=client)
        await q.enqueue(jobs.plain, 0)  # the server's version, read once
        built.clear()
        done = asyncio.Event()

        async def counter():
            while not done.is_set():
                await asyncio.sleep(0)
                turns[0] += 1

        count = asyncio.create_task(counter())
        first = await asyncio.gather(*(q.enqueue(jobs.record, f't{i}') for i in range(200)))
        again = await asyncio.gather(*(q.enqueue(jobs.record, f't{i}') for i in range(200)))
        done.set()
        await count
        await client.aclose()
        await pool.disconnect()
        return first, again

    first, again = _run(main())
    assert all(job is not None for job in first) and again == [None] * 200
    assert len(PolicyQueue('aio-turns', connection=connection).job_ids) == 201
    assert len(built) == 400
    per_turn = max(built.count(turn) for turn in set(built))
    assert per_turn == 1, f'{per_turn} builds in one turn of the loop'


@not_on_cluster('a cluster client has a pool per node and takes redis-py\'s own send')
def test_an_error_reply_in_a_pipeline_is_its_own_calls(connection, redis_url, monkeypatch):
    """One pipelined write carries calls that fail on the server (a queue whose key holds a string: WRONGTYPE) among
    calls that succeed: each failing caller gets the server's error, every other caller its job (the first call,
    alone in flight, goes on a connection of its own; the 19 others in one pipeline)."""
    from redis.exceptions import ResponseError

    from rq_policies.surfaces import aio

    monkeypatch.setattr(aio, 'SLICE_SECONDS', 10.0)  # every build in one turn: one pipeline
    connection.set(f'{RQ}:queue:aio-wrong', 'not a list')

    async def main():
        client = _client(redis_url)
        good, bad = AsyncPolicyQueue('aio-right', connection=client), AsyncPolicyQueue('aio-wrong', connection=client)
        await good.enqueue(jobs.plain, 0)
        with pytest.raises(ResponseError, match='WRONGTYPE'):  # alone; and the server's version is read
            await bad.enqueue(jobs.plain, 0)
        pool = _counting(client)
        calls = [(bad if i % 5 == 2 else good).enqueue(jobs.plain, f'e{i}') for i in range(20)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        taken = pool.taken
        await client.aclose()
        return results, taken

    results, taken = _run(main())
    assert taken == 2, taken
    for i, outcome in enumerate(results):
        if i % 5 == 2:
            assert isinstance(outcome, ResponseError) and 'WRONGTYPE' in str(outcome), (i, outcome)
        else:
            assert isinstance(outcome, Job) and outcome.args == (f'e{i}',), (i, outcome)
    written = PolicyQueue('aio-right', connection=connection).job_ids
    assert len(written) == 17 and sorted(written[1:]) == sorted(job.id for job in results if isinstance(job, Job))


@not_on_cluster('a cluster client has a pool per node and takes redis-py\'s own send')
def test_a_pipeline_whose_replies_are_lost_is_sent_again_and_leaves_one_job_each(connection, fault_proxy,
                                                                                 monkeypatch):
    """The replies of a pipelined write of 20 admissions are lost (the server ran them; the connection closes): the
    calls not answered go again, through the connection's retry, and each script recognises its replay: 20 callers,
    20 jobs, each once."""
    from rq_policies.surfaces import aio

    monkeypatch.setattr(aio, 'SLICE_SECONDS', 10.0)  # every build in one turn: one pipeline

    async def main():
        client = AsyncRedis.from_url(fault_proxy.url, retry=AsyncRetry(NoBackoff(), 3))
        q = AsyncPolicyQueue('aio-lost', connection=client)
        await q.enqueue(jobs.plain, 0)
        await q.holder(jobs.plain, 0)
        pool = _counting(client)
        lookup = await _lookup_in_flight(q, connection, fault_proxy)
        fault_proxy.drop_reply(match=b'EVALSHA')
        results = await asyncio.gather(*(q.enqueue(jobs.record, f'l{i}') for i in range(10)),
                                       *(q.enqueue(jobs.plain, f'l{i}') for i in range(10)))
        await lookup
        taken = pool.taken
        await client.aclose()
        return results, taken

    connection.flushdb()
    results, taken = _run(main())
    assert taken == 2 and [kind for kind, _ in fault_proxy.fired] == ['delay', 'drop']
    assert all(isinstance(job, Job) for job in results)
    ids = PolicyQueue('aio-lost', connection=connection).job_ids
    assert len(ids) == 21 and sorted(ids[1:]) == sorted(job.id for job in results)


@not_on_cluster('a cluster client has a pool per node and takes redis-py\'s own send')
def test_noscript_replies_in_a_pipeline_send_those_calls_again_with_the_source(connection, fault_proxy, monkeypatch):
    """After a SCRIPT FLUSH, every call of a pipelined write is answered NOSCRIPT (none ran): each goes again with its
    script's source, on the same connection, and each caller gets its job. (A holder lookup whose reply the proxy
    holds is in flight meanwhile, so that none of the 20 goes alone.)"""
    from rq_policies.surfaces import aio

    monkeypatch.setattr(aio, 'SLICE_SECONDS', 10.0)  # every build in one turn: one pipeline

    async def main():
        client = AsyncRedis.from_url(fault_proxy.url)
        q = AsyncPolicyQueue('aio-flushed', connection=client)
        await q.enqueue(jobs.plain, 0)
        await q.holder(jobs.plain, 0)
        pool = _counting(client)
        lookup = await _lookup_in_flight(q, connection, fault_proxy)
        connection.script_flush()
        connection.config_resetstat()
        results = await asyncio.gather(*(q.enqueue(jobs.record, f'n{i}') for i in range(20)))
        await lookup
        taken = pool.taken
        await client.aclose()
        return results, taken

    connection.flushdb()
    results, taken = _run(main())
    assert taken == 2 and all(isinstance(job, Job) for job in results)
    stats = connection.info('commandstats')
    assert stats['cmdstat_evalsha']['calls'] + stats['cmdstat_evalsha'].get('rejected_calls', 0) >= 20
    assert stats['cmdstat_eval']['calls'] == 20
    ids = PolicyQueue('aio-flushed', connection=connection).job_ids
    assert len(ids) == 21 and sorted(ids[1:]) == sorted(job.id for job in results)


def test_per_key_concurrency_on_the_async_door(connection, redis_url):
    """A per-key Concurrency job from the async door is admitted and carries its key like the sync door's."""
    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio', connection=client)
        policy = Concurrency(1, key=lambda args, kwargs: args[0], scope='tenant')
        first = await q.enqueue(jobs.plain, 't1', policy=policy)
        second = await q.enqueue(jobs.plain, 't1', policy=policy)
        await client.aclose()
        return first, second

    first, second = _run(main())
    sync = PolicyQueue('aio', connection=connection)
    reference = sync.enqueue(jobs.plain, 't1', policy=Concurrency(1, key=lambda args, kwargs: args[0],
                                                                 scope='tenant'))
    fields = {k.decode() for k in connection.hkeys(first.key)}
    assert fields == {k.decode() for k in connection.hkeys(reference.key)}
    assert second is not None  # Concurrency admits every job; it parks them at fetch


_SLOW_PROXY = """
import sys, time
from tests.helpers.faultproxy import FaultProxy
proxy = FaultProxy('127.0.0.1', int(sys.argv[1]), lifetime=120, record=False).start()
proxy.delay_reply(float(sys.argv[2]), match=b'EVALSHA', times=10**6)
print(proxy.port, flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _slow_proxy(redis_url, delay):
    """A fault proxy in a process of its own (its threads must not take this process's GIL from the loop being
    measured) holding every EVALSHA reply ``delay`` seconds; yields its URL."""
    port = urlparse(redis_url).port
    env = with_root(dict(os.environ))
    proc = subprocess.Popen([sys.executable, '-c', _SLOW_PROXY, str(port), str(delay)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)
    try:
        yield f'redis://127.0.0.1:{proc.stdout.readline().strip()}/0'
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


def _ticker_lag(url, enqueues, workers=2, seconds=4.0):
    """Run ``enqueues`` door calls from ``workers`` tasks while a ticker sleeps 1 ms at a time; each tick's lag past
    its due time. ``enqueues=0``: the ticker alone, for ``seconds``."""
    async def main():
        client = AsyncRedis.from_url(url, max_connections=workers + 2)
        q = AsyncPolicyQueue('aio', connection=client)
        # warm: the server version, and one connection per task (a new connection's handshake is not a door's)
        await asyncio.gather(*(q.enqueue(jobs.plain, 0) for _ in range(workers)))
        lags, done = [], asyncio.Event()

        async def ticker():
            loop = asyncio.get_running_loop()
            while not done.is_set():
                due, cpu = loop.time() + 0.001, time.thread_time()
                await asyncio.sleep(0.001)
                lags.append((loop.time() - due, time.thread_time() - cpu))

        async def worker(index):
            if not enqueues:
                await asyncio.sleep(seconds)
            for i in range(enqueues // workers):
                await q.enqueue(jobs.record, f'{index}-{i}')

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        lags.clear()
        await asyncio.gather(*(worker(w) for w in range(workers)))
        done.set()
        await tick
        await client.aclose()
        return lags

    return _run(main())


@pytest.mark.long
@not_on_cluster('the 8 ms delay comes from a fault proxy in front of one node')
def test_event_loop_lag_stays_under_5ms_while_1000_enqueues_run(connection, redis_url):
    """1,000 enqueues from 2 tasks, each admission reply held 8 ms by a proxy (in a process of its own): a door that
    blocked the loop for its round trip would make every tick wait 8 ms. The loop's lag stays under 5 ms: the
    median tick is under 5 ms late, and the loop never computes for 5 ms between two ticks (the CPU time of the
    loop's thread between ticks: what the doors between two ticks cost).

    The largest wall-clock lag is reported, not asserted: on a loaded 2-core machine the scheduler takes the CPU away
    from the process for tens of ms at a time (the ticker alone, the baseline measured in each round, shows it), which
    no code of ours can prevent. The best of five interleaved rounds counts."""
    rounds = []
    with _slow_proxy(redis_url, 0.008) as url:
        for _ in range(5):
            baseline = max(lag for lag, _ in _ticker_lag(url, 0))
            connection.flushdb()
            ticks = _ticker_lag(url, 1000)
            assert len(connection.keys(f'{RQ}:job:*')) == 1002
            wall = sorted(lag for lag, _ in ticks)
            cpu = max(used for _, used in ticks)
            rounds.append((max(wall[len(wall) // 2], cpu), wall[len(wall) // 2], cpu, wall[-1], baseline, len(ticks)))
            if rounds[-1][0] < 0.005:
                break
    best = min(rounds)
    print(f'loop lag: median {best[1] * 1e3:.2f} ms, max {best[3] * 1e3:.1f} ms (ticker alone: max '
          f'{best[4] * 1e3:.1f} ms), most CPU between two ticks {best[2] * 1e3:.2f} ms; {best[5]} ticks')
    # the run took about 500 x 8 ms: the ticker ran all along (a loop blocked by each call would tick at most
    # once a call, 1,000 times in 8 s)
    assert best[5] > 1200, rounds
    assert best[1] < 0.005, f'median tick {best[1] * 1e3:.1f} ms late (rounds: {rounds})'
    assert best[2] < 0.005, f'the loop computed {best[2] * 1e3:.1f} ms between two ticks (rounds: {rounds})'


def test_cancelled_task_leaves_a_whole_job_or_none(connection, redis_url, fault_proxy):
    """Cancel the awaiting task at many points (after 0..N loop turns, and at many times while the reply is held by
    the proxy): each chosen job id is then either a whole job (hash, queue entry and loner marker agree) or
    nothing at all."""
    async def attempt(q, index, turns=None, after=None):
        task = asyncio.create_task(q.enqueue(jobs.record, f'c{index}', job_id=f'c{index}'))
        if turns is not None:
            for _ in range(turns):
                await asyncio.sleep(0)
        else:
            await asyncio.sleep(after)
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return 'cancelled'

    async def main():
        client = AsyncRedis.from_url(fault_proxy.url, max_connections=8)
        q = AsyncPolicyQueue('aio', connection=client)
        await q.enqueue(jobs.plain, 0)
        outcomes = {}
        index = 0
        for turns in range(0, 12):
            outcomes[index] = await attempt(q, index, turns=turns)
            index += 1
        fault_proxy.delay_reply(0.03, match=b'EVALSHA', times=20)
        for after in [0.0005 * k for k in range(20)] + [0.04, 0.05]:
            outcomes[index] = await attempt(q, index, after=after)
            index += 1
        fault_proxy.disarm()
        # the connections a cancellation closed are not reused with an unread reply: every pooled connection answers
        # its own command (an unread late reply would answer the next ECHO), and the door still works
        echoes = await asyncio.gather(*(client.echo(f'e{i}') for i in range(8)))
        assert echoes == [f'e{i}'.encode() for i in range(8)], echoes
        check = await q.enqueue(jobs.record, 'after')
        await client.aclose()
        return outcomes, check

    outcomes, check = _run(main())
    assert check is not None
    sync = PolicyQueue('aio', connection=connection)
    queued = set(sync.job_ids)
    kinds = {'whole': 0, 'none': 0}
    for index, outcome in outcomes.items():
        job_id = f'c{index}'
        exists = connection.exists(f'{RQ}:job:{job_id}') == 1
        holder = sync.holder(jobs.record, job_id)
        if exists:
            assert job_id in queued and holder == job_id, (job_id, outcome)
            assert Job.fetch(job_id, connection=connection).args == (job_id,)
            kinds['whole'] += 1
        else:
            assert job_id not in queued and holder is None, (job_id, outcome)
            assert outcome == 'cancelled'
            kinds['none'] += 1
    # both outcomes happened: cancellation before the send, and after it
    assert kinds['whole'] > 0 and kinds['none'] > 0, (kinds, outcomes)


def test_lost_replies_on_the_async_path_leave_one_job(connection, fault_proxy):
    """The admission's reply is lost (the server ran it; the connection closes); redis-py's asyncio retry resends
    the same call, which the script recognises as a replay: one job, and the door answers with it."""
    async def main():
        client = AsyncRedis.from_url(fault_proxy.url, retry=AsyncRetry(NoBackoff(), 3))
        q = AsyncPolicyQueue('aio', connection=client)
        await q.enqueue(jobs.plain, 0)
        fault_proxy.drop_reply(match=b'EVALSHA', times=2)
        loner = await q.enqueue(jobs.record, 'lost')
        fault_proxy.drop_reply(match=b'EVALSHA')
        plain = await q.enqueue(jobs.plain, 'lost')
        await client.aclose()
        return loner, plain

    connection.flushdb()
    loner, plain = _run(main())
    assert loner is not None and plain is not None
    assert fault_proxy.seen(b'EVALSHA') >= 5
    ids = PolicyQueue('aio', connection=connection).job_ids
    assert ids.count(loner.id) == 1 and ids.count(plain.id) == 1 and len(ids) == 3


def test_an_async_reset_whose_reply_is_lost_answers_the_first_runs_count(connection, fault_proxy):
    """``AsyncPolicyQueue.reset`` runs the same script as the synchronous one: its replay answers the first run's
    count (it answered 0 before: the first attempt had removed the marker)."""
    from rq_policies.engine import scripts

    connection.script_load(scripts.script('reset').script)  # a NOSCRIPT answer ran nothing: no replay to test

    async def main():
        client = AsyncRedis.from_url(fault_proxy.url, retry=AsyncRetry(NoBackoff(), 3))
        q = AsyncPolicyQueue('aio', connection=client)
        await q.enqueue(jobs.record, 'reset-lost')
        fault_proxy.drop_reply(match=b'EVALSHA')
        first = await q.reset(jobs.record, 'reset-lost')
        second = await q.reset(jobs.record, 'reset-lost')
        await client.aclose()
        return first, second

    first, second = _run(main())
    assert fault_proxy.seen(b'EVALSHA') >= 4  # the admission, the reset and its replay, the second reset
    assert (first, second) == (1, 0)
    assert PolicyQueue('aio', connection=connection).enqueue(jobs.record, 'reset-lost') is not None  # free again


def test_noscript_falls_back_to_eval(connection, redis_url):
    async def main():
        client = _client(redis_url)
        q = AsyncPolicyQueue('aio', connection=client)
        await client.script_flush()
        job = await q.enqueue(jobs.record, 'flushed')
        await client.aclose()
        return job

    assert _run(main()) is not None
    assert connection.llen(f'{RQ}:queue:aio') == 1


@pytest.mark.long
@not_on_cluster('Sentinel is the other way to fail over: a cluster of its own, not one of the session')
def test_sentinel_client_follows_a_failover(connection):
    """A ``redis.asyncio.sentinel`` master_for client: the door finds the master through the Sentinels, and after a
    failover (SENTINEL FAILOVER) the same client's doors reach the new master; the identity held before is still
    held there (replicated), and ``explain`` reads through ``sync_connection=``."""
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    from tests.helpers.sentinel_cluster import SentinelCluster

    cluster = SentinelCluster().start()
    try:
        async def main():
            sentinel = AsyncSentinel(cluster.instances, socket_timeout=1)
            client = sentinel.master_for('mymaster', socket_timeout=2)
            sync = cluster.sentinel().master_for('mymaster', socket_timeout=2)
            q = AsyncPolicyQueue('sent', connection=client, sync_connection=sync)
            first = await q.enqueue(jobs.record, 's')
            before = cluster.master_address()
            await asyncio.sleep(0.5)  # let the replica receive the write
            await sentinel.sentinels[0].execute_command('SENTINEL', 'FAILOVER', 'mymaster')
            deadline = time.monotonic() + 30
            while cluster.master_address() == before and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            outcomes = []
            for _ in range(100):  # the old master may refuse writes (READONLY) or drop connections while it turns
                try:
                    outcomes.append(await q.enqueue(jobs.record, 's'))
                    outcomes.append(await q.enqueue(jobs.record, 't'))
                    break
                except Exception as exc:  # noqa: BLE001 - any error of the failover window: try again
                    outcomes = [type(exc).__name__]
                    await asyncio.sleep(0.2)
            why = await q.explain(first.id)
            await client.aclose()
            for each in sentinel.sentinels:  # the Sentinels' own clients are the caller's to close
                await each.aclose()
            sync.close()
            return first, before, cluster.master_address(), outcomes, why

        first, before, after, outcomes, why = asyncio.run(main())
    finally:
        cluster.close()
    assert after != before
    assert first is not None and len(outcomes) == 2, outcomes
    dropped, other = outcomes
    assert dropped is None and other is not None  # the held identity, read on the new master
    assert why['status'] == 'queued'


@not_on_cluster('a server of its own, restarted and told to close idle connections')
@pytest.mark.parametrize('how', ['idle-timeout', 'restart'])
@pytest.mark.parametrize('door', ['enqueue', 'enqueue_in', 'fair'])
def test_the_first_async_door_call_after_the_server_closed_its_connection_succeeds(door, how):
    """The synchronous doors' lease had to learn to find a connection the server closed while idle
    (tests/engine/test_lease.py); the async door takes redis-py's asyncio pool, whose checkout finds it: held here,
    with a ``from_url`` client (no Retry), after the server's ``timeout`` closed the connection and after a restart."""
    from rq_policies.surfaces.testing import RedisServer
    from tests.helpers import fair_jobs
    from tests.helpers.idle import close_idle_connections

    async def call(q, tag):
        if door == 'enqueue':
            return await q.enqueue(jobs.record, tag)
        if door == 'enqueue_in':
            return await q.enqueue_in(timedelta(seconds=60), jobs.record, tag)
        return await q.enqueue(fair_jobs.work, tag, tenant='acme')

    with RedisServer() as server:
        async def main():
            client = AsyncRedis.from_url(server.url)
            q = AsyncPolicyQueue('idle', connection=client)
            assert await call(q, 'warm-1') is not None
            assert await call(q, 'warm-2') is not None
            await asyncio.get_running_loop().run_in_executor(None, close_idle_connections, server, how)
            job = await call(q, 'after-close')
            await client.aclose()
            return job

        job = _run(main())
        assert job is not None
        admin = server.client()
        assert admin.hget(f'{RQ}:job:{job.id}', 'created_at') is not None
        admin.close()
