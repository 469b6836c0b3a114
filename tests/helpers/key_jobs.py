"""Job functions the per-key tests enqueue (tests/concurrency/test_concurrency.py, tests/concurrency/test_key_rate.py,
bench/keys.py); importable by worker subprocesses as ``tests.helpers.key_jobs`` (the repository's root is on their
PYTHONPATH)."""

from __future__ import annotations

import os
import time

from redis import Redis
from rq import get_current_job

from rq_policies import BackOff, Concurrency, Loner, PolicyWorker, Rate, policy
from tests.helpers.cluster import connect


def _conn() -> Redis:
    return connect(os.environ['REDIS_URL'])


def _span(tag: str, key: object, seconds: float) -> None:
    """Record this job's start and end (server clock) under its key: a test computes the overlap per key."""
    conn = _conn()
    job = get_current_job()
    start = conn.time()
    conn.rpush(f'test:keyspan:{tag}', f'{key} {job.id} start {start[0] + start[1] / 1e6:.6f}')
    time.sleep(seconds)
    end = conn.time()
    conn.rpush(f'test:keyspan:{tag}', f'{key} {job.id} end {end[0] + end[1] / 1e6:.6f}')


@policy(Concurrency(2, key=lambda args, kwargs: kwargs['customer']))
def per_customer(tag, seconds, customer):
    _span(tag, customer, seconds)


@policy(Concurrency(1, key=lambda args, kwargs: kwargs['customer']))
def one_per_customer(tag, seconds, customer):
    _span(tag, customer, seconds)


@policy(Concurrency(1))
def per_payload(tag, seconds, payload):
    _span(tag, payload, seconds)


@policy(Loner(), Concurrency(1))
def waiting_and_running(tag, seconds, payload):
    """One waiting and never two running per payload (sidekiq-unique-jobs' until_and_while_executing)."""
    _span(tag, payload, seconds)


@policy(Loner(until='finished'), Concurrency(1))
def one_in_all(tag, seconds, payload):
    """One job per payload, waiting or running; a forced duplicate waits for it instead of running beside it."""
    _span(tag, payload, seconds)


@policy(Loner(until='finished'), Concurrency(1, key=lambda args, kwargs: kwargs['payload']))
def held_everywhere(tag, seconds, payload):
    """A loner until it finishes, one at a time per payload on any queue; records its work horse's pid first
    (tests/worker/test_kill_shapes.py signals it)."""
    _conn().rpush(f'test:pid:{tag}', os.getpid())
    _span(tag, payload, seconds)


@policy(Concurrency(2, key=lambda args, kwargs: kwargs['customer'], scope='billing'))
def billing_a(tag, seconds, customer):
    _span(tag, customer, seconds)


@policy(Concurrency(2, key=lambda args, kwargs: kwargs['customer'], scope='billing'))
def billing_b(tag, seconds, customer):
    _span(tag, customer, seconds)


@policy(Rate(5, per=1, burst=2, key=lambda args, kwargs: kwargs['shop']))
def per_shop(tag, shop):
    _span(tag, shop, 0)


@policy(Rate(windows=[(3, 1, 3), (5, 10, 5)], key=lambda args, kwargs: kwargs['shop']))
def per_shop_windows(tag, shop):
    """Three a second (burst 3) and five in ten seconds (burst 5) per shop
    (tests/concurrency/test_key_rate_windows.py)."""
    _span(tag, shop, 0)


@policy(
    Concurrency(1, key=lambda args, kwargs: kwargs['customer'], scope='both'),
    Rate(1, per=60, key=lambda args, kwargs: kwargs['shop'], scope='both'),
)
def both_limits(tag, customer, shop):
    _span(tag, customer, 0)


@policy(Concurrency(1, key=lambda args, kwargs: kwargs['customer'], scope='backoff'))
def backs_off_once(tag, customer):
    """Raise BackOff(1, key=True) on the first run of each job, then record the run."""
    conn = _conn()
    job = get_current_job()
    if conn.incr(f'test:backoff-runs:{job.id}') == 1:
        now = conn.time()
        conn.rpush(f'test:keyspan:{tag}', f'{customer} {job.id} backoff {now[0] + now[1] / 1e6:.6f}')
        raise BackOff(1, key=True)
    _span(tag, customer, 0)


class FetchTimesWorker(PolicyWorker):
    """Records, for every job it takes, the clock just before and just after the fetch that took it (this host's
    clock, the server's too in the tests): the fetch script's own time, which a rate decides on, lies in between."""

    def dequeue_job_and_maintain_ttl(self, *args, **kwargs):
        before = time.time()
        result = super().dequeue_job_and_maintain_ttl(*args, **kwargs)
        after = time.time()
        if result is not None:
            job = result[0]
            key = job.kwargs.get('shop', job.origin)  # per shop for the per-key tests, per queue for the others
            self.connection.rpush('test:fetched', f'{key} {job.id} {before:.6f} {after:.6f}')
        return result


def fetch_times(conn: Redis) -> dict[str, list[tuple[float, float]]]:
    """Per key (a job's ``shop`` keyword, else its queue), the (before, after) interval of each fetch a
    FetchTimesWorker made."""
    out: dict[str, list[tuple[float, float]]] = {}
    for raw in conn.lrange('test:fetched', 0, -1):
        key, _, before, after = raw.decode().rsplit(' ', 3)
        out.setdefault(key, []).append((float(before), float(after)))
    return out


def spans(conn: Redis, tag: str) -> dict[str, list[tuple[str, str, float]]]:
    """The recorded events per key: ``{key: [(job id, 'start'|'end'|'backoff', server time), ...]}``."""
    out: dict[str, list[tuple[str, str, float]]] = {}
    for raw in conn.lrange(f'test:keyspan:{tag}', 0, -1):
        key, job_id, what, at = raw.decode().rsplit(' ', 3)
        out.setdefault(key, []).append((job_id, what, float(at)))
    return out


def max_overlap(events: list[tuple[str, str, float]]) -> int:
    """The most jobs running at once among ``events`` (starts and ends)."""
    running = best = 0
    for _, what, _ in sorted(events, key=lambda e: (e[2], e[1] == 'start')):
        if what == 'start':
            running += 1
            best = max(best, running)
        elif what == 'end':
            running -= 1
    return best


@policy(Concurrency(10, key=lambda args, kwargs: kwargs['customer'], cost=lambda args, kwargs: kwargs['pages']))
def by_pages(tag, seconds, customer, pages):
    """Concurrency(10) per customer, each job taking ``pages`` units (tests/concurrency/test_concurrency.py's cost
    tests)."""
    _span(tag, customer, seconds)


# -- a key's limit under two producers with different code (tests/concurrency/test_key_rule.py, bench/key_rule.py) --
# Producer A's code declares 6 for scope 'tiered', producer B's (a later release) 1: each job carries its own
# producer's number, and the scope's rule (Concurrency.set_rule) must decide instead.


@policy(Concurrency(6, key=lambda args, kwargs: kwargs['customer'], scope='tiered'))
def tiered_loose(tag, seconds, customer):
    _span(tag, customer, seconds)


@policy(Concurrency(1, key=lambda args, kwargs: kwargs['customer'], scope='tiered'))
def tiered_strict(tag, seconds, customer):
    _span(tag, customer, seconds)


def rq_limited(tag, seconds, customer):
    """No policy of ours: rq's own ``RateLimit`` on the enqueue limits it (the side-by-side drift demo)."""
    _span(tag, customer, seconds)
