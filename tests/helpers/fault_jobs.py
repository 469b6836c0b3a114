"""Job functions for the hold fault tests; importable by worker subprocesses as ``tests.helpers.fault_jobs`` (the
repository's root is on their PYTHONPATH)."""

from __future__ import annotations

import re
import time

from rq import get_current_job


def gil_bound_span(path: str, size: int) -> str:
    """Record start and end (wall clock) to a local file around a catastrophic regex: CPython's ``re`` holds the GIL
    for the whole match, so no other thread of this process runs meanwhile (size 28: about 9 s on an idle core)."""
    job_id = get_current_job().id
    with open(path, 'a') as f:
        f.write(f'{job_id} start {time.time():.6f}\n')
    re.match(r'(a+)+$', 'a' * size + 'b')
    with open(path, 'a') as f:
        f.write(f'{job_id} end {time.time():.6f}\n')
    return job_id
