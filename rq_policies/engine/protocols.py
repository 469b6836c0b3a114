"""The engine's interface to a policy, typed: what the door, the admission framework and the fetch ask of a policy,
and nothing else. Twelve methods in three ``typing.Protocol`` classes, each documented here once, and the data a
policy declares beside them (class attributes); the base classes in :mod:`rq_policies.engine.policy` give every one
its default, so a policy overrides only what it decides.

* :class:`Declared`: what the door asks of every policy declared on a call (``@policy(...)`` or ``policy=``), an
  admission policy or a per-job fetch policy (Concurrency, Rate, Fair) alike, before and after the one script call.
* :class:`AdmissionSide`: what ``lua/admit.lua``'s framework (:mod:`rq_policies.engine.admission`) adds for a policy
  that decides at enqueue: its part of the call, its drop, and what frees its state.
* :class:`FetchSide`: what ``lua/fetch.lua``'s framework (:mod:`rq_policies.engine.fetch`) and the worker ask of a
  fetch policy class: its keys in the fetch call, how a hold of its own goes back, and a job's exception.

What a policy shows (``info``, ``explain``, the dashboard, metrics, CLI commands) is its views, apart:
:class:`rq_policies.engine.views.PolicyViews`. ``tests/engine/test_architecture.py::
test_the_engine_s_protocols_are_narrow_typed_and_met`` holds every registered policy to these protocols, their size
to a dozen methods and their signatures free of ``Any``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline
    from rq.job import Job
    from rq.queue import Queue

    from .admission import Verdict
    from .keys import Family
    from .ledger import Hold
    from .ops import Call


@runtime_checkable
class Declared(Protocol):
    """A policy declared on a call: asked before the admission script runs and told its verdict after."""

    #: The one name of the policy: drop counters, metrics labels, ``info``, logs, the Lua part's file name.
    name: str
    #: Does the policy take part in ``lua/admit.lua`` (its part's ``check``, ``commit``, ``force``, ``written``)?
    #: Every admission policy does; a fetch policy that decides where its jobs wait (Fair) says so.
    admits: bool
    #: Keyword options of ``enqueue``/``enqueue_at``/``enqueue_in`` it consumes (Fair's ``priority``): the door takes
    #: them out before rq parses the call, and :func:`rq_policies.engine.queue.door_options` hands them to
    #: :meth:`job_fields`.
    call_options: tuple[str, ...]
    #: The names of other policies it cannot be declared with, each with why (a refusal naming that reason).
    excludes: Mapping[str, str]
    #: The fields :meth:`job_fields` writes from the call's arguments: an in-place rewrite of a waiting job (Loner's
    #: ``'replace'``, Debounce, a trailing Throttle) replaces them along with the payload.
    payload_fields: tuple[str, ...]
    #: Can an expected drop be decided by its checks alone, before rq builds the job (the hinted probe)?
    probes: bool
    #: The job is written as a scheduled one even without a time (the policy's part sets the time).
    schedules: bool
    #: The family whose key for the job's identity it writes with the job hash's lifetime: a deferred job handed to
    #: rq's dependency handling has its lease dropped from that key too. None: no such key.
    leased: Family | None

    def validate(self, job: Job, mode: str, force: bool) -> None:
        """Refuse an enqueue this policy cannot serve (``PolicyConfigurationError`` naming why), before anything is
        written. ``mode`` is how the job would be written: R/L (pushed to the tail/head), S (scheduled), D (deferred).
        """

    def job_fields(self, job: Job, queue: str, digest: str) -> list[str]:
        """Fields this policy stores on the job hash (field, value, ...), read back at fetch, removal or ``explain``,
        and written by the script with the job; those that depend on the call's arguments (a per-key policy's key)
        are named in :attr:`payload_fields`. Raising here (a bad key) refuses the enqueue before anything is
        written."""
        ...

    def on_admit(self, job: Job, queue: str, verdict: Verdict) -> None:
        """The job was admitted (or its payload taken in place by a waiting job): bring the Python object in line
        with what the script wrote (its id, its status), and log what it replaced."""

    def hint_seconds(self, verdict: Verdict) -> float:
        """How long this process may expect the next identical enqueue to be dropped after ``verdict`` (the identity
        hint that sends it to the probe first, :func:`rq_policies.engine.admission.probe_plan`); 0: no expectation."""
        ...


@runtime_checkable
class AdmissionSide(Declared, Protocol):
    """A policy that decides at enqueue, in ``lua/admit.lua`` (its Lua part: ``check``, ``commit``, ``force``,
    ``replace``)."""

    #: The order its checks run in (lower first): a throttle window is tested before a loner marker.
    rank: int
    #: ``(field, value)``: :meth:`release` at a job's end has something to free only for a job whose hash, as its
    #: fetch read it, holds ``field`` set to ``value`` (the worker's end-of-run pipeline leaves the policy out for any
    #: other); None: at the end of every job's run. A replayed fetch, which reads no hash, runs every policy's.
    ended_when: tuple[str, str] | None
    #: Its per-identity key families (:class:`rq_policies.engine.keys.Family`), for ``info``, ``reset``, the page.
    identity_families: tuple[Family, ...]

    def admit_part(self, call: Call, queue: Queue, digest: str) -> Mapping[str, object]:
        """Add this policy's keys to ``call`` (named ``<name>.<what>``, :meth:`rq_policies.engine.ops.Call.key`) and
        return its arguments for its Lua part (``a.p[name]``). Every key the part touches arrives so, in KEYS."""
        ...

    def narrow_part(self, queue: Queue, digest: str) -> tuple[str, list[str]] | None:
        """This policy's part of the narrow admission (``lua/admit_narrow.lua``: a call with this policy alone, not
        forced): its marker key and its options there, as that script's header names them; None (the default):
        the call goes to ``lua/admit.lua``."""
        ...

    def on_drop(self, func_name: str, queue: str, verdict: Verdict) -> None:
        """This policy dropped an enqueue (the script counted it): log it, or raise (Loner's
        ``on_conflict='raise'``)."""

    def release(self, connection: Redis | Pipeline, job_prefix: str, job_ids: list[str], ended: bool = False) -> None:
        """Free what these jobs hold: they stopped waiting (deleted, cancelled, removed, emptied), or with ``ended``
        the job ended for good (finished, failed with no retry left, stopped, timed out, its horse killed) and
        ``connection`` is the worker's pipeline that records the ending. ``connection`` may be a pipeline the
        release rides."""

    def reset_part(self, call: Call, queue: str, digest: str, declared: AdmissionSide | None) -> Mapping[str, object]:
        """Add the keys ``lua/reset.lua`` clears for one identity and return the part's arguments (``declared``:
        this policy as the call declares it, if it does; a class method, so an undeclared policy resets too)."""
        ...


@runtime_checkable
class FetchSide(Protocol):
    """A fetch policy class, as ``lua/fetch.lua``'s framework calls it (its Lua part: ``gate`` and ``take``, or
    ``fields``/``admit_job``/``take_job``/``due`` for a per-job one, and ``merge``: the value of its field on one job
    formed from several, which a ``due`` that forms a job asks for through ``ctx.merged``: Batch's batch job, whose
    Concurrency and Rate costs are the sum of its members'; fetch.lua's header documents each hook). A take that reports
    hold flag 1 holds in the queue's ledger (:func:`rq_policies.engine.keys.holds`); one of its own reports that
    ledger's key."""

    name: str
    #: Declared on the job's function (``@policy(...)``, its setting stored on each job hash) rather than configured
    #: per queue in Redis.
    per_job: bool
    #: The keys of the fetch call (names :meth:`fetch_keys` gave ``call.key``, or ``call.key_list``) whose absence
    #: means its gate passes every queue, its take does nothing, none of its keys has parked jobs and its ``source``
    #: has nothing to hand out: while none of the fetch policies' state keys exists, a fetch skips every gate, take,
    #: source and due key (one EXISTS decides; ``lua/fetch.lua``'s ``state`` phase). None: its hooks always run.
    fetch_state: tuple[str, ...] | None
    #: The hash whose fields are the queues it has a setting for (a cap, a rate): they count as known queues and are
    #: listed by ``info``. None: it configures no queue.
    queue_settings: str | None

    def fetch_keys(self, call: Call, queue_names: list[str]) -> None:
        """Add the keys (named ``<name>.<what>``) and arguments the policy's Lua part reads to the fetch call for
        the worker's ``queue_names``."""

    def release_hold(self, connection: Redis | Pipeline, hold: Hold, wake: str) -> bool:
        """Give back ``hold``, which names this policy (a take that reported a ledger of its own), on ``connection``
        or a pipeline; ``wake`` is the claim's queue's wake-up channel. True when the hold was still there."""
        ...

    def on_job_exception(self, job: Job, queue: Queue, exc: BaseException, pipeline: Pipeline) -> bool:
        """A job raised ``exc`` in a PolicyWorker: when it is this policy's (Snooze, BackOff), queue onto
        ``pipeline`` what becomes of the job instead of rq's failure path, and return True (the worker then skips
        the job's failure callback, rq's exception handlers and its failure and retry handling, removes it from its
        started registry and sends the pipeline; its holds are released as on every other path). Raising instead
        (a :class:`~rq_policies.engine.exceptions.PolicyError` chained from ``exc``) fails the job with that error
        through rq's own failure path."""
        ...
