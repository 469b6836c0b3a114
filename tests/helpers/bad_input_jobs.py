"""Job functions for tests/admission/test_bad_input.py: one per policy whose enqueue encodes the call's arguments."""

from __future__ import annotations

from rq_policies import Concurrency, Debounce, Loner, Rate, Throttle, policy


def plain(*args, **kwargs):
    return len(args)


@policy(Loner())
def unique(*args, **kwargs):
    return len(args)


@policy(Loner(), unique_context=lambda args, kwargs: args[0])
def unique_by_first(*args, **kwargs):
    return len(args)


@policy(Throttle(60))
def throttled(*args, **kwargs):
    return len(args)


@policy(Debounce(60))
def debounced(*args, **kwargs):
    return len(args)


@policy(Concurrency(1))
def one_per_call(*args, **kwargs):
    return len(args)


@policy(Concurrency(2, key=lambda args, kwargs: args[0]))
def per_customer(*args, **kwargs):
    return len(args)


@policy(Rate(5, per=60, key=lambda args, kwargs: kwargs['shop']))
def per_shop(*args, **kwargs):
    return len(args)
