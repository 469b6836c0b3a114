"""Job functions of tests/engine/test_pipeline_scripts.py (importable by worker subprocesses)."""

from __future__ import annotations

import os

from rq import get_current_job

from rq_policies import Loner, policy
from tests.helpers.cluster import connect


@policy(Loner(until='finished'))
def held_until_finished(tag, n):
    """Record this job's id in ``test:ran:<tag>``; its identity is held until the end-of-run pipeline frees it."""
    connect(os.environ['REDIS_URL']).rpush(f'test:ran:{tag}', get_current_job().id)
    return n


def plain_record(tag, n):
    connect(os.environ['REDIS_URL']).rpush(f'test:ran:{tag}', get_current_job().id)
    return n
