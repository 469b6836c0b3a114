"""A mixed workload (half new identities, half duplicates of identities other producers admitted) costs one round
trip per enqueue: counted on the server (INFO commandstats), over several producer processes."""

from __future__ import annotations

import multiprocessing

from redis import Redis

from rq_policies import PolicyQueue
from rq_policies.engine import scripts
from tests.helpers import jobs


def _produce(url: str, n: int, results) -> None:
    import os

    q = PolicyQueue('mixed', connection=Redis.from_url(url))
    admitted = dropped = 0
    for i in range(n):
        admitted += q.enqueue(jobs.sweep_cache, f'new-{os.getpid()}-{i}') is not None
        dropped += q.enqueue(jobs.sweep_cache, f'held-{i % 40}') is None  # another producer admitted it
    results.put((admitted, dropped))


def test_a_mixed_workload_costs_one_round_trip_per_enqueue(connection, redis_url):
    q = PolicyQueue('mixed', connection=connection)
    for i in range(40):  # held by a producer that is not one of those below
        assert q.enqueue(jobs.sweep_cache, f'held-{i}') is not None
    connection.script_load(scripts.script('admit').script)
    connection.config_resetstat()
    ctx = multiprocessing.get_context('fork')
    results = ctx.Queue()
    producers, n = 3, 60
    procs = [ctx.Process(target=_produce, args=(redis_url, n, results)) for _ in range(producers)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert outcomes == [(n, n)] * producers
    stats = connection.info('commandstats')
    evalsha = int(stats['cmdstat_evalsha']['calls'])
    assert 'cmdstat_eval' not in stats
    assert evalsha == 2 * n * producers, (evalsha, 2 * n * producers)  # one EVALSHA per enqueue, admitted or dropped
    assert q.count == 40 + n * producers
