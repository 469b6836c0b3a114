"""Batch's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies import Batch
from tests.helpers.cases import _first_argument

#: Instances covering Batch's distinct behaviours.
EXAMPLES = {
    'batch': (Batch(key=_first_argument, size=2, max_wait=60), Batch(key=_first_argument, size=5, max_wait=0.5,
                                                                     min_size=2, scope='contract')),
}

#: Constructor arguments Batch refuses, each with the argument its error names.
INVALID = {
    'batch': (
        ({'size': 2, 'max_wait': 1}, 'key'),
        ({'key': 'shop', 'size': 2, 'max_wait': 1}, 'key'),
        ({'key': len, 'size': 0, 'max_wait': 1}, 'size'),
        ({'key': len, 'size': -3, 'max_wait': 1}, 'size'),
        ({'key': len, 'size': 2.5, 'max_wait': 1}, 'size'),
        ({'key': len, 'size': True, 'max_wait': 1}, 'size'),
        ({'key': len, 'size': None, 'max_wait': 1}, 'size'),
        ({'key': len, 'size': 1001, 'max_wait': 1}, 'size'),
        ({'key': len, 'size': 2, 'max_wait': -1}, 'max_wait'),
        ({'key': len, 'size': 2, 'max_wait': '5'}, 'max_wait'),
        ({'key': len, 'size': 2, 'max_wait': float('nan')}, 'max_wait'),
        ({'key': len, 'size': 2}, 'max_wait'),
        ({'key': len, 'size': 2, 'max_wait': 1, 'min_size': 3}, 'min_size'),
        ({'key': len, 'size': 2, 'max_wait': 1, 'min_size': 0}, 'min_size'),
        ({'key': len, 'size': 2, 'max_wait': 1, 'scope': 'a:b'}, 'scope'),
    ),
}

#: The per-job suite's start-then-park cases are a limit's (a key at its limit parks its next job, which starts when
#: the key frees); tests/batch/test_batch.py holds Batch's own (size, max_wait, replays, what a fetch leaves).
NO_LIMIT = {'batch': 'every member is parked until its batch forms, and what starts is the batch job, not a member'}
