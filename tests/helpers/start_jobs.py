"""A PolicyWorker that stops between its fetch and the record of a job's start, for a test to SIGKILL the server
just then (tests/faults/test_cluster.py::test_a_start_caught_by_a_failover_runs_the_job_once)."""

from __future__ import annotations

import os
import time

from rq_policies import PolicyWorker


class GatedStart(PolicyWorker):
    """Before recording the start of a job whose id starts with ``gated`` (rq's ``prepare_execution``, whose
    transaction writes the job's execution and, through ``lua/start.lua``, its start: issue 34), the worker creates
    ``<START_GATE>.waiting`` and waits until the file ``START_GATE`` exists (at most a minute): the fetch has taken
    the job, its start is not written yet."""

    def prepare_execution(self, job):  # type: ignore[no-untyped-def]
        gate = os.environ.get('START_GATE')
        if gate and job.id.startswith('gated'):
            with open(f'{gate}.waiting', 'w'):
                pass
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().prepare_execution(job)
