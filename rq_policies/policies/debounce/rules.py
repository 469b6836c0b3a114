"""Debounce: run a job once a burst of enqueues of its identity has gone quiet, with the last payload.

Each enqueue schedules the job ``wait`` seconds from now in rq's scheduled-job registry, from which the fetch of a
PolicyWorker serving its queue promotes it when due (by the server's clock; rq's scheduler, ``--with-scheduler``,
does it for stock workers). If a job of the same identity is still pending there, that job is rewritten in place,
in the admission script: it keeps its id and takes the new payload (args and kwargs, description, meta, and a per-key
policy's key) and the new run time, now + ``wait``; the enqueue returns that job (its id, the new payload). So every
handle the app kept (the first enqueue's Job, any later one's) reads the one job that will run: ``get_status()``
says ``scheduled`` with the latest payload until it runs, then its real state. What the first enqueue set otherwise
stays (``created_at``, ``timeout``, ``result_ttl`` and the other enqueue options), as with Loner's
``on_conflict='replace'``, BullMQ's deduplication ``replace`` and Sidekiq-unique-jobs' ``replace`` strategy.
``max_wait`` caps the delay since the enqueue that started the pending period, so a stream that never pauses still runs
at least every ``max_wait`` seconds.

A resend of a replacing call (redis-py retries a command whose reply was lost) is a replay: the call's own id keeps a
merge record naming the pending job, so the resend answers that job and writes nothing, even when another enqueue
rewrote the job in between. ``explain`` on that id (given as ``job_id=``) names the pending job; on an id superseded
before 0.3 (when a replacement deleted the pending job and wrote a new one) it follows the chain of replacements to
the job that will run.

Times come from the Redis server's clock. Run times are whole seconds (as rq's scheduler reads them); an idle
PolicyWorker wakes at the due time, so a debounced job runs within a moment of its quiet period's end (up to about two
seconds with rq's scheduler instead): use ``wait`` in seconds, not milliseconds.

A pending job whose run time has been reached is never replaced, because it may be being moved (promoted) to the
queue at that moment: it runs, and the next enqueue starts a new pending period. ``enqueue_at``/``enqueue_in`` are
debounced too; the job runs at the debounce time or the time asked for, whichever is later.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, ClassVar

from rq.registry import ScheduledJobRegistry

from rq_policies.engine import compat, keys
from rq_policies.engine.exceptions import PolicyConfigurationError
from rq_policies.engine.policy import AdmissionPolicy, replaced_in_place, whole_seconds

logger = logging.getLogger('rq_policies')

#: Job hash field a debounced job carries for ``rq-policies explain``: its identity's pending pointer.
DEBOUNCE_FIELD = 'policies_debounce'


class Debounce(AdmissionPolicy):
    """Run the job ``wait`` seconds after the last enqueue of its identity, with the last payload.

    Example::

        @policy(Debounce(5, max_wait=60))   # reindex 5 s after the edits stop, at least once a minute while they go on
        def reindex_document(doc_id): ...

    Args:
        wait: the quiet period, a whole number of seconds >= 1.
        max_wait: optional cap on the delay since the first pending enqueue, a whole number of seconds >= ``wait``.
    """

    name: ClassVar[str] = 'debounce'
    rank: ClassVar[int] = 30
    identity_families: ClassVar[tuple[keys.Family, ...]] = (keys.DEBOUNCE_KEYS,)
    excludes: ClassVar[dict[str, str]] = {'loner': (
        'Debounce and Loner cannot be combined: Debounce already keeps one pending job per identity and replaces it '
        'with the latest payload; Loner would drop the very replacements a debounce exists to keep.'
    )}

    def __init__(self, wait: int, max_wait: int | None = None) -> None:
        self.wait = whole_seconds('wait', wait)
        if max_wait is not None:
            whole_seconds('max_wait', max_wait)
            if max_wait < wait:
                raise ValueError(f'max_wait must be >= wait ({wait}), got {max_wait!r}')
        self.max_wait = max_wait

    def __repr__(self) -> str:
        return f'Debounce({self.wait}{f", max_wait={self.max_wait}" if self.max_wait is not None else ""})'

    # -- the admission framework's hooks --------------------------------------------------------------------------

    schedules: ClassVar[bool] = True

    @property
    def probes(self) -> bool:
        return False  # a debounce never drops: every enqueue replaces the pending job

    def admit_part(self, call: Any, queue: Any, digest: str) -> dict[str, Any]:
        call.key('debounce.state', keys.debounce(queue.name, digest))
        call.key('registry', ScheduledJobRegistry(queue=queue).key)
        return {'wait': self.wait, 'max_wait': self.max_wait or 0}

    def job_fields(self, job: Any, queue: str, digest: str) -> list[str]:
        return [DEBOUNCE_FIELD, keys.debounce(queue, digest)]

    def validate(self, job: Any, mode: str, force: bool) -> None:
        if compat.has_dependencies(job) and not force:
            raise PolicyConfigurationError(
                f'depends_on= cannot be combined with Debounce (job {job.func_name!r}): a debounced job is scheduled, '
                'and a scheduled job does not wait for dependencies'
            )

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        if verdict.code == 3 and verdict.policy == self.name:
            # The pending job took this call's payload and run time in place: the Job returned is that job.
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    'rq-policies: %s on queue %r (debounce): replaced the payload of pending job %s in place (this '
                    'call was job %s), runs at %s', job.func_name, queue, verdict.job_id, job.id,
                    datetime.fromtimestamp(verdict.number, timezone.utc).isoformat(),
                )
            replaced_in_place(job, verdict)

    @classmethod
    def reset_part(cls, call: Any, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        call.key('debounce.state', keys.debounce(queue, digest))
        return {}
