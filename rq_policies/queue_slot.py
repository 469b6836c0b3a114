"""QueueSlot: at most N jobs of a queue running across the whole cluster, crash-safe.

Why a ledger and not a counter: INCR on fetch and DECR on completion is right until a holder is SIGKILLed between the
two; then the count never comes back down and the queue runs one job short forever. A TTL on the counter trades that
for the mirror bug: the whole count expires at once while jobs still run. So the ledger holds the *holders*, one
ZSET member each (``rq:policies:slots:<queue>``, member = claim token, score = epoch second the hold expires):

* a killed holder stops refreshing and its member ages out within :attr:`QueueSlot.TTL_SECONDS`, with no operator
  action;
* a release names one member, so a release arriving after its own hold expired frees nothing instead of a slot that
  has since been handed to someone else;
* a claim token (``<host>:<pid>:<tid>:<n>``) names one claim, so a stale release from an earlier job of the same
  thread can never take the live job's hold.

Holds are refreshed on the worker's heartbeat (:meth:`QueueSlot.refresh_in`), and a refresh never revives a hold that
already expired. The cap itself is stored in Redis (``rq:policies:capacity``), so every worker in the cluster obeys
the same number and an operator changes it without a deploy.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, ClassVar

from redis import Redis

from . import keys, scripts
from .policy import MAX_CAPACITY, FetchPolicy, positive_int, whole_seconds

#: Payloads published on ``rq:policies:wake:<queue>`` besides a pushed job's id (see ``lua/enqueue_job.lua``). A
#: waiting worker treats a push to a queue it found full as no news; these two always wake it.
WAKE_RELEASED = 'released'
WAKE_CAPACITY = 'capacity'


def queue_name(value: Any) -> str:
    """Accept a queue name or an rq Queue; refuse anything else."""
    name = getattr(value, 'name', value)
    if not isinstance(name, str) or not name:
        raise ValueError(f'queue must be a non-empty queue name or an rq Queue, got {value!r}')
    return name


class _Held:
    """The holds this process has right now: claim token -> ledger key. The heartbeat refreshes from it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds: dict[str, str] = {}
        self._pid = os.getpid()

    def _check_fork(self) -> None:
        # A forked child does not own its parent's holds: the parent refreshes and releases them.
        if self._pid != os.getpid():
            self._holds = {}
            self._pid = os.getpid()
            self._lock = threading.Lock()

    def add(self, token: str, ledger: str) -> None:
        self._check_fork()
        with self._lock:
            self._holds[token] = ledger

    def discard(self, token: str) -> None:
        self._check_fork()
        with self._lock:
            self._holds.pop(token, None)

    def snapshot(self) -> dict[str, str]:
        self._check_fork()
        with self._lock:
            return dict(self._holds)


class QueueSlot(FetchPolicy):
    """The slot ledger on its own: capacity, holds, tokens. Fetching under a cap is PolicyWorker's job.

    A fetch policy whose settings live in Redis (the cap per queue), so it is used through classmethods rather than
    declared on a function.
    """

    name: ClassVar[str] = 'queue_slot'

    #: Seconds a hold survives unrefreshed. rq's worker beats every ``job_monitoring_interval`` (30 s by default)
    #: while a job runs and gives its own key ``job_monitoring_interval + 60`` seconds; a hold outlives a missed beat
    #: by exactly as much (pinned by a test). Shorter and a busy worker's holds evaporate under a slow Redis while
    #: its jobs run; longer and a killed worker's capacity comes back later than the worker leaves the dashboard.
    TTL_SECONDS: int = 90

    #: The process-wide registry of live holds, refreshed by :meth:`refresh_in`.
    HELD = _Held()

    _local = threading.local()

    # -- capacity -------------------------------------------------------------------------------------------------

    @classmethod
    def set_capacity(cls, queue: Any, capacity: int, connection: Redis | None = None) -> None:
        """Cap ``queue`` at ``capacity`` running jobs across the cluster (stored in Redis; every worker obeys it).

        Lowering the cap below the holds in use stops admissions until enough of them end; it never stops a job.
        Idle PolicyWorkers are woken, so a raised cap is used at once.
        """
        name = queue_name(queue)
        positive_int('capacity', capacity, MAX_CAPACITY)
        with _need(connection).pipeline(transaction=False) as pipe:
            pipe.hset(keys.CAPACITY, name, capacity)
            pipe.publish(keys.wake(name), WAKE_CAPACITY)
            pipe.execute()

    @classmethod
    def capacity(cls, queue: Any, connection: Redis | None = None) -> int | None:
        """The cap of ``queue``, or None when it is uncapped."""
        raw = _need(connection).hget(keys.CAPACITY, queue_name(queue))
        return int(raw) if raw is not None else None

    @classmethod
    def clear_capacity(cls, queue: Any, connection: Redis | None = None) -> bool:
        """Uncap ``queue``. Live holds stay until released or expired; they no longer limit anything.

        Returns:
            True when the queue had a cap.
        """
        name = queue_name(queue)
        with _need(connection).pipeline(transaction=False) as pipe:
            pipe.hdel(keys.CAPACITY, name)
            pipe.publish(keys.wake(name), WAKE_CAPACITY)
            removed, _ = pipe.execute()
        return bool(removed)

    @classmethod
    def in_use(cls, queue: Any, connection: Redis | None = None) -> int:
        """Live holds of ``queue`` (a gauge for humans and tests; admission counts under the script's own clock)."""
        conn = _need(connection)
        seconds, micros = conn.time()
        return int(conn.zcount(keys.slots(queue_name(queue)), f'({seconds + micros / 1e6:.6f}', '+inf'))

    @classmethod
    def holders(cls, queue: Any, connection: Redis | None = None) -> list[tuple[str, float]]:
        """Live holds of ``queue`` as ``(claim token, seconds to expiry)``, soonest to expire first."""
        connection = _need(connection)
        seconds, micros = connection.time()
        now = seconds + micros / 1e6
        rows = connection.zrangebyscore(keys.slots(queue_name(queue)), f'({now:.6f}', '+inf', withscores=True)
        return [(member.decode() if isinstance(member, bytes) else member, score - now) for member, score in rows]

    # -- the ledger -----------------------------------------------------------------------------------------------

    @classmethod
    def acquire(
        cls,
        queue: Any,
        capacity: int,
        ttl: int = TTL_SECONDS,
        token: str | None = None,
        connection: Redis | None = None,
    ) -> bool:
        """Take one of ``queue``'s slots, or report that the cluster is at capacity.

        Replay-safe: a retried call whose first attempt landed finds its own member and answers True again (and
        refreshes it), never counting itself twice. A taken hold joins :attr:`HELD`, so :meth:`refresh_in` keeps it
        live until :meth:`release`.

        Args:
            queue: queue name or Queue.
            capacity: the cluster-wide ceiling, a positive integer.
            ttl: seconds the hold survives unrefreshed, a positive integer.
            token: the holder; defaults to this thread's :meth:`token`.
            connection: the Redis connection.

        Returns:
            True when the caller now holds a slot.
        """
        name = queue_name(queue)
        limit = positive_int('capacity', capacity, MAX_CAPACITY)
        seconds = whole_seconds('ttl', ttl)
        holder = _holder(token)
        conn = _need(connection)
        taken = scripts.run('queue_slot_acquire', conn, [keys.slots(name)], [limit, holder, seconds]) == 1
        if taken:
            # A hold this process has: refresh_in keeps it live (a PolicyWorker's heartbeat does) until released.
            cls.HELD.add(holder, keys.slots(name))
        return taken

    @classmethod
    def release(cls, queue: Any, token: str | None = None, connection: Redis | Any = None) -> bool:
        """Give back a hold. Idempotent: it only ever removes this holder's own member.

        A bare ZREM (plus a wake-up for idle workers) so it can ride a pipeline: pass a pipeline as ``connection``
        and the release goes out with it (the return value is then True: the answer arrives with ``execute()``).
        A hold that already expired is simply absent, so a late release frees nothing that someone else holds now.

        Returns:
            True when the hold was still in the ledger.
        """
        name = queue_name(queue)
        holder = _holder(token)
        conn = _need(connection)
        if _is_pipeline(conn):
            conn.zrem(keys.slots(name), holder)
            conn.publish(keys.wake(name), WAKE_RELEASED)
            cls.HELD.discard(holder)
            return True
        with conn.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.slots(name), holder)
            pipe.publish(keys.wake(name), WAKE_RELEASED)
            removed, _ = pipe.execute()
        cls.HELD.discard(holder)
        return removed == 1

    @classmethod
    def refresh_in(cls, pipeline: Any, ttl: int = TTL_SECONDS) -> None:
        """Queue a refresh of every hold this process has onto a pipeline the caller already owns.

        One EVALSHA covering every hold; it touches nothing when nothing is held, which is every process in an
        install that caps nothing. A hold that already expired is not revived (see ``lua/refresh_slots.lua``).
        """
        seconds = whole_seconds('ttl', ttl)
        held = cls.HELD.snapshot()
        if not held:
            return
        tokens = list(held)
        scripts.run('refresh_slots', pipeline, [held[t] for t in tokens], [seconds, *tokens])

    # -- tokens ---------------------------------------------------------------------------------------------------

    @classmethod
    def token(cls) -> str:
        """This thread's holder token, ``<host>:<pid>:<tid>``; rebuilt after a fork, so a child never shares it."""
        local = cls._local
        pid = os.getpid()
        memo = getattr(local, 'token', None)
        if memo is not None and memo[0] == pid:
            return memo[1]
        built = f'{socket.gethostname()}:{pid}:{threading.get_ident()}'
        local.token = (pid, built)
        local.seq = 0
        return built

    @classmethod
    def claim_token(cls) -> str:
        """A token naming one claim, ``<host>:<pid>:<tid>:<n>``: a stale release of an earlier claim frees nothing."""
        base = cls.token()
        cls._local.seq = getattr(cls._local, 'seq', 0) + 1
        return f'{base}:{cls._local.seq}'


def _need(connection: Any) -> Any:
    if connection is None:
        raise ValueError('connection is required: pass connection=Redis(...)')
    return connection


def _holder(token: Any) -> str:
    if token is None:
        return QueueSlot.token()
    if not isinstance(token, str) or not token:
        raise ValueError(f'token must be a non-empty string, got {token!r}')
    return token


def _is_pipeline(conn: Any) -> bool:
    return hasattr(conn, 'execute') and hasattr(conn, 'command_stack')
