"""Debounce: run a job once a burst of enqueues of its identity has gone quiet, with the last payload.

Each enqueue schedules the job ``wait`` seconds from now (server clock); a pending job of the same identity is
rewritten in place instead (same id, the new payload and run time), so every handle the app kept reads the one job that
will run. ``max_wait`` caps the delay since the enqueue that started the pending period. A resend of a replacing call
is a replay (a merge record under its own id names the pending job). A pending job whose run time has been reached is
never replaced (it may be being promoted): it runs, and the next enqueue starts a new period.
docs/throttle-debounce.md.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from rq.registry import ScheduledJobRegistry

from rq_policies.engine import compat, keys
from rq_policies.engine.exceptions import InvalidArgument, PolicyConfigurationError
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
                raise InvalidArgument('max_wait', message=f'max_wait must be >= wait ({wait}), got {max_wait!r}')
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
            replaced_in_place(job, queue, verdict, self.name, 'pending job')

    @classmethod
    def reset_part(cls, call: Any, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        call.key('debounce.state', keys.debounce(queue, digest))
        return {}
