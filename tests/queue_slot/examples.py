"""QueueSlot's contract cases (tests/helpers/cases.py finds them by the policy's registered name). Its example
settings are ``QueueSlot.setting_examples()``, which the dashboard uses too."""

from rq_policies.engine.policy import MAX_CAPACITY

#: Settings ``QueueSlot.configure`` refuses, each with the argument its error names.
INVALID = {
    'queue_slot': (
        ({'capacity': 0}, 'capacity'),
        ({'capacity': True}, 'capacity'),
        ({'capacity': '3'}, 'capacity'),
        ({'capacity': MAX_CAPACITY + 1}, 'capacity'),
    ),
}
