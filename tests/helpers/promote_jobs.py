"""Job functions the promotion and outage tests enqueue; worker subprocesses import them (tests/ is on their path).

Each records ``<job id> <value> <server time>`` to ``test:ran:<tag>`` (the server's clock: a test compares run times
with due times, and with the moment the server answered again after a restart)."""

from __future__ import annotations

import os

from rq import get_current_job

from rq_policies import BackOff, Concurrency, Debounce, Loner, Throttle, policy
from tests.helpers.cluster import connect


def _record(tag: str, value) -> None:
    conn = connect(os.environ['REDIS_URL'])
    seconds, micros = conn.time()
    conn.rpush(f'test:ran:{tag}', f'{get_current_job().id} {value} {seconds + micros / 1e6:.6f}')


def stamp(tag, value=None):
    _record(tag, value)


@policy(Loner())
def lone(tag, value):
    _record(tag, value)


@policy(Debounce(3), unique_context=lambda args, kwargs: args[1])
def debounced(tag, doc, version):
    _record(tag, f'debounce:{version}')


@policy(Throttle(3, trailing=True), unique_context=lambda args, kwargs: args[1])
def trailing(tag, task, value):
    _record(tag, f'trailing:{value}')


@policy(Concurrency(1, key=lambda args, kwargs: args[1], scope='promote'))
def backs_off(tag, customer):
    """Raise BackOff(3, key=True) on its first run, then record the run."""
    conn = connect(os.environ['REDIS_URL'])
    job = get_current_job()
    if conn.incr(f'test:backoff-runs:{job.id}') == 1:
        raise BackOff(3, key=True)
    _record(tag, 'backoff')


# The persistence outage test's jobs (tests/test_outage.py::_outage): the same records, due 6 s out instead of 3, so a
# loaded machine has the time to finish the leading runs before the timers come due (CI once took longer than 3 s,
# and the test never saw only timers pending).
@policy(Debounce(6), unique_context=lambda args, kwargs: args[1])
def debounced_later(tag, doc, version):
    _record(tag, f'debounce:{version}')


@policy(Throttle(6, trailing=True), unique_context=lambda args, kwargs: args[1])
def trailing_later(tag, task, value):
    _record(tag, f'trailing:{value}')


@policy(Concurrency(1, key=lambda args, kwargs: args[1], scope='promote-later'))
def backs_off_later(tag, customer):
    """Raise BackOff(6, key=True) on its first run, then record the run."""
    conn = connect(os.environ['REDIS_URL'])
    job = get_current_job()
    if conn.incr(f'test:backoff-runs:{job.id}') == 1:
        raise BackOff(6, key=True)
    _record(tag, 'backoff')
