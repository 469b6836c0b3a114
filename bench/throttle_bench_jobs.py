"""The job functions bench/enqueue_throttle.py enqueues (rq refuses functions defined in ``__main__``)."""

from __future__ import annotations

from rq_policies import Debounce, Throttle, policy

#: The slot of ``throttled``: bench/enqueue_throttle.py claims slots of it through ``Throttle.admit``.
SLOT = 3600


def work(x, *rest):
    return x


@policy(Throttle(SLOT))
def throttled(x):
    return x


@policy(Throttle(3600, trailing=True), unique_context=lambda args, kwargs: args[0])
def trailing(key, x):
    return x


@policy(Debounce(3600), unique_context=lambda args, kwargs: args[0])
def debounced(key, x):
    return x


def burst(x):
    """The function of the memory check's identities (never enqueued: only its slots are claimed)."""
    return x
