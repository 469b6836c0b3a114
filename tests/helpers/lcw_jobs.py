"""LimitedCapacityWorker classes the tests run; importable by worker subprocesses as ``tests.helpers.lcw_jobs`` (the
repository's root is on their PYTHONPATH).

Each consumes a backlog kept in a Redis list (``test:backlog:<name>``), as a real one would consume a table, and
records every unit's start and end on the server's clock so a test can compute how many ran at once.
"""

from __future__ import annotations

import os
import time

from redis import Redis
from rq import get_current_job

from rq_policies import LimitedCapacityWorker
from tests.helpers.cluster import connect


def _conn() -> Redis:
    return connect(os.environ['REDIS_URL'])


def _now(conn: Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


class Backlog(LimitedCapacityWorker):
    """Pops one item per job; an item 'fail' raises, 'sleep:<s>' sleeps that long, 'pid' records the pid."""

    queue_name = 'lcw'
    name = 'backlog'
    limit_key = 'test:lcw:max'
    unit_seconds = 0.2

    def _backlog(self) -> str:
        return f'test:backlog:{self.name}'

    def perform_work(self, *args):
        conn = _conn()
        item = conn.lpop(self._backlog())
        if item is None:
            return None
        item = item.decode()
        conn.rpush(f'test:span:{self.name}', f'start {_now(conn):.6f}')
        try:
            if item == 'fail':
                raise RuntimeError('unit failing on purpose')
            if item == 'pid':
                conn.rpush(f'test:pid:{self.name}', os.getpid())
                time.sleep(60)
            seconds = float(item.split(':', 1)[1]) if item.startswith('sleep:') else self.unit_seconds
            time.sleep(seconds)
            conn.rpush(f'test:done:{self.name}', item)
        finally:
            conn.rpush(f'test:span:{self.name}', f'end {_now(conn):.6f}')
        return item

    def remaining_work_count(self, *args):
        return _conn().llen(self._backlog())

    def max_running_jobs(self):
        raw = _conn().get(self.limit_key)
        return int(raw) if raw is not None else 2


class ShortHold(Backlog):
    """A hold that lapses 2 s after a killed job stopped refreshing it (the default is 90 s)."""

    name = 'short'
    hold_ttl = 2


class WithArgs(LimitedCapacityWorker):
    """args select the backlog: perform_with_capacity('a') drains test:backlog:a."""

    queue_name = 'lcw'

    def perform_work(self, name):
        _conn().lpop(f'test:backlog:{name}')

    def remaining_work_count(self, name):
        return _conn().llen(f'test:backlog:{name}')

    def max_running_jobs(self):
        return 3


class BadCount(LimitedCapacityWorker):
    queue_name = 'lcw'

    def perform_work(self):
        pass

    def remaining_work_count(self):
        return '3'

    def max_running_jobs(self):
        return 2


class Ephemeral(Backlog):
    """Keeps no result (``result_ttl = 0``: rq deletes a job's hash as soon as it succeeded) and records the id of
    every job that ran, so a test can see one id run twice."""

    name = 'ephemeral'
    result_ttl = 0
    unit_seconds = 0.05

    def perform_work(self, *args):
        _conn().rpush(f'test:ran:{self.name}', get_current_job().id)
        return super().perform_work(*args)
