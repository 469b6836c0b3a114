"""Debounce's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies import Debounce

#: Instances covering Debounce's distinct behaviours; the contract suite runs each one.
EXAMPLES = {'debounce': (Debounce(30), Debounce(30, max_wait=120))}

#: Constructor arguments Debounce refuses, each with the argument its error names.
INVALID = {
    'debounce': (({'wait': 0}, 'wait'), ({'wait': 30, 'max_wait': 10}, 'max_wait'), ({'wait': 'x'}, 'wait')),
}
