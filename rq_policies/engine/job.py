"""PolicyJob: an ordinary rq Job that also frees its loner identity when it is deleted or cancelled.

Its hash in Redis is exactly a stock Job's, so rq, rq-dashboard and stock workers read it unchanged. A job deleted
through a stock ``Job`` object instead is still handled: its marker no longer names a waiting job, and the next
enqueue of that identity treats it as free.
"""

from __future__ import annotations

from builtins import id as id_of
from typing import Any

from rq.job import Job

from . import admission, compat


def rq_class_name(cls: type) -> str:
    """The name rq would show for ``cls``: that of the first class in its MRO that rq-policies does not define.

    ``PolicyJob`` shows as ``Job``, ``PolicyQueue`` as ``Queue``, the queue class a PolicyWorker generates for a
    custom ``queue_class`` as that class; a user's own subclass of ours keeps its own name.
    """
    for klass in cls.__mro__:
        if klass.__module__ != 'rq_policies' and not klass.__module__.startswith('rq_policies.'):
            return klass.__name__
    return cls.__name__


#: Serializers rq's ``resolve_serializer`` has accepted as they are, by id (each held, so its id stays its own).
_RESOLVED: dict[int, Any] = {}


class PolicyJob(Job):
    """A Job whose ``delete()`` and ``cancel()`` also free the loner identity it holds.

    Otherwise it is the rq Job it was admitted as, and says so: it equals (and hashes like) any rq ``Job`` with the
    same id, whichever side of ``==`` it is on (Python asks the subclass first), so ``q.enqueue(...)`` compares equal
    to what ``Job.fetch``, registries, ``Group.get_jobs`` or ``get_current_job`` return; and its ``str``/``repr``
    read ``<Job id: description>``/``Job('id', ...)``, like rq's, for logs and tools that parse them.
    """

    def __init__(self, id: str | None = None, connection: Any = None, serializer: Any = None) -> None:
        # rq's Job.__init__ checks the serializer against a runtime-checkable Protocol (an isinstance that walks the
        # protocol's attributes, a tenth of an enqueue's client CPU), although every door passes the queue's
        # serializer, checked once already. A serializer object rq accepted as it is is accepted again unchecked.
        if serializer is not None and _RESOLVED.get(id_of(serializer)) is serializer:
            super().__init__(id, connection)
            self.serializer = serializer
            return
        super().__init__(id, connection, serializer)
        if self.serializer is serializer and len(_RESOLVED) < 64:
            _RESOLVED[id_of(serializer)] = serializer

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Job):
            return self.id == other.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f'{rq_class_name(type(self))}({compat.given_id(self)!r}, enqueued_at={self.enqueued_at!r})'

    def __str__(self) -> str:
        return f'<{rq_class_name(type(self))} {self.id}: {self.description}>'

    def delete(self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False) -> Any:
        # Before the hash goes: the hash names the marker. On a pipeline the release rides it, ahead of the delete.
        admission.release(self.connection if pipeline is None else pipeline, self.redis_job_namespace_prefix, [self.id])
        return super().delete(
            pipeline=pipeline, remove_from_queue=remove_from_queue, delete_dependents=delete_dependents
        )

    def cancel(self, pipeline: Any = None, *args: Any, **kwargs: Any) -> Any:
        admission.release(self.connection if pipeline is None else pipeline, self.redis_job_namespace_prefix, [self.id])
        return super().cancel(pipeline, *args, **kwargs)
