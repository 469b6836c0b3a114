"""Concurrency's and Rate's contract cases (tests/helpers/cases.py finds them by the policies' registered names)."""

from rq_policies import Concurrency, Rate
from rq_policies.engine.policy import MAX_CAPACITY, MAX_SECONDS
from tests.helpers.cases import _first_argument

#: Instances covering each per-key policy's distinct behaviours; the contract suite runs each one.
EXAMPLES = {
    'concurrency': (Concurrency(1), Concurrency(1, key=_first_argument, scope='contract')),
    'key_rate': (Rate(1, per=1), Rate(2, per=1, burst=1, key=_first_argument, scope='contract'),
                 Rate(windows=[(1, 1), (3, 4, 2)], key=_first_argument, scope='contract')),
}

#: Constructor arguments each refuses, each with the argument its error names.
INVALID = {
    'concurrency': (
        ({'limit': 0}, 'limit'),
        ({'limit': True}, 'limit'),
        ({'limit': '2'}, 'limit'),
        ({'limit': MAX_CAPACITY + 1}, 'limit'),
        ({'limit': 1, 'key': 'customer_id'}, 'key'),
        ({'limit': 1, 'scope': 'a:b'}, 'scope'),
        ({'limit': 1, 'scope': ''}, 'scope'),
        ({'limit': 1, 'scope': 3}, 'scope'),
    ),
    'key_rate': (
        ({'limit': 0}, 'limit'),
        ({'limit': True}, 'limit'),
        ({'limit': 1.5}, 'limit'),
        ({'limit': MAX_CAPACITY + 1}, 'limit'),
        ({'limit': 5, 'per': 0}, 'per'),
        ({'limit': 5, 'per': 0.5}, 'per'),
        ({'limit': 5, 'per': MAX_SECONDS + 1}, 'per'),
        ({'limit': 5, 'burst': 0}, 'burst'),
        ({'limit': 5, 'burst': 6}, 'burst'),
        ({'limit': 5, 'key': 'shop'}, 'key'),
        ({'limit': 5, 'scope': 'a:b'}, 'scope'),
        ({'windows': []}, 'windows'),
        ({'windows': [(0, 1)]}, 'windows'),
        ({'windows': [(3, 1), (5, 1)]}, 'windows'),
        ({'windows': [(3, 1.5)]}, 'windows'),
        ({'limit': 5, 'windows': [(3, 1), (5, 60)]}, 'windows'),
    ),
}
