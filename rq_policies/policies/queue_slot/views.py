"""QueueSlot: what it shows (its caps and holds in ``info``, ``explain``, the dashboard and the metrics; ``rq-policies
cap``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from redis import Redis

from rq_policies.engine import keys, reading, views
from rq_policies.engine.admin import Cap
from rq_policies.engine.exceptions import UnknownQueueWarning
from rq_policies.engine.ops import text
from rq_policies.engine.policy import MAX_CAPACITY, positive_int
from rq_policies.engine.readable import in_seconds

from .rules import QueueSlot, queue_name


@dataclass(frozen=True)
class SlotHold:
    """A live hold of a queue's cap, as ``info`` shows it: its holder token and the seconds until it expires."""

    holder: str
    expires_in: float


@dataclass(frozen=True)
class SlotState(views.Section):
    """QueueSlot's part of a queue in ``rq-policies info``: its cap (None: uncapped), how many holds are live, and
    the holds listed (at most ``--limit``); ``--json`` shows these fields as they are named."""

    capacity: int | None
    holds_in_use: int
    holds: list[SlotHold]

    def headline(self) -> str:
        if self.capacity is not None:
            return f'cap {self.capacity}, {self.holds_in_use} in use'
        return f'uncapped, {self.holds_in_use} holds'

    def rows(self, shown: views.Shown) -> list[views.Row | str]:
        lines: list[views.Row | str] = [views.Row('hold', f'{hold.holder:<36} expires {in_seconds(hold.expires_in)}')
                                        for hold in self.holds]
        if self.holds_in_use > len(self.holds):
            lines.append(f'  ... and {self.holds_in_use - len(self.holds)} more (--limit 0 lists all)')
        return lines


class QueueSlotViews(views.PolicyViews):
    policy = QueueSlot
    queue_settings = ('capacity',)

    @classmethod
    def check_setting(cls, settings: dict[str, int]) -> None:
        positive_int('capacity', settings.get('capacity'), MAX_CAPACITY)

    @classmethod
    def queue_info(cls, connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, views.Section]:
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
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
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
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[views.Metric]:
        in_use = views.Metric('rq_policies_queue_slots_in_use',
                              'Live QueueSlot holds of a queue (jobs running under its cap).', ('queue',))
        capacity = views.Metric('rq_policies_queue_slots_capacity', 'Cluster-wide QueueSlot cap of a queue.',
                                ('queue',))
        for row in QueueSlot.gauges(connection, reading.queue_names(connection), now):
            in_use.add([row['queue']], row['in_use'])
            if row['capacity'] is not None:
                capacity.add([row['queue']], row['capacity'])
        return [in_use, capacity]

    @classmethod
    def commands(cls) -> tuple[views.View, ...]:
        """``rq-policies cap``."""
        return (views.Setting(
            'cap', 'Cap QUEUE at N jobs running across the cluster, remove its cap with --clear, or show it (no N).',
            targets=(views.Argument('queue'),),
            value=views.Argument('n', kind=views.Digits(f'a positive integer up to {MAX_CAPACITY}', 1, MAX_CAPACITY)),
            clear_help='Remove the cap (live holds stay until released or expired).',
            force_help='Cap a queue rq does not know yet.',
            json_help='Print the cap and the holds in use as JSON.',
            prepare=_cap_prepare, status=_cap_status, set=_cap_set, clear=_cap_clear,
        ),)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[views.Panel]:
        """The dashboard's holds panel: per queue with a cap or a hold, the cap, the holds in use and each hold
        (holder, the job its worker runs, seconds to expiry). A hold past its expiry still in the ledger is
        *expired*: its holder stopped refreshing (killed, or stalled longer than the ttl); it no longer counts
        against the cap, and a fetch purges it when the ledger reaches its cap (or now and then once it holds 100
        holds: lua/policies/queue_slot.lua). It is shown greyed, as expired, until then: nothing is wrong
        (a hold that ages out is the crash path working), and a running job's lapsed hold is re-added and counted
        by its worker's next heartbeat (``rq_policies_hold_lapses_total`` counts those)."""
        names = [name for name in reading.queue_names(connection) if not search or search in name]
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
                holds.append([name, token, None,
                              views.Cell('expired (no longer counts)', at=score - now, expired=True)])
            for hold in entry.holds:
                holds.append([name, hold.holder, None, views.Cell(at=hold.expires_in)])
            shown += in_use + len(lapsed)
        holds = holds[:limit]
        jobs = reading.running_jobs(connection, [row[1] for row in holds])
        for row in holds:
            job_id = jobs.get(row[1].rsplit(':', 2)[0])
            row[2] = views.Cell(job_id, job=job_id) if job_id else None
        if not queues:
            return []
        out = [views.Panel('Queue caps (QueueSlot)', ['queue', 'cap', 'in use', 'expired holds (not counted)'], queues)]
        if holds:
            out.append(views.Panel('Holds (QueueSlot)', ['queue', 'holder', 'job', 'expires'], holds,
                                   f'{len(holds)} of {shown} holds listed' if shown > len(holds) else ''))
        return out


def _cap_prepare(values: views.Values, mode: str) -> views.Values:
    try:
        queue_name(values['queue'])
    except ValueError as exc:
        raise views.BadArgument(str(exc), 'QUEUE') from None
    return values


def _cap_status(conn: Redis, values: views.Values) -> views.Reply:
    queue = str(values['queue'])
    status = QueueSlot.status(queue, connection=conn)
    if values['as_json']:
        return views.Reply(data={'queue': queue, 'capacity': status.capacity, 'in_use': status.in_use})
    if status.capacity is None:
        return views.Reply((f'Queue {queue!r} is uncapped ({status.in_use} hold(s) in use).',))
    return views.Reply((f'Queue {queue!r} is capped at {status.capacity}, {status.in_use} in use.',))


def _cap_set(conn: Redis, values: views.Values) -> views.Reply:
    queue, n = str(values['queue']), values['n']
    before = QueueSlot.get(queue, connection=conn)
    with warnings.catch_warnings():  # refused unless --force: the operator meant it
        warnings.simplefilter('ignore', UnknownQueueWarning)
        QueueSlot.set(queue, n, connection=conn)
    return _cap_changed(conn, values, before, f'Queue {queue!r} is capped at {n}')


def _cap_clear(conn: Redis, values: views.Values) -> views.Reply:
    queue = str(values['queue'])
    before = QueueSlot.get(queue, connection=conn)
    QueueSlot.clear(queue, connection=conn)
    return _cap_changed(conn, values, before, f'Queue {queue!r} is uncapped')


def _cap_changed(conn: Redis, values: views.Values, before: Cap | None, words: str) -> views.Reply:
    if values['as_json']:
        now = QueueSlot.get(str(values['queue']), connection=conn)
        return views.Reply(data={'queue': values['queue'], 'capacity': now.capacity if now else None,
                                 'was': before.capacity if before else None})
    was = f'was {before.capacity}' if before is not None else 'was uncapped'
    return views.Reply((f'{words} ({was}).',))
