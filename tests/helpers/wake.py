"""Timing an idle PolicyWorker's wake-up: pushes made as soon as its shard subscription is seen, each push's delay
to the job's start, and the bound that tells a wake-up from the once-a-second probe (tests/faults/test_sharded_wake.py,
tests/faults/test_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rq_policies import PolicyQueue
from rq_policies.engine import keys
from rq_policies.engine.fetch import IDLE_POLL_SECONDS
from tests.helpers import jobs
from tests.helpers.workers import output, wait_for

#: How many pushes each wake-up test times (each after the worker's subscription is back and it waits again).
ROUNDS = 3
#: A push as soon as the worker's subscription is seen, which its once-a-second probe found, starts about 0.85 s or
#: more after it (the wait began a poll of wait_for before): a start sooner than this was woken. (Half the probe's
#: period, with the push 0.3 s into the wait, left a probe-found start 0.2 s above the bound and a wake-up 0.2 s for
#: a loaded machine's fork and start: one that took 0.56 s failed.)
WOKEN_WITHIN = 0.7 * IDLE_POLL_SECONDS


def numsub(client, channel: str) -> tuple[int, int]:
    """(shard subscribers, classic subscribers) of ``channel`` on one node."""
    return client.pubsub_shardnumsub(channel)[0][1], client.pubsub_numsub(channel)[0][1]


def started(spans: Path, job_id: str) -> float | None:
    if not spans.exists():
        return None
    for line in spans.read_text().splitlines():
        name, kind, at = line.split()
        if name == job_id and kind == 'start':
            return float(at)
    return None


def wake_delays(queue: PolicyQueue, node, spans: Path, tag: str, proc: subprocess.Popen) -> list[float]:
    """Push ROUNDS jobs, each as soon as the worker is subscribed again (SHARDNUMSUB 1 on ``node``), so that its
    once-a-second probe would find the job about 0.85-1 s later; each push's delay to its start."""
    channel = keys.wake(queue.name)
    delays = []
    for i in range(ROUNDS):
        assert wait_for(lambda: numsub(node, channel)[0] == 1, 30), output(proc)
        job_id = f'{tag}{i}'
        sent = time.time()
        queue.enqueue(jobs.span_to_file, str(spans), 0, job_id=job_id)
        assert wait_for(lambda: started(spans, job_id) is not None, 30), output(proc)  # noqa: B023
        delays.append(started(spans, job_id) - sent)
        time.sleep(0.1)  # its subscription was dropped with the claim; the next round waits for it to be back
    return delays


def cluster_worker(env: dict, queue: str, log: Path) -> subprocess.Popen:
    with open(log, 'w') as out:
        proc = subprocess.Popen([sys.executable, '-m', 'tests.helpers.cluster_worker', 'PolicyWorker', queue], env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    proc.log_path = str(log)  # type: ignore[attr-defined]
    return proc
