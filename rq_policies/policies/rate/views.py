"""Rate: what it shows (``explain``, its keys in ``info``, ``rq-policies keys`` and the dashboard)."""

from __future__ import annotations

from typing import Any

from rq.job import Job

from rq_policies.engine import keys, reading, views
from rq_policies.engine.admin import RateWindow, rate_now_words, rate_status, window_tuples
from rq_policies.engine.keyed import check_scope
from rq_policies.engine.ops import need_connection as _need
from rq_policies.engine.ops import text
from rq_policies.engine.readable import at

from .rules import Rate, _declared_rate, _stored_rate, ruled_rate


class RateViews(views.KeyedViews):
    policy = Rate
    columns = ('key', 'parked', 'waiting for', 'rate')

    @classmethod
    def explain(cls, connection: Any, job: dict[str, str], now: float) -> list[views.Explanation]:
        raw = job.get(cls.policy.field)
        if not raw:
            return []
        declared = _declared_rate(raw, None)
        if declared is None:
            return []
        key_id = raw.split(' ', 3)[3]
        scope, _, key = key_id.partition(':')
        with connection.pipeline(transaction=False) as pipe:
            pipe.get(keys.KEY_TAT_PREFIX(key_id))
            pipe.get(keys.KEY_BLOCK_PREFIX(key_id))
            pipe.lpos(keys.KEY_PARKED_PREFIX(cls.name, key_id), job['id'])
            pipe.hget(keys.KEY_RATES, key_id)
            pipe.hget(keys.KEY_RULES, Rate.rule_field(scope))
            tat, blocked, position, stored, rule = pipe.execute()
        stored_rate = _stored_rate(stored)
        ruled, source = ruled_rate(Rate.decode_rule(rule), key)
        rate = stored_rate or ruled or declared
        status = rate_status(rate, tat, blocked, now)
        assert status is not None
        entry: dict[str, Any] = {'scope': scope, 'key': key, 'limit': rate.limit,
                                 'per': rate.per, 'burst': rate.burst, 'available': status.available,
                                 'next_at': status.next_at}
        if len(rate.windows) > 1:
            entry['windows'] = [_window(w) for w in rate.windows]
            entry['held_by'] = None if status.held_by is None else _window(status.held_by)
        change = ''
        entry['set_at_run_time'] = stored_rate is not None
        entry['source'] = 'set' if stored_rate is not None else source or 'declared'
        mark = ' (set at run time)' if stored_rate is not None else f' ({source})' if source else ''
        words = f'key {key!r} (scope {scope}) rate {rate.rate_words()}{mark}: ' + rate_now_words(
            status.available, status.next_at, status.held_by, now)
        if position is not None:
            entry['parked_position'] = int(position)
            words += f' (parked, position {int(position) + 1})'
            change = 'it goes back to the front of its queue when its key\'s rate allows a start'
        if status.backoff_until is not None:
            entry['backoff_until'] = status.backoff_until
            words += f', backed off for {status.backoff_until - now:.1f} s more'
        verdict = words
        return [views.Explanation(cls.name, verdict, change, entry)]

    @classmethod
    def key_rows(cls, connection: Any, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` with jobs parked by their rate, most parked first, at most ``limit`` (0: all): each
        ``{'key', 'parked', 'next_due' (server time, or None), 'rate' ((limit, per, burst): the run-time rate, else
        the one its oldest parked job declares, or None; with several windows, the first's), 'windows' (every
        window's (limit, per, burst), or None), 'set_at_run_time', 'source' ('set', "rule tier '<prefix>'",
        'rule default', 'declared' or None: what gave the key its rate)}``. Found by SCAN (MATCH, COUNT), never KEYS,
        unless ``names`` gives the keys to read."""
        conn = _need(connection)
        scope = check_scope(scope)
        prefix = keys.KEY_PARKED_PREFIX(cls.name, scope, '')
        if names is None:
            found = keys.scanner(conn).scan_iter(match=reading.glob_escape(prefix) + '*', count=1000)
            names = sorted({text(raw)[len(prefix):] for raw in found})
            names = [k for k in names if search is None or search in k]
        with conn.pipeline(transaction=False) as pipe:
            for key in names:
                pipe.llen(prefix + key)
                pipe.zscore(keys.KEY_DUE, f'{cls.name}:{scope}:{key}')
                pipe.lindex(prefix + key, 0)
            pipe.hmget(keys.KEY_RATES, [keys.key_id(scope, key) for key in names] or ['-'])
            pipe.hget(keys.KEY_RULES, Rate.rule_field(scope))
            *replies, stored, stored_rule = pipe.execute()
        rule = Rate.decode_rule(stored_rule)
        heads = {i: text(replies[3 * i + 2]) for i in range(len(names)) if replies[3 * i + 2] is not None}
        with conn.pipeline(transaction=False) as pipe:
            for job_id in heads.values():
                pipe.hget(Job.redis_job_namespace_prefix + job_id, cls.policy.field)
            fields = dict(zip(heads, pipe.execute()))
        ruled = [ruled_rate(rule, key) for key in names]
        rates = [_stored_rate(stored[i]) or ruled[i][0] or _declared_rate(fields.get(i), f'{scope}:{key}')
                 for i, key in enumerate(names)]
        sources = ['set' if stored[i] is not None else ruled[i][1] or ('declared' if rates[i] else None)
                   for i in range(len(names))]
        rows = [{'key': key, 'parked': int(replies[3 * i]),
                 'next_due': float(replies[3 * i + 1]) if replies[3 * i + 1] is not None else None,
                 'rate': None if rates[i] is None else window_tuples(rates[i].windows)[0],
                 'windows': None if rates[i] is None else window_tuples(rates[i].windows),
                 'set_at_run_time': stored[i] is not None, 'source': sources[i]}
                for i, key in enumerate(names)]
        rows.sort(key=lambda r: (-r['parked'], r['key']))
        return rows[:limit] if limit else rows

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        out = []
        for row in rows:
            due = '' if row['next_due'] is None else f'; waiting for its rate: next start {at(row["next_due"], now)}'
            rate = '' if row['rate'] is None else ' ' + _row_rate(row)
            out.append(f'key {row["key"]}  rate{rate}{_mark(row)}: {row["parked"]} parked{due}')
        return out

    @classmethod
    def panel_row(cls, row: dict[str, Any], now: float) -> list[views.CellValue]:
        return [row['key'], row['parked'], None if row['next_due'] is None else
                views.Cell('its rate', note='next start', at=max(row['next_due'] - now, 0.0)),
                None if row['rate'] is None else _row_rate(row) + _mark(row)]


def _mark(row: dict[str, Any]) -> str:
    """What gave a key row its rate, when not its jobs' declaration: `` (set at run time)``, `` (rule ...)``."""
    if row.get('set_at_run_time'):
        return ' (set at run time)'
    return f' ({row["source"]})' if str(row.get('source')).startswith('rule') else ''


def _row_rate(row: dict[str, Any]) -> str:
    """A key row's rate in words: ``5/1s burst 2``, or its windows joined by `` + ``."""
    return ' + '.join('{}/{}s burst {}'.format(*w) for w in row.get('windows') or [row['rate']])


def _window(window: RateWindow) -> dict[str, int]:
    return {'limit': window.limit, 'per': window.per, 'burst': window.burst}
