"""The history checker (issue 31): reads a history folder (:mod:`tests.history.events`) and reports, per property,
the violations with the events that show them, the documented lapses counted apart, and figures.

    python -m tests.history.check HISTORY_DIR [--json] [--bounds FILE]

Exit code 1 on any violation, 0 otherwise (lapses are reported, not failed). docs/history.md says what each property
means precisely, which bounds it uses and how it treats the stamps' uncertainty; this module is the same in code: one
function per property (:data:`PROPERTIES`) over an :class:`Index` built once.

Time. Every event carries the server's time ``t``, measured by its process from an offset whose uncertainty is half
the calibration's round trip (``dt`` in the process's ``hello``), plus ``stamp_slack``: an event happened somewhere in
``[t - u, t + u]`` (:func:`lo`, :func:`hi`). A property flags a violation only when every placement of the events
inside their intervals breaks it, and excuses nothing that no placement explains. A door call happened (took effect
on the server) somewhere between its ``invoke`` and its completion, or exactly at the ``now`` its ``ok`` reports. A
run's start was decided by the fetch that took the job, before the job's ``start`` event: inside the worker's
``fetched`` stamps when the start carries them, else within ``start_lag`` before the start's stamp.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# -- the bounds ------------------------------------------------------------------------------------------------------

#: Every bound the checker uses: name -> (value, where it comes from). The product's come from its documentation;
#: the last three are the checker's own allowances for what the history does not record. ``--bounds FILE`` (a JSON
#: object of name -> value) overrides any of them.
BOUNDS: dict[str, tuple[float, str]] = {
    'due_delay': (2.0, "README 'Running workers' and docs/reliability.md: an idle PolicyWorker wakes at the due time; "
                       'after a restart or an outage due jobs run within about 2 s of the server answering'),
    'due_rounding': (1.0, 'docs/queue-rate.md (Snooze), docs/throttle-debounce.md: run times are whole seconds, as '
                          "rq's scheduled registry keeps them"),
    'lease': (90.0, 'docs/queue-slot.md: hold_ttl, job_monitoring_interval + 60 s by default; a nemesis event\'s own '
                    '`lease` wins'),
    'refresh_fraction': (1 / 3, 'docs/reliability.md "Kill shapes": a running job\'s holds are refreshed every third '
                                'of the keep period (the worker\'s beat, 30 s of 90, the same third): a hold may '
                                'lapse from lease x (1 - this) after its last seen refresh'),
    'recount_delay': (1.0, 'docs/reliability.md "Kill shapes": after SIGCONT the guard writes a lapsed hold back '
                           'within orphan_check_seconds (1 s)'),
    'worker_ttl': (90.0, "docs/loner.md: a started Loner(until='finished') holder counts while rq's worker key lives "
                         '(job_monitoring_interval + 60 s, 90 s by default) or its liveness key'),
    'fair_lag': (1.0, 'docs/fair.md: two keys that stay backlogged start in the ratio of their weights, within one '
                      'job, over any stretch (a pair may differ by fair_lag x (1/w_a + 1/w_b) starts per weight)'),
    'failover_loss_window': (1.0, 'docs/guarantees.md: a failover loses what the replica missed (asynchronous '
                                  'replication); the window before a SIGKILL failover whose writes may be lost '
                                  '(not measured yet: issue 31 item 4 measures it per topology)'),
    'start_lag': (1.0, 'the checker\'s allowance: a start event without `fetched` was decided by a fetch at most this '
                       'long before it (the fork and the job\'s first line)'),
    'default_dt': (0.05, "the checker's allowance: the round trip assumed for a process whose hello gives no dt"),
    'stamp_slack': (0.001, "the checker's allowance: a process's clock drift between two calibrations"),
}

#: Verdicts of an ``ok`` that leave a job waiting for the call (an acknowledged admission).
ADMITTING = ('admitted', 'replaced', 'parked', 'scheduled')
#: Verdicts that are a refusal.
REFUSING = ('dropped', 'raised')
#: What ``final`` may say of a job that is still visibly waiting (not lost).
WAITING = ('queued', 'scheduled', 'deferred', 'parked', 'waiting')
#: What ``final`` may say of a job that ended.
ENDED = ('finished', 'failed', 'stopped', 'canceled')
#: Nemesis actions: on a worker's processes, and on the server (a window during which it may not answer).
KILLS = ('kill_worker', 'kill_group')
STOPS = ('stop_worker', 'stop_group', 'stop_horse')
SERVER_FAULTS = ('restart_aof', 'outage', 'lost_reply', 'failover_kill', 'failover_graceful', 'migrate_slot')
INF = math.inf


def load_bounds(path: str | None) -> dict[str, float]:
    """The bounds in force: :data:`BOUNDS`, with the values of the JSON object in ``path`` over them."""
    bounds = {name: value for name, (value, _) in BOUNDS.items()}
    if path:
        given = json.loads(Path(path).read_text())
        if not isinstance(given, dict):
            raise SystemExit(f'--bounds {path}: expected a JSON object of name -> number, got {type(given).__name__}')
        for name, value in given.items():
            if name not in bounds:
                raise SystemExit(f'--bounds {path}: unknown bound {name!r} (known: {", ".join(sorted(bounds))})')
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise SystemExit(f'--bounds {path}: {name} must be a number >= 0, got {value!r}')
            bounds[name] = float(value)
    return bounds


# -- time ------------------------------------------------------------------------------------------------------------

def lo(event: dict) -> float:
    """The earliest server instant the event may have happened at."""
    return event['t'] - event['_u']


def hi(event: dict) -> float:
    """The latest server instant the event may have happened at."""
    return event['t'] + event['_u']


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted disjoint intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def clip(intervals: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """The parts of sorted disjoint intervals inside ``[t0, t1]``."""
    i = max(bisect.bisect_left(intervals, (t0, -INF)) - 1, 0)
    out = []
    while i < len(intervals) and intervals[i][0] < t1:
        a, b = intervals[i]
        if b > t0:
            out.append((max(a, t0), min(b, t1)))
        i += 1
    return out


def subtract(keep: list[tuple[float, float]], drop: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``keep`` minus ``drop`` (both sorted and disjoint)."""
    out = []
    j = 0
    for a, b in keep:
        while j < len(drop) and drop[j][1] <= a:
            j += 1
        k = j
        while k < len(drop) and drop[k][0] < b:
            if drop[k][0] > a:
                out.append((a, drop[k][0]))
            a = max(a, drop[k][1])
            k += 1
        if a < b:
            out.append((a, b))
    return out


def longest(intervals: list[tuple[float, float]]) -> tuple[float, float] | None:
    return max(intervals, key=lambda ab: ab[1] - ab[0], default=None)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class Timeline:
    """A setting's value over time: each change took effect at an unknown instant of ``[lo, hi]`` (the call's window).

    ``default`` is the value before any change, and what a change to None (a clear) goes back to (the declared
    value); it may be None (no limit).
    """

    def __init__(self, changes: list[tuple[float, float, Any, dict]], default: Any = None):
        self.changes = sorted(changes, key=lambda c: c[0])
        self.starts = [c[0] for c in self.changes]
        self.default = default

    def possible(self, t0: float, t1: float, default: Any = None) -> list[Any]:
        """Every value possibly in force at some instant of ``[t0, t1]`` (None values mean ``default``)."""
        base = self.default if default is None else default
        values = []
        # Back from the last change that may have taken effect by t1: every change still in doubt at t0 or made
        # inside [t0, t1], then the last one surely done before t0 (the value in force when the span began).
        j = bisect.bisect_right(self.starts, t1) - 1
        while j >= 0 and self.changes[j][1] >= t0:
            values.append(self.changes[j][2])
            j -= 1
        values.append(self.changes[j][2] if j >= 0 else None)
        return [base if v is None else v for v in values]


# -- loading ---------------------------------------------------------------------------------------------------------

@dataclass
class Op:
    """One door call: its ``invoke`` and its completion (``ok``, ``fail``, ``info``; None if the process died)."""

    id: str
    invoke: dict
    done: dict | None = None

    @property
    def kind(self) -> str:
        return self.done['e'] if self.done is not None else 'info'

    @property
    def verdict(self) -> str | None:
        return self.done.get('verdict') if self.kind == 'ok' else None

    @property
    def job(self) -> str | None:
        """The job waiting for the call: the ``ok``'s (a replaced job's id), else the id the caller passed."""
        if self.kind == 'ok' and self.done.get('job'):
            return self.done['job']
        return self.invoke.get('job')

    @property
    def lo(self) -> float:
        """The earliest instant the call may have taken effect."""
        now = self.done.get('now') if self.kind == 'ok' else None
        return now if now is not None else lo(self.invoke)

    @property
    def hi(self) -> float:
        """The latest instant the call may have taken effect (INF when its completion is unknown)."""
        if self.kind == 'ok':
            now = self.done.get('now')
            return now if now is not None else hi(self.done)
        if self.kind == 'fail':
            return hi(self.done)
        return INF

    @property
    def queue(self) -> str:
        return self.invoke.get('queue')

    @property
    def payload(self) -> Any:
        return self.invoke.get('payload')

    def policy(self, kind: str) -> dict | None:
        return policy_of(self.invoke, kind)

    @property
    def events(self) -> list[dict]:
        return [self.invoke] + ([self.done] if self.done is not None else [])


def policy_of(event: dict, kind: str) -> dict | None:
    """The resolved policy of ``kind`` an invoke or a start names, or None."""
    for item in event.get('policies') or ():
        if item.get('kind') == kind:
            return item
    return None


def key_id(policy: dict) -> tuple[Any, Any]:
    """A per-key policy's key: (scope, key); ``scope`` is None when the recorder folded it into ``key``."""
    return policy.get('scope'), policy.get('key')


@dataclass
class Run:
    """One execution of a job: its ``start``, its ``end`` (None when nothing recorded one)."""

    id: str
    start: dict
    end: dict | None = None
    #: The interval the fetch that took the job happened in (the run's start as the server decided it).
    lo: float = 0.0
    hi: float = 0.0
    #: Until when the worker may still have held what the run took (its release, its next fetch, its death + lease).
    after: float = INF

    @property
    def job(self) -> str:
        return self.start['job']

    @property
    def worker(self) -> str | None:
        return self.start.get('worker')

    @property
    def queue(self) -> str:
        return self.start.get('queue')

    @property
    def a(self) -> float:
        """From when the run surely ran."""
        return hi(self.start)

    @property
    def b(self) -> float | None:
        """Until when the run surely ran: its own end's earliest instant (None: only its start is known)."""
        end = self.end
        if end is None or end.get('p') != self.start.get('p'):
            return None  # an end the worker recorded for a horse that died earlier says nothing of when it died
        return max(lo(end), self.a) if lo(end) > self.a else None

    @property
    def end_hi(self) -> float | None:
        return hi(self.end) if self.end is not None else None

    @property
    def retry(self) -> bool:
        return bool(self.end is not None and self.end.get('retry'))

    def policy(self, kind: str) -> dict | None:
        return policy_of(self.start, kind)

    @property
    def events(self) -> list[dict]:
        return [self.start] + ([self.end] if self.end is not None else [])


@dataclass
class Fault:
    """One nemesis action: its ``begin`` and ``end`` events (a kill may have only a begin)."""

    action: str
    begin: dict
    end: dict | None = None

    @property
    def workers(self) -> list[str]:
        return list(self.begin.get('workers') or (self.end or {}).get('workers') or ())

    @property
    def lo(self) -> float:
        return lo(self.begin)

    @property
    def hi(self) -> float:
        return hi(self.end) if self.end is not None else INF

    def lease(self, default: float) -> float:
        value = self.begin.get('lease') or (self.end or {}).get('lease')
        return float(value) if value else default

    @property
    def events(self) -> list[dict]:
        return [self.begin] + ([self.end] if self.end is not None else [])


@dataclass
class Worker:
    name: str
    hello: dict | None = None
    queues: set = field(default_factory=set)
    runs: list[Run] = field(default_factory=list)
    #: Deaths: (earliest, latest, events) of a kill of the worker or its group, or its exit.
    deaths: list[tuple[float, float, list[dict]]] = field(default_factory=list)
    #: Freezes: (from, to, fault) of a SIGSTOP until its SIGCONT.
    freezes: list[tuple[float, float, Fault]] = field(default_factory=list)
    #: Every kill (horse included) or stop naming the worker, with its action.
    faults: list[Fault] = field(default_factory=list)
    #: Times of the worker process's own events (what it did, in order).
    own: list[float] = field(default_factory=list)


@dataclass
class Index:
    """Everything the properties read, built once from the sorted events."""

    folder: Path
    files: list[Path]
    events: list[dict]
    bounds: dict[str, float]
    torn: int = 0
    ops: dict[str, Op] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    jobs_runs: dict[str, list[Run]] = field(default_factory=lambda: defaultdict(list))
    jobs_ops: dict[str, list[Op]] = field(default_factory=lambda: defaultdict(list))
    workers: dict[str, Worker] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    settings: dict[tuple, list[tuple[float, float, Any, dict]]] = field(default_factory=lambda: defaultdict(list))
    releases: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    final: dict | None = None
    begin: float = 0.0
    end: float = 0.0

    # -- the queries every property shares --------------------------------------------------------------------------

    def timeline(self, what: str, scope: Any, key: Any = None, default: Any = None) -> Timeline:
        return Timeline(self.settings.get((what, scope, key), []), default)

    def final_status(self, job: str) -> str | None:
        if self.final is None:
            return None
        return (self.final.get('jobs') or {}).get(job)

    def server_faults(self, actions: tuple[str, ...] = SERVER_FAULTS) -> list[Fault]:
        return [f for f in self.faults if f.action in actions]

    def in_failover_window(self, t0: float, t1: float) -> Fault | None:
        """A SIGKILL failover whose lost window (``failover_loss_window`` before it, to its end) meets ``[t0, t1]``."""
        window = self.bounds['failover_loss_window']
        for fault in self.faults:
            if fault.action == 'failover_kill' and fault.lo - window <= t1 and t0 <= (
                    fault.hi if fault.end is not None else fault.lo + window):
                return fault
        return None

    def lapse_from(self, run: Run, at: float) -> Fault | None:
        """A kill or stop of the run's worker that may have let the run's holds lapse by ``at``: at least
        ``lease x (1 - refresh_fraction)`` after it began, and (for a stop) no later than its SIGCONT plus
        ``recount_delay``, when the guard writes the hold back."""
        worker = self.workers.get(run.worker)
        if worker is None:
            return None
        spare = 1 - self.bounds['refresh_fraction']
        for fault in worker.faults:
            if fault.action == 'kill_horse' or fault.lo > at or (run.b is not None and fault.lo > run.b) \
                    or fault.lo + fault.lease(self.bounds['lease']) * spare > at:
                continue
            if fault.action in STOPS:
                until = min((b for a, b, f in worker.freezes if f is fault), default=INF)
                if at > until + self.bounds['recount_delay']:
                    continue
            return fault
        return None


def read_history(folder: str | Path, bounds: dict[str, float]) -> Index:
    """Read every ``*.jsonl`` of ``folder`` (a line that does not parse, a killed process's torn last line, is
    counted and skipped), stamp each event with its uncertainty and sort them by time, once."""
    folder = Path(folder)
    files = sorted(folder.glob('*.jsonl'))
    if not files:
        raise SystemExit(f'{folder}: no *.jsonl files (a history folder holds one file per recording process)')
    events: list[dict] = []
    torn = 0
    loads = json.loads
    for number, path in enumerate(files):
        offset = 0
        with path.open('rb') as handle:
            for line in handle:
                here = offset
                offset += len(line)
                if not line.strip():
                    continue
                try:
                    event = loads(line)
                    event['t'] = float(event['t'])
                except (ValueError, KeyError, TypeError):
                    torn += 1
                    continue
                event['_f'] = number
                event['_o'] = here
                events.append(event)
    # Each process's stamp uncertainty, from its hello; a horse without one shares its worker's.
    slack, default = bounds['stamp_slack'], bounds['default_dt'] / 2
    by_process: dict[str, float] = {}
    by_worker: dict[str, float] = {}
    for event in events:
        if event.get('e') == 'hello':
            dt = event.get('dt')
            u = (float(dt) / 2 if dt is not None else default) + slack
            by_process[event.get('p')] = u
            if event.get('role') == 'worker' and event.get('worker'):
                by_worker[event['worker']] = u
    for event in events:
        u = by_process.get(event.get('p'))
        if u is None:
            u = by_worker.get(event.get('worker'), default + slack)
        event['_u'] = u
    events.sort(key=lambda e: e['t'])
    index = Index(folder=folder, files=files, events=events, bounds=bounds, torn=torn)
    build(index)
    return index


def build(ix: Index) -> None:
    """Fill the index: ops, runs, workers and their faults, settings, releases, the final event."""
    events = ix.events
    ix.begin = min((lo(e) for e in events), default=0.0)
    ix.end = max((hi(e) for e in events), default=0.0)
    runs: dict[str, Run] = {}
    open_faults: dict[Any, list[Fault]] = defaultdict(list)
    worker_process: dict[str, str] = {}
    for event in events:
        kind = event.get('e')
        if kind == 'invoke':
            ix.ops[event['op']] = Op(event['op'], event)
        elif kind in ('ok', 'fail', 'info'):
            op = ix.ops.get(event.get('op'))
            if op is not None and op.done is None:
                op.done = event
        elif kind == 'start':
            rid = event.get('run') or f'{event.get("job")}@{event["t"]}'
            if rid not in runs:
                runs[rid] = Run(rid, event)
        elif kind == 'end':
            run = runs.get(event.get('run'))
            if run is not None and run.end is None:
                run.end = event
        elif kind == 'hello':
            name = event.get('worker')
            if event.get('role') == 'worker' and name:
                worker = ix.workers.setdefault(name, Worker(name))
                worker.hello = event
                worker.queues.update(event.get('queues') or ())
                worker_process[event.get('p')] = name
        elif kind == 'nemesis':
            key = event.get('id') or (event.get('action'), json.dumps(event.get('target'), sort_keys=True))
            if event.get('phase') == 'end' and open_faults.get(key):
                open_faults[key].pop(0).end = event
            else:
                fault = Fault(event.get('action'), event)
                ix.faults.append(fault)
                if event.get('phase') == 'begin':
                    open_faults[key].append(fault)
        elif kind == 'exit':
            name = event.get('worker')
            if name:
                worker = ix.workers.setdefault(name, Worker(name))
                last = worker.own[-1] if worker.own else lo(event)
                worker.deaths.append((last, hi(event), [event]))
        elif kind == 'setting':
            what = event.get('what')
            scope = event.get('queue') if event.get('queue') is not None else event.get('scope')
            start = event['t0'] - event['_u'] if event.get('t0') is not None else lo(event)
            ix.settings[(what, scope, event.get('key'))].append((start, hi(event), event.get('value'), event))
        elif kind == 'release':
            ix.releases[event.get('job')].append(event)
        elif kind == 'final':
            ix.final = event
        name = worker_process.get(event.get('p'))
        if name is not None:
            ix.workers[name].own.append(event['t'])
    # Ops by the job they name.
    for op in ix.ops.values():
        for job in {op.job, op.invoke.get('job')} - {None}:
            ix.jobs_ops[job].append(op)
    # Faults onto the workers they name.
    conts = [f for f in ix.faults if f.action == 'cont']
    for fault in ix.faults:
        if fault.action not in KILLS + STOPS + ('kill_horse',):
            continue
        for name in fault.workers:
            worker = ix.workers.setdefault(name, Worker(name))
            worker.faults.append(fault)
            if fault.action in KILLS:
                worker.deaths.append((fault.lo, hi(fault.begin), fault.events))
            elif fault.action in STOPS:
                until = fault.hi if fault.end is not None else INF
                for cont in conts:
                    if cont.lo >= fault.lo and (name in cont.workers or cont.begin.get('target') ==
                                                fault.begin.get('target')):
                        until = min(until, hi(cont.begin))
                        break
                worker.freezes.append((fault.lo, until, fault))
    for worker in ix.workers.values():
        worker.deaths.sort(key=lambda d: d[0])
    # Runs: their fetch window, their worker's, and how long what they took may have been held.
    start_lag = ix.bounds['start_lag']
    worker_u = {name: (w.hello or {}).get('_u') for name, w in ix.workers.items()}
    for run in runs.values():
        start = run.start
        fetched = start.get('fetched')
        if fetched:
            u = worker_u.get(run.worker) or start['_u']
            run.lo, run.hi = fetched[0] - u, min(fetched[1] + u, hi(start))
        else:
            run.lo, run.hi = lo(start) - start_lag, hi(start)
        ix.runs.append(run)
        ix.jobs_runs[run.job].append(run)
        if run.worker:
            worker = ix.workers.setdefault(run.worker, Worker(run.worker))
            worker.runs.append(run)
            if not worker.hello:
                worker.queues.add(run.queue)
            elif not worker.hello.get('queues'):
                worker.queues.add(run.queue)
    ix.runs.sort(key=lambda r: r.lo)
    for runs_of in ix.jobs_runs.values():
        runs_of.sort(key=lambda r: r.start['t'])
    lease = ix.bounds['lease']
    for worker in ix.workers.values():
        worker.runs.sort(key=lambda r: r.start['t'])
        for i, run in enumerate(worker.runs):
            bounds_after = []
            for release in ix.releases.get(run.job, ()):
                if release['t'] >= run.start['t'] and release.get('claim') in (None, run.start.get('claim')):
                    bounds_after.append(hi(release))
                    break
            if i + 1 < len(worker.runs):
                bounds_after.append(worker.runs[i + 1].hi)
            for dead_lo, dead_hi, _ in worker.deaths:
                if dead_hi >= run.lo:
                    bounds_after.append(dead_hi + lease)
                    break
            run.after = min(bounds_after) if bounds_after else ix.end
            if run.end_hi is not None:
                run.after = max(run.after, run.end_hi)


# -- findings --------------------------------------------------------------------------------------------------------

@dataclass
class Finding:
    """One violation or lapse: what it is, the events that show it, and its size (lapses: how far over)."""

    what: str
    events: list[dict]
    size: float | None = None


@dataclass
class Result:
    number: int
    name: str
    violations: list[Finding] = field(default_factory=list)
    lapses: list[Finding] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def fmt(t: float | None) -> str:
    return 'never' if t is None or t == INF else f'{t:.3f}'
