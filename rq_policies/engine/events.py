"""What the engine lets a surface observe: each door's round trip, each job a PolicyWorker runs, and what its fetches
do besides taking a job.

The engine never imports a surface: a surface that watches (OpenTelemetry, :mod:`rq_policies.surfaces.otel`) registers
its functions here (:func:`observe`) and removes them again (:func:`unobserve`). While none is registered, a door and a
worker pay one check (``if DOORS:``, ``if RUNS:``, ``if FETCHES:``) and nothing else.

A door observer is one function, called as ``sys.settrace`` calls a tracer: ``observer(event, plan, detail, state)``.
The door core (:mod:`rq_policies.engine.admission`) calls it

* ``('planned', plan, None, None)`` for each plan it makes, before the plan's call is built (so what the observer adds
  to the job, a trace context in its ``meta``, rides the one round trip; a probe's call is built already). What it
  returns is its ``state`` for the events that follow;
* ``('decided', plan, verdict, state)`` once the policies have acted on the verdict (``verdict`` None for a job written
  without a policy);
* ``('failed', plan, exc, state)`` when the door raised ``exc`` after the plan was made: a refused option, a Redis
  error, a policy's raise (``plan.verdict`` is the verdict if one was read).

``plan`` is an :class:`rq_policies.engine.admission.Plan` (the queue, the policies, the identity, the job's write, the
call), ``verdict`` an :class:`rq_policies.engine.admission.Verdict`: an observer reads the door's own data, and writes
nothing but the job's ``meta`` (and its write's fields). It must not raise.

A run observer is called as ``observer(run, job, queue, *args)`` around each job a PolicyWorker runs, and returns
``run(job, queue, *args)`` (rq's ``perform_job``).

A fetch observer is called as ``observer(event, queue, detail)`` (:func:`fetched`) for each thing a PolicyWorker's
fetch (``lua/fetch.lua``, one round trip) did besides taking a job, as its reply says
(:meth:`rq_policies.engine.fetch.FetchReply.news`), after the reply arrived and before the job taken is read:

* ``'park'``: a job refused by its key's per-key policy (Concurrency, Rate) was parked on the key; ``detail``:
  ``job_id``, ``policy``, ``scope``, ``key``;
* ``'skip'``: the queue was skipped, its fetch policy's gate closed (a QueueSlot cap at its cap, a QueueRate);
  ``detail``: ``policy``, ``until`` (the server time, epoch s, the gate named, or None: until a release);
* ``'promote'``: due scheduled jobs were promoted onto the queue; ``detail``: ``count``;
* ``'unpark'``: a parked job was given back to its queue (its key could take it again); ``detail`` as for a park.

``queue`` is the queue's name. It should not raise (one that does is logged and passed over: the fetch may have
taken a job).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

#: The door observers, in the order they were registered.
DOORS: list[Callable[[str, Any, Any, Any], Any]] = []
#: The run observers, in the order they were registered (the first runs outermost).
RUNS: list[Callable[..., Any]] = []
#: The fetch observers, in the order they were registered.
FETCHES: list[Callable[[str, str, dict[str, Any]], Any]] = []


def observe(door: Callable[[str, Any, Any, Any], Any] | None = None, run: Callable[..., Any] | None = None,
            fetch: Callable[[str, str, dict[str, Any]], Any] | None = None) -> None:
    """Register a door, a run and/or a fetch observer (once each: registering one again changes nothing)."""
    for found, hooks in ((door, DOORS), (run, RUNS), (fetch, FETCHES)):
        if found is not None and found not in hooks:
            hooks.append(found)


def unobserve(door: Callable[[str, Any, Any, Any], Any] | None = None, run: Callable[..., Any] | None = None,
              fetch: Callable[[str, str, dict[str, Any]], Any] | None = None) -> None:
    """Remove a door, a run and/or a fetch observer (one not registered is no error)."""
    for found, hooks in ((door, DOORS), (run, RUNS), (fetch, FETCHES)):
        if found is not None and found in hooks:
            hooks.remove(found)


def fetched(news: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Tell every fetch observer each ``(event, queue, detail)`` of ``news`` (a fetch's, in its order). An observer
    that raises is logged and passed over: the fetch may have taken a job, which must reach the worker."""
    for event, queue, detail in news:
        for observer in FETCHES:
            try:
                observer(event, queue, detail)
            except Exception:
                logging.getLogger('rq_policies').exception('rq-policies: a fetch observer (%r) raised', observer)


def perform(run: Callable[..., Any], job: Any, queue: Any, *args: Any) -> Any:
    """``run(job, queue, *args)`` inside every run observer, the first registered outermost."""
    for observer in reversed(RUNS):
        run = _around(observer, run)
    return run(job, queue, *args)


def _around(observer: Callable[..., Any], run: Callable[..., Any]) -> Callable[..., Any]:
    return lambda job, queue, *args: observer(run, job, queue, *args)
