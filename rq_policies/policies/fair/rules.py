"""Fair: a queue's starts shared fairly among the keys (tenants) with waiting jobs, weighted; priority within a key;
per-key pause and backlog cap.

Per-key ``Concurrency`` and ``Rate`` stop one tenant from using more than its limit; they do not share the queue when
no limit binds: a tenant that enqueues 100,000 jobs puts every other tenant's next job behind all of them. ``Fair``
is the noisy-neighbour answer (BullMQ Pro's groups, Temporal's fairness keys, Oban Pro's weights)::

    @policy(Fair(key=lambda args, kwargs: kwargs['tenant']))
    def sync(tenant, item): ...

    @policy(Fair(key=lambda a, k: k['tenant'], weight=lambda a, k: 3 if k.get('plan') == 'pro' else 1))
    def render(tenant, doc, plan='free'): ...

    q.enqueue(sync, tenant='acme', item=7, priority=10)   # higher first within acme's line; FIFO among equals

The design, and why:

* **Virtual time, not a rotating pointer.** Each key of a queue with waiting jobs (an *active* key) has a virtual
  time; a start of one of its jobs moves it on by ``1 / weight``; the key with the lowest virtual time starts next
  (start-time fair queueing, as WFQ/SFQ schedulers do; deficit round-robin with a quantum of one job gives the same
  order). Over any stretch where two keys stay backlogged their starts are in the ratio of their weights, within
  one job. A key that becomes active (its first waiting job, or a resume) joins at the lowest virtual time of the
  queue's active keys: an idle key earns no credit, and a newcomer's first job starts within one round (one start
  per active key). The choice is one ``ZRANGE 0 0`` of the queue's active keys, a ``ZPOPMIN`` of the key's line and
  a ``ZADD``: O(log keys) per start, whatever the number of keys or waiting jobs, and idle keys cost nothing.
* **A waiting job is an ordinary rq job.** Admission writes the job's hash as rq does, with status ``deferred`` and
  its id in rq's deferred registry of its queue (as a parked per-key job), and files the id in its key's line
  (``rq:policies:fair:wait:<queue>:<scope>:<key>``, priority then FIFO) instead of on the queue's list. ``rq info``,
  rq-dashboard and ``Job.fetch`` read it sanely; a fetch that finds the queue's list empty takes the next job by
  the turns above (lua/policies/fair.lua's ``source``), and the job is popped from there on as any other (so
  ``Concurrency``/``Rate`` of its key, ``QueueSlot``, ``QueueRate`` and ``Loner`` apply to it as to a plain job).
* **Plain jobs of the same queue come first** (as BullMQ Pro's groups: "non-grouped jobs get precedence"): a fetch
  takes from the queue's list, then from the Fair lines. Give Fair jobs their own queue to share it among keys only.
* **Priority within a key**: ``priority=`` on enqueue (an int from -1000 to 1000; higher first), or
  ``Fair(priority=fn)`` computing it from ``(args, kwargs)``; the enqueue's own wins. Keys still take turns.
* **Pause per key** (:meth:`Fair.pause`/:meth:`Fair.resume`, ``rq-policies fair pause``): indefinite; the key's jobs
  stay in its lines (status deferred), none starts until the resume, other keys flow. The pause lives in Redis, so
  it survives worker restarts.
* **Backlog cap per key**: ``max_waiting=N``: an enqueue that finds N jobs of its key waiting on its queue is dropped
  (counted, logged, ``on_drop``), or with ``on_conflict='raise'`` raises :class:`BacklogFull`; checked in the
  admission script, so 16 racing producers never leave more than N waiting.
* **Weights**: ``weight=`` an int (1 to 1000) or a function of ``(args, kwargs)``; :meth:`Fair.set` sets a key's
  weight at run time (it wins over the declared one from the key's next start).
* **With a per-key limit**: a Fair job its key's ``Concurrency`` or ``Rate`` refuses is parked in that policy's line
  (its turn was used: the turn goes to the key, which starts that job first when its limit frees), and the next
  fetch serves the next key: a key at its limit never stalls the others.

What is not covered: a Fair job scheduled (``enqueue_at``/``enqueue_in``) or waiting on dependencies joins its queue's
list directly when rq releases it (its turn is not counted); ``at_front=`` is ignored for Fair jobs (use priority);
stock rq workers do not take Fair jobs (they wait in the deferred registry, not on the list).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry

from rq_policies.engine import compat, keys
from rq_policies.engine.admin import clear_setting, refusing
from rq_policies.engine.exceptions import PolicyError
from rq_policies.engine.ops import Call, text
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.policy import FetchPolicy, positive_int
from rq_policies.engine.views import (
    Argument,
    BadArgument,
    Cell,
    Command,
    Explanation,
    Group,
    Heading,
    Option,
    Panel,
    Reply,
    Row,
    Section,
    Setting,
    Shown,
    Values,
    View,
)
from rq_policies.policies.concurrency.rules import KeyedPolicy, check_scope, key_text, keyed_args

if TYPE_CHECKING:
    from redis import Redis

__all__ = ['BacklogFull', 'Fair', 'FairStatus', 'FairWeight']

logger = logging.getLogger('rq_policies')

#: Fair's keys.
PREFIX = keys.PREFIX + 'fair:'
#: A key's line on one queue: ``<prefix><queue>:<scope>:<key>``, ZSET id -> -priority * 2**40 + seq.
WAIT_PREFIX = PREFIX + 'wait:'
#: The admissions counter of a line (FIFO among equal priorities), gone with the line's last job.
SEQ_PREFIX = PREFIX + 'seq:'
#: A queue's active keys: ``<prefix><queue>``, ZSET '<scope>:<key>' -> virtual time.
ACTIVE_PREFIX = PREFIX + 'active:'
#: Paused keys: HASH '<scope>:<key>' -> 1.
PAUSED = PREFIX + 'paused'
#: The queues a paused key left: ``<prefix><scope>:<key>``, SET (read and dropped by the resume).
PAUSED_IN_PREFIX = PREFIX + 'pausedin:'
#: Run-time weights: HASH '<scope>:<key>' -> weight.
WEIGHTS = PREFIX + 'weights'

#: The job hash field: ``'<weight> <priority> <scope>:<key>'``.
FIELD = 'policies_fair'
MAX_WEIGHT = 1000
#: Priorities run from -MAX_PRIORITY to MAX_PRIORITY (the line's score keeps them exact beside 2**40 admissions).
MAX_PRIORITY = 1000

#: Functions of ``(args, kwargs)``, as key functions get them.
ValueFunction = Callable[[tuple, dict], Any]


class BacklogFull(PolicyError):
    """``Fair(max_waiting=N, on_conflict='raise')``: the key already had N jobs waiting on the queue.

    Counted as a drop (``rq-policies info``, metrics), and nothing was written.

    Attributes:
        scope: the policy's scope (the function's import path unless given).
        queue: the queue name.
        waiting: how many jobs of the key were waiting.
        first: the id of the key's first waiting job (its hash names the key: ``Fair.explain``, ``explain``).
    """

    def __init__(self, scope: str, queue: str, waiting: int, first: str):
        self.scope, self.queue, self.waiting, self.first = scope, queue, waiting, first
        super().__init__(f'a key of scope {scope!r} already has {waiting} job(s) waiting on queue {queue!r} '
                         f'(max_waiting; its first is job {first})')


@dataclass(frozen=True)
class FairWeight:
    """A key's weight set at run time (:meth:`Fair.set`)."""

    weight: int


@dataclass(frozen=True)
class FairStatus:
    """One key's Fair state on one queue (:meth:`Fair.status`).

    Attributes:
        waiting: jobs of the key waiting in its line on the queue.
        active: is the key taking turns on the queue now (it has waiting jobs and is not paused)?
        paused: is the key paused (on every queue)?
        weight: the run-time weight (:meth:`Fair.set`), or None (its jobs' declared weight applies).
        active_keys: how many keys take turns on the queue.
    """

    waiting: int
    active: bool
    paused: bool
    weight: int | None
    active_keys: int


@dataclass(frozen=True)
class FairPause:
    """One key's pause and backlog (:meth:`Fair.pause_status`): what a pause or a resume would change.

    Attributes:
        paused: is the key paused (on every queue)?
        waiting: the key's waiting jobs per queue (only queues where it has some).
    """

    paused: bool
    waiting: dict[str, int]


def _weight(value: Any, where: str = 'weight') -> int:
    return positive_int(where, value, MAX_WEIGHT)


def _priority(value: Any, where: str = 'priority') -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f'{where} must be an int from {-MAX_PRIORITY} to {MAX_PRIORITY}, got {value!r}')
    return value


def _key_id(scope: Any, key: Any) -> str:
    return keys.key_id(check_scope(scope), key_text(key))


class Fair(FetchPolicy):
    """Share a queue's starts fairly among the keys with waiting jobs, by weight (virtual time; see the module).

    Args:
        key: ``(args, kwargs) -> str | int``, the key (tenant) a job belongs to.
        weight: an int from 1 to 1000, or ``(args, kwargs) -> int``: a key's starts per round relative to others.
        max_waiting: at most this many jobs of one key waiting on a queue (None: no cap).
        on_conflict: ``'drop'`` (default) or ``'raise'`` (:class:`BacklogFull`) for an enqueue over ``max_waiting``.
        scope: the namespace keys are named in (no colon); default: the function's import path.
        priority: ``(args, kwargs) -> int`` (-1000 to 1000), the job's priority within its key when the enqueue
            gives no ``priority=``; default 0.
    """

    name: ClassVar[str] = 'fair'
    per_job: ClassVar[bool] = True
    admits: ClassVar[bool] = True
    rank: ClassVar[int] = 200
    call_options: ClassVar[tuple[str, ...]] = ('priority',)
    #: A queue's turns have nothing to hand out while its active-keys index is absent (FetchPolicy.fetch_state).
    fetch_state: ClassVar[tuple[str, ...] | None] = ('fair.active',)
    #: The admission never schedules a Fair job, and its check alone decides a backlog drop.
    schedules: ClassVar[bool] = False
    #: The run-time switch is pausing one key of a scope (:meth:`pause`, :meth:`resume`, :meth:`pause_status`):
    #: the dashboard's pause and resume forms offer it.
    key_pause_setting: ClassVar[bool] = True
    probes: ClassVar[bool] = True
    #: For the shared key function handling (KeyedPolicy.key_of).
    _key_of = KeyedPolicy.key_of

    def __init__(self, key: ValueFunction, weight: int | ValueFunction = 1, max_waiting: int | None = None,
                 on_conflict: str = 'drop', scope: str | None = None, priority: ValueFunction | None = None) -> None:
        if not callable(key):
            raise TypeError(f'key must be a callable (args, kwargs) -> str | int, got {key!r}')
        if not callable(weight):
            _weight(weight)
        if max_waiting is not None:
            positive_int('max_waiting', max_waiting)
        if on_conflict not in ('drop', 'raise'):
            raise ValueError(f"on_conflict must be 'drop' or 'raise', got {on_conflict!r}")
        if priority is not None and not callable(priority):
            raise TypeError(f'priority must be a callable (args, kwargs) -> int (or give priority= on enqueue), '
                            f'got {priority!r}')
        self.key, self.weight, self.max_waiting, self.on_conflict = key, weight, max_waiting, on_conflict
        self.scope = None if scope is None else check_scope(scope)
        self.priority = priority

    def __repr__(self) -> str:
        words = [f'key={getattr(self.key, "__name__", self.key)}']
        if self.weight != 1:
            words.append(f'weight={getattr(self.weight, "__name__", self.weight)}')
        if self.max_waiting is not None:
            words.append(f'max_waiting={self.max_waiting}')
        if self.on_conflict != 'drop':
            words.append(f'on_conflict={self.on_conflict!r}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        if self.priority is not None:
            words.append(f'priority={getattr(self.priority, "__name__", self.priority)}')
        return f'Fair({", ".join(words)})'

    # -- the enqueue ----------------------------------------------------------------------------------------------

    def call_field_names(self) -> tuple[str, ...]:
        return (FIELD,)

    def _value(self, fn: ValueFunction, job: Any, what: str) -> Any:
        try:
            return fn(tuple(job.args), dict(job.kwargs))
        except Exception as exc:
            raise TypeError(f'{self!r}: the {what} function failed on this call: {exc!r}') from exc

    def call_fields(self, job: Any, queue: str, digest: str) -> list[Any]:
        from rq_policies.engine.queue import door_options

        scope, key = self._key_of(job, digest)
        weight = _weight(self._value(self.weight, job, 'weight') if callable(self.weight) else self.weight,
                         f'{self!r} weight (the value the weight function returned)')
        options = door_options()
        if 'priority' in options:
            priority = _priority(options['priority'], 'priority (on enqueue)')
        elif self.priority is not None:
            priority = _priority(self._value(self.priority, job, 'priority'),
                                 f'{self!r} priority (the value the priority function returned)')
        else:
            priority = 0
        return [FIELD, f'{weight} {priority} {keys.key_id(scope, key)}']

    def job_fields(self, queue: str, digest: str) -> list[str]:
        return []

    def leased_keys(self, queue: str, digest: str) -> list[str]:
        return []

    def validate(self, job: Any, mode: str, force: bool) -> None:
        return None

    def hint_seconds(self, verdict: Any) -> float:
        return 0.0

    def admit_part(self, call: Any, queue: Any, digest: str) -> dict[str, Any]:
        fields = call.args.get('fields') or ()
        raw = None
        for i in range(len(fields) - 2, -1, -2):  # call_fields come last
            if fields[i] == FIELD:
                raw = fields[i + 1]
                break
        if raw is None:  # a probe (no job built yet): nothing to check
            return {}
        weight, priority, key_id = raw.split(' ', 2)
        line = f'{queue.name}:{key_id}'
        call.key('fair.wait', WAIT_PREFIX + line)
        call.key('fair.seq', SEQ_PREFIX + line)
        call.key('fair.active', ACTIVE_PREFIX + queue.name)
        call.key('fair.paused', PAUSED)
        call.key('fair.pausedin', PAUSED_IN_PREFIX + key_id)
        call.key('fair.deferred', DeferredJobRegistry.key_template.format(queue.name))
        return {'key_id': key_id, 'priority': int(priority), 'max_waiting': self.max_waiting, 'queue': queue.name,
                'wake': keys.wake(queue.name)}

    def on_drop(self, func_name: str, queue: str, verdict: Any) -> None:
        if self.on_conflict == 'raise':
            raise BacklogFull(self.scope or func_name, queue, int(verdict.number), verdict.job_id)
        if logger.isEnabledFor(logging.INFO):
            logger.info('rq-policies: dropped %s on queue %r (fair): its key already has %d job(s) waiting '
                        '(max_waiting %s)', func_name, queue, int(verdict.number), self.max_waiting)

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        if verdict.code == 1 and job.get_status(refresh=False) == JobStatus.QUEUED:
            compat.set_local_status(job, JobStatus.DEFERRED)  # it waits in its key's line, as the script wrote it

    # -- the fetch ------------------------------------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key_list('fair.active', [ACTIVE_PREFIX + name for name in queue_names])
        call.key('fair.waits', WAIT_PREFIX)
        call.key('fair.seqs', SEQ_PREFIX)
        call.key('fair.pausedins', PAUSED_IN_PREFIX)
        call.key('fair.paused', PAUSED)
        call.key('fair.weights', WEIGHTS)
        call.arg('keyed', keyed_args(call.args.get('job_prefix', Job.redis_job_namespace_prefix)))

    # -- run-time settings (the admin API: rq_policies.engine.admin) --------------------------------------------------

    @classmethod
    def set(cls, scope: str, key: Any, weight: int, connection: Any = None) -> FairWeight:
        """Set the weight of one key of ``scope`` at run time (1 to 1000): it wins over the weight its jobs declare,
        from the key's next start on every queue.

        Raises:
            InvalidSetting: (a ValueError) naming the argument and the value; nothing is written.
        """
        with refusing():
            key_id = _key_id(scope, key)
            _weight(weight)
            conn = _need(connection)
        conn.hset(WEIGHTS, key_id, weight)
        return FairWeight(weight)

    @classmethod
    def get(cls, scope: str, key: Any, connection: Any = None) -> FairWeight | None:
        """The weight set at run time for one key of ``scope``, or None (its jobs' declared weight applies)."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        raw = conn.hget(WEIGHTS, key_id)
        return None if raw is None else FairWeight(int(raw))

    @classmethod
    def clear(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Remove the run-time weight of one key: its jobs' declared weight applies again. True when it had one."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        return clear_setting(conn, WEIGHTS, key_id)

    @classmethod
    def status(cls, scope: str, key: Any, queue: str = 'default', connection: Any = None) -> FairStatus:
        """One key's state on ``queue``: waiting jobs, active or paused, its run-time weight, the active keys."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        with conn.pipeline(transaction=False) as pipe:
            pipe.zcard(WAIT_PREFIX + f'{queue}:{key_id}')
            pipe.zscore(ACTIVE_PREFIX + queue, key_id)
            pipe.hexists(PAUSED, key_id)
            pipe.hget(WEIGHTS, key_id)
            pipe.zcard(ACTIVE_PREFIX + queue)
            waiting, score, paused, weight, count = pipe.execute()
        return FairStatus(int(waiting), score is not None and not paused, bool(paused),
                          None if weight is None else int(weight),
                          int(count))

    @classmethod
    def pause(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Pause one key of ``scope`` on every queue, until :meth:`resume`: its waiting jobs stay waiting (status
        deferred) and none starts; other keys are not touched. Survives worker restarts (it lives in Redis).
        Returns True when the key was not paused already."""
        return _pause_call(scope, key, True).answered().run(_need(connection)) == 1

    @classmethod
    def resume(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Resume a paused key: it takes turns again on every queue where it has waiting jobs, from that queue's
        current virtual time (a paused key earns no credit). Returns True when it was paused."""
        return _pause_call(scope, key, False).answered().run(_need(connection)) == 1

    @classmethod
    def pause_status(cls, scope: str, key: Any, connection: Any = None) -> FairPause:
        """Is one key of ``scope`` paused, and how many of its jobs wait on each queue (the queues with keys taking
        turns, one bounded SCAN as :meth:`queues`, and those the key left when paused): what the dashboard's
        confirmation of a pause or a resume shows.

        Raises:
            InvalidSetting: (a ValueError) naming the argument and the value; nothing is read or written.
        """
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        left = {text(q) for q in conn.smembers(PAUSED_IN_PREFIX + key_id)}
        names = sorted(set(cls.queues(conn)) | left)
        with conn.pipeline(transaction=False) as pipe:
            pipe.hexists(PAUSED, key_id)
            for queue in names:
                pipe.zcard(WAIT_PREFIX + f'{queue}:{key_id}')
            paused, *counts = pipe.execute()
        return FairPause(bool(paused), {q: int(n) for q, n in zip(names, counts) if int(n)})

    @classmethod
    def waiting(cls, queue: str, scope: str, key: Any, connection: Any = None) -> list[str]:
        """The ids of one key's jobs waiting on ``queue``, in the order they start (priority, then FIFO)."""
        with refusing():
            key_id = _key_id(scope, key)
            conn = _need(connection)
        return [text(j) for j in conn.zrange(WAIT_PREFIX + f'{queue}:{key_id}', 0, -1)]

    # -- what explain, info and the page show ------------------------------------------------------------------

    @classmethod
    def key_rows(cls, connection: Any, queue: str, limit: int = 20) -> list[dict[str, Any]]:
        """The keys taking turns on ``queue``, next turn first, at most ``limit`` (0: all), then its paused keys
        with waiting jobs among the first ``limit`` paused: each ``{'key', 'waiting', 'weight', 'share',
        'paused', 'vtime'}``. ``share`` is the key's weight over the listed active keys' (every active key's when
        all are listed): the part of the queue's Fair starts it gets while they stay backlogged."""
        conn = connection
        end = (limit - 1) if limit else -1
        active = [(text(m), float(s)) for m, s in conn.zrange(ACTIVE_PREFIX + queue, 0, end, withscores=True)]
        paused_all = {text(c) for c in conn.hkeys(PAUSED)}
        paused = sorted(paused_all)[:limit or None]
        key_ids = [c for c, _ in active] + [c for c in paused if c not in dict(active)]
        if not key_ids:
            return []
        with conn.pipeline(transaction=False) as pipe:
            for key_id in key_ids:
                pipe.zcard(WAIT_PREFIX + f'{queue}:{key_id}')
                pipe.zrange(WAIT_PREFIX + f'{queue}:{key_id}', 0, 0)
            pipe.hmget(WEIGHTS, key_ids)
            *replies, weights = pipe.execute()
        heads = {i: text(replies[2 * i + 1][0]) for i in range(len(key_ids)) if replies[2 * i + 1]}
        with conn.pipeline(transaction=False) as pipe:
            for job_id in heads.values():
                pipe.hget(Job.redis_job_namespace_prefix + job_id, FIELD)
            declared = dict(zip(heads, pipe.execute()))
        scores = dict(active)
        rows = []
        for i, key_id in enumerate(key_ids):
            waiting = int(replies[2 * i])
            if key_id not in scores and not waiting:
                continue  # a paused key with nothing waiting on this queue
            weight = weights[i]
            if weight is None and declared.get(i) is not None:
                weight = text(declared[i]).split(' ', 1)[0]
            rows.append({'key': key_id, 'waiting': waiting, 'weight': int(weight) if weight is not None else 1,
                         'paused': key_id in paused_all or key_id not in scores, 'vtime': scores.get(key_id),
                         'set_at_run_time': weights[i] is not None})
        total = sum(r['weight'] for r in rows if not r['paused'])
        for row in rows:
            row['share'] = 0.0 if row['paused'] or not total else row['weight'] / total
        return rows

    @classmethod
    def queues(cls, connection: Any, budget: int = 5000) -> list[str]:
        """Queues with keys taking turns (one bounded SCAN of the active sets)."""
        from rq_policies.policies.concurrency.rules import _glob

        found: set[str] = set()
        cursor, examined = 0, 0
        while True:
            cursor, batch = keys.scanner(connection).scan(cursor=cursor, match=_glob(ACTIVE_PREFIX) + '*', count=1000)
            examined += 1000
            found.update(text(raw)[len(ACTIVE_PREFIX):] for raw in batch)
            if not cursor or examined >= budget:
                return sorted(found)

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[Explanation]:
        raw = job.get(FIELD)
        if not raw:
            return []
        weight, priority, key_id = raw.split(' ', 2)
        queue = job.get('origin', '')
        scope, _, key = key_id.partition(':')
        with connection.pipeline(transaction=False) as pipe:
            pipe.zrank(WAIT_PREFIX + f'{queue}:{key_id}', job['id'])
            pipe.zcard(ACTIVE_PREFIX + queue)
            pipe.hexists(PAUSED, key_id)
            pipe.hget(WEIGHTS, key_id)
            pipe.zcard(WAIT_PREFIX + f'{queue}:{key_id}')
            rank, active, paused, stored, waiting = pipe.execute()
        weight_now = int(stored) if stored is not None else int(weight)
        entry: dict[str, Any] = {'scope': scope, 'key': key, 'queue': queue,
                                 'weight': weight_now, 'priority': int(priority), 'active_keys': int(active),
                                 'paused': bool(paused), 'waiting': int(waiting)}
        change = ''
        if rank is not None:
            entry['position'] = int(rank)
            words = f'{_ordinal(int(rank) + 1)} in line for key {key!r} (scope {scope})'
            change = (f'it starts when key {key!r} has its turn and the jobs before it in the line have '
                      'started; Fair.pause/resume, Fair.set change the key\'s turns')
        else:
            words = f'key {key!r} (scope {scope}): not waiting in its line'
        words += f', {int(active)} key(s) taking turns on queue {queue!r}, weight {weight_now}'
        if stored is not None:
            words += ' (set at run time)'
        if int(priority):
            words += f', priority {int(priority)}'
        if paused:
            words += f', {key} paused'
            change = f'the key is paused: Fair.resume({scope!r}, {key!r}) lets its jobs start'
        verdict = words
        return [Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def cluster_info(cls, connection: Redis, now: float, limit: int | None) -> Section | None:
        out = {}
        for queue in cls.queues(connection):
            rows = cls.key_rows(connection, queue, limit or 0)
            if rows:
                out[queue] = FairQueue(int(connection.zcard(ACTIVE_PREFIX + queue)), rows)
        paused = sorted(text(c) for c in connection.hkeys(PAUSED))
        if not out and not paused:
            return None
        return FairState(out, paused, now)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[Panel]:
        out = []
        for queue in cls.queues(connection):
            rows = [r for r in cls.key_rows(connection, queue, limit) if search is None or search in r['key']
                    or search == queue]
            if rows:
                count = int(connection.zcard(ACTIVE_PREFIX + queue))
                out.append(Panel(
                    f'Fair share: {queue}', ['key', 'waiting', 'weight', 'share', 'state'],
                    [[r['key'], r['waiting'], r['weight'] if not r['set_at_run_time'] else
                      f'{r["weight"]} (set at run time)', f'{r["share"]:.0%}',
                      Cell('paused', warn=True) if r['paused'] else 'taking turns'] for r in rows],
                    '' if count <= limit else f'the next {limit} of {count} keys taking turns; shares among those '
                                              'listed',
                ))
        return out

    @classmethod
    def commands(cls) -> tuple[View, ...]:
        """``rq-policies fair pause|resume|weight|keys``."""
        scope_key = (Argument('scope'), Argument('key'))
        return (Group('fair', 'Fair share between keys: pause, resume, weights, and each key\'s line and share.', (
            Command('pause', 'Pause KEY of SCOPE on every queue until resumed (its jobs wait; others flow).',
                    arguments=scope_key, run=_pause_run),
            Command('resume', 'Resume a paused KEY of SCOPE: it takes turns again.', arguments=scope_key,
                    run=_resume_run),
            Setting('weight', 'Show, set (WEIGHT) or --clear the run-time weight of KEY of SCOPE.', targets=scope_key,
                    value=Argument('weight', kind=int),
                    clear_help='Remove the run-time weight: the declared one applies again.',
                    status=_weight_status, set=_weight_set, clear=_weight_clear),
            Command('keys', 'The keys taking turns on QUEUE, next turn first: waiting jobs, weight, share; then paused '
                            'keys.', arguments=(Argument('queue'),),
                    options=(Option('--limit', 'limit', 'List at most this many keys (0: all; 20).', default=20,
                                    kind=int),),
                    run=_keys_run),
        )),)


def _refused(action: Callable[[], Any]) -> Any:
    """``action()``, its ValueError (a bad scope, key or weight) a refusal of the command line."""
    try:
        return action()
    except ValueError as exc:
        raise BadArgument(str(exc)) from None


def _pause_run(conn: Redis, values: Values) -> Reply:
    scope, key = str(values['scope']), str(values['key'])
    changed = _refused(lambda: Fair.pause(scope, key, connection=conn))
    return Reply((f'{scope}:{key} paused' + ('' if changed else ' (it was already)'),))


def _resume_run(conn: Redis, values: Values) -> Reply:
    scope, key = str(values['scope']), str(values['key'])
    changed = _refused(lambda: Fair.resume(scope, key, connection=conn))
    return Reply((f'{scope}:{key} resumed' + ('' if changed else ' (it was not paused)'),))


def _weight_clear(conn: Redis, values: Values) -> Reply:
    scope, key = str(values['scope']), str(values['key'])
    _refused(lambda: Fair.clear(scope, key, connection=conn))
    return Reply((f'{scope}:{key}: run-time weight cleared',))


def _weight_set(conn: Redis, values: Values) -> Reply:
    scope, key, weight = str(values['scope']), str(values['key']), values['weight']
    _refused(lambda: Fair.set(scope, key, weight, connection=conn))
    return Reply((f'{scope}:{key}: weight {weight}',))


def _weight_status(conn: Redis, values: Values) -> Reply:
    scope, key = str(values['scope']), str(values['key'])
    got = _refused(lambda: Fair.get(scope, key, connection=conn))
    return Reply((f'{scope}:{key}: ' + (f'weight {got.weight} (set at run time)' if got else
                                        'no run-time weight (its jobs\' declared weight applies)'),))


def _keys_run(conn: Redis, values: Values) -> Reply:
    queue = str(values['queue'])
    rows = _refused(lambda: Fair.key_rows(conn, queue, values['limit']))
    return Reply(tuple(_row_line(row) for row in rows) or (f'No key takes turns on queue {queue!r}.',))


@dataclass(frozen=True)
class FairQueue:
    """One queue's keys taking turns, in ``rq-policies info``: how many, and the next ones (:meth:`Fair.key_rows`'s
    rows, at most ``--limit``)."""

    keys: int
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class FairState(Section):
    """Fair's part of ``rq-policies info`` (``policies.fair`` in ``--json``: ``queues``, ``paused``, ``now``): a
    heading per queue with its keys' lines, then the paused keys."""

    queues: dict[str, FairQueue]
    paused: list[str]
    now: float

    def rows(self, shown: Shown) -> list[Row | str]:
        lines: list[Row | str] = []
        for queue, entry in self.queues.items():
            lines.append(Heading(f'Fair on queue {queue}', f'  ({entry.keys} key(s) taking turns)'))
            lines += ['  ' + _row_line(row) for row in entry.rows]
        if self.paused:
            lines.append(f'Fair: paused key(s): {", ".join(self.paused)}')
        return lines


def _row_line(row: dict[str, Any]) -> str:
    state = 'paused' if row['paused'] else f'share {row["share"]:.0%}'
    mark = ' (set at run time)' if row.get('set_at_run_time') else ''
    return f'key {row["key"]}  {row["waiting"]} waiting, weight {row["weight"]}{mark}, {state}'


def _ordinal(n: int) -> str:
    suffix = 'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')
    return f'{n}{suffix}'


def _pause_call(scope: str, key: Any, pause: bool) -> Call:
    with refusing():
        key_id = _key_id(scope, key)
    call = Call('fair_pause', key_id=key_id, pause=pause, waits=WAIT_PREFIX, actives=ACTIVE_PREFIX,
                wake=keys.wake(''))
    call.key('paused', PAUSED)
    call.key('pausedin', PAUSED_IN_PREFIX + key_id)
    return call
