"""What the views read from Redis, shared by the policies' views and the surfaces that render them.

* the queues this cluster knows (rq's queue set, the fetch policies' settings, the live workers);
* the per-identity key families of the admission policies, found by SCAN (never inside a script, never KEYS) and read
  in batches: every family for ``info`` (:func:`scan_identity_keys`, :func:`identity_rows`), or a bounded sample for a
  panel of the page (:func:`sample_family`);
* the records an admission leaves about a job id with no hash (tombstones, followed to the job that runs);
* the jobs the workers run, by claim token; the per-key policies' scopes and keys, found by a bounded SCAN.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from redis import Redis
from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker

from . import compat, keys
from .ops import text
from .policy import ADMISSION, FETCH, registered

_BATCH = 500


def glob_escape(value: str) -> str:
    """``value`` with the glob characters of SCAN MATCH escaped."""
    return ''.join('\\' + ch if ch in '*?[]\\' else ch for ch in value)


def any_field(connection: Any, name: str, pattern: str) -> bool:
    """Has hash ``name`` a field matching ``pattern`` (a SCAN MATCH glob)? HSCAN, stopping at the first."""
    return next(iter(connection.hscan_iter(name, match=pattern, count=1000)), None) is not None


def any_member(connection: Any, name: str, pattern: str) -> bool:
    """Has sorted set ``name`` a member matching ``pattern``? ZSCAN, stopping at the first."""
    return next(iter(connection.zscan_iter(name, match=pattern, count=1000)), None) is not None


def any_key(connection: Any, pattern: str) -> bool:
    """Is there a key matching ``pattern``? SCAN (through :func:`keys.scanner`), stopping at the first: a walk of
    the keyspace when there is none, for the admin calls that refuse an unknown scope, never a door."""
    client = keys.scanner(connection)
    cursor = 0
    while True:
        cursor, batch = client.scan(cursor=cursor, match=pattern, count=1000)
        if batch:
            return True
        if not cursor:
            return False


# -- queues ---------------------------------------------------------------------------------------------------------


def configured_queues(connection: Redis) -> set[str]:
    """Queues some fetch policy has a setting for (a cap, a rate: its ``queue_settings`` hash)."""
    names: set[str] = set()
    for cls in registered(FETCH):
        if cls.queue_settings is not None:
            names.update(text(name) for name in connection.hkeys(cls.queue_settings))
    return names


def queue_names(connection: Redis) -> list[str]:
    """Queues rq knows (``rq:queues``) and queues a fetch policy has a setting for, sorted."""
    prefix = Queue.redis_queue_namespace_prefix
    names = {text(key)[len(prefix):] for key in connection.smembers(Queue.redis_queues_keys)}
    names.update(configured_queues(connection))
    return sorted(names)


#: Queue names a PolicyQueue was built for in this process (:func:`declare_queue`): at most this many are kept.
DECLARED_MAX = 10_000
_declared: set[str] = set()


def declare_queue(name: str) -> None:
    """Note that this process built a PolicyQueue named ``name``: the queue is declared in code, so a setting made
    for it before its first enqueue (rq lists a queue only from then) is no typo (:func:`declared_queue`)."""
    if len(_declared) < DECLARED_MAX:
        _declared.add(name)


def declared_queue(name: str) -> bool:
    """Did this process build a PolicyQueue named ``name`` (:func:`declare_queue`)?"""
    return name in _declared


def known_queue(connection: Redis, name: str) -> bool:
    """Is ``name`` a queue this cluster uses: known to rq, configured by a policy, or listened to by a live worker?"""
    if connection.sismember(Queue.redis_queues_keys, Queue.redis_queue_namespace_prefix + name):
        return True
    if name in configured_queues(connection):
        return True
    return any(name in worker.queue_names() for worker in Worker.all(connection=connection))


def running_jobs(connection: Any, tokens: list[str]) -> dict[str, str]:
    """``'<host>:<pid>'`` -> the id of the job that worker runs, for the workers these claim tokens name (a claim
    token is ``<host>:<pid>:<tid>:<n>``, taken in the worker's own process). Reads rq's worker registry (O(workers),
    rq's own ``Worker.all``), and only when a hold is listed."""
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


# -- per-identity state (SCAN: for humans) --------------------------------------------------------------------------


def families() -> list[keys.Family]:
    """The per-identity key families of every registered admission policy, in the order ``info`` shows them."""
    found = []
    for cls in registered(ADMISSION):
        found.extend(cls.identity_families)
    return sorted(found, key=keys.FAMILIES.index) if all(f in keys.FAMILIES for f in found) else found


def scan_identity_keys(
    connection: Redis, queues: Iterable[str] | None, kinds: list[keys.Family]
) -> dict[str, dict[str, list[str]]]:
    """family name -> queue -> keys, found by SCAN (per queue when queues are named, else over the whole prefix)."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    wanted = None if queues is None else set(queues)
    for family in kinds:
        if queues is None:
            patterns = [family.head + '*']
        else:
            patterns = [f'{family.head}{glob_escape(q)}:*' for q in queues]
        for pattern in patterns:
            for raw in keys.scanner(connection).scan_iter(match=pattern, count=1000):
                key = text(raw)
                parsed = family.parse(key)
                if parsed is None:
                    continue
                queue = parsed[0]
                if wanted is not None and queue not in wanted:
                    continue  # a longer queue name that shares the pattern's prefix
                found[family.name][queue].append(key)
    return found


def identity_rows(connection: Redis, family: keys.Family, key_list: list[str],
                  job_prefix: str = Job.redis_job_namespace_prefix) -> list[dict[str, Any]]:
    """One row per key of ``family`` (sorted), as ``info --json`` lists them: the identity's digest, its job's
    description, the holder job and its status (or a pending job's hash), whether it still holds, and its expiry."""
    rows: list[dict[str, Any]] = []
    ordered = sorted(key_list)
    for chunk in (ordered[i: i + _BATCH] for i in range(0, len(ordered), _BATCH)):
        with connection.pipeline(transaction=False) as pipe:
            for key in chunk:
                if family.hash:
                    pipe.hgetall(key)
                else:
                    pipe.get(key)
                pipe.pttl(key)
            replies = pipe.execute()
        holders = [replies[2 * i] for i in range(len(chunk))]
        if family.hash:  # a pending job's state: its job id is the ``job`` field
            holders = [(value or {}).get(b'job', (value or {}).get('job')) for value in holders]
        # One HMGET per key that names a job (a key that expired since the SCAN names none): nothing keyless in the
        # pipeline, which a cluster's refuses (ECHO as a placeholder did).
        asked = [i for i, holder in enumerate(holders) if holder]
        statuses: list[Any] = [None] * len(chunk)
        if asked:
            with connection.pipeline(transaction=False) as pipe:
                for i in asked:
                    pipe.hmget(job_prefix + text(holders[i]), 'status', family.held_until_field or 'status',
                               'description', family.width_field or 'description')
                for i, found in zip(asked, pipe.execute()):
                    statuses[i] = found
        for i, key in enumerate(chunk):
            value, pttl = replies[2 * i], replies[2 * i + 1]
            _, digest, window = family.parse(key) or ('', '', None)
            row: dict[str, Any] = {'digest': digest}
            status, until, description, width = statuses[i] if isinstance(statuses[i], list) else (None,) * 4
            row['job_description'] = text(description) if description else None
            if family.windowed:
                row['slot'] = window
                if width is not None and text(width).isdigit() and str(window).isdigit():
                    # the window's bounds: slot n of width w is [n * w, (n + 1) * w) in epoch seconds
                    row['window_start'] = int(window) * int(text(width))
                    row['window_end'] = (int(window) + 1) * int(text(width))
            if family.hash:
                row['fields'] = {text(k): text(v) for k, v in (value or {}).items()}
            else:
                row['job_id'] = text(value) if value is not None else None
                row['job_status'] = text(status) if status else None
                if family.while_waiting:
                    # held while it waits, and with until='finished' while it runs too
                    row['waiting'] = row['job_status'] in compat.WAITING_STATUSES or (
                        bool(family.held_until_field) and until is not None and text(until) == 'finished'
                        and row['job_status'] == 'started')
            row['expires_in'] = round(pttl / 1000, 3) if pttl is not None and pttl >= 0 else None
            rows.append(row)
    return rows


#: Keys one bounded sample (:func:`sample_family`) lets SCAN examine. A SCAN with MATCH costs about 1 ms of server
#: time per 1,000 keys examined, so a family costs at most ~5 ms whatever the keyspace holds, and the page says when
#: the walk stopped before the end.
SAMPLE_BUDGET = 5_000


def sample_family(
    connection: Redis, family: keys.Family, limit: int, search: str | None = None, budget: int = SAMPLE_BUDGET
) -> dict[str, Any]:
    """At most ``limit`` keys of one per-identity family, read as :func:`identity_rows` reads them, in a bounded
    number of commands: SCAN (COUNT 1000, MATCH the family, and ``search`` as a substring of the queue name or the
    identity digest) stops once ``limit`` keys are found or ``budget`` keys were examined.

    Returns:
        ``{'rows': [...] (identity rows, plus 'queue'), 'complete': bool (the SCAN reached its end, so ``found`` is
        every match), 'found': keys matched}``.
    """
    pattern = family.head + '*' + (f'{glob_escape(search)}*' if search else '')
    found: list[str] = []
    cursor, examined, matched = 0, 0, 0
    while True:
        cursor, batch = keys.scanner(connection).scan(cursor=cursor, match=pattern, count=1000)
        examined += 1000
        for raw in batch:
            key = text(raw)
            if family.parse(key) is not None:
                matched += 1
                if len(found) < limit:
                    found.append(key)
        if cursor == 0 or len(found) >= limit or examined >= budget:
            break
    rows = identity_rows(connection, family, found)
    for key, row in zip(sorted(found), rows):
        row['queue'] = (family.parse(key) or ('',))[0]
    return {'rows': rows, 'complete': cursor == 0, 'found': matched}


def sample_note(sample: dict[str, Any], what: str) -> str:
    """What a panel built from :func:`sample_family` says about its counts (exact, or a lower bound)."""
    shown = len(sample['rows'])
    if sample['complete'] and sample['found'] == shown:
        return f'{shown} {what}'
    total = f'{sample["found"]}' if sample['complete'] else f'at least {sample["found"]} (the page stopped looking)'
    return f'showing {shown} of {total} {what}; rq-policies info --limit 0 lists them all'


# -- a job id with no hash: what the admission left about it --------------------------------------------------------


def job_status(connection: Any, job_prefix: str, job_id: str) -> tuple[str, str]:
    """``(status, origin)`` of job ``job_id`` ('' for what its hash lacks, both for no hash): for ``explain`` hooks
    naming another job (a holder, a replacement)."""
    status, origin = connection.hmget(job_prefix + job_id, 'status', 'origin')
    return (status.decode() if isinstance(status, bytes) else status or '',
            origin.decode() if isinstance(origin, bytes) else origin or '')


def read_tombstone(raw: Any) -> dict[str, Any] | None:
    """A tombstone (``keys.superseded``, lib/pending.lua) as ``{'policy', 'by', 'merged'}``: "<policy> <by>" (a
    pending job deleted and replaced by job ``by``) or "<policy> <by> merged <created>" (an enqueue whose payload was
    written into pending job ``by`` in place: its own id was never a job). None for none, and for a rewrite guard
    ("rewrite ..."), which the fetch reads and which says nothing of a gone id."""
    if raw is None:
        return None
    value = text(raw)
    if value.startswith('rewrite '):
        return None
    policy, _, rest = value.partition(' ')
    by, _, how = rest.partition(' ')
    return {'policy': policy, 'by': by, 'merged': how.split(' ')[0] == 'merged'}


#: The most tombstones ``explain`` follows from a gone id to the job that will run (each hop is one round trip).
CHAIN_HOPS = 32


def follow(connection: Any, job_prefix: str, by: str) -> tuple[list[str], str, str]:
    """Follow a chain of replacements from job ``by`` (the job that replaced a gone one) to the job that will run:
    while a job in the chain has no hash but a tombstone of its own (it was itself superseded, or merged, as
    pending jobs were before they were rewritten in place), go on to the job that one names. Returns (the chain,
    ``by`` first; the last job's status and queue, '' when it is gone too)."""
    chain = [by]
    status, queue = '', ''
    for _ in range(CHAIN_HOPS):
        with connection.pipeline(transaction=False) as pipe:
            pipe.hmget(job_prefix + chain[-1], 'status', 'origin')
            pipe.get(keys.superseded(chain[-1]))
            (status, queue), raw = pipe.execute()
        status, queue = text(status) if status is not None else '', text(queue) if queue is not None else ''
        if status or queue:
            break
        nxt = read_tombstone(raw)
        if nxt is None or not nxt['by'] or nxt['by'] in chain:
            break
        chain.append(nxt['by'])
    return chain, status, queue


# -- the per-key policies' keys (Concurrency, Rate): bounded SCANs --------------------------------------------------


def scopes(conn: Any, policy: str, holds: bool = True) -> set[str]:
    """The scopes with parked jobs of ``policy`` (and, with ``holds``, live holds): SCAN with COUNT, never KEYS."""
    found: set[str] = set()
    prefixes = [keys.KEY_PARKED_PREFIX(policy, '')] + ([keys.KEY_HOLDS_PREFIX] if holds else [])
    for prefix in prefixes:
        for raw in keys.scanner(conn).scan_iter(match=prefix + '*', count=1000):
            found.add(text(raw)[len(prefix):].split(':', 1)[0])
    return found


#: What one dashboard read of a per-key policy may cost: SCAN examines at most PANEL_BUDGET keys (as
#: :data:`SAMPLE_BUDGET` for the identity families), and at most PANEL_KEYS keys of a scope are read.
PANEL_BUDGET = 5_000
PANEL_KEYS = 200


def sample_keys(conn: Any, policy: str, holds: bool, budget: int = PANEL_BUDGET) -> tuple[dict[str, set[str]], bool]:
    """scope -> the keys with parked jobs of ``policy`` (and, with ``holds``, a hold ledger), from one SCAN walk
    (COUNT 1000) of the per-key keys that stops once ``budget`` keys were examined; and whether it reached the end."""
    prefixes = [keys.KEY_PARKED_PREFIX(policy, '')] + ([keys.KEY_HOLDS_PREFIX] if holds else [])
    found: dict[str, set[str]] = {}
    cursor, examined = 0, 0
    while True:
        cursor, batch = keys.scanner(conn).scan(cursor=cursor, match=glob_escape(keys.PREFIX) + 'key*', count=1000)
        examined += 1000
        for raw in batch:
            name = text(raw)
            for prefix in prefixes:
                if name.startswith(prefix):
                    scope, _, key = name[len(prefix):].partition(':')
                    found.setdefault(scope, set()).add(key)
        if cursor == 0 or examined >= budget:
            return found, cursor == 0


def panel_names(found: set[str], search: str | None, complete: bool) -> tuple[list[str], str | None]:
    """The keys of one scope a panel reads (matching ``search``, at most PANEL_KEYS) and the note it shows when that
    is not every key of the scope."""
    names = sorted(k for k in found if search is None or search in k)
    note = None
    if len(names) > PANEL_KEYS or not complete:
        note = (f'from {min(len(names), PANEL_KEYS)} of {"at least " if not complete else ""}{len(names)} keys '
                '(the page stopped looking); rq-policies keys SCOPE --limit 0 lists them all')
    return names[:PANEL_KEYS], note
