"""QueueRate's contract cases (tests/helpers/cases.py finds them by the policy's registered name)."""

from rq_policies.engine.policy import MAX_CAPACITY, MAX_SECONDS

#: Settings under each of which one start is allowed now and the next is refused (``QueueRate.set``'s).
SETTINGS = {'queue_rate': ({'limit': 1, 'per': 60}, {'limit': 10, 'per': 3600, 'burst': 1},
                          {'windows': [(5, 1, 5), (1, 60)]})}

#: Settings ``QueueRate.set`` refuses, each with the argument its error names.
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
