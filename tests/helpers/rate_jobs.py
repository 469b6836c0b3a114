"""The queue-rate tests' jobs and recording worker. Kept out of the test module: a forking worker's horse imports a
job's module afresh unless the worker already has it, and importing a test module (pytest and all) in every horse
costs more than a job's turn at 10 jobs/s on a loaded machine. ``rq worker -w tests.helpers.rate_jobs.RecordingWorker``
loads this module once, so its horses find these functions already imported."""

from __future__ import annotations

import time

from redis import Redis
from rq import get_current_job

from rq_policies import BackOff, PolicyWorker, Snooze
from rq_policies.policies.queue_rate.rules import BACKOFFS_META, SNOOZES_META


def _job_conn() -> Redis:
    return get_current_job().connection


def record_start(key: str) -> None:
    """Push the server time this job started at (epoch s) onto list ``key``."""
    conn = _job_conn()
    seconds, micros = conn.time()
    conn.rpush(key, f'{seconds + micros / 1e6:.6f}')


def record_and_sleep(key: str, seconds: float) -> None:
    record_start(key)
    time.sleep(seconds)


def back_off_once(key: str, seconds: float) -> None:
    """The first run backs its queue off for ``seconds``; the next one records its start."""
    if not get_current_job().meta.get(BACKOFFS_META):
        raise BackOff(seconds)
    record_start(key)


def snooze_times(key: str, times: int, seconds: float, max_snoozes: int = 100) -> None:
    """Snooze ``times`` times (each snooze's server time onto ``<key>:snoozed``), then record the start."""
    job = get_current_job()
    _job_conn().rpush(key + ':runs', job.id)
    if job.meta.get(SNOOZES_META, 0) < times:
        record_start(key + ':snoozed')
        raise Snooze(seconds, max_snoozes=max_snoozes)
    record_start(key)


def note_failure(job, connection, *exc_info) -> None:
    connection.rpush('failure-callbacks', job.id)


class RecordingWorker(PolicyWorker):
    """A PolicyWorker that records, in the worker, the server time it took each job at (``taken:<queue>``): the
    start the rate governs, a few milliseconds after the fetch, before the fork that delays the job's own record."""

    def execute_job(self, job, queue):
        seconds, micros = self.connection.time()
        self.connection.rpush(f'taken:{queue.name}', f'{seconds + micros / 1e6:.6f}')
        return super().execute_job(job, queue)
