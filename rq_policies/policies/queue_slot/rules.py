"""QueueSlot: at most N jobs of a queue running across the whole cluster, crash-safe.

The count is a hold ledger per queue (``rq:policies:slots:<queue>``: claim token -> the epoch second its hold expires,
:mod:`rq_policies.engine.ledger`), taken in the script that pops the job (``lua/policies/queue_slot.lua``), refreshed
on the worker's heartbeat and released on every exit path; a killed holder's hold ages out within
:attr:`QueueSlot.TTL_SECONDS`, with no reaper. The cap lives in Redis (``rq:policies:capacity``), so every worker obeys
the same number and an operator changes it without a deploy. docs/queue-slot.md.
"""

from __future__ import annotations

from typing import Any, ClassVar

from redis import Redis

from rq_policies.engine import keys, ledger
from rq_policies.engine.admin import (
    Cap,
    SlotStatus,
    deprecated,
    queue_name,
    queue_target,
    refusing,
    warn_unknown_queue,
    write_queue_setting,
)
from rq_policies.engine.exceptions import InvalidArgument
from rq_policies.engine.ledger import WAKE_CAPACITY, WAKE_RELEASED, Hold
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import text, time_in
from rq_policies.engine.policy import MAX_CAPACITY, FetchPolicy, positive_int, whole_seconds

__all__ = ['WAKE_CAPACITY', 'WAKE_RELEASED', 'QueueSlot', 'queue_name']


class QueueSlot(FetchPolicy):
    """A queue's hold ledger on its own: capacity, holds, tokens. Fetching under a cap is PolicyWorker's job.

    A fetch policy whose settings live in Redis (the cap per queue), so it is used through classmethods rather than
    declared on a function: :meth:`set`, :meth:`get`, :meth:`clear` and :meth:`status`, the shape every run-time
    setting has (:mod:`rq_policies.engine.admin`).
    """

    name: ClassVar[str] = 'queue_slot'
    #: No queue is capped while the capacity hash is absent.
    fetch_state: ClassVar[tuple[str, ...] | None] = ('queue_slot.capacity',)
    queue_settings: ClassVar[str | None] = keys.CAPACITY

    #: Seconds a hold survives unrefreshed (:data:`rq_policies.engine.ledger.TTL_SECONDS`: rq's heartbeat margin).
    TTL_SECONDS: int = ledger.TTL_SECONDS

    #: Deprecated alias of :data:`rq_policies.engine.ledger.PROCESS` (the holds this process has, refreshed by
    #: :meth:`refresh_in`): one name for one thing; kept for code that reads it.
    HELD = ledger.PROCESS

    # -- capacity -------------------------------------------------------------------------------------------------

    @classmethod
    def set(cls, queue: Any, capacity: int, connection: Redis | None = None) -> Cap:
        """Cap ``queue`` (a name or a Queue) at ``capacity`` running jobs across the cluster (stored in Redis: every
        worker obeys it). Lowering it below the holds in use stops admissions until enough of them end; it never stops
        a job. Idle PolicyWorkers are woken, so a raised cap is used at once. Returns the :class:`Cap` now set; errors
        and the unknown-queue warning are the admin API's (:mod:`rq_policies.engine.admin`, docs/admin.md).
        """
        with refusing():
            name = queue_name(queue)
            positive_int('capacity', capacity, MAX_CAPACITY)
            conn = _need(connection)
        warn_unknown_queue(conn, name, 'QueueSlot.set')
        write_queue_setting(conn, keys.CAPACITY, name, capacity)
        return Cap(capacity)

    @classmethod
    def get(cls, queue: Any, connection: Redis | None = None) -> Cap | None:
        """The cap of ``queue``, or None when it is uncapped."""
        name, conn = queue_target(queue, connection)
        raw = conn.hget(keys.CAPACITY, name)
        return Cap(int(raw)) if raw is not None else None

    @classmethod
    def clear(cls, queue: Any, connection: Redis | None = None) -> bool:
        """Uncap ``queue``: True when it had a cap. Live holds stay until released or expired; they no longer limit
        anything."""
        name, conn = queue_target(queue, connection)
        return write_queue_setting(conn, keys.CAPACITY, name, None)

    @classmethod
    def status(cls, queue: Any, connection: Redis | None = None) -> SlotStatus:
        """The cap of ``queue`` and its live holds now (server clock), read in one round trip."""
        name, conn = queue_target(queue, connection)
        with conn.pipeline(transaction=False) as pipe:
            time_in(pipe)
            pipe.hget(keys.CAPACITY, name)
            (seconds, micros), raw = pipe.execute()
        now = seconds + micros / 1e6
        rows = conn.zrangebyscore(keys.holds(name), f'({now:.6f}', '+inf', withscores=True)
        holders = tuple((text(member), score - now) for member, score in rows)
        return SlotStatus(int(raw) if raw is not None else None, len(holders), holders)

    # -- the 0.2 names (deprecated, removed in 0.4) ----------------------------------------------------------------

    @classmethod
    @deprecated('QueueSlot.set(queue, capacity, connection=)')
    def set_capacity(cls, queue: Any, capacity: int, connection: Redis | None = None) -> None:
        """Deprecated: :meth:`set` (which returns the :class:`Cap`)."""
        cls.set(queue, capacity, connection=connection)

    @classmethod
    @deprecated('QueueSlot.get(queue, connection=), which returns a Cap or None')
    def capacity(cls, queue: Any, connection: Redis | None = None) -> int | None:
        """Deprecated: :meth:`get`."""
        cap = cls.get(queue, connection=connection)
        return cap.capacity if cap is not None else None

    @classmethod
    @deprecated('QueueSlot.clear(queue, connection=)')
    def clear_capacity(cls, queue: Any, connection: Redis | None = None) -> bool:
        """Deprecated: :meth:`clear`."""
        return cls.clear(queue, connection=connection)

    @classmethod
    @deprecated('QueueSlot.status(queue, connection=).in_use')
    def in_use(cls, queue: Any, connection: Redis | None = None) -> int:
        """Deprecated: :meth:`status` ``.in_use``."""
        return cls.status(queue, connection=connection).in_use

    @classmethod
    @deprecated('QueueSlot.status(queue, connection=).holders')
    def holders(cls, queue: Any, connection: Redis | None = None) -> list[tuple[str, float]]:
        """Deprecated: :meth:`status` ``.holders``."""
        return list(cls.status(queue, connection=connection).holders)

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
        """Take a hold on ``queue``, or report that the cluster is at capacity.

        Replay-safe: a retried call whose first attempt landed finds its own member and answers True again (and
        refreshes it), never counting itself twice. A taken hold joins :data:`rq_policies.engine.ledger.PROCESS`, so
        :meth:`refresh_in` keeps it live until :meth:`release`.

        Args:
            queue: queue name or Queue.
            capacity: the cluster-wide ceiling, a positive integer.
            ttl: seconds the hold survives unrefreshed, a positive integer.
            token: the holder; defaults to this thread's :meth:`token`.
            connection: the Redis connection.

        Returns:
            True when the caller now has a hold.
        """
        name = queue_name(queue)
        limit = positive_int('capacity', capacity, MAX_CAPACITY)
        seconds = whole_seconds('ttl', ttl)
        # A taken hold joins ledger.PROCESS: refresh_in keeps it live (a PolicyWorker's heartbeat does) until released.
        return ledger.PROCESS.acquire(_need(connection), Hold(keys.holds(name), _holder(token), seconds), limit)

    @classmethod
    def release(cls, queue: Any, token: str | None = None, connection: Redis | Any = None) -> bool:
        """Give back a hold. Idempotent: it only ever removes this holder's own member.

        A bare ZREM (plus a wake-up for idle workers) so it can ride a pipeline: pass a pipeline as ``connection``
        and the release goes out with it (the return value is then True: the answer arrives with ``execute()``).
        A hold that already expired is simply absent, so a late release frees nothing that someone else holds now.

        Returns:
            True when the hold was still in the ledger (a replay after a lost reply answers what the first attempt
            found: lua/release_hold.lua).
        """
        name = queue_name(queue)
        hold = Hold(keys.holds(name), _holder(token), cls.TTL_SECONDS)
        return ledger.PROCESS.release(_need(connection), hold, wake=keys.wake(name), answered=True)

    @classmethod
    def refresh_in(cls, pipeline: Any, ttl: int = TTL_SECONDS) -> None:
        """Queue a refresh of every hold this process has onto a pipeline the caller already owns.

        One EVALSHA covering every hold; it touches nothing when nothing is held, which is every process in an
        install that caps nothing. A hold found lapsed is re-added and counted (see ``lua/refresh_holds.lua``).
        """
        ledger.PROCESS.refresh_in(pipeline, ttl=whole_seconds('ttl', ttl))

    # -- the fetch (lua/policies/queue_slot.lua) ------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key('queue_slot.capacity', keys.CAPACITY)
        call.key_list('queue_slot.holds', [keys.holds(name) for name in queue_names])

    # -- reading --------------------------------------------------------------------------------------------------

    @classmethod
    def gauges(cls, connection: Any, names: list[str], now: float) -> list[dict[str, Any]]:
        """Per queue with a cap or a live hold: ``{'queue', 'capacity' (int or None), 'in_use'}`` (cheap: a scrape)."""
        capacity = {text(k): int(v) for k, v in connection.hgetall(keys.CAPACITY).items()}
        names = sorted(set(names) | set(capacity))
        with connection.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zcount(keys.holds(name), f'({now:.6f}', '+inf')
            counts = pipe.execute()
        return [
            {'queue': name, 'capacity': capacity.get(name), 'in_use': int(count)}
            for name, count in zip(names, counts)
            if name in capacity or count
        ]

    # -- tokens ---------------------------------------------------------------------------------------------------

    @classmethod
    def token(cls) -> str:
        """This thread's holder token, ``<host>:<pid>:<tid>``; rebuilt after a fork, so a child never shares it."""
        return ledger.token()

    @classmethod
    def claim_token(cls) -> str:
        """A token naming one claim, ``<host>:<pid>:<tid>:<n>``: a stale release of an earlier claim frees nothing."""
        return ledger.claim_token()



def _holder(token: Any) -> str:
    if token is None:
        return QueueSlot.token()
    if not isinstance(token, str) or not token:
        raise InvalidArgument('token', message=f'token must be a non-empty string, got {token!r}')
    return token
