"""The engine's interface to a policy, typed: what the admission framework and the fetch ask of a policy, and nothing
else. Eleven methods in three ``typing.Protocol`` classes, each documented here once; the base classes in
:mod:`rq_policies.engine.policy` give every method a no-op default, so a policy overrides only what it decides.

* :class:`Declared`: what the door asks of every policy declared on a call (``@policy(...)`` or ``policy=``), an
  admission policy or a per-job fetch policy (Concurrency, Rate) alike, before and after the one script call.
* :class:`AdmissionSide`: what ``lua/admit.lua``'s framework (:mod:`rq_policies.engine.admission`) adds for a policy
  that
  decides at enqueue: its part of the call, its drop, and what frees its state.
* :class:`FetchSide`: what ``lua/fetch.lua``'s framework (:mod:`rq_policies.engine.fetch`) asks of a fetch policy class:
  its
  keys in the fetch call, and the hold its take took and how it goes back.

What a policy shows (``info``, ``explain``, the dashboard, metrics, CLI commands) is not part of this interface: the
views call their own hooks (``commands``, ``metrics``, ``panels``, ``explain``, ``queue_info``, ...) through the
registry, and those hooks return descriptions (:mod:`rq_policies.engine.views`) that one renderer per view renders. The
test ``tests/engine/test_architecture.py::test_the_engine_s_protocols_are_narrow_typed_and_met`` holds every registered
policy to these protocols, their size to a dozen methods and their signatures free of ``Any``.
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
    from .ledger import Hold
    from .ops import Call


@runtime_checkable
class Declared(Protocol):
    """A policy declared on a call: asked before the admission script runs and told its verdict after."""

    name: str

    def validate(self, job: Job, mode: str, force: bool) -> None:
        """Refuse an enqueue this policy cannot serve (``PolicyConfigurationError`` naming why), before anything is
        written. ``mode`` is how the job would be written: R/L (pushed to the tail/head), S (scheduled), D (deferred).
        """

    def job_fields(self, queue: str, digest: str) -> list[str]:
        """Fields this policy stores on the job hash (field, value, ...), read back at fetch or removal; the script
        writes them with the job."""
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

    def release(self, connection: Redis | Pipeline, job_prefix: str, job_ids: list[str]) -> None:
        """These jobs stopped waiting (deleted, cancelled, removed, emptied): free what they hold. ``connection`` may
        be a pipeline the release rides."""

    def ended(self, pipeline: Pipeline, job_prefix: str, job_id: str) -> None:
        """This job ended for good (finished, failed with no retry left, stopped, timed out, its horse killed): free
        what it held while it ran, on ``pipeline``, the worker's pipeline that records the ending."""


@runtime_checkable
class FetchSide(Protocol):
    """A fetch policy class, as ``lua/fetch.lua``'s framework calls it (its Lua part: ``gate`` and ``take``, or
    ``fields``/``admit_job``/``take_job``/``due`` for a per-job one)."""

    name: str

    def fetch_keys(self, call: Call, queue_names: list[str]) -> None:
        """Add the keys (named ``<name>.<what>``) and arguments the policy's Lua part reads to the fetch call for
        the worker's ``queue_names``."""

    def fetch_hold(self, queue_name: str, token: str, ttl: int) -> Hold:
        """The :class:`~rq_policies.engine.ledger.Hold` the policy's ``take`` took for a claim on ``queue_name``."""
        ...

    def release_hold(self, connection: Redis | Pipeline, hold: Hold, wake: str) -> bool:
        """Give back ``hold``, which names this policy (a take that reported a ledger of its own), on ``connection``
        or a pipeline; ``wake`` is the claim's queue's wake-up channel. True when the hold was still there."""
        ...
