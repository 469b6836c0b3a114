"""What a producer process last saw of an identity's policy state: it chooses which script an enqueue runs first.

Building and serializing a job costs more than deciding to drop it. A process that has just seen an identity held
(a throttle slot taken, a loner waiting) first asks a small check script, which drops the extra as one complete
atomic decision when the identity is still held; otherwise the enqueue takes the full path, whose script checks
again and writes. A hint never decides anything by itself, and a stale one costs one extra round trip, once.

A hint key is the call as the caller wrote it (queue, function, policy, args, kwargs), so a call without a hint costs
one dictionary lookup; a hit is confirmed against the identity digest before it is used (Python takes ``1``,
``1.0`` and ``True`` for one key; the digest does not).
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any


class Hints:
    """A bounded map of hint key -> (identity digest, time.monotonic() after which the hint is ignored)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._items: dict[tuple, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple | None) -> str | None:
        """The digest remembered for ``key`` while its hint is fresh, else None."""
        if key is None:
            return None
        found = self._items.get(key)
        if found is None or found[1] <= time.monotonic():
            return None
        return found[0]

    def remember(self, key: tuple | None, digest: str, seconds: float) -> None:
        if key is None or seconds <= 0:
            return
        with self._lock:
            if len(self._items) >= self._size:
                now = time.monotonic()
                for stale in [k for k, (_, until) in self._items.items() if until <= now]:
                    del self._items[stale]
                if len(self._items) >= self._size:
                    self._items.clear()
            self._items[key] = (digest, time.monotonic() + seconds)

    def forget(self, key: tuple | None) -> None:
        if key is not None:
            self._items.pop(key, None)


def hint_key(queue: str, policy: Any, f: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The hint key of a call, or None when its arguments are not hashable (such calls take the full path)."""
    try:
        key = (queue, policy, f, args, tuple(sorted(kwargs.items())) if kwargs else ())
        hash(key)
    except TypeError:
        return None
    return key


def call_identity(queue: Any, unique_context: Any, f: Any, args: tuple, kwargs: dict) -> tuple[str, str, str] | None:
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
    return func_name, identity.digest(func_name, queue.name, fargs, fkwargs, unique_context), job_id or ''
