"""Scripts on pipelines go out as EVALSHA, never as an EVAL carrying the source: loaded once per connection pool,
and a NOSCRIPT (SCRIPT FLUSH, a restart) between the load and the pipeline recovered inside ``execute()``.

Counted on the server (INFO commandstats), on plain pipelines and on a real forking worker's run, with a flush and a
lost reply landing on the worker's end-of-run transaction through the fault proxy.
"""

from __future__ import annotations

import pytest
from redis import Redis

from rq_policies import Loner, PolicyQueue, QueueSlot
from rq_policies.engine import keys, scripts
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.policies.loner.rules import holder, release_markers
from tests.helpers.workers import output, start_worker, stop, wait_for

PREFIX = f'{RQ}:job:'


pytestmark = pytest.mark.usefixtures('jobs_env')


def calls(connection: Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT (``eval``, ``evalsha``, ``script|load``...)."""
    stats = connection.info('commandstats')
    return {name[len('cmdstat_'):]: int(row['calls']) for name, row in stats.items()}


def scripted(connection: Redis) -> tuple[int, int]:
    found = calls(connection)
    return found.get('eval', 0), found.get('evalsha', 0)


@pytest.mark.parametrize('transaction', [True, False])
def test_a_pipeline_sends_evalsha_and_loads_once_per_pool(connection, transaction):
    connection.script_flush()
    client = Redis(connection_pool=connection.connection_pool.__class__(**connection.connection_pool.connection_kwargs))
    connection.config_resetstat()
    for _ in range(3):
        with client.pipeline(transaction=transaction) as pipe:
            holder(pipe, 'q', 'd', PREFIX)
            release_markers(pipe, PREFIX, ['x'])
            assert pipe.execute() == [None, 0]
    found = calls(connection)
    assert found.get('eval', 0) == 0
    assert found['evalsha'] == 6
    assert found['script|load'] == 2  # once per script, on the first pipeline of the pool
    client.close()


@pytest.mark.parametrize('transaction', [True, False])
def test_a_flush_between_the_load_and_the_pipeline_runs_every_command_once(connection, transaction):
    """SCRIPT FLUSH after the pool loaded the scripts: the server answers NOSCRIPT for each script (and only for it;
    in a MULTI/EXEC the others ran), and execute() sends each such script alone with its source: every command ran
    once and the caller sees the scripts' own replies, not the error."""
    connection.set(keys.loner('q', 'd'), 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'finished', keys.LONER_FIELD: keys.loner('q', 'd')})
    with connection.pipeline(transaction=transaction) as pipe:  # loads both scripts on this pool
        holder(pipe, 'q', 'other', PREFIX)
        release_markers(pipe, PREFIX, ['nobody'])
        pipe.execute()
    connection.script_flush()
    connection.config_resetstat()
    with connection.pipeline(transaction=transaction) as pipe:
        pipe.incr('test:counter')
        holder(pipe, 'q', 'other', PREFIX)
        Loner.release(pipe, PREFIX, ['j1'], ended=True)  # the worker's end-of-run release
        pipe.incr('test:counter')
        replies = pipe.execute()
    assert replies[:2] == [1, None] and replies[3] == 2 and not isinstance(replies[2], Exception)
    assert not connection.exists(keys.loner('q', 'd'))  # the release ran
    assert scripted(connection) == (2, 2)  # two NOSCRIPT answers, each script resent once with its source
    connection.config_resetstat()
    with connection.pipeline(transaction=transaction) as pipe:  # the EVALs loaded them again
        holder(pipe, 'q', 'other', PREFIX)
        pipe.execute()
    assert scripted(connection) == (0, 1)


def test_an_error_of_the_script_itself_is_still_raised_after_a_recovery(connection):
    """A NOSCRIPT recovered, the pipeline's other errors reach the caller as redis-py raises them."""
    with connection.pipeline() as pipe:
        holder(pipe, 'q', 'd', PREFIX)
        pipe.execute()
    connection.script_flush()
    connection.set('test:string', 'x')
    with connection.pipeline() as pipe:
        holder(pipe, 'q', 'd', PREFIX)
        pipe.lpush('test:string', 'y')  # WRONGTYPE
        with pytest.raises(Exception, match='WRONGTYPE'):
            pipe.execute()


def _enqueue_mix(connection: Redis, tag: str, n: int) -> None:
    loners = PolicyQueue('cost', connection=connection)
    capped = PolicyQueue('cost-capped', connection=connection)
    QueueSlot.set('cost-capped', 2, connection=connection)
    for i in range(n):
        loners.enqueue('tests.helpers.cost_jobs.held_until_finished', tag, i)
        loners.enqueue('tests.helpers.cost_jobs.plain_record', tag, i)
        capped.enqueue('tests.helpers.cost_jobs.plain_record', tag, i)


def test_a_workers_run_sends_no_eval(connection, redis_url, worker_env):
    """Over a forking worker's whole run (Loner until='finished', plain and capped jobs: the end-of-run transaction
    of each until='finished' job carries its release, capped jobs a hold's release too), the server counts EVALSHA
    only, no EVAL."""
    connection.script_flush()
    _enqueue_mix(connection, 'mix', 5)
    connection.config_resetstat()
    worker = start_worker(redis_url, ['cost', 'cost-capped'], worker_env, burst=True)
    try:
        worker.wait(timeout=60)
    finally:
        stop(worker)
    assert connection.llen('test:ran:mix') == 15, output(worker)
    found = calls(connection)
    assert found.get('eval', 0) == 0, (found, output(worker))
    # a fetch per job, and an end-of-run release per until='finished' job (a plain or capped job holds nothing of a
    # Loner's until its end: Loner.ended_when)
    assert found['evalsha'] >= 15 + 5
    assert found.get('script|load', 0) <= len(list(scripts._lua_root().glob('*.lua')))  # once, at bootstrap


def _end_of_run(job_id: str):
    """What only the end-of-run transaction of job ``job_id`` carries: the release's EVALSHA and the job's key."""
    return (b'EXEC', scripts.script('release_markers').sha.encode(), job_id.encode())


def test_a_script_flush_just_before_a_jobs_end_of_run_pipeline(connection, fault_proxy, worker_env):
    """A real worker (through the proxy); just before the end-of-run transaction of the second job reaches the
    server, SCRIPT FLUSH: its release answers NOSCRIPT inside EXEC, is resent alone with its source, and the job
    ends finished with its identity freed (a new enqueue of the same call is admitted)."""
    q = PolicyQueue('cost', connection=connection)
    first = q.enqueue('tests.helpers.cost_jobs.held_until_finished', 'flush', 1)
    second = q.enqueue('tests.helpers.cost_jobs.held_until_finished', 'flush', 2)
    flushed = []
    fault_proxy.before_request(lambda: flushed.append(Redis.from_url(worker_env['REDIS_URL']).script_flush()),
                               match=_end_of_run(second.id))
    worker = start_worker(fault_proxy.url, ['cost'], worker_env, burst=True)
    try:
        worker.wait(timeout=60)
    finally:
        stop(worker)
    assert flushed == [True], output(worker)
    assert connection.lrange('test:ran:flush', 0, -1) == [first.id.encode(), second.id.encode()]
    for job in (first, second):
        job.refresh()
        assert job.get_status() == 'finished', output(worker)
    assert not connection.keys(keys.loner('cost', '*'))  # both identities freed by their end-of-run release
    assert q.enqueue('tests.helpers.cost_jobs.held_until_finished', 'flush', 2) is not None


def test_a_lost_reply_of_a_jobs_end_of_run_pipeline(connection, fault_proxy, worker_env):
    """The end-of-run transaction's reply is lost (the server ran it, the connection closed): rq and redis-py send
    it again, EVALSHA included, and the job runs once, ends finished, its identity freed once."""
    q = PolicyQueue('cost', connection=connection)
    job = q.enqueue('tests.helpers.cost_jobs.held_until_finished', 'lost', 1)
    fault_proxy.drop_reply(match=_end_of_run(job.id))
    worker = start_worker(fault_proxy.url, ['cost'], worker_env, burst=True,
                          extra=['--connection-class', 'tests.helpers.faultproxy.RetryingRedis'])
    try:
        assert wait_for(lambda: job.get_status(refresh=True) == 'finished', timeout=30), output(worker)
        worker.wait(timeout=30)
    finally:
        stop(worker)
    assert fault_proxy.seen(_end_of_run(job.id)) >= 2, output(worker)
    assert connection.lrange('test:ran:lost', 0, -1) == [job.id.encode()]
    assert not connection.keys(keys.loner('cost', '*'))
    assert q.enqueue('tests.helpers.cost_jobs.held_until_finished', 'lost', 1) is not None


def test_a_pipeline_read_off_is_sent_again_whole(connection):
    """compat.queued_commands and queue_again (a worker's end of run sent again once the server answers): what was
    queued, in or out of a transaction, is queued again on the reset pipeline and runs once."""
    from rq_policies.engine import compat

    for transaction in (True, False):
        connection.delete('again:n')
        pipe = connection.pipeline(transaction=transaction)
        pipe.set('again:x', 'one')
        pipe.incr('again:n')
        queued = compat.queued_commands(pipe)
        pipe.reset()  # what redis-py does to a pipeline whose execute() failed
        compat.queue_again(pipe, queued)
        assert pipe.execute() == [True, 1]
