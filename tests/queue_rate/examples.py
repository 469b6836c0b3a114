"""QueueRate's contract cases (tests/helpers/cases.py finds them by the policy's registered name). Its example
settings are ``QueueRate.setting_examples()``, which the dashboard uses too."""

from rq_policies.engine.policy import MAX_CAPACITY, MAX_SECONDS

#: Settings ``QueueRate.configure`` (and ``QueueRate.set``) refuses, each with the argument its error names.
INVALID = {
    'queue_rate': (
        ({'limit': 0}, 'limit'),
        ({'limit': -3}, 'limit'),
        ({'limit': 1.5}, 'limit'),
        ({'limit': True}, 'limit'),
        ({'limit': MAX_CAPACITY + 1}, 'limit'),
        ({'limit': 5, 'per': 0}, 'per'),
        ({'limit': 5, 'per': 0.5}, 'per'),
        ({'limit': 5, 'per': MAX_SECONDS + 1}, 'per'),
        ({'limit': 5, 'burst': 0}, 'burst'),
        ({'limit': 5, 'burst': 6}, 'burst'),
        ({'limit': 5, 'burst': '2'}, 'burst'),
    ),
}
