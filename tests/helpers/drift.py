"""Two producers with different code enqueue for one key while forking workers run them: ours (Concurrency with a
scope rule, PolicyWorkers) and rq's own ``RateLimit(key, concurrency)`` (stock rq workers) side by side, the same
workload. Producer A declares a limit of 6 for every key, producer B 1; the limit the operator means is the rule's
(:data:`RULE`). Each job records its start and end under its key (server clock, tests/helpers/key_jobs.py), and
:func:`over_admissions` sweeps the records.

Used by tests/concurrency/test_key_rule.py (which asserts our side) and bench/key_rule.py (which prints both).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from redis import Redis

from tests.helpers import key_jobs, with_root
from tests.helpers.workers import output, start_worker, stop, wait_for

#: The limit each key should have: what the rule states, and what rq's side is measured against.
LIMITS = {'premium:a': 3, 'free:b': 1, 'other': 2}
LOOSE, STRICT = 6, 1

PRODUCE = f'''
import sys
from tests.helpers import key_jobs, with_root
from tests.helpers.cluster import connect
side, url, tag, which, n, seconds = sys.argv[1:7]
conn = connect(url)
keys = {list(LIMITS)!r}
if side == 'ours':
    from rq_policies import PolicyQueue
    q = PolicyQueue('drift', connection=conn)
    func = key_jobs.tiered_loose if which == 'loose' else key_jobs.tiered_strict
    for i in range(int(n)):
        for key in keys:
            q.enqueue(func, tag, float(seconds), customer=key)
else:
    from rq import Queue
    from rq.rate_limit import RateLimit
    q = Queue('drift', connection=conn)
    limit = {LOOSE} if which == 'loose' else {STRICT}
    for i in range(int(n)):
        for key in keys:
            q.enqueue(key_jobs.rq_limited, tag, float(seconds), customer=key, rate_limit=RateLimit(key, limit))
'''


def run(side: str, conn: Redis, url: str, env: dict, tag: str, per_producer: int = 8, seconds: float = 0.2,
        workers: int = 4, timeout: float = 120) -> dict[str, list[tuple[str, str, float]]]:
    """Run the workload on ``side``: 'ours' (a scope rule), 'declared' (ours without a rule: each job's declared
    limit, as before rules) or 'rq' (rq's RateLimit); the two producers in subprocesses at once, ``workers`` forking
    workers (PolicyWorker for ours, rq's Worker for rq's); returns every job's start and end records per key."""
    if side == 'ours':
        from rq_policies import Concurrency, Tiers

        Concurrency.set_rule('tiered', Tiers({'premium:': LIMITS['premium:a'], 'free:': LIMITS['free:b']},
                                             default=LIMITS['other']), connection=conn, force=True)
    worker_class = 'rq.worker.Worker' if side == 'rq' else 'rq_policies.PolicyWorker'
    side = 'ours' if side == 'declared' else side  # the same producers
    running = [start_worker(url, ['drift'], env, worker_class=worker_class) for _ in range(workers)]
    producers = [subprocess.Popen([sys.executable, '-c', PRODUCE, side, url, tag, which, str(per_producer),
                                   str(seconds)], env=with_root(env)) for which in ('loose', 'strict')]
    total = 2 * 2 * per_producer * len(LIMITS)  # a start and an end per job
    try:
        for producer in producers:
            assert producer.wait(timeout) == 0
        assert wait_for(lambda: sum(len(v) for v in key_jobs.spans(conn, tag).values()) >= total, timeout), \
            output(running[0])
    finally:
        stop(*running, *producers)
    return key_jobs.spans(conn, tag)


def over_admissions(events: list[tuple[str, str, float]], limit: int) -> int:
    """How many starts of one key found ``limit`` or more of its jobs already running (each one a job admitted over
    the limit), sweeping its start and end records in time order (an end before a start at the same instant)."""
    running = over = 0
    for _, what, _ in sorted(events, key=lambda e: (e[2], e[1] == 'start')):
        if what == 'start':
            over += running >= limit
            running += 1
        elif what == 'end':
            running -= 1
    return over


def summary(found: dict[str, list[tuple[str, str, float]]]) -> dict[str, Any]:
    """Per key: the limit meant, the most running at once, and the starts over the limit; and the total."""
    keys = {key: {'limit': limit, 'max_running': key_jobs.max_overlap(found.get(key, [])),
                  'over_admitted': over_admissions(found.get(key, []), limit)} for key, limit in LIMITS.items()}
    return {'keys': keys, 'over_admitted': sum(k['over_admitted'] for k in keys.values())}
