"""PolicyJob: an ordinary rq Job that also frees its loner identity when it is deleted or cancelled.

Its hash in Redis is exactly a stock Job's, so rq, rq-dashboard and stock workers read it unchanged. A job deleted
through a stock ``Job`` object instead is still handled: its marker no longer names a waiting job, and the next
enqueue of that identity treats it as free.
"""

from __future__ import annotations

from typing import Any

from rq.job import Job

from . import admission


class PolicyJob(Job):
    """A Job whose ``delete()`` and ``cancel()`` also free the loner identity it holds."""

    def delete(self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False) -> Any:
        # Before the hash goes: the hash names the marker. On a pipeline the release rides it, ahead of the delete.
        admission.release(self.connection if pipeline is None else pipeline, self.redis_job_namespace_prefix, [self.id])
        return super().delete(
            pipeline=pipeline, remove_from_queue=remove_from_queue, delete_dependents=delete_dependents
        )

    def cancel(self, pipeline: Any = None, *args: Any, **kwargs: Any) -> Any:
        admission.release(self.connection if pipeline is None else pipeline, self.redis_job_namespace_prefix, [self.id])
        return super().cancel(pipeline, *args, **kwargs)
