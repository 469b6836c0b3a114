"""QueueSlot: at most N jobs of a queue running across the whole cluster, crash-safe.

The count is a hold ledger (:mod:`rq_policies.engine.ledger`: why a ledger and not a counter), one per queue
(``rq:policies:slots:<queue>``, member = claim token, score = epoch second the hold expires). A PolicyWorker takes a
hold in the same script that pops the job (``lua/fetch.lua``, this policy's part ``lua/policies/queue_slot.lua``):

* a killed holder stops refreshing and its hold ages out within :attr:`QueueSlot.TTL_SECONDS`, with no operator
  action;
* a release names one hold, so a release arriving after its own hold expired frees nothing instead of a hold that has
  since been handed to someone else;
* a claim token (``<host>:<pid>:<tid>:<n>``) names one claim, so a stale release from an earlier job of the same
  thread can never take the live job's hold.

Holds are refreshed on the worker's heartbeat (:meth:`QueueSlot.refresh_in`) while their jobs run; a hold the refresh
finds lapsed (a stall longer than its ttl, a restart without persistence) is re-added, counted and logged, so a
running job is always counted again. The cap itself is stored in Redis (``rq:policies:capacity``), so every worker in
the cluster obeys the same number and an operator changes it without a deploy.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

from redis import Redis

from rq_policies.engine import keys, ledger
from rq_policies.engine.admin import Cap, SlotStatus, clear_setting, deprecated, refusing, warn_unknown_queue
from rq_policies.engine.exceptions import UnknownQueueWarning
from rq_policies.engine.ledger import WAKE_CAPACITY, WAKE_RELEASED, Hold, wake_up
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import text, time_in
from rq_policies.engine.policy import MAX_CAPACITY, FetchPolicy, positive_int, whole_seconds
from rq_policies.engine.views import (
    Argument,
    BadArgument,
    Cell,
    Digits,
    Explanation,
    Metric,
    Panel,
    Reply,
    Row,
    Section,
    Setting,
    Shown,
    Values,
    View,
)

__all__ = ['WAKE_CAPACITY', 'WAKE_RELEASED', 'QueueSlot', 'queue_name']


def queue_name(value: Any) -> str:
    """Accept a queue name or an rq Queue; refuse anything else."""
    name = getattr(value, 'name', value)
    if not isinstance(name, str) or not name:
        raise ValueError(f'queue must be a non-empty queue name or an rq Queue, got {value!r}')
    return name


@dataclass(frozen=True)
class SlotHold:
    """A live hold of a queue's cap, as ``info`` shows it: its holder token and the seconds until it expires."""

    holder: str
    expires_in: float


@dataclass(frozen=True)
class SlotState(Section):
    """QueueSlot's part of a queue in ``rq-policies info``: its cap (None: uncapped), how many holds are live, and
    the holds listed (at most ``--limit``); ``--json`` shows these fields as they are named."""

    capacity: int | None
    holds_in_use: int
    holds: list[SlotHold]

    def headline(self) -> str:
        if self.capacity is not None:
            return f'cap {self.capacity}, {self.holds_in_use} in use'
        return f'uncapped, {self.holds_in_use} holds'

    def rows(self, shown: Shown) -> list[Row | str]:
        from rq_policies.engine.readable import in_seconds

        lines: list[Row | str] = [Row('hold', f'{hold.holder:<36} expires {in_seconds(hold.expires_in)}')
                                  for hold in self.holds]
        if self.holds_in_use > len(self.holds):
            lines.append(f'  ... and {self.holds_in_use - len(self.holds)} more (--limit 0 lists all)')
        return lines


class QueueSlot(FetchPolicy):
    """A queue's hold ledger on its own: capacity, holds, tokens. Fetching under a cap is PolicyWorker's job.

    A fetch policy whose settings live in Redis (the cap per queue), so it is used through classmethods rather than
    declared on a function: :meth:`set`, :meth:`get`, :meth:`clear` and :meth:`status`, the shape every run-time
    setting has (:mod:`rq_policies.engine.admin`).
    """

    name: ClassVar[str] = 'queue_slot'
    #: No queue is capped while the capacity hash is absent (see :attr:`FetchPolicy.fetch_state`).
    fetch_state: ClassVar[tuple[str, ...] | None] = ('queue_slot.capacity',)

    #: Seconds a hold survives unrefreshed (:data:`rq_policies.engine.ledger.TTL_SECONDS`: rq's heartbeat margin).
    TTL_SECONDS: int = ledger.TTL_SECONDS

    #: Deprecated alias of :data:`rq_policies.engine.ledger.PROCESS` (the holds this process has, refreshed by
    #: :meth:`refresh_in`): one name for one thing; kept for code that reads it.
    HELD = ledger.PROCESS

    # -- capacity -------------------------------------------------------------------------------------------------

    @classmethod
    def set(cls, queue: Any, capacity: int, connection: Redis | None = None) -> Cap:
        """Cap ``queue`` at ``capacity`` running jobs across the cluster (stored in Redis; every worker obeys it).

        Lowering the cap below the holds in use stops admissions until enough of them end; it never stops a job.
        Idle PolicyWorkers are woken, so a raised cap is used at once. The admin API's shape
        (:mod:`rq_policies.engine.admin`): ``set``/``get``/``clear``/``status``.

        Args:
            queue: queue name or Queue.
            capacity: running jobs at most, a positive integer.
            connection: the Redis connection.

        Returns:
            The cap now set.

        Raises:
            InvalidSetting: (a ValueError) naming the argument and the value; nothing is written.

        Warns:
            UnknownQueueWarning: ``queue`` is unknown to rq, to every policy setting and to every live worker (perhaps
                a typo); the cap is set anyway (``rq-policies cap`` refuses it without ``--force``).
        """
        with refusing():
            name = queue_name(queue)
            positive_int('capacity', capacity, MAX_CAPACITY)
            conn = _need(connection)
        warn_unknown_queue(conn, name, 'QueueSlot.set')
        with conn.pipeline(transaction=False) as pipe:
            pipe.hset(keys.CAPACITY, name, capacity)
            wake_up(pipe, keys.wake(name), WAKE_CAPACITY)
            pipe.execute()
        return Cap(capacity)

    @classmethod
    def get(cls, queue: Any, connection: Redis | None = None) -> Cap | None:
        """The cap of ``queue``, or None when it is uncapped."""
        with refusing():
            name = queue_name(queue)
            conn = _need(connection)
        raw = conn.hget(keys.CAPACITY, name)
        return Cap(int(raw)) if raw is not None else None

    @classmethod
    def clear(cls, queue: Any, connection: Redis | None = None) -> bool:
        """Uncap ``queue``. Live holds stay until released or expired; they no longer limit anything.

        Returns:
            True when the queue had a cap.
        """
        with refusing():
            name = queue_name(queue)
            conn = _need(connection)
        return clear_setting(conn, keys.CAPACITY, name, keys.wake(name), WAKE_CAPACITY)

    @classmethod
    def status(cls, queue: Any, connection: Redis | None = None) -> SlotStatus:
        """The cap of ``queue`` and its live holds now (server clock), read in one round trip."""
        with refusing():
            name = queue_name(queue)
            conn = _need(connection)
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

    @classmethod
    def fetch_hold(cls, queue_name: str, token: str, ttl: int) -> Hold:
        return Hold(keys.holds(queue_name), token, ttl)

    # -- the contract suite's settings ----------------------------------------------------------------------------

    @classmethod
    def configure(cls, connection: Any, queue: str, **settings: Any) -> None:
        cls.set(queue, connection=connection, **settings)

    @classmethod
    def unconfigure(cls, connection: Any, queue: str) -> None:
        cls.clear(queue, connection=connection)

    @classmethod
    def setting_examples(cls) -> tuple[dict[str, Any], ...]:
        return ({'capacity': 1},)

    # -- state, metrics, the CLI -----------------------------------------------------------------------------------

    @classmethod
    def configured_queues(cls, connection: Any) -> set[str]:
        return {text(name) for name in connection.hkeys(keys.CAPACITY)}

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

    @classmethod
    def queue_info(cls, connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, Section]:
        return dict(cls.slot_states(connection, names, now, limit))

    @classmethod
    def slot_states(cls, connection: Redis, names: list[str], now: float,
                    limit: int | None) -> dict[str, SlotState]:
        """Per queue name, its cap, live holds and the holds listed (at most ``limit``; None: all): what ``info``
        and the dashboard show."""
        capacity = {text(k): int(v) for k, v in connection.hgetall(keys.CAPACITY).items()}
        with connection.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zrangebyscore(keys.holds(name), f'({now:.6f}', '+inf', withscores=True)
            replies = pipe.execute()
        out: dict[str, SlotState] = {}
        for name, rows in zip(names, replies):
            holds = [SlotHold(text(m), round(score - now, 3)) for m, score in rows]
            out[name] = SlotState(capacity.get(name), len(holds), holds[:limit] if limit else holds)
        return out

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[Explanation]:
        queue = job.get('origin')
        if not queue:
            return []
        with connection.pipeline(transaction=False) as pipe:
            pipe.hget(keys.CAPACITY, queue)
            pipe.zrangebyscore(keys.holds(queue), f'({now:.6f}', '+inf', withscores=True)
            cap, rows = pipe.execute()
        if cap is None:
            return []
        cap = int(cap)
        holders = [(text(member), round(score - now, 1)) for member, score in rows]
        entry: dict[str, Any] = {'capacity': cap, 'in_use': len(holders),
                                 'holders': [{'token': t, 'expires_in': e} for t, e in holders]}
        listed = ', '.join(f'{t} (expires in {e} s)' for t, e in holders[:5]) + (' ...' if len(holders) > 5 else '')
        if job.get('status') == 'queued' and len(holders) >= cap:
            verdict = f'queue at cap {len(holders)}/{cap}, holders: {listed}'
            change = 'a hold is released when its job ends (a dead worker\'s expires by itself), or raise ' \
                              'the cap (rq-policies cap)'
        else:
            verdict = f'queue cap {cap}, {len(holders)} in use' + (f': {listed}' if holders else '')
            change = ''
        return [Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[Metric]:
        from rq_policies.surfaces import state

        in_use = Metric('rq_policies_queue_slots_in_use',
                        'Live QueueSlot holds of a queue (jobs running under its cap).', ('queue',))
        capacity = Metric('rq_policies_queue_slots_capacity', 'Cluster-wide QueueSlot cap of a queue.', ('queue',))
        for row in cls.gauges(connection, state.queue_names(connection), now):
            in_use.add([row['queue']], row['in_use'])
            if row['capacity'] is not None:
                capacity.add([row['queue']], row['capacity'])
        return [in_use, capacity]

    @classmethod
    def commands(cls) -> tuple[View, ...]:
        """``rq-policies cap``."""
        return (Setting(
            'cap', 'Cap QUEUE at N jobs running across the cluster, remove its cap with --clear, or show it (no N).',
            targets=(Argument('queue'),),
            value=Argument('n', kind=Digits(f'a positive integer up to {MAX_CAPACITY}', 1, MAX_CAPACITY)),
            clear_help='Remove the cap (live holds stay until released or expired).',
            force_help='Cap a queue rq does not know yet.',
            json_help='Print the cap and the holds in use as JSON.',
            prepare=_cap_prepare, status=_cap_status, set=_cap_set, clear=_cap_clear,
        ),)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """The dashboard's holds panel: per queue with a cap or a hold, the cap, the holds in use and each hold
        (holder, the job its worker runs, seconds to expiry). A hold past its expiry still in the ledger is
        *expired*: its holder stopped refreshing (killed, or stalled longer than the ttl); it no longer counts
        against the cap, and a fetch purges it when the ledger reaches its cap (or now and then once it holds 100
        holds: lua/policies/queue_slot.lua). It is shown greyed, as expired, until then: nothing is wrong
        (a hold that ages out is the crash path working), and a running job's lapsed hold is re-added and counted
        by its worker's next heartbeat (``rq_policies_hold_lapses_total`` counts those)."""
        from rq_policies.surfaces import state

        names = [name for name in state.queue_names(connection) if not search or search in name]
        live = cls.slot_states(connection, names, now, limit)
        with connection.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.zrangebyscore(keys.holds(name), '-inf', f'{now:.6f}', start=0, num=limit, withscores=True)
            lapsed_rows = dict(zip(names, pipe.execute()))
        queues, holds, shown = [], [], 0
        for name in names:
            entry = live[name]
            lapsed = [(text(member), score) for member, score in lapsed_rows[name]]
            if entry.capacity is None and not entry.holds_in_use and not lapsed:
                continue
            in_use = entry.holds_in_use
            queues.append([name, entry.capacity, in_use, len(lapsed)])
            for token, score in lapsed:
                holds.append([name, token, None, Cell('expired (no longer counts)', at=score - now, expired=True)])
            for hold in entry.holds:
                holds.append([name, hold.holder, None, Cell(at=hold.expires_in)])
            shown += in_use + len(lapsed)
        holds = holds[:limit]
        jobs = _running_jobs(connection, [row[1] for row in holds])
        for row in holds:
            job_id = jobs.get(row[1].rsplit(':', 2)[0])
            row[2] = Cell(job_id, job=job_id) if job_id else None
        if not queues:
            return []
        out = [Panel('Queue caps (QueueSlot)', ['queue', 'cap', 'in use', 'expired holds (not counted)'], queues)]
        if holds:
            out.append(Panel('Holds (QueueSlot)', ['queue', 'holder', 'job', 'expires'], holds,
                             f'{len(holds)} of {shown} holds listed' if shown > len(holds) else ''))
        return out

    # -- tokens ---------------------------------------------------------------------------------------------------

    @classmethod
    def token(cls) -> str:
        """This thread's holder token, ``<host>:<pid>:<tid>``; rebuilt after a fork, so a child never shares it."""
        return ledger.token()

    @classmethod
    def claim_token(cls) -> str:
        """A token naming one claim, ``<host>:<pid>:<tid>:<n>``: a stale release of an earlier claim frees nothing."""
        return ledger.claim_token()



def _cap_prepare(values: Values, mode: str) -> Values:
    try:
        queue_name(values['queue'])
    except ValueError as exc:
        raise BadArgument(str(exc), 'QUEUE') from None
    return values


def _cap_status(conn: Redis, values: Values) -> Reply:
    queue = str(values['queue'])
    status = QueueSlot.status(queue, connection=conn)
    if values['as_json']:
        return Reply(data={'queue': queue, 'capacity': status.capacity, 'in_use': status.in_use})
    if status.capacity is None:
        return Reply((f'Queue {queue!r} is uncapped ({status.in_use} hold(s) in use).',))
    return Reply((f'Queue {queue!r} is capped at {status.capacity}, {status.in_use} in use.',))


def _cap_set(conn: Redis, values: Values) -> Reply:
    queue, n = str(values['queue']), values['n']
    before = QueueSlot.get(queue, connection=conn)
    with warnings.catch_warnings():  # refused unless --force: the operator meant it
        warnings.simplefilter('ignore', UnknownQueueWarning)
        QueueSlot.set(queue, n, connection=conn)
    return _cap_changed(conn, values, before, f'Queue {queue!r} is capped at {n}')


def _cap_clear(conn: Redis, values: Values) -> Reply:
    queue = str(values['queue'])
    before = QueueSlot.get(queue, connection=conn)
    QueueSlot.clear(queue, connection=conn)
    return _cap_changed(conn, values, before, f'Queue {queue!r} is uncapped')


def _cap_changed(conn: Redis, values: Values, before: Cap | None, words: str) -> Reply:
    if values['as_json']:
        now = QueueSlot.get(str(values['queue']), connection=conn)
        return Reply(data={'queue': values['queue'], 'capacity': now.capacity if now else None,
                           'was': before.capacity if before else None})
    was = f'was {before.capacity}' if before is not None else 'was uncapped'
    return Reply((f'{words} ({was}).',))


def _running_jobs(connection: Any, tokens: list[str]) -> dict[str, str]:
    """``'<host>:<pid>'`` -> the id of the job that worker runs, for the workers these claim tokens name (a claim
    token is ``<host>:<pid>:<tid>:<n>``, taken in the worker's own process). Reads rq's worker registry (O(workers),
    rq's own ``Worker.all``), and only when a hold is listed."""
    from rq.worker import Worker

    wanted = {token.rsplit(':', 2)[0] for token in tokens}
    if not wanted:
        return {}
    found = {}
    for worker in Worker.all(connection=connection):
        where = f'{worker.hostname}:{worker.pid}'
        if where in wanted:
            job_id = worker.get_current_job_id()
            if job_id:
                found[where] = job_id
    return found



def _holder(token: Any) -> str:
    if token is None:
        return QueueSlot.token()
    if not isinstance(token, str) or not token:
        raise ValueError(f'token must be a non-empty string, got {token!r}')
    return token
