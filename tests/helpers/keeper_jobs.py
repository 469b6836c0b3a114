"""Jobs the keeper tests run in a PolicySimpleWorker: they record what the worker's process looks like meanwhile."""

from __future__ import annotations

import json
import os
import time

from rq import get_current_job

from rq_policies import QueueSlot
from tests.helpers.cluster import connect


def children_of(pid: int) -> list[int]:
    """Live (not zombie) children of ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != 'Z':
            found.append(int(entry))
    return found


def record_process(queue: str, seconds: float = 0.0) -> None:
    """Record, in ``test:keeper``, the worker's pid (the job runs in it), its live children and the holds in use on
    ``queue``, then sleep ``seconds``."""
    conn = connect(os.environ['REDIS_URL'])
    conn.rpush('test:keeper', json.dumps({
        'job': get_current_job().id, 'pid': os.getpid(), 'children': children_of(os.getpid()),
        'in_use': QueueSlot.status(queue, connection=conn).in_use,
    }))
    conn.close()
    time.sleep(seconds)
