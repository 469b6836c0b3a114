"""The soak (tests/soak.py) as a test: a bounded run; RQ_POLICIES_SOAK_SECONDS sets its length (default 30)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import soak

pytestmark = pytest.mark.slow


def test_soak_keeps_every_invariant():
    seconds = float(os.environ.get('RQ_POLICIES_SOAK_SECONDS', '30'))
    results = soak.run(seconds)
    print('\n' + json.dumps(results, indent=2), file=sys.stderr)
    assert results['run']['redis_restarts'] == 1
    assert sum(results['run']['kills'].values()) > 0
    for invariant in ('cap', 'lost', 'loner', 'throttle', 'keyed', 'leaks'):
        assert results[invariant]['ok'], (invariant, results[invariant])
    assert results['cap']['runs'] > 0 and results['loner']['jobs'] > 0 and results['throttle']['slots'] > 0
    assert results['run']['drained'], results['run']['backlog_left']
    # A second SIGTERM sent to a worker still busy 1.3 s after the first is a cold shutdown, seen in its log.
    if results['run']['kills'].get('cold_second_signal'):
        assert results['run']['cold_shutdowns'] > 0, results['run']
    assert results['ok']
