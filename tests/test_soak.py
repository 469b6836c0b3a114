"""The soak (tests/soak.py) as a test: a bounded run; RQ_POLICIES_SOAK_SECONDS sets its length (default 30).

It restarts Redis twice (with and without its data) and loses replies through the fault proxy; every invariant,
double runs and stranded jobs included, must hold."""

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
    assert [kind for kind, _, _ in results['run']['restarts']] == ['aof', 'empty']
    assert sum(results['run']['kills'].values()) > 0
    assert sum(results['run']['lost_replies_fired'].values()) > 0  # replies were lost, and the clients resent
    for invariant in ('cap', 'lost', 'double_runs', 'stranded', 'loner', 'throttle', 'leaks'):
        assert results[invariant]['ok'], (invariant, results[invariant])
    assert results['cap']['runs'] > 0 and results['loner']['jobs'] > 0 and results['throttle']['slots'] > 0
    assert results['run']['drained'], results['run']['backlog_left']
    # A second SIGTERM sent to a worker still busy 1.3 s after the first is a cold shutdown, seen in its log.
    if results['run']['kills'].get('cold_second_signal'):
        assert results['run']['cold_shutdowns'] > 0, results['run']
    assert results['ok']
