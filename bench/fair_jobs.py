"""The job functions bench/fair.py enqueues: the same no-op with and without Fair, in one module, so every work horse
imports the same code and only the policy differs."""

from __future__ import annotations

from rq_policies import Fair, policy


def _tenant(args, kwargs):
    return kwargs['tenant']


def plain_noop(i: int, tenant: int = 0) -> int:
    """Without Fair (the baseline)."""
    return i


@policy(Fair(key=_tenant, scope='bench'))
def fair_noop(i: int, tenant: int = 0) -> int:
    """Under Fair, keyed by ``tenant``."""
    return i
