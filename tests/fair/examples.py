"""Fair's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies import Fair
from rq_policies.policies.fair.rules import MAX_WEIGHT
from tests.helpers.cases import _first_argument

#: Instances covering Fair's distinct behaviours; the contract suite runs each one.
EXAMPLES = {
    'fair': (Fair(key=_first_argument), Fair(key=_first_argument, weight=3, max_waiting=100, scope='contract')),
}

#: Constructor arguments Fair refuses, each with the argument its error names.
INVALID = {
    'fair': (
        ({'key': 'tenant'}, 'key'),
        ({'key': len, 'weight': 0}, 'weight'),
        ({'key': len, 'weight': 1.5}, 'weight'),
        ({'key': len, 'weight': MAX_WEIGHT + 1}, 'weight'),
        ({'key': len, 'max_waiting': 0}, 'max_waiting'),
        ({'key': len, 'max_waiting': True}, 'max_waiting'),
        ({'key': len, 'on_conflict': 'replace'}, 'on_conflict'),
        ({'key': len, 'scope': 'a:b'}, 'scope'),
        ({'key': len, 'priority': 5}, 'priority'),
    ),
}
