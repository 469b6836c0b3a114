"""Job functions the throttle and debounce tests enqueue; worker subprocesses import them (tests/ is on their path)."""

from __future__ import annotations

import os

from rq import get_current_job

from rq_policies import Debounce, Loner, Throttle, policy
from tests.helpers.cluster import connect


def _record(tag: str, value) -> None:
    """Append ``<job id> <value> <server time>`` to the list ``test:ran:<tag>``, so tests see what ran and when."""
    conn = connect(os.environ['REDIS_URL'])
    seconds, micros = conn.time()
    conn.rpush(f'test:ran:{tag}', f'{get_current_job().id} {value} {seconds + micros / 1e6:.6f}')


@policy(Throttle(2))
def poll_account(account_id, tag='poll'):
    _record(tag, account_id)
    return account_id


@policy(Throttle(60))
def poll_minute(account_id):
    return account_id


@policy(Throttle(2, trailing=True), unique_context=lambda args, kwargs: args[0])
def publish_progress(task_id, value, tag='progress'):
    _record(tag, value)
    return value


@policy(Throttle(60, trailing=True), unique_context=lambda args, kwargs: args[0])
def publish_minute(task_id, value):
    return value


@policy(Throttle(1), Loner())
def poll_loner(account_id):
    return account_id


@policy(Throttle(60, trailing=True), Loner(), unique_context=lambda args, kwargs: args[0])
def publish_loner(task_id, value):
    return value


@policy(Debounce(1), unique_context=lambda args, kwargs: args[0])
def reindex(doc_id, version, tag='reindex'):
    _record(tag, version)
    return version


@policy(Debounce(1, max_wait=2), unique_context=lambda args, kwargs: args[0])
def reindex_capped(doc_id, version, tag='capped'):
    _record(tag, version)
    return version


@policy(Debounce(30), unique_context=lambda args, kwargs: args[0])
def reindex_slow(doc_id, version):
    return version


@policy(Throttle(1))
def burst(identity):
    return identity
