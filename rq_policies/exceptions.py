"""Exceptions raised by rq-policies, all under :class:`PolicyError`."""

from __future__ import annotations


class PolicyError(Exception):
    """Base class of every error rq-policies raises on purpose."""


class PipelineNotSupported(PolicyError):
    """A policy was asked to run inside a caller's pipeline, where its verdict could not be reported.

    Attributes:
        queue: the queue name the enqueue targeted.
        func_name: the job's function.
    """

    def __init__(self, queue: str, func_name: str):
        self.queue = queue
        self.func_name = func_name
        super().__init__(
            f'pipeline= cannot be combined with a policy (queue {queue!r}, function {func_name!r}): the admission '
            'decides whether the job exists at all, and a pipeline cannot report that before it executes. Enqueue '
            'outside the pipeline, or pass policy=None to enqueue unchecked.'
        )


class PolicyConfigurationError(PolicyError, ValueError):
    """Policies that cannot be combined, or a worker set up so that policies would be bypassed."""


class DuplicateJob(PolicyError):
    """``Loner(on_conflict='raise')``: an enqueue found its identity held by another job.

    Counted as a drop (``rq-policies info``, metrics), and nothing was written.

    Attributes:
        holder: the id of the job that holds the identity.
        queue: the queue name.
        identity: the identity digest (what ``rq-policies explain`` and ``info`` show).
    """

    def __init__(self, holder: str, queue: str, identity: str):
        self.holder = holder
        self.queue = queue
        self.identity = identity
        super().__init__(f'duplicate job on queue {queue!r}: identity {identity[:12]} is held by job {holder}')
