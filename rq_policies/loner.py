"""Loner's fast path: drop a duplicate before rq builds its job, when this process just saw the identity held.

The Loner policy itself is :class:`rq_policies.policy.Loner`; its admission is ``lua/enqueue_job.lua``, run by
PolicyQueue. This module only chooses, from what the process saw (:mod:`rq_policies.hints`), whether an enqueue first
asks ``lua/loner_check.lua``. A marker can be freed at any moment (a worker takes the job), so a loner hint is kept
only briefly; a stale one costs one extra round trip before the full path.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from . import keys, scripts
from .hints import Hints
from .policy import Loner

if TYPE_CHECKING:
    from .policy import PolicySet
    from .queue import PolicyQueue

logger = logging.getLogger('rq_policies')

#: Seconds a "seen held" hint is trusted to pick the check script first.
HINT_SECONDS = 5.0

_hints = Hints()


def quick_drop(queue: PolicyQueue, spec: PolicySet | None, f: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """Returns (dropped, hint key). Applies to a Loner without Throttle or Debounce, on an asynchronous queue."""
    if spec is None or spec.get(Loner) is None or len(spec.policies) != 1 or not queue._is_async:
        return False, None
    key, call = _hints.confirmed(queue, 'loner', spec.unique_context, f, args, kwargs)
    if call is None:
        return False, key
    func_name, digest, job_id = call
    dropped, holder = scripts.run(
        'loner_check',
        queue.connection,
        [keys.loner(queue.name, digest), keys.DROPS],
        [job_id, queue.job_class.redis_job_namespace_prefix, keys.drop_field('loner', queue.name)],
    )
    if not dropped:
        _hints.forget(key)
        return False, key
    log_drop(func_name, queue.name, holder)
    return True, key


def remember_held(key: tuple | None, digest: str) -> None:
    """The full path saw this identity held: try the check script first for the next few seconds."""
    _hints.remember(key, digest, HINT_SECONDS)


def log_drop(func_name: str, queue: str, holder: Any) -> None:
    if logger.isEnabledFor(logging.INFO):
        holder_id = holder.decode() if isinstance(holder, bytes) else holder
        logger.info('rq-policies: dropped %s on queue %r (loner): identity held by job %s', func_name, queue, holder_id)
