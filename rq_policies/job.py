"""PolicyJob: an ordinary rq Job that also frees its loner identity when it is deleted or cancelled.

Its hash in Redis is exactly a stock Job's, so rq, rq-dashboard and stock workers read it unchanged. A job deleted
through a stock ``Job`` object instead is still handled: its marker no longer names a waiting job, and the next
enqueue of that identity treats it as free.
"""

from __future__ import annotations

from typing import Any

from rq.job import Job

from . import scripts


def release_markers(connection: Any, job_class: type[Job], job_ids: list[str]) -> int:
    """Delete the loner markers that still name these jobs. Returns how many were deleted."""
    if not job_ids:
        return 0
    result = scripts.run('release_markers', connection, [], [job_class.redis_job_namespace_prefix, *job_ids])
    return result if isinstance(result, int) else 0  # on a pipeline the count arrives with its execute()


class PolicyJob(Job):
    """A Job whose ``delete()`` and ``cancel()`` also free the loner identity it holds.

    Otherwise it is the rq Job it was admitted as: it equals (and hashes like) any rq ``Job`` with the same id,
    whichever side of ``==`` it is on (Python asks the subclass first), so ``q.enqueue(...)`` compares equal to what
    ``Job.fetch``, registries, ``Group.get_jobs`` or ``get_current_job`` return. (rq's own ``__eq__`` wants an
    instance of the left side's class.)
    """

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Job):
            return self.id == other.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def delete(self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False) -> Any:
        # Before the hash goes: the hash names the marker. On a pipeline the release rides it, ahead of the delete.
        release_markers(pipeline if pipeline is not None else self.connection, type(self), [self.id])
        return super().delete(
            pipeline=pipeline, remove_from_queue=remove_from_queue, delete_dependents=delete_dependents
        )

    def cancel(self, pipeline: Any = None, *args: Any, **kwargs: Any) -> Any:
        release_markers(pipeline if pipeline is not None else self.connection, type(self), [self.id])
        return super().cancel(pipeline, *args, **kwargs)
