"""What a producer process last saw of its enqueues' policy state: it chooses which script an enqueue runs first.

Building and serializing a job costs more than deciding to drop it. An enqueue expected to be dropped first asks
the admission script as a *probe* (checks only, no job built), which drops the extra as one complete atomic decision
when the identity is still held; otherwise the enqueue takes the full path, whose script checks again and writes. An
expectation never decides anything by itself, and a wrong one costs one extra round trip. Two things make an
enqueue expected to be dropped:

* **An identity hint** (:class:`Hints`): this process has just seen this very call's identity held (a throttle
  window taken, a loner waiting). The hint keeps the probe's call built and packed, so the next identical enqueue
  sends it as it is: no identity digest, no call building, no msgpack. A hint key is the call as the caller wrote
  it (queue, function, policy set, args, kwargs), so a call without a hint costs one dictionary lookup; a hit is
  confirmed before it is used: Python takes ``1``, ``1.0`` and ``True`` for one key, the digest does not, so the key
  also carries the type of every top-level argument, and a call with an argument of any other type than ``str``,
  ``int``, ``bool``, ``None`` or ``bytes`` (whose equal values always encode alike) confirms against the digest.
* **A drop-rate predictor** (:class:`DropRates`), for the identities this process has not seen (the common case
  with several producers: each identity is enqueued by one and dropped in another). Per (queue, function, policy
  set) it keeps a weighted rate of the outcomes of enqueues that had no identity hint, and a cold enqueue probes
  first only while that rate is above :data:`DropRates.THRESHOLD`; otherwise it is admitted directly in one round
  trip. The rate is asymmetric: a drop moves it a little (:data:`DropRates.RISE`), an admission a lot
  (:data:`DropRates.FALL`). A run of about 16 drops in a row starts the probes, and one admission stops them, so
  a stream that keeps probing is one of drops almost only (more than about 95 in 100 on average): a mixed stream
  (half duplicates from other producers, half new identities) never probes, and each of its admissions is one
  round trip, as are its drops (they take the full path, which checks and drops in its one script). A misprediction
  costs one extra round trip, once per run of drops. Chosen over a symmetric rate with a threshold of one half
  (which probed a 1:1 mix before most admissions: 2 round trips each), over a per-identity probe of every cold
  enqueue (an extra round trip on every admission) and over a shared server-side hint (another round trip to read
  it). What would make a mixed stream's drops cheap too is a probe that admits when it finds nothing to drop, which
  needs the job built first: see docs/scaling.md.
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, NamedTuple

#: Argument types whose equal values (of the same exact type) always have the same canonical encoding, so a hint key
#: holding only these needs no digest to confirm it (a float does not qualify: ``0.0 == -0.0``).
_PLAIN = frozenset((str, int, bool, type(None), bytes))


class Hint(NamedTuple):
    """What one identity hint remembers."""

    digest: str
    until: float  # time.monotonic() after which the hint is ignored
    spec: Any  # the PolicySet the hint was seen under
    probe: Any  # the probe's call, built and packed (rq_policies.engine.ops.Packed), or None


class Hints:
    """A bounded map of hint key -> :class:`Hint`."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._items: dict[tuple, Hint] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple | None, spec: Any = None) -> Hint | None:
        """The hint remembered for ``key`` while it is fresh (and, given ``spec``, seen under an equal set), else
        None."""
        if key is None:
            return None
        found = self._items.get(key)
        if found is None or found.until <= time.monotonic():
            return None
        if spec is not None and found.spec is not spec and not (
                found.spec.policies == spec.policies and found.spec.unique_context is spec.unique_context):
            return None
        return found

    def remember(self, key: tuple | None, digest: str, seconds: float, spec: Any = None, probe: Any = None) -> None:
        if key is None or seconds <= 0:
            return
        with self._lock:
            if len(self._items) >= self._size:
                now = time.monotonic()
                for stale in [k for k, item in self._items.items() if item.until <= now]:
                    del self._items[stale]
                if len(self._items) >= self._size:
                    self._items.clear()
            self._items[key] = Hint(digest, time.monotonic() + seconds, spec, probe)

    def forget(self, key: tuple | None) -> None:
        if key is not None:
            self._items.pop(key, None)


class DropRates:
    """Per (queue, function, policy set): the weighted rate at which enqueues without an identity hint were dropped.

    Bounded (a process enqueuing under many queues or functions only refills it); updates are not locked, because a
    lost update of a rate that only chooses which script runs first changes nothing a caller sees.
    """

    #: How far one drop moves the rate towards 1, and one admission towards 0 (an exponentially weighted average
    #: with a weight per outcome): from 0, a run of 16 drops passes the threshold (1 - 0.9 ** 16 > 0.8), and from
    #: any rate one admission brings it under (0.5 * 1.0 < 0.8).
    RISE = 0.1
    FALL = 0.5
    #: The rate above which a cold enqueue probes first. With RISE and FALL as they are, a stream whose average share
    #: of drops is q settles at q * RISE / (q * RISE + (1 - q) * FALL): above the threshold only for q above 0.95.
    THRESHOLD = 0.8

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._rates: dict[tuple, float] = {}

    def likely(self, key: tuple | None) -> bool:
        """Is a drop the likely outcome of the next enqueue without a hint under ``key``?"""
        return key is not None and self._rates.get(key, 0.0) > self.THRESHOLD

    def record(self, key: tuple | None, dropped: bool) -> None:
        """One enqueue without a hint under ``key`` was dropped (or admitted)."""
        if key is None:
            return
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= self._size:
                self._rates.clear()
            rate = 0.0
        self._rates[key] = rate + (1.0 - rate) * self.RISE if dropped else rate * (1.0 - self.FALL)


def spec_token(spec: Any) -> int:
    """A small hashable stand-in for a PolicySet in hint keys, computed once per set (a hit is confirmed against the
    set itself, :meth:`Hints.get`)."""
    memo = spec.memo
    token = memo.get('hint token')
    if token is None:
        token = memo['hint token'] = hash(spec.policies)
    return token


def hint_key(queue: str, token: Any, f: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The hint key of a call, or None when its arguments are not hashable (such calls take the full path).

    The key ends with ``True`` when every argument is of a :data:`_PLAIN` type, so that an equal key means an equal
    identity without computing it; the types of the top-level arguments are part of the key either way.
    """
    try:
        if kwargs:
            items = tuple(sorted(kwargs.items()))
            types = (*map(type, args), *(type(value) for _, value in items))
        else:
            items = ()
            types = tuple(map(type, args))
        key = (queue, token, f, args, items, types, _PLAIN.issuperset(types))
        hash(key)
    except TypeError:
        return None
    return key


def plain(key: tuple) -> bool:
    """Does an equal hint key mean the same identity (every argument of a :data:`_PLAIN` type)?"""
    return key[-1]


def call_identity(queue: Any, spec: Any, f: Any, args: tuple, kwargs: dict) -> tuple[str, str, str] | None:
    """``(func_name, digest, explicit job id or '')`` of an enqueue call, computed without building its job.

    None when only the full path can tell: bound methods and callable objects (rq names them in ways only building
    the job reproduces), and calls carrying options the full path must refuse with an error (pipeline=, unique=,
    rate_limit=), which must never become a silent drop here.
    """
    from . import identity

    if not (isinstance(f, str) or inspect.isfunction(f)):
        return None
    if kwargs:  # rq's options travel in kwargs: let rq tell them from the function's own
        parsed = queue.parse_args(f, *args, **dict(kwargs))
        if parsed.pipeline is not None or parsed.unique or getattr(parsed, 'rate_limit', None) is not None:
            return None
        fargs, fkwargs, job_id = tuple(parsed.args or ()), dict(parsed.kwargs or {}), parsed.job_id
    else:
        fargs, fkwargs, job_id = args, {}, None
    func_name = identity.function_name(f)
    digest = identity.digest(func_name, queue.name, fargs, fkwargs, spec.unique_context, spec.policies)
    return func_name, digest, job_id or ''
