"""Job functions and the worker class of the soak (tests/helpers/soak.py); importable by its worker processes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from rq import get_current_job

from rq_policies import Concurrency, Debounce, Loner, PolicyWorker, Throttle, policy

#: Throttle slot width of the soak's throttled kind (seconds).
SLOT_SECONDS = 2

#: Jobs of one identity of the per-key kind running at once (Concurrency, keyed on the identity, whatever the queue).
KEY_LIMIT = 1



class SoakWorker(PolicyWorker):
    """A PolicyWorker whose holds age out quickly, so the soak sees killed workers' capacity come back.

    It also records when each job stopped waiting (the moment before the fetch that took it), for the loner check.
    """

    hold_ttl = 10
    #: Holds are refreshed every job_monitoring_interval (seconds), which must be shorter than hold_ttl.
    monitoring_interval = 3

    def __init__(self, *args, **kwargs):
        kwargs['job_monitoring_interval'] = self.monitoring_interval
        super().__init__(*args, **kwargs)

    def _note(self, *record) -> None:
        """Append a timestamped event of this worker (a reaped horse, a released hold) for the soak's cap check."""
        path = os.path.join(os.environ['SOAK_RUN_DIR'], f'events-{os.getpid()}.log')
        with open(path, 'a') as f:
            f.write(json.dumps([*record, time.time()]) + '\n')

    def monitor_work_horse(self, job, queue, *args):  # rq 3 passes the execution; rq 2.12 has no such argument
        try:
            return super().monitor_work_horse(job, queue, *args)
        finally:  # the horse has been waited for (rq's cold shutdown waits for it too, then raises)
            self._note('reaped', job.id)

    def heartbeat(self, timeout=None, pipeline=None):
        pending = list(self._pending_releases) if pipeline is None else []
        try:
            super().heartbeat(timeout, pipeline=pipeline)
        finally:
            for claim in pending:
                if claim not in self._pending_releases:
                    self._note('released', claim.job_id)

    def _flush_release(self, grace=0.0):
        pending = list(self._pending_releases)
        try:
            super()._flush_release(grace)
        finally:
            for claim in pending:
                if claim not in self._pending_releases:
                    self._note('released', claim.job_id)

    def execute_job(self, job, queue):
        claim = self._policy_fetcher.claim
        if claim is not None and claim.job_id == job.id:
            path = os.path.join(os.environ['SOAK_RUN_DIR'], f'pops-{os.getpid()}.log')
            with open(path, 'a') as f:
                f.write(json.dumps(['pop', job.id, claim.fetched_after]) + '\n')
        return super().execute_job(job, queue)


def process_start(pid: int | str) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid, it names one
    process even after the pid is reused (pid_max is often 32768, and a long soak forks more horses than that)."""
    with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(') ', 1)[1].split()[19]


def _record(kind: str, identity: str, seconds: float) -> str:
    job = get_current_job()
    horse = f'{os.getpid()}-{process_start("self")}'
    path = os.path.join(os.environ['SOAK_RUN_DIR'], f'jobs-{horse}.log')
    with open(path, 'a') as f:
        f.write(json.dumps(['start', job.id, job.origin, kind, identity, os.getpid(), time.time(), horse]) + '\n')
    time.sleep(seconds)
    with open(path, 'a') as f:
        f.write(json.dumps(['end', job.id, time.time(), os.getpid()]) + '\n')
    return job.id


def soak_plain(identity: str, seconds: float) -> str:
    return _record('plain', identity, seconds)


@policy(Loner(), unique_context=lambda args, kwargs: args[0])  # the identity, whatever the duration
def soak_loner(identity: str, seconds: float) -> str:
    return _record('loner', identity, seconds)


@policy(Throttle(SLOT_SECONDS), unique_context=lambda args, kwargs: args[0])
def soak_throttled(identity: str, seconds: float) -> str:
    return _record('throttle', identity, seconds)


@policy(Throttle(SLOT_SECONDS, trailing=True), unique_context=lambda args, kwargs: args[0])
def soak_trailing(identity: str, seconds: float) -> str:
    return _record('trailing', identity, seconds)


@policy(Debounce(1, max_wait=3), unique_context=lambda args, kwargs: args[0])
def soak_debounced(identity: str, seconds: float) -> str:
    return _record('debounce', identity, seconds)


@policy(Concurrency(KEY_LIMIT, key=lambda args, kwargs: args[0]))
def soak_keyed(identity: str, seconds: float) -> str:
    return _record('keyed', identity, seconds)


@dataclass(frozen=True)
class Kind:
    """One kind of job the producers enqueue.

    Attributes:
        func: the job function (its declared policy is the kind's).
        replacing: a later enqueue of the identity replaces the kind's pending job, which is deleted by design: only
            the latest of each identity must run.
        checks: the names of the soak's per-kind invariant checks (``soak.KIND_CHECKS``) that read this kind's records.
    """

    func: Callable
    replacing: bool = False
    checks: tuple[str, ...] = ()


def kinds() -> dict[str, Kind]:
    """The kinds the producers pick from, by name. A new kind adds its entry here, and its invariant as a function in
    ``tests.helpers.soak.KIND_CHECKS`` named in ``checks``."""
    return {
        'plain': Kind(soak_plain),
        'loner': Kind(soak_loner, checks=('loner',)),
        'throttle': Kind(soak_throttled, checks=('throttle',)),
        'trailing': Kind(soak_trailing, replacing=True),
        'debounce': Kind(soak_debounced, replacing=True),
        'keyed': Kind(soak_keyed, checks=('keyed',)),
    }
