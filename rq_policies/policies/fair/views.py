"""Fair: what it shows (``explain``, its keys' turns in ``info``, ``rq-policies fair ...`` and the dashboard)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis import Redis
from rq.job import Job

from rq_policies.engine import keys, views
from rq_policies.engine.exceptions import InvalidSetting
from rq_policies.engine.ops import text

from .rules import FIELD, Fair, _weight


class FairViews(views.PolicyViews):
    policy = Fair
    key_pause_setting = True
    key_weight_setting = True

    @classmethod
    def check_setting(cls, settings: dict[str, int]) -> None:
        _weight(settings.get('weight'))

    @classmethod
    def key_rows(cls, connection: Any, queue: str, limit: int = 20) -> list[dict[str, Any]]:
        """The keys taking turns on ``queue``, next turn first, at most ``limit`` (0: all), then its paused keys
        with waiting jobs among the first ``limit`` paused: each ``{'key', 'waiting', 'weight', 'share',
        'paused', 'vtime'}``. ``share`` is the key's weight over the listed active keys' (every active key's when
        all are listed): the part of the queue's Fair starts it gets while they stay backlogged."""
        conn = connection
        end = (limit - 1) if limit else -1
        active = [(text(m), float(s)) for m, s in conn.zrange(keys.FAIR_ACTIVE(queue), 0, end, withscores=True)]
        paused_all = {text(c) for c in conn.hkeys(keys.FAIR_PAUSED)}
        paused = sorted(paused_all)[:limit or None]
        key_ids = [c for c, _ in active] + [c for c in paused if c not in dict(active)]
        if not key_ids:
            return []
        with conn.pipeline(transaction=False) as pipe:
            for key_id in key_ids:
                pipe.zcard(keys.FAIR_WAIT(queue, key_id))
                pipe.zrange(keys.FAIR_WAIT(queue, key_id), 0, 0)
            pipe.hmget(keys.FAIR_WEIGHTS, key_ids)
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
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
        raw = job.get(FIELD)
        if not raw:
            return []
        weight, priority, key_id = raw.split(' ', 2)
        queue = job.get('origin', '')
        scope, _, key = key_id.partition(':')
        with connection.pipeline(transaction=False) as pipe:
            pipe.zrank(keys.FAIR_WAIT(queue, key_id), job['id'])
            pipe.zcard(keys.FAIR_ACTIVE(queue))
            pipe.hexists(keys.FAIR_PAUSED, key_id)
            pipe.hget(keys.FAIR_WEIGHTS, key_id)
            pipe.zcard(keys.FAIR_WAIT(queue, key_id))
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
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def cluster_info(cls, connection: Redis, now: float, limit: int | None) -> views.Section | None:
        out = {}
        for queue in Fair.queues(connection):
            rows = cls.key_rows(connection, queue, limit or 0)
            if rows:
                out[queue] = FairQueue(int(connection.zcard(keys.FAIR_ACTIVE(queue))), rows)
        paused = sorted(text(c) for c in connection.hkeys(keys.FAIR_PAUSED))
        if not out and not paused:
            return None
        return FairState(out, paused, now)

    @classmethod
    def panels(cls, connection: Any, now: float, limit: int, search: str | None = None) -> list[views.Panel]:
        out = []
        for queue in Fair.queues(connection):
            rows = [r for r in cls.key_rows(connection, queue, limit) if search is None or search in r['key']
                    or search == queue]
            if rows:
                count = int(connection.zcard(keys.FAIR_ACTIVE(queue)))
                out.append(views.Panel(
                    f'Fair share: {queue}', ['key', 'waiting', 'weight', 'share', 'state'],
                    [[r['key'], r['waiting'], r['weight'] if not r['set_at_run_time'] else
                      f'{r["weight"]} (set at run time)', f'{r["share"]:.0%}',
                      views.Cell('paused', warn=True) if r['paused'] else 'taking turns'] for r in rows],
                    '' if count <= limit else f'the next {limit} of {count} keys taking turns; shares among those '
                                              'listed',
                ))
        return out

    @classmethod
    def commands(cls) -> tuple[views.View, ...]:
        """``rq-policies fair pause|resume|weight|keys``."""
        scope_key = (views.Argument('scope'), views.Argument('key'))
        force = views.Option('--force', 'force', 'Write even though no Fair is known to use SCOPE (a typo?).',
                             is_flag=True)
        about = 'Fair share between keys: pause, resume, weights, and each key\'s line and share.'
        return (views.Group('fair', about, (
            views.Command('pause', 'Pause KEY of SCOPE on every queue until resumed (its jobs wait; others flow).',
                          arguments=scope_key, options=(force,), run=_pause_run),
            views.Command('resume', 'Resume a paused KEY of SCOPE: it takes turns again.', arguments=scope_key,
                          run=_resume_run),
            views.Setting('weight', 'Show, set (WEIGHT) or --clear the run-time weight of KEY of SCOPE.',
                          targets=scope_key, value=views.Argument('weight', kind=int),
                          clear_help='Remove the run-time weight: the declared one applies again.', options=(force,),
                          status=_weight_status, set=_weight_set, clear=_weight_clear),
            views.Command('keys', 'The keys taking turns on QUEUE, next turn first: waiting jobs, weight, share; then '
                                  'paused keys.', arguments=(views.Argument('queue'),),
                          options=(views.Option('--limit', 'limit', 'List at most this many keys (0: all; 20).',
                                                default=20, kind=int),),
                          run=_keys_run),
        )),)


def _refused(action: Callable[[], Any]) -> Any:
    """``action()``, its ValueError (a bad scope, key or weight) a refusal of the command line; a scope no Fair is
    known to use (a typo?) refused as ``cap`` refuses an unknown queue, its hint the command's ``--force``."""
    try:
        return action()
    except InvalidSetting as exc:
        if exc.argument == 'scope' and 'force=True' in str(exc):
            raise views.BadArgument(str(exc).replace('force=True', '--force'), 'SCOPE') from None
        raise views.BadArgument(str(exc)) from None
    except ValueError as exc:
        raise views.BadArgument(str(exc)) from None


def _pause_run(conn: Redis, values: views.Values) -> views.Reply:
    scope, key = str(values['scope']), str(values['key'])
    changed = _refused(lambda: Fair.pause(scope, key, connection=conn, force=bool(values.get('force'))))
    return views.Reply((f'{scope}:{key} paused' + ('' if changed else ' (it was already)'),))


def _resume_run(conn: Redis, values: views.Values) -> views.Reply:
    scope, key = str(values['scope']), str(values['key'])
    changed = _refused(lambda: Fair.resume(scope, key, connection=conn))
    return views.Reply((f'{scope}:{key} resumed' + ('' if changed else ' (it was not paused)'),))


def _weight_clear(conn: Redis, values: views.Values) -> views.Reply:
    scope, key = str(values['scope']), str(values['key'])
    _refused(lambda: Fair.clear(scope, key, connection=conn))
    return views.Reply((f'{scope}:{key}: run-time weight cleared',))


def _weight_set(conn: Redis, values: views.Values) -> views.Reply:
    scope, key, weight = str(values['scope']), str(values['key']), values['weight']
    _refused(lambda: Fair.set(scope, key, weight, connection=conn, force=bool(values.get('force'))))
    return views.Reply((f'{scope}:{key}: weight {weight}',))


def _weight_status(conn: Redis, values: views.Values) -> views.Reply:
    scope, key = str(values['scope']), str(values['key'])
    got = _refused(lambda: Fair.get(scope, key, connection=conn))
    return views.Reply((f'{scope}:{key}: ' + (f'weight {got.weight} (set at run time)' if got else
                                              'no run-time weight (its jobs\' declared weight applies)'),))


def _keys_run(conn: Redis, values: views.Values) -> views.Reply:
    queue = str(values['queue'])
    rows = _refused(lambda: FairViews.key_rows(conn, queue, values['limit']))
    return views.Reply(tuple(_row_line(row) for row in rows) or (f'No key takes turns on queue {queue!r}.',))


@dataclass(frozen=True)
class FairQueue:
    """One queue's keys taking turns, in ``rq-policies info``: how many, and the next ones (:meth:`FairViews.key_rows`'s
    rows, at most ``--limit``)."""

    keys: int
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class FairState(views.Section):
    """Fair's part of ``rq-policies info`` (``policies.fair`` in ``--json``: ``queues``, ``paused``, ``now``): a
    heading per queue with its keys' lines, then the paused keys."""

    queues: dict[str, FairQueue]
    paused: list[str]
    now: float

    def rows(self, shown: views.Shown) -> list[views.Row | str]:
        lines: list[views.Row | str] = []
        for queue, entry in self.queues.items():
            lines.append(views.Heading(f'Fair on queue {queue}', f'  ({entry.keys} key(s) taking turns)'))
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
