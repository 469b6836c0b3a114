"""LimitedCapacityWorker: a job class that keeps up to N of its own jobs running over a backlog kept elsewhere
(GitLab's ``LimitedCapacity::Worker`` on RQ)::

    class ImportProjects(LimitedCapacityWorker):
        queue_name = 'imports'

        def perform_work(self, *args): ...              # one unit of work from a backlog kept elsewhere
        def remaining_work_count(self, *args) -> int: ...
        def max_running_jobs(self) -> int: ...

    ImportProjects.perform_with_capacity(connection=redis)   # from a periodic job; the same args every time

The refill counts and writes in one script (``lua/lcw_enqueue.lua``), so two at once never overshoot; the running count
is a hold ledger (``rq:policies:lcw-running:<class>``), so a killed job's unit comes back within :attr:`hold_ttl`; a
job that finishes re-enqueues itself while work remains (``lua/lcw_finish.lua``). How it runs: docs/limited-capacity.md.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any, ClassVar

from redis import Redis
from rq import get_current_job
from rq.utils import import_attribute

from rq_policies.engine import keys, ledger
from rq_policies.engine.exceptions import InvalidArgument
from rq_policies.engine.ledger import Hold, Keeper, Ledger, acquire_call
from rq_policies.engine.ops import Call
from rq_policies.engine.queue import PolicyQueue

logger = logging.getLogger('rq_policies')

#: Seconds the recorded gauges and the class index outlive the class's last refill or job.
STATE_TTL_SECONDS = 24 * 3600


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(name, message=f'{name} must return an integer >= 0, got {value!r}')
    return value


class LimitedCapacityWorker:
    """Base class of a worker class that runs at most ``max_running_jobs()`` of its jobs at once, cluster-wide."""

    #: The rq queue the class's jobs go to.
    queue_name: ClassVar[str | None] = None

    #: Seconds a running job's hold survives unrefreshed: how soon a killed job's unit comes back. The job refreshes
    #: it every third of this while ``perform_work`` runs.
    hold_ttl: ClassVar[int] = ledger.TTL_SECONDS

    #: rq job options for the class's jobs (None: the queue's or rq's default).
    job_timeout: ClassVar[int | str | None] = None
    result_ttl: ClassVar[int | None] = None
    failure_ttl: ClassVar[int | None] = None

    # -- what a subclass implements -------------------------------------------------------------------------------

    def perform_work(self, *args: Any) -> Any:
        """Do one unit of work (taken from a backlog kept elsewhere)."""
        raise NotImplementedError(f'{type(self).__qualname__} must implement perform_work(*args)')

    def remaining_work_count(self, *args: Any) -> int:
        """How many units of work are left (an integer >= 0)."""
        raise NotImplementedError(f'{type(self).__qualname__} must implement remaining_work_count(*args)')

    def max_running_jobs(self) -> int:
        """How many jobs of this class may run at once, cluster-wide (an integer >= 0; 0 pauses the class)."""
        raise NotImplementedError(f'{type(self).__qualname__} must implement max_running_jobs()')

    # -- the public entry points ----------------------------------------------------------------------------------

    @classmethod
    def class_path(cls) -> str:
        """The class's import path, ``module.Class``: its name in Redis keys, metrics labels and rq jobs."""
        return f'{cls.__module__}.{cls.__qualname__}'

    @classmethod
    def perform_with_capacity(cls, *args: Any, connection: Redis) -> list[str]:
        """Enqueue up to the free capacity: ``min(max_running_jobs - running - queued, remaining_work_count)`` jobs.

        Call it from a periodic job (see ``examples/limited_capacity_cron.py``) with the same ``args`` every time.

        Args:
            *args: passed to ``perform_work`` and ``remaining_work_count`` of every job.
            connection: the Redis connection.

        Returns:
            The ids of the jobs enqueued (possibly none).

        Raises:
            TypeError: the class cannot be imported by its path (defined in a function or in ``__main__``), or
                ``connection`` is missing.
            ValueError: ``queue_name`` is not set, or a method returned something other than an integer >= 0.
        """
        conn = cls._connection(connection)
        queue_name = cls._checked()
        instance = cls()
        limit = _count(f'{cls.__qualname__}.max_running_jobs()', instance.max_running_jobs())
        remaining = _count(f'{cls.__qualname__}.remaining_work_count()', instance.remaining_work_count(*args))
        queue, fields, ttl = cls._template(args, conn, queue_name)
        ids = [str(uuid.uuid4()) for _ in range(min(limit, remaining))]
        path = cls.class_path()
        call = cls._call('lcw_enqueue', queue, limit, remaining, ttl, fields, ids=ids)
        call.key_list('jobs', [queue.job_class.key_for(job_id) for job_id in ids])
        enqueued = call.run(conn)
        result = [job_id.decode() if isinstance(job_id, bytes) else job_id for job_id in enqueued]
        logger.debug('rq-policies: %s.perform_with_capacity enqueued %d job(s)', path, len(result))
        return result

    @classmethod
    def perform(cls, *args: Any) -> Any:
        """The job function rq runs (by import path, ``module.Class.perform``); not called directly.

        Takes a hold in the running ledger, runs ``perform_work``, and on success gives the hold back and enqueues a
        successor when work remains. Every exit path gives the hold back; SIGKILL leaves it to expire.
        """
        job = get_current_job()
        if job is None:
            raise RuntimeError(f'{cls.class_path()}.perform runs inside an rq job; call perform_with_capacity()')
        conn = job.connection
        instance = cls()
        path = cls.class_path()
        limit = _count(f'{cls.__qualname__}.max_running_jobs()', instance.max_running_jobs())
        token = f'{socket.gethostname()}:{os.getpid()}:{job.id}'
        hold = Hold(keys.lcw_running(path), token, positive_ttl(cls.hold_ttl), job.id)
        acquired = 0
        with conn.pipeline(transaction=True) as pipe:
            # Taking the hold and leaving the queued set in one MULTI: a concurrent refill sees this job either
            # waiting or running, never neither (which would let it overshoot).
            if limit > 0:
                acquire_call(hold, limit).run(pipe)
            pipe.zrem(keys.lcw_queued(path), job.id)
            replies = pipe.execute()
        if limit > 0:
            acquired = replies[0]
        if acquired != 1:
            # The cap was lowered, or holds of killed jobs have not expired yet: the jobs that run re-enqueue
            # themselves, so this one steps aside without a successor.
            logger.info('rq-policies: %s job %s found no free capacity (max %d); skipped', path, job.id, limit)
            return None

        # The refresh runs in the process that runs the job (the work horse), because the hold is that process's: a
        # worker parent's heartbeat cannot see it.
        held = Ledger([hold])
        keeper = Keeper(conn, held, max(hold.ttl / 3, 0.5), until_empty=True, name='rq-policies-lcw-hold').start()
        try:
            result = instance.perform_work(*args)
        except BaseException:
            keeper.stop()
            logger.error(
                'rq-policies: %s job %s failed; not re-enqueued (the next perform_with_capacity replaces it)',
                path, job.id, exc_info=True,
            )
            _release(conn, held, hold)
            raise
        keeper.stop()
        try:
            remaining = _count(f'{cls.__qualname__}.remaining_work_count()', instance.remaining_work_count(*args))
            limit = _count(f'{cls.__qualname__}.max_running_jobs()', instance.max_running_jobs())
            cls._finish_call(args, conn, job.origin, limit, remaining, hold.token).run(conn)
        except BaseException:
            _release(conn, held, hold)
            raise
        return result

    # -- reading --------------------------------------------------------------------------------------------------

    @classmethod
    def running_jobs_count(cls, connection: Redis) -> int:
        """Live holds in the class's running ledger (the ``limited_capacity_worker_running_jobs`` gauge)."""
        seconds, micros = connection.time()
        return int(connection.zcount(keys.lcw_running(cls.class_path()), f'({seconds + micros / 1e6:.6f}', '+inf'))

    @classmethod
    def queued_jobs_count(cls, connection: Redis) -> int:
        """Jobs of the class enqueued and not started yet (entries of ended jobs are pruned on the next refill)."""
        return int(connection.zcard(keys.lcw_queued(cls.class_path())))

    # -- internals ------------------------------------------------------------------------------------------------

    @staticmethod
    def _connection(connection: Any) -> Redis:
        if connection is None:
            raise InvalidArgument(
                'connection', message='perform_with_capacity: connection is required, pass connection=Redis(...)')
        return connection

    @classmethod
    def _checked(cls) -> str:
        name = cls.queue_name
        if not isinstance(name, str) or not name:
            raise InvalidArgument(
                'queue_name', message=f'{cls.__qualname__}.queue_name must be a non-empty queue name, got {name!r}')
        path = cls.class_path()
        try:
            found = import_attribute(path)
        except (ImportError, AttributeError, ValueError):
            found = None
        if found is not cls or cls.__module__ == '__main__':
            raise TypeError(
                f'{path} cannot be imported by its path, so a worker could not run its jobs: define the class at the '
                'top level of an importable module (not in a function, not in __main__)'
            )
        return name

    @classmethod
    def _template(cls, args: tuple, conn: Redis, queue_name: str) -> tuple[PolicyQueue, list[Any], int]:
        """The job hash every job of this call shares (as rq's own enqueue writes it), and the ttl."""
        queue = PolicyQueue(queue_name, connection=conn)
        options: dict[str, Any] = {'args': args}
        if cls.job_timeout is not None:
            options['timeout'] = cls.job_timeout
        if cls.result_ttl is not None:
            options['result_ttl'] = cls.result_ttl
        if cls.failure_ttl is not None:
            options['failure_ttl'] = cls.failure_ttl
        job = queue.create_job(f'{cls.class_path()}.perform', **options)
        write = queue.job_write(job)
        return queue, write.fields, write.ttl

    @classmethod
    def _finish_call(cls, args: tuple, conn: Redis, queue_name: str, limit: int, remaining: int,
                     token: str) -> Call:
        """The ``lua/lcw_finish.lua`` call of a job whose hold is ``token``: give the hold back and enqueue a
        successor. The successor's id is drawn here, so a replay of this very call carries the same one and finds
        the first attempt's answer recorded under it (``keys.lcw_finish``)."""
        queue, fields, job_ttl = cls._template(args, conn, queue_name)
        successor = str(uuid.uuid4())
        call = cls._call('lcw_finish', queue, limit, remaining, job_ttl, fields, token=token, successor=successor,
                         record_ttl=keys.CLAIM_TTL)
        call.key('successor', queue.job_class.key_for(successor))
        call.key('record', keys.lcw_finish(successor))
        return call

    @classmethod
    def _call(cls, script: str, queue: PolicyQueue, limit: int, remaining: int, ttl: int, fields: list[Any],
              **args: Any) -> Call:
        """The ``lua/<script>.lua`` call (lcw_enqueue or lcw_finish) with the keys and arguments both share."""
        path = cls.class_path()
        call = Call(script, max=limit, remaining=remaining,
                    job_prefix=queue.job_class.redis_job_namespace_prefix, queue_name=queue.name,
                    wake=keys.wake(queue.name), ttl=ttl, state_ttl=STATE_TTL_SECONDS, fields=fields, **args)
        call.arg('class', path)
        for name, key in (('running', keys.lcw_running(path)), ('queued', keys.lcw_queued(path)),
                          ('gauges', keys.lcw_state(path)), ('index', keys.LCW_INDEX), ('queue', queue.key),
                          ('queues', queue.redis_queues_keys)):
            call.key(name, key)
        return call


def positive_ttl(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument('hold_ttl', message=f'hold_ttl must be a positive integer (seconds), got {value!r}')
    return value


def _release(conn: Redis, held: Ledger, hold: Hold) -> None:
    try:
        held.release(conn, hold)
    except Exception:
        # Unreachable Redis: the hold ages out within hold_ttl, which is the floor this is an optimization on.
        logger.warning('rq-policies: could not release hold %s on %s; it expires by itself', hold.token, hold.ledger)
