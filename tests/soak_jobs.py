"""Job functions and the worker class of the soak (tests/soak.py); importable by its worker processes."""

from __future__ import annotations

import json
import os
import time

from rq import get_current_job

from rq_policies import Loner, PolicyWorker, policy

#: Throttle slot width of the soak's throttled kind (seconds).
SLOT_SECONDS = 2

#: Kinds whose pending job a later enqueue replaces (the replaced job is deleted by design).
REPLACING = {'debounce'}


class SoakWorker(PolicyWorker):
    """A PolicyWorker whose holds age out quickly, so the soak sees killed workers' capacity come back."""

    hold_ttl = 10


def _record(kind: str, identity: str, seconds: float) -> str:
    job = get_current_job()
    path = os.path.join(os.environ['SOAK_RUN_DIR'], f'jobs-{os.getpid()}.log')
    meta = job.meta or {}
    with open(path, 'a') as f:
        f.write(json.dumps(['start', job.id, job.origin, kind, identity, os.getpid(), time.time(),
                            meta.get('throttle_slot'), bool(meta.get('throttle_trailing'))]) + '\n')
    time.sleep(seconds)
    with open(path, 'a') as f:
        f.write(json.dumps(['end', job.id, time.time(), os.getpid()]) + '\n')
    return job.id


def soak_plain(identity: str, seconds: float) -> str:
    return _record('plain', identity, seconds)


@policy(Loner(), unique_context=lambda args, kwargs: args[0])  # the identity, whatever the duration
def soak_loner(identity: str, seconds: float) -> str:
    return _record('loner', identity, seconds)


def kinds() -> dict:
    """The kinds the producers pick from: name -> job function."""
    table = {'plain': soak_plain, 'loner': soak_loner}
    return table
