"""QueueSlot's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies.engine.policy import MAX_CAPACITY

#: Settings under each of which one start is allowed now and the next is refused (``QueueSlot.set``'s).
SETTINGS = {'queue_slot': ({'capacity': 1},)}

#: Settings ``QueueSlot.set`` refuses, each with the argument its error names.
INVALID = {
    'queue_slot': (
        ({'capacity': 0}, 'capacity'),
        ({'capacity': True}, 'capacity'),
        ({'capacity': '3'}, 'capacity'),
        ({'capacity': MAX_CAPACITY + 1}, 'capacity'),
    ),
}
