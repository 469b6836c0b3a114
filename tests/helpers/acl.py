"""The ACL rules docs/acl.md documents for an rq-policies user: the security tests check them against a real server,
the docs tests that docs/acl.md shows the same rules."""

#: The ACL docs/acl.md documents; keep the two the same.
ACL_RULES = [
    'on', '>s3cret', 'resetkeys', '~rq:*', 'resetchannels', '&rq:*', '-@all',
    '+@read', '+@write', '+@scripting', '+@pubsub', '+@connection', '+@transaction',
    '-@dangerous', '+info', '+time', '+client|setname', '+client|getname', '+client|list', '+client|id',
]
