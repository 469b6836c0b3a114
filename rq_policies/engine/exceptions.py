"""Exceptions raised by rq-policies, all under :class:`PolicyError`."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError


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


class InvalidArgument(PolicyError, ValueError, TypeError):
    """A bad argument, refused before anything is written (nothing in Redis changed): a policy's setting
    (``Loner(ttl=-5)``, ``Loner(until='done')``), something other than a policy where one is expected
    (``policy='loner'``), an enqueue option, an admin call's queue, key, scope or number (:class:`InvalidSetting`),
    or an enqueue's argument that cannot be taken as given: nested too deeply (or containing itself) to encode, text
    Redis cannot store (a lone surrogate, which UTF-8 cannot encode), a number or date out of range. The message names
    the argument and the value.

    A ValueError and a TypeError both, so that ``except ValueError`` and ``except TypeError`` written against earlier
    versions (which raised one or the other) still catch it.

    Attributes:
        argument: which one: ``'ttl'``, ``'policy'``, ``'args[0]'``, ``"kwargs['name']"``, ``'the name of keyword
            argument ...'``, or the value a key function or ``unique_context`` returned (and from which argument,
            when one equals it).
        function: the job's function (its import path), or None where there is none (a policy's setting, a key given
            by hand).
        reason: what is wrong with it.
    """

    def __init__(self, argument: str, reason: str = '', function: str | None = None, context: str = '', *,
                 message: str | None = None):
        """``message``, when given, is the whole message (it names ``argument`` itself); else the message is
        ``'<argument>[ in a call of <function>]<context>: <reason>'``."""
        self.argument = argument
        self.function = function
        self.reason = reason or (message or '')
        where = f' in a call of {function}' if function else ''
        super().__init__(message if message is not None else f'{argument}{where}{context}: {reason}')


class Snooze(PolicyError):  # noqa: N818 - raised by a job as a request, not an error
    """Raised inside a job: put this job back, due again in ``seconds``; not a failure, no retry used, same job id.

    A PolicyWorker serving its queue moves the job back to its queue (its fetch promotes due scheduled jobs; with
    stock workers only, rq's scheduler, ``--with-scheduler``, does)
    when it is due. It is due at the first whole second of the server's clock at least ``seconds`` from the snooze
    (rq's scheduled registry scores whole seconds), so a snooze lasts from ``seconds`` to ``seconds`` + 1, never less.
    The job's meta counts it (``policies_snoozes``); past ``max_snoozes`` the job fails instead.

    Attributes:
        seconds: the delay, in seconds (a positive number).
        max_snoozes: how many times the job may be snoozed in all.
    """

    def __init__(self, seconds: float, max_snoozes: int = 100) -> None:
        self.seconds = _delay('seconds', seconds)
        if isinstance(max_snoozes, bool) or not isinstance(max_snoozes, int) or max_snoozes < 1:
            raise InvalidArgument('max_snoozes', message=f'max_snoozes must be a positive integer, got {max_snoozes!r}')
        self.max_snoozes = max_snoozes
        super().__init__(f'snoozed for {seconds} s')


class BackOff(PolicyError):  # noqa: N818 - raised by a job as a request, not an error
    """Raised inside a job: no PolicyWorker starts a job of this queue for ``seconds`` (server clock); this job goes
    back to the head of its queue. Not a failure, no retry used; the job's meta counts it (``policies_backoffs``).

    With ``key=True`` only this job's key is blocked (the key of its Concurrency or Rate, every function sharing
    that scope): the queue's other keys run on, and the key's jobs are parked until the block ends.

    A second BackOff on the same queue (or key) extends the block only when it ends later.

    Attributes:
        seconds: how long the queue (or key) is blocked, in seconds (a positive number).
        key: block only the job's key.
    """

    def __init__(self, seconds: float, key: bool = False) -> None:
        self.seconds = _delay('seconds', seconds)
        if not isinstance(key, bool):
            raise InvalidArgument('key', message=f'key must be True or False, got {key!r}')
        self.key = key
        super().__init__(f'backed off for {seconds} s' + (' (its key)' if key else ''))


class StopAsked(PolicyError):  # noqa: N818 - the reason a job ended stopped, not an error of the caller
    """The reason a job ended ``stopped`` without running: another job's admission asked its stop before a worker
    started it (``Loner(on_conflict='cancel')``; rq's stop-job command reaches only a started job). The job's
    ``exc_info`` names the asking job."""

    def __init__(self, job_id: str, asked_by: str) -> None:
        self.job_id, self.asked_by = job_id, asked_by
        super().__init__(f'job {job_id} was stopped before it ran: the enqueue of job {asked_by} asked its stop '
                         f'(Loner cancel) while it was taken and not yet started')


class SnoozeLimitReached(PolicyError):
    """A job raised :class:`Snooze` more than its ``max_snoozes`` allows: it fails with this error."""


#: The longest delay Snooze and BackOff accept (ten years, as every other policy duration).
_MAX_DELAY = 10 * 366 * 24 * 3600


def _delay(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_DELAY:
        raise InvalidArgument(
            name, message=f'{name} must be a number of seconds > 0 and <= {_MAX_DELAY}, got {value!r}')
    return float(value)

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


class InvalidSetting(InvalidArgument):
    """A run-time setting call (``set``/``get``/``clear``/``status`` of QueueSlot, QueueRate, Concurrency, Rate, Fair's
    weights and pauses) was given a bad argument: an :class:`InvalidArgument` (so a ValueError and a TypeError too),
    under the name 0.2 to 0.4 gave it. The message names the argument and the value, and nothing in Redis was changed.
    """


class UnknownQueueWarning(UserWarning):
    """A cap or a rate was set on a queue no worker, producer or policy setting has seen yet (a typo?). The setting
    is stored all the same (the queue may simply not exist yet); ``rq-policies cap/rate`` refuse it without
    ``--force``."""


class SlotMigrating(PolicyError, RedisConnectionError):
    """The prefix's hash slot was being migrated to another node of a Redis Cluster for longer than the client waits
    (its ``slot_wait_seconds``, :data:`rq_policies.engine.compat.SLOT_WAIT_SECONDS` by default): the command, the script
    or the transaction did not run (the server refused it with ``TRYAGAIN``, ``ASK`` or ``MOVED`` every time).

    A redis-py ``ConnectionError`` too, so that what rides out a Redis outage rides this out as well: a PolicyWorker
    waits and tries again, and a producer that retries on ``ConnectionError`` retries it (safe: nothing of the call
    ran). ``__cause__`` is the server's last refusal.

    Attributes:
        waited: seconds the client kept retrying.
    """

    def __init__(self, waited: float, last: BaseException | None = None) -> None:
        self.waited = waited
        super().__init__(
            f'the Redis Cluster slot of the key prefix stayed in migration for {waited:.1f} s (the server refused the '
            f'call with {type(last).__name__ if last is not None else "a redirection"}: {last}); nothing of the call '
            'ran. Try again once the slot has settled on its new node'
        )


class NotReplicated(PolicyError):
    """A door that waits for replicas (``wait_replicas=``) admitted the job, and fewer replicas than asked had it when
    ``WAIT`` answered, after ``timeout_ms``: **the job is admitted** (it is on the primary, and runs as any other),
    it is not known to be on that many replicas yet, so a failover in the next moments could still lose it.

    Do not enqueue the same call again to make up for it (without a policy that is a second job): the replicas
    usually catch up; :func:`rq_policies.surfaces.replicas.wait_for_replicas` waits again, and ``explain(job.id)`` (on
    the primary) says where the job is.

    Attributes:
        job: the admitted job (``enqueue_many``: its list of results, None where a policy dropped one).
        acknowledged: how many replicas had it.
        replicas: how many were asked for.
        timeout_ms: how long ``WAIT`` waited, in milliseconds.
    """

    def __init__(self, job: object, acknowledged: int, replicas: int, timeout_ms: int) -> None:
        self.job = job
        self.acknowledged = acknowledged
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        what = f'job {job.id}' if hasattr(job, 'id') else 'the jobs'
        super().__init__(
            f'{what} is admitted, and {acknowledged} of {replicas} replica(s) had it after {timeout_ms} ms: it is on '
            'the primary and runs, but a failover now could still lose it. Do not enqueue it again; '
            'rq_policies.surfaces.replicas.wait_for_replicas waits for the replicas again'
        )
