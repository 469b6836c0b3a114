"""Running ``rq-policies`` as a user does, in a subprocess, and checking its one-line errors."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.cluster import CLUSTER_CLASS, ON_CLUSTER


def run(*args, env=None, url=None):
    """Run ``rq-policies ARGS`` (as ``python -m rq_policies``, so it needs no console script on the PATH)."""
    full = [sys.executable, '-m', 'rq_policies', *args]
    if url is not None:
        full += ['--url', url, *(CLUSTER_CLASS if ON_CLUSTER else [])]
    return subprocess.run(full, env=env, capture_output=True, text=True, timeout=60)


def assert_one_line_error(result, *needles):
    assert result.returncode != 0
    assert 'Traceback' not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith('Error: ')
    for needle in needles:
        assert needle in lines[0]
