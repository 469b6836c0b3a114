"""QueueRate: at most ``limit`` job starts of a queue every ``per`` seconds across the whole cluster, checked at fetch;
or several such windows at once (``windows=``), all checked by the one fetch script.

A GCRA on the server's clock (``lua/policies/queue_rate.lua``): one key per limited queue holds its theoretical arrival
time (``rq:policies:tat:<queue>``), exact and O(1), no reaper. The check runs in the fetch script with the pop and any
QueueSlot hold, so a refused start never pops and a start refused by a cap consumes no rate; a worker whose queues are
all limited sleeps until the earliest allowed start. The settings live in Redis (``rq:policies:rate``). The policy also
owns BackOff's block (``rq:policies:backoff``) and what happens to a job that raises Snooze or BackOff.
docs/queue-rate.md. (Not ``RateLimit``: rq 3's is a concurrency limit at enqueue.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from redis import Redis

from rq_policies.engine import compat, keys
from rq_policies.engine.admin import (
    RateStatus,
    WindowedRate,
    queue_name,
    queue_target,
    rate_setting,
    rate_status,
    read_rate,
    refusing,
    warn_unknown_queue,
    write_queue_setting,
)
from rq_policies.engine.exceptions import BackOff, Snooze, SnoozeLimitReached
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import server_now as _server_now
from rq_policies.engine.ops import time_in
from rq_policies.engine.policy import FetchPolicy

__all__ = ['BACKOFFS_META', 'SNOOZES_META', 'BackOff', 'QueueRate', 'RateStatus', 'Snooze', 'SnoozeLimitReached']

#: The job's meta key counting how often it was snoozed, and how often it backed its queue off.
SNOOZES_META = 'policies_snoozes'
BACKOFFS_META = 'policies_backoffs'


@dataclass(frozen=True, repr=False)
class QueueRate(WindowedRate, FetchPolicy):
    """A queue's start rate: ``limit`` starts every ``per`` seconds, up to ``burst`` at once after a quiet spell; or
    several ``windows`` (``[(limit, per), (limit, per, burst), ...]``), every one of which must allow a start.

    Used through classmethods (:meth:`set`, :meth:`get`, :meth:`clear`, :meth:`status`, the shape every run-time
    setting has: :mod:`rq_policies.engine.admin`): the setting lives in Redis, not on a function. An instance is what
    :meth:`set` and :meth:`get` return: its ``windows`` are every window (:class:`~rq_policies.RateWindow`), shortest
    period first, and its ``limit``, ``per`` and ``burst`` the first window's.
    """

    name: ClassVar[str] = 'queue_rate'
    #: No queue is limited or blocked while these are absent.
    fetch_state: ClassVar[tuple[str, ...] | None] = ('queue_rate.settings', 'queue_rate.backoff')
    queue_settings: ClassVar[str | None] = keys.RATE

    # -- the setting ----------------------------------------------------------------------------------------------

    @classmethod
    def set(cls, queue: Any, limit: int | None = None, per: int = 1, burst: int = 1,
            connection: Redis | None = None, *, windows: Any = None) -> QueueRate:
        """Limit ``queue`` (a name or a Queue) to ``limit`` job starts every ``per`` seconds (whole, >= 1) across the
        cluster, up to ``burst`` (1 to ``limit``) at once; or to several ``windows`` at once, ``[(limit, per),
        (limit, per, burst), ...]`` (at most 8, one per period): a job starts only when every window allows a start,
        and its start counts in each. Stored in Redis: every PolicyWorker's next fetch obeys it,
        and idle ones are woken, so a raised rate is used at once. The starts already owed keep their count and are
        paid at the new rate, so a change never grants a fresh burst by itself (a window of a new period starts with
        nothing owed). Returns the rate now set; errors and the unknown-queue warning are the admin API's
        (:mod:`rq_policies.engine.admin`, docs/admin.md): a bad window raises InvalidSetting naming ``windows`` and
        the value, and writes nothing.
        """
        with refusing():
            name = queue_name(queue)
            rate = cls(limit, per, burst, windows)
            conn = _need(connection)
        warn_unknown_queue(conn, name, 'QueueRate.set')
        write_queue_setting(conn, keys.RATE, name, rate_setting(rate.windows))
        return rate

    @classmethod
    def get(cls, queue: Any, connection: Redis | None = None) -> QueueRate | None:
        """The rate of ``queue``, or None when it is unlimited."""
        name, conn = queue_target(queue, connection)
        return parse(conn.hget(keys.RATE, name))

    @classmethod
    def clear(cls, queue: Any, connection: Redis | None = None) -> bool:
        """Remove the rate of ``queue`` (its arrival time expires by itself). Returns True when it had one."""
        name, conn = queue_target(queue, connection)
        return write_queue_setting(conn, keys.RATE, name, None, also=(keys.rate_tat(name),))

    @classmethod
    def status(cls, queue: Any, connection: Redis | None = None) -> RateStatus | None:
        """How many starts ``queue`` allows now and when the next one is allowed; None when it has no rate and no
        back-off. The state reading of the admin API (:mod:`rq_policies.engine.admin`)."""
        name, conn = queue_target(queue, connection)
        with conn.pipeline(transaction=False) as pipe:
            time_in(pipe)
            pipe.hget(keys.RATE, name)
            pipe.get(keys.rate_tat(name))
            pipe.zscore(keys.BACKOFF, name)
            (seconds, micros), raw, tat, blocked = pipe.execute()
        return rate_status(parse(raw), tat, blocked, seconds + micros / 1e6)

    @classmethod
    def backoff(cls, queue: Any, seconds: float, connection: Redis | None = None) -> float:
        """Block ``queue`` for ``seconds`` (server clock), as a job raising :class:`BackOff` does; a block that
        already ends later is kept. Returns the server time the block ends."""
        name = queue_name(queue)
        delay = BackOff(seconds).seconds
        conn = _need(connection)
        with conn.pipeline(transaction=False) as pipe:
            _backoff_in(pipe, name, delay, _server_now(conn))
            pipe.execute()
        return float(conn.zscore(keys.BACKOFF, name) or 0.0)

    # -- the fetch (lua/policies/queue_rate.lua) ------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key('queue_rate.settings', keys.RATE)
        call.key('queue_rate.backoff', keys.BACKOFF)
        call.key_list('queue_rate.tat', [keys.rate_tat(name) for name in queue_names])

    # -- a job raised Snooze or BackOff ---------------------------------------------------------------------------

    @classmethod
    def on_job_exception(cls, job: Any, queue: Any, exc: BaseException, pipeline: Any) -> bool:
        if isinstance(exc, Snooze):
            count = int(job.meta.get(SNOOZES_META, 0)) + 1
            if count > exc.max_snoozes:
                raise SnoozeLimitReached(
                    f'job {job.id} raised Snooze({exc.seconds:g}) after {count - 1} snoozes: max_snoozes='
                    f'{exc.max_snoozes} reached, so it fails'
                ) from exc
            job.meta[SNOOZES_META] = count
            # the server's clock, as the fetch that promotes the job reads it: no host clock decides when it is due.
            # rq's scheduled registry keeps whole seconds (it truncates), so round up: never due before `seconds`.
            due = math.ceil(_server_now(queue.connection) + exc.seconds)
            when = datetime.fromtimestamp(due, timezone.utc)
            queue.schedule_job(job, when, pipeline=pipeline)  # saves the job, meta included
            return True
        if isinstance(exc, BackOff) and not exc.key:  # BackOff(key=True) is the per-key policies'
            job.meta[BACKOFFS_META] = int(job.meta.get(BACKOFFS_META, 0)) + 1
            _backoff_in(pipeline, queue.name, exc.seconds, _server_now(queue.connection))
            compat.enqueue_now(queue, job, pipeline=pipeline, at_front=True)  # saves the job, meta included
            return True
        return False

def parse(raw: Any) -> QueueRate | None:
    """A stored setting (``'<limit> <per> <burst>'``, or with several windows each word a comma-separated list:
    :func:`rq_policies.engine.admin.rate_setting`) as a QueueRate, or None (none, or not one)."""
    windows = read_rate(raw)
    return None if windows is None else QueueRate(windows=windows)


def _backoff_in(pipe: Any, name: str, seconds: float, now: float) -> None:
    """Queue onto ``pipe`` a block of queue ``name`` until ``now + seconds``, kept when one ends later (ZADD GT)."""
    pipe.zadd(keys.BACKOFF, {name: round(now + seconds, 6)}, gt=True)
    pipe.zremrangebyscore(keys.BACKOFF, '-inf', f'({now:.6f}')


