"""What a PolicyWorker does once at bootstrap so its work horses need not do it per job: every Lua script read into
the process's caches (rq_policies.engine.scripts.preload), and redis-py's client name and version resolved on the pool
(rq_policies.engine.worker._resolve_driver_info_once): the connections its work horses open announce exactly what a
stock worker's do, and a pool given its own name, version or driver info is left as it was.
"""

from __future__ import annotations

import pytest
import redis
from redis import Redis
from rq import Queue
from rq.job import Job

from rq_policies import PolicyQueue, PolicyWorker
from rq_policies.engine import scripts
from rq_policies.engine.worker import _resolve_driver_info_once
from tests.helpers.workers import output, start_worker, stop


def test_bootstrap_reads_every_script_before_the_first_fork(redis_url):
    scripts.source.cache_clear()
    scripts._lean.cache_clear()
    scripts._cache.clear()
    conn = Redis.from_url(redis_url)
    worker = PolicyWorker(['preload'], connection=conn)
    worker.bootstrap()
    try:
        names = sorted(item.name[:-len('.lua')] for item in scripts._lua_root().iterdir() if item.name.endswith('.lua'))
        assert 'release_markers' in names and 'fetch' in names
        assert sorted(scripts._cache) == names  # a work horse inherits them: it reads no script file per job
        # The lean form only where a pipeline's EVAL carries it (a cluster's pipelines, one of another shape): a
        # redis-py pipeline on one server carries EVALSHA, as the horse's end-of-run pipeline does on every job, and
        # making the lean forms cost each worker's start about 9 ms (issue 33).
        lean = 0 if scripts._carries_evalsha(conn) else len(names)
        assert scripts._lean.cache_info().currsize == lean
        assert scripts.source.cache_info().currsize == len(names) + lean
        with conn.pipeline() as pipe:
            assert scripts._sha_pipeline(pipe) == (lean == 0)
    finally:
        worker.teardown()
        conn.close()


def _driver_info() -> object:
    return pytest.importorskip('redis.driver_info', reason='redis-py < 7 reads its version once, at import')


def _takes_setinfo(conn: Redis) -> bool:
    """Does the server record a client's CLIENT SETINFO (Redis 7.2+, Valkey)? Debian's Redis 7.0 has no such
    command: redis-py sends it and ignores the error, and CLIENT INFO shows no lib-name at all."""
    return 'lib-name' in conn.client_info()


def _run_in_horse(connection: Redis, redis_url: str, worker_env: dict, worker_class: str, queue: str) -> list[str]:
    job = (PolicyQueue if 'rq_policies' in worker_class else Queue)(queue, connection=connection).enqueue(
        'tests.helpers.jobs.announced', result_ttl=600)
    proc = start_worker(redis_url, [queue], worker_env, worker_class=worker_class, burst=True)
    try:
        proc.wait(60)
    finally:
        stop(proc)
    fetched = Job.fetch(job.id, connection=connection)
    assert fetched.get_status() == 'finished', output(proc)
    return [str(item) for item in fetched.return_value()]


def test_a_work_horse_announces_the_same_name_and_version_as_a_stock_one(connection, redis_url, worker_env):
    policy = _run_in_horse(connection, redis_url, worker_env, 'rq_policies.PolicyWorker', 'announce-policy')
    stock = _run_in_horse(connection, redis_url, worker_env, 'tests.helpers.workers.StockWorker', 'announce-stock')
    assert policy == stock
    assert policy == (['redis-py', redis.__version__] if _takes_setinfo(connection) else ['', ''])


def test_the_pool_carries_the_resolved_driver_info_from_bootstrap(redis_url):
    driver_info = _driver_info()
    conn = Redis.from_url(redis_url)
    worker = PolicyWorker(['announce'], connection=conn)
    worker.bootstrap()
    try:
        resolved = conn.connection_pool.connection_kwargs['driver_info']
        assert isinstance(resolved, driver_info.DriverInfo)
        assert (resolved.formatted_name, resolved.lib_version) == ('redis-py', redis.__version__)
        fresh = conn.connection_pool.make_connection()  # what a work horse's reset pool opens
        fresh.connect()
        try:
            fresh.send_command('CLIENT', 'INFO')
            line = fresh.read_response().decode()
        finally:
            fresh.disconnect()
        if _takes_setinfo(conn):
            assert 'lib-name=redis-py' in line and f'lib-ver={redis.__version__}' in line
    finally:
        worker.teardown()
        conn.close()


@pytest.mark.parametrize('given', [{'lib_name': 'mine'}, {'lib_version': '1.0'},
                                   {'driver_info': None}])
def test_a_pool_with_its_own_name_version_or_driver_info_is_left_alone(redis_url, given):
    _driver_info()
    conn = Redis.from_url(redis_url, **given)
    before = dict(conn.connection_pool.connection_kwargs)
    _resolve_driver_info_once(conn)
    assert conn.connection_pool.connection_kwargs == before
    conn.close()


@pytest.mark.parametrize('worker_class', ['rq_policies.PolicyWorker', 'rq_policies.PolicySimpleWorker'])
def test_a_burst_worker_exits_soon_after_its_queue_runs_dry(connection, redis_url, worker_env, worker_class):
    """rq starts the worker's command-channel thread waiting 60 s per look, and since redis-py 8.2 its shutdown joins
    that thread: a burst worker with nothing to do took a minute to exit (stock rq too). A PolicyWorker's thread looks
    every second. The bound leaves room for a loaded machine's start-up (the process alone takes about 1 s); the
    wait it guards against is 60 s."""
    import time

    PolicyQueue('dry', connection=connection).enqueue('tests.helpers.jobs.announced')
    for _ in range(2):
        began = time.monotonic()
        proc = start_worker(redis_url, ['dry'], worker_env, worker_class=worker_class, burst=True)
        try:
            proc.wait(60)
        finally:
            stop(proc)
        assert proc.returncode == 0, output(proc)
        assert time.monotonic() - began < 20, output(proc)


def test_a_worker_imports_no_views_until_something_looks():
    """What a PolicyWorker and a producer import leaves out every policy's views and the explainer (they cost a
    worker's start about 8 ms, issue 33); the first look at the views imports every built-in policy's, and
    ``rq_policies.explain`` is there at its first lookup."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    script = textwrap.dedent('''
        import sys
        import rq_policies
        from rq_policies import PolicyQueue, PolicyWorker, QueueSlot, Concurrency
        import rq_policies.engine.worker, rq_policies.engine.fetch
        loaded = sorted(m for m in sys.modules if m.endswith('.views') or 'explainer' in m)
        assert loaded == [], loaded
        from rq_policies.engine.views import shown, views_of
        names = sorted(found.policy.name for found in shown())
        assert names == ['batch', 'concurrency', 'debounce', 'fair', 'key_rate', 'loner', 'queue_rate',
                         'queue_slot', 'throttle'], names
        assert views_of('loner').__name__ == 'LonerViews'
        assert rq_policies.explain.__module__ == 'rq_policies.surfaces.explainer'
        assert rq_policies.UnknownJob.__name__ == 'UnknownJob'
        print('ok')
    ''')
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, '-c', script], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == 'ok', done.stderr
