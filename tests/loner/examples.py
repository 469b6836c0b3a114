"""Loner's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies import Loner

#: Instances covering Loner's distinct behaviours; the contract suite runs each one.
EXAMPLES = {
    'loner': (Loner(), Loner(until='finished'), Loner(on_conflict='replace'),
              Loner(until='finished', on_conflict='replace'), Loner(ttl=60), Loner(until='finished', ttl=60),
              Loner(until='finished', on_conflict='keep_last'), Loner(until='finished', on_conflict='cancel')),
}

#: Constructor arguments Loner refuses, each with the argument its error names.
INVALID = {
    'loner': (
        ({'until': 'x'}, 'until'), ({'until': None}, 'until'), ({'on_conflict': 'skip'}, 'on_conflict'),
        ({'on_conflict': True}, 'on_conflict'), ({'ttl': 0}, 'ttl'), ({'ttl': -5}, 'ttl'), ({'ttl': '60'}, 'ttl'),
        ({'ttl': True}, 'ttl'), ({'ttl': float('nan')}, 'ttl'), ({'ttl': float('inf')}, 'ttl'),
        ({'on_conflict': 'keep_last'}, 'until'), ({'until': 'started', 'on_conflict': 'keep_last'}, 'until'),
        ({'until': 'finished', 'on_conflict': 'keep_last', 'ttl': 60}, 'ttl'),
        ({'on_conflict': 'cancel'}, 'until'), ({'until': 'finished', 'on_conflict': 'cancel', 'ttl': 60}, 'ttl'),
    ),
}
