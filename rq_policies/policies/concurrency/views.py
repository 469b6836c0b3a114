"""Concurrency: what it shows (``explain``, its keys in ``info``, ``rq-policies keys`` and ``override``, the
dashboard, the due index's gauges)."""

from __future__ import annotations

from typing import Any

from redis import Redis

from rq_policies.engine import keys, reading, views
from rq_policies.engine.admin import KeyLimit
from rq_policies.engine.keyed import check_scope, key_text
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import server_now as _server_now
from rq_policies.engine.ops import text
from rq_policies.engine.policy import MAX_CAPACITY
from rq_policies.engine.readable import at, relative

from .rules import Concurrency, _key_rows, key_limit


class ConcurrencyViews(views.KeyedViews):
    policy = Concurrency
    columns = ('key', 'in use', 'limit', 'parked', 'waiting for')
    key_limit_setting = True

    @classmethod
    def key_rows(cls, connection: Any, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` with live holds or parked jobs, busiest first, at most ``limit`` (0: all): each
        ``{'key', 'in_use', 'limit' (override, else the declared limit of a parked or running job's, or None),
        'overridden', 'parked', 'next_due' (server time, or None: the key's oldest hold's crash expiry or its
        back-off's end), 'backoff_until', 'waiting_for' ('release', 'backoff', 'fetch' or None: what the parked jobs
        wait for)}``. Found by SCAN (MATCH, COUNT), never KEYS, unless ``names`` gives the keys to read."""
        conn = _need(connection)
        scope = check_scope(scope)
        now = _server_now(conn) if now is None else now
        if names is None:
            found: set[str] = set()
            pattern = reading.glob_escape(scope) + ':*'
            for prefix in (keys.KEY_HOLDS_PREFIX, keys.KEY_PARKED_PREFIX(cls.name, '')):
                for raw in keys.scanner(conn).scan_iter(match=prefix + pattern, count=1000):
                    found.add(text(raw)[len(prefix) + len(scope) + 1:])
            names = sorted(k for k in found if search is None or search in k)
        rows = _key_rows(conn, cls.name, scope, names, now)
        rows.sort(key=lambda r: (-(r['in_use'] + r['parked']), r['key']))
        return rows[:limit] if limit else rows

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[views.Metric]:
        """Two gauges of the due index, O(log n) whatever the number of keys (no SCAN in a scrape): how many keys
        (of Concurrency and Rate) have parked jobs, and how late the most overdue one is being served (seconds past
        its due time; it stays near 0 while PolicyWorkers fetch)."""
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.KEY_DUE)
            pipe.zrange(keys.KEY_DUE, 0, 0, withscores=True)
            count, head = pipe.execute()
        parked = views.Metric('rq_policies_keys_with_parked_jobs',
                              'Keys of the per-key policies (Concurrency, Rate) with parked jobs.')
        parked.add([], int(count))
        late = views.Metric('rq_policies_keys_due_overdue_seconds',
                            'Seconds the most overdue key with parked jobs is past its due time (0: none).')
        late.add([], round(max(now - head[0][1], 0.0), 3) if head else 0.0)
        return [parked, late]

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        """``rq-policies keys``'s lines for :meth:`key_rows`."""
        out = []
        for row in rows:
            limit_text = '?' if row['limit'] is None else str(row['limit'])
            waiting = waiting_words(row, now)
            mark = ' (override)' if row['overridden'] else (
                f' ({row["source"]})' if str(row.get('source')).startswith('rule') else '')
            out.append(f'key {row["key"]}  {row["in_use"]}/{limit_text}{mark} in use, {row["parked"]} parked'
                       + (f'; {waiting}' if waiting else ''))
        return out

    @classmethod
    def panel_row(cls, row: dict[str, Any], now: float) -> list[views.CellValue]:
        return [row['key'], views.Cell(str(row['in_use']), warn=True) if row['limit'] is not None
                and row['in_use'] > row['limit'] else row['in_use'], _limit_cell(row), row['parked'],
                _waiting_cell(row, now)]

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
        raw = job.get(cls.policy.field)
        if not raw:
            return []
        declared, _, key_id = raw.partition(' ')
        declared = declared.partition('*')[0]  # a costed job's '<limit>*<cost>'
        scope, _, key = key_id.partition(':')
        ledger_key = keys.KEY_HOLDS_PREFIX(key_id)
        parked_key = keys.KEY_PARKED_PREFIX(cls.name, key_id)
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcount(ledger_key, f'({now:.6f}', '+inf')
            pipe.hget(keys.KEY_LIMITS, key_id)
            pipe.lpos(parked_key, job['id'])
            pipe.get(keys.KEY_BLOCK_PREFIX(key_id))
            pipe.hget(keys.KEY_RULES, Concurrency.rule_field(scope))
            in_use, override, position, blocked, stored_rule = pipe.execute()
        rule = Concurrency.decode_rule(stored_rule)
        limit, source = key_limit(key, override, rule, lambda: int(declared))
        entry: dict[str, Any] = {'scope': scope, 'key': key, 'limit': limit, 'source': source,
                                 'in_use': int(in_use), 'overridden': override is not None}
        words = f'key {key!r} (scope {scope}) at {int(in_use)}/{limit}'
        if source != 'declared':  # the declared limit is the usual case, and the job's own field says it
            words += f' (limit: {_source_words(source)})'
        if position is not None:
            entry['parked_position'] = int(position)
            words += f' (parked, position {int(position) + 1})'
            change = ('it goes back to the front of its queue when a hold of its key is released or expires '
                      '(or raise the key\'s limit: rq-policies override)')
        else:
            change = ''
        if blocked is not None and float(blocked) > now:
            entry['backoff_until'] = float(blocked)
            words += f', backed off for {float(blocked) - now:.1f} s more'
        verdict = words
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def commands(cls) -> tuple[views.View, ...]:
        """``rq-policies keys`` (every per-key policy's keys of a scope) and ``rq-policies override``."""
        return (
            views.Command(
                'keys', 'The keys of SCOPE with running or parked jobs (Concurrency, Rate): in use / limit, parked, '
                        'and what\nthe parked jobs wait for (a release, a back-off, a rate), with local times.',
                arguments=(views.Argument('scope'),),
                options=(views.Option('--limit', 'limit', 'List at most this many keys (0: all; 20).', default='20'),
                         views.Option('--search', 'search', 'Only keys containing this text.'),
                         views.Option('--json', 'as_json', 'Print the keys as JSON (server-clock times).',
                                      is_flag=True)),
                prepare=_keys_prepare, run=_keys_run,
            ),
            views.Setting(
                'override', 'Set the Concurrency limit of KEY in SCOPE to N at run time, remove that override with '
                            '--clear, or\nshow the key\'s limit and state (no N).',
                targets=(views.Argument('scope'), views.Argument('key')),
                value=views.Argument('n', kind=views.Digits(f'a positive integer up to {MAX_CAPACITY}', 1,
                                                            MAX_CAPACITY)),
                clear_help='Remove the override: the declared limit applies again.',
                options=(views.Option('--force', 'force', 'Set it even though no Concurrency is known to use SCOPE '
                                                          '(a typo?).', is_flag=True),),
                json_help='Print the key\'s state as JSON.',
                prepare=_override_prepare, status=_override_status, set=_override_set, clear=_override_clear,
            ),
        )


def _keys_prepare(values: views.Values) -> views.Values:
    count = views.Digits('a positive integer up to 1000000000', 0, 10**9).parse(values['limit'], '--limit')
    try:
        check_scope(values['scope'])
    except ValueError as exc:
        raise views.BadArgument(str(exc), 'SCOPE') from None
    return {**values, 'limit': count}


def _keys_run(conn: Redis, values: views.Values) -> views.Reply:
    scope, count, search = str(values['scope']), int(values['limit']), values['search']  # type: ignore[call-overload]
    now = _server_now(conn)
    rules = {policy.name: rule for policy in views.keyed_views()
             if (rule := getattr(policy.policy, 'get_rule', lambda *a, **k: None)(scope, connection=conn)) is not None}
    if values['as_json']:
        return views.Reply(data={'scope': scope, 'server_time': now,
                                 'rules': {name: repr(rule) for name, rule in rules.items()},
                                 'policies': {policy.name: policy.key_rows(conn, scope, count, search, now)
                                              for policy in views.keyed_views()}})
    lines = [f'{name} rule of scope {scope}: {rule!r} (a key\'s own setting wins over it)'
             for name, rule in rules.items()]
    for policy in views.keyed_views():
        lines += policy.key_lines(policy.key_rows(conn, scope, count, search, now), now)
    return views.Reply(tuple(lines or [f'No key of scope {scope!r} has running or parked jobs.']))


def _override_prepare(values: views.Values, mode: str) -> views.Values:
    try:
        check_scope(values['scope'])
        key_text(values['key'])
    except (TypeError, ValueError) as exc:
        raise views.BadArgument(str(exc), 'SCOPE' if 'scope' in str(exc) else 'KEY') from None
    return values


def _override_status(conn: Redis, values: views.Values) -> views.Reply:
    scope, key = str(values['scope']), str(values['key'])
    status = Concurrency.status(scope, key, connection=conn)
    if values['as_json']:
        return views.Reply(data={'scope': scope, 'key': key, 'limit': status.limit, 'overridden': status.overridden,
                                 'source': status.source,
                                 'in_use': status.in_use, 'parked': list(status.parked),
                                 'backoff_until': status.backoff_until})
    limit = 'no known limit' if status.limit is None else (
        f'limit {status.limit} ({"override" if status.overridden else status.source})')
    return views.Reply((f'Key {key!r} of scope {scope!r}: {limit}, {status.in_use} in use, '
                        f'{len(status.parked)} parked.',))


def _override_set(conn: Redis, values: views.Values) -> views.Reply:
    scope, key, n = str(values['scope']), str(values['key']), values['n']
    if not values.get('force'):
        try:
            Concurrency.require_known_scope(conn, scope, 'pass --force to set it anyway')
        except ValueError as exc:
            raise views.BadArgument(str(exc), 'SCOPE') from None
    before = Concurrency.get(scope, key, connection=conn)
    Concurrency.set(scope, key, n, connection=conn, force=True)  # type: ignore[arg-type]
    return _override_changed(conn, values, before, f'Key {key!r} of scope {scope!r} is limited to {n} running at once')


def _override_clear(conn: Redis, values: views.Values) -> views.Reply:
    scope, key = str(values['scope']), str(values['key'])
    before = Concurrency.get(scope, key, connection=conn)
    Concurrency.clear(scope, key, connection=conn)
    return _override_changed(conn, values, before, f'Key {key!r} of scope {scope!r} has its declared limit again')


def _override_changed(conn: Redis, values: views.Values, before: KeyLimit | None, words: str) -> views.Reply:
    if values['as_json']:
        found = Concurrency.get(str(values['scope']), str(values['key']), connection=conn)
        return views.Reply(data={'scope': values['scope'], 'key': values['key'],
                                 'override': found.limit if found else None, 'was': before.limit if before else None})
    was = f'was {before.limit}' if before is not None else 'had no override'
    return views.Reply((f'{words} ({was}).',))


def _limit_cell(row: dict[str, Any]) -> views.CellValue:
    """The page's limit cell: the number, with what gave it on a second line when not its jobs' declaration."""
    if row.get('source') in (None, 'declared'):
        return row['limit']
    return views.Cell(str(row['limit']), sub='set at run time' if row['source'] == 'set' else row['source'])


def _source_words(source: str) -> str:
    """What gave a key its limit, in words (explain)."""
    if source == 'set':
        return 'set for the key at run time'
    if source == 'declared':
        return 'the one its job declares'
    return f"its scope's {source}"


def waiting_words(row: dict[str, Any], now: float) -> str:
    """A key row's ``waiting_for`` in words, with the moments it names (local time and how far from now)."""
    kind = row.get('waiting_for')
    if kind == 'backoff':
        return f'waiting for its back-off to end {at(row["backoff_until"], now)}'
    if kind == 'release':
        words = 'waiting for a release (a running job of the key ends)'
        if row.get('next_due') is not None:
            words += f'; a dead worker\'s hold expires {relative(row["next_due"] - now)}'
        return words
    if kind == 'fetch':
        return 'a unit is free: the next fetch gives a parked job back'
    return ''


def _waiting_cell(row: dict[str, Any], now: float) -> views.CellValue:
    """The page's "waiting for" cell of a key: what its parked jobs wait for, with the moment as a live time."""
    kind = row.get('waiting_for')
    if kind == 'backoff':
        return views.Cell('its back-off to end', at=row['backoff_until'] - now)
    if kind == 'release':
        if row.get('next_due') is not None:
            return views.Cell('a release (a running job ends)', note='a dead worker\'s hold expires',
                              at=row['next_due'] - now)
        return views.Cell('a release (a running job ends)')
    if kind == 'fetch':
        return 'the next fetch (a unit is free)'
    return None
