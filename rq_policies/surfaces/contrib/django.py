"""Django-RQ: a PolicyQueue that keeps django-rq's commit modes.

``PolicyQueue`` and ``PolicyWorker`` work through django-rq's settings as they are
(``RQ = {'QUEUE_CLASS': 'rq_policies.PolicyQueue', 'WORKER_CLASS': 'rq_policies.PolicyWorker'}``), but a plain
PolicyQueue enqueues at once, even inside ``transaction.atomic()``: django-rq's ``COMMIT_MODE`` (``on_db_commit``
by default) lives in its own queue class, ``DjangoRQ``. :class:`PolicyDjangoQueue` is both: an enqueue made inside
a transaction is held until the commit, as django-rq does, and is admitted through its policies *when it is really
written*, with the ``policy=`` it was called with. A deferred enqueue returns None, as it does in django-rq.
"""

from __future__ import annotations

from typing import Any

from django_rq.queues import DjangoRQ

from rq_policies.engine.queue import DECLARED, PolicyQueue, door_override


class PolicyDjangoQueue(PolicyQueue, DjangoRQ):
    """django-rq's queue class with rq-policies' admission: ``RQ = {'QUEUE_CLASS': '...PolicyDjangoQueue'}``.

    A call held until the commit is recorded in the shape rq's own ``enqueue`` gives it (``func=`` and the job
    options as keywords, nothing added); only a call that names its policies carries them, as the ``policy=`` it
    was given (or that ``enqueue`` was given), to the real enqueue.
    """

    def enqueue_call(self, *args: Any, policy: Any = DECLARED, **kwargs: Any) -> Any:  # type: ignore[override]
        # When enqueue() opened the door, its policy rules; carry it to wherever DjangoRQ runs the real enqueue.
        override = door_override(policy)
        if override is not DECLARED:
            func = kwargs['func'] if 'func' in kwargs else args[0] if args else None
            if override is not self._declared_for(func):  # the declared policies need no carrying
                kwargs['policy'] = override
        return DjangoRQ.enqueue_call(self, *args, **kwargs)

    def original_enqueue_call(self, *args: Any, **kwargs: Any) -> Any:
        override = kwargs.pop('policy', DECLARED)
        # At commit time no door is open any more: open one, so the job is admitted when it is written.
        with self._door(override):
            return DjangoRQ.original_enqueue_call(self, *args, **kwargs)
