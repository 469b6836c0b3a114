"""Throttle's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies import Throttle

#: Instances covering Throttle's distinct behaviours; the contract suite runs each one.
EXAMPLES = {'throttle': (Throttle(60), Throttle(60, trailing=True))}

#: Constructor arguments Throttle refuses, each with the argument its error names.
INVALID = {
    'throttle': (
        ({'slot': 0}, 'slot'), ({'slot': 1.5}, 'slot'), ({'slot': True}, 'slot'),
        ({'slot': 60, 'trailing': 1}, 'trailing'),
    ),
}
