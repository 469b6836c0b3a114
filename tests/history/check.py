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
import gc
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
    'in_process_ttl': (240.0, "docs/loner.md: an in-process worker (rq's SimpleWorker) cannot beat while its job runs, "
                              "so rq sets its key's ttl to the job's timeout + 60 s at the start (rq's default timeout "
                              '180 s): its started holder counts that long after the start if the worker dies'),
    'fair_lag': (1.0, 'docs/fair.md: two keys that stay backlogged start in the ratio of their weights, within one '
                      'job, over any stretch (a pair may differ by fair_lag turns of the queue\'s lightest key at '
                      'each end of a stretch: fair_lag x 2 / w_min starts per weight)'),
    'failover_loss_window': (1.0, 'docs/guarantees.md: a failover loses what the replica missed (asynchronous '
                                  'replication); the window before a SIGKILL failover whose writes may be lost '
                                  '(not measured yet: issue 31 item 4 measures it per topology)'),
    'given_back_lag': (1.0, 'docs/per-key.md: a rate-parked job "comes back with its start already paid": its start '
                            'was decided when it was given back, before its fetch (not measured: how long before '
                            'is up to the workers; a window this explains is a lapse)'),
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
    """The resolved policy of ``kind`` an invoke or a start names, or None (a dict by kind, made once per event)."""
    found = event.get('_policies')
    if found is None:
        found = event['_policies'] = {}
        for item in event.get('policies') or ():
            found.setdefault(item.get('kind'), item)
    return found.get(kind)


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
    #: Its runs' start stamps, in order (for bisecting ``runs``).
    starts: list[float] = field(default_factory=list)


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


def read_file(data: bytes, number: int) -> tuple[list[dict], int]:
    """One file's events, each with its file number and its line's byte offset; and how many lines did not parse.
    The lines are parsed as one JSON array (one call into the C decoder, not one a line); a file with a torn line is
    parsed again line by line."""
    lines, offsets, offset = [], [], 0
    for line in data.split(b'\n'):
        if line.strip():
            lines.append(line)
            offsets.append(offset)
        offset += len(line) + 1
    try:
        found = json.loads(b'[' + b','.join(lines) + b']')
        if not all(isinstance(e, dict) and isinstance(e.get('t'), (int, float)) for e in found):
            raise ValueError('an event without a time')
    except ValueError:
        found = []
        for line in lines:
            try:
                event = json.loads(line)
                float(event['t'])
            except (ValueError, KeyError, TypeError):
                event = None
            found.append(event)
    events, torn = [], 0
    for event, here in zip(found, offsets):
        if event is None:
            torn += 1
            continue
        event['t'] = float(event['t'])
        event['_f'] = number
        event['_o'] = here
        events.append(event)
    return events, torn


def read_history(folder: str | Path, bounds: dict[str, float]) -> Index:
    """Read every ``*.jsonl`` of ``folder`` (a line that does not parse, a killed process's torn last line, is
    counted and skipped), stamp each event with its uncertainty and sort them by time, once."""
    folder = Path(folder)
    files = sorted(folder.glob('*.jsonl'))
    if not files:
        raise SystemExit(f'{folder}: no *.jsonl files (a history folder holds one file per recording process)')
    events: list[dict] = []
    torn = 0
    for number, path in enumerate(files):
        found, bad = read_file(path.read_bytes(), number)
        events += found
        torn += bad
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
    # Completions and ends are paired once every invoke and start is known: two processes' stamps (a horse's start,
    # the worker's end for it) or one process's across a recalibration may sort an ending before its beginning.
    completions, ends = [], []
    for event in events:
        kind = event.get('e')
        if kind == 'invoke':
            ix.ops.setdefault(event['op'], Op(event['op'], event))
        elif kind in ('ok', 'fail', 'info'):
            completions.append(event)
        elif kind == 'start':
            rid = event.get('run') or f'{event.get("job")}@{event["t"]}'
            if rid not in runs:
                runs[rid] = Run(rid, event)
        elif kind == 'end':
            ends.append(event)
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
    for event in completions:
        op = ix.ops.get(event.get('op'))
        if op is not None and op.done is None:
            op.done = event
    for event in ends:
        run = runs.get(event.get('run'))
        if run is not None and run.end is None:
            run.end = event
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
            if not (worker.hello or {}).get('queues'):
                worker.queues.add(run.queue)  # no queues said: those its runs came from
    ix.runs.sort(key=lambda r: r.lo)
    for runs_of in ix.jobs_runs.values():
        runs_of.sort(key=lambda r: r.start['t'])
    lease = ix.bounds['lease']
    for worker in ix.workers.values():
        worker.runs.sort(key=lambda r: r.start['t'])
        worker.starts = [r.start['t'] for r in worker.runs]
        for i, run in enumerate(worker.runs):
            bounds_after = []
            for release in ix.releases.get(run.job, ()):
                if release['t'] >= run.start['t'] and release.get('claim') in (None, run.start.get('claim')):
                    bounds_after.append(hi(release))
                    break
            if i + 1 < len(worker.runs):
                bounds_after.append(worker.runs[i + 1].hi)
            for _, dead_hi, _ in worker.deaths:
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


#: At most this many findings of each kind are kept per property (the rest are counted).
KEEP = 200


def add(found: list[Finding], result: Result, what: str, events: list[dict], size: float | None = None) -> None:
    if len(found) < KEEP:
        found.append(Finding(what, sorted(events, key=lambda e: e['t']), size))
    else:
        result.figures['findings_not_kept'] = result.figures.get('findings_not_kept', 0) + 1


def violation(result: Result, what: str, events: list[dict], size: float | None = None) -> None:
    add(result.violations, result, what, events, size)


def lapse(result: Result, what: str, events: list[dict], size: float | None = None) -> None:
    add(result.lapses, result, what, events, size)


def payload_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def admitting_ops(ix: Index) -> list[Op]:
    """The acknowledged admissions, in the order of their invokes."""
    return [op for op in ix.ops.values() if op.kind == 'ok' and op.verdict in ADMITTING]


# -- 1. no loss ------------------------------------------------------------------------------------------------------

def no_loss(ix: Index) -> Result:
    """Every acknowledged admission (an ``ok`` admitted, replaced, parked or scheduled) reaches an end without a
    retry, or the ``final`` drain shows its job waiting (queued, scheduled, deferred, parked); a job whose last run
    has no end record (its process was killed) and that ``final`` shows ended counts as ended. A job a later call
    deleted by design (its ``ok``'s ``dropped_jobs``: a force's dropped pending job) is not lost. A loss whose
    admission fell in a SIGKILL failover's lost window is a lapse (docs/guarantees.md)."""
    result = Result(1, 'no loss')
    if ix.final is None:
        result.notes.append('not checked: the history has no final event (the run did not drain)')
        return result
    if ix.final.get('drained') is False:
        result.notes.append('the final drain timed out: jobs still running or waiting then are judged as final '
                            'shows them')
    deleted: dict[str, Op] = {}
    for op in ix.ops.values():
        if op.kind == 'ok':
            for job in op.done.get('dropped_jobs') or ():
                deleted.setdefault(job, op)
    seen = set()
    for op in admitting_ops(ix):
        job = op.job
        if job in seen:
            continue
        seen.add(job)
        runs = ix.jobs_runs.get(job, [])
        status = ix.final_status(job)
        if any(run.end is not None and not run.retry for run in runs) or status in WAITING:
            continue
        if runs and runs[-1].end is None and status in ENDED:
            continue
        if job in deleted and deleted[job].lo >= op.lo:
            continue
        said = (f'its last run {runs[-1].id} ' + ('ended with a retry' if runs[-1].end is not None else 'has no end')
                if runs else 'it never started')
        what = f'job {job}: admitted ({op.verdict}) at {fmt(op.hi)}; {said}; final says {status or "nothing"}'
        evidence = op.events + [e for run in runs[-2:] for e in run.events] + [ix.final]
        fault = ix.in_failover_window(op.lo, op.hi)
        if fault is not None:
            lapse(result, what + f'; admitted in the lost window of {fault.action} at {fmt(fault.lo)}',
                  evidence + fault.events, 1)
        else:
            violation(result, what, evidence)
    result.figures['acknowledged'] = len(seen)
    return result


# -- 2. no double run ------------------------------------------------------------------------------------------------

def surely_overlap(x: Run, y: Run) -> bool:
    """Were both runs surely running at one instant, wherever their events fall inside their intervals?"""
    if x.b is not None and y.b is not None:
        return max(x.a, y.a) < min(x.b, y.b)
    for p, q in ((x, y), (y, x)):  # one known only by its start: it started while the other surely ran
        if p.b is not None and p.a <= lo(q.start) and hi(q.start) <= p.b:
            return True
    return False


def moved_on(ix: Index, worker: Worker, first: Run, before: float) -> bool:
    """Had the worker surely finished with ``first`` before ``before`` (a release of it, or a later fetch)?"""
    done = first.end_hi if first.end is not None else first.a
    for release in ix.releases.get(first.job, ()):
        if release['t'] >= first.start['t'] and hi(release) < before:
            return True
    # Its next runs after ``done`` (the first few: later ones only end later).
    k = bisect.bisect_right(worker.starts, done)
    return any(run is not first and run.lo > done and run.hi < before for run in worker.runs[k:k + 3])


def justified(ix: Index, first: Run, second: Run) -> list[dict] | None:
    """The events that allow ``second`` after ``first`` (a retry, a stop, a death of first's worker), or None."""
    if first.retry or (first.end is not None and 'retry' in first.end and first.end['retry'] is None):
        return first.events  # retried, or the worker could not read whether rq would run it again
    if first.end is not None and first.end.get('outcome') == 'stopped':
        return first.events
    worker = ix.workers.get(first.worker)
    if worker is None:
        return None
    # A clean exit (code 0) came after the worker finished its jobs: it explains no second run.
    marks = [(d_lo, d_hi, events) for d_lo, d_hi, events in worker.deaths
             if not (events[0].get('e') == 'exit' and events[0].get('code') == 0)]
    marks += [(f.lo, hi(f.begin), f.events) for f in worker.faults]
    for m_lo, m_hi, events in sorted(marks, key=lambda m: m[0]):
        if m_lo <= second.hi and m_hi >= first.lo and not moved_on(ix, worker, first, m_lo):
            return events
    return None


def no_double_run(ix: Index) -> Result:
    """A job's runs never overlap (both surely running at one instant), and each run after the first follows a
    first run that ended with ``retry``, or was stopped, or a recorded kill, stop or exit of its worker after it
    started and before the second run's fetch (while the worker had not yet surely moved on to other work)."""
    result = Result(2, 'no double run')
    twice = 0
    for job, runs in ix.jobs_runs.items():
        if len(runs) < 2:
            continue
        twice += 1
        for i in range(1, len(runs)):
            second = runs[i]
            both = next((first for first in runs[:i] if surely_overlap(first, second)), None)
            if both is not None:
                violation(result, f'job {job} ran twice at once: run {both.id} on {both.worker} '
                                  f'({fmt(both.a)}..{fmt(both.b)}) and run {second.id} on {second.worker} '
                                  f'from {fmt(second.a)}', both.events + second.events)
                continue
            first = runs[i - 1]
            if justified(ix, first, second) is None:
                violation(result, f'job {job} ran again: run {second.id} on {second.worker} at '
                                  f'{fmt(second.start["t"])} after run {first.id} on {first.worker} (started '
                                  f'{fmt(first.start["t"])}, ' + (f'ended {first.end.get("outcome")} without a retry'
                                                                   if first.end is not None else 'no end') +
                                  f'), with no death or stop of {first.worker} between',
                          first.events + second.events)
    result.figures['jobs_run_more_than_once'] = twice
    return result


# -- 3. no phantom ---------------------------------------------------------------------------------------------------

def no_phantom(ix: Index) -> Result:
    """Every run's job was named by a call that admitted it (an ``ok`` with an admitting verdict naming it) or may
    have (an ``info``: unknown outcome), and no run started before the first such call was invoked."""
    result = Result(3, 'no phantom')
    for job, runs in ix.jobs_runs.items():
        ops = ix.jobs_ops.get(job, [])
        naming = [op for op in ops if (op.kind == 'ok' and op.verdict in ADMITTING and op.job == job)
                  or (op.kind == 'info' and op.invoke.get('job') == job)]
        first = runs[0]
        if not naming:
            said = ', '.join(f'{op.kind} {op.verdict or ""}'.strip() for op in ops) or 'no call'
            violation(result, f'job {job} ran (run {first.id} on {first.worker}) but no call admitted it ({said})',
                      first.events + [e for op in ops for e in op.events])
            continue
        earliest = min(naming, key=lambda op: lo(op.invoke))
        if first.hi < lo(earliest.invoke):
            violation(result, f'job {job} started at {fmt(first.start["t"])} before the call that admitted it was '
                              f'invoked ({fmt(earliest.invoke["t"])})', first.events + earliest.events)
    result.figures['jobs_that_ran'] = len(ix.jobs_runs)
    return result


# -- 4. Loner --------------------------------------------------------------------------------------------------------

@dataclass
class Holder:
    """A job holding a Loner identity: admitted between ``lo`` and ``hi`` (``hi`` INF: only maybe, an info)."""

    job: str
    ops: list[Op]
    lo: float = INF
    hi: float = INF
    sure_end: float = -INF
    poss_end: float = INF


def death_after(ix: Index, worker_name: str | None, t: float) -> tuple[float, float, list[dict]] | None:
    worker = ix.workers.get(worker_name)
    if worker is None:
        return None
    return next((d for d in worker.deaths if d[1] >= t), None)


def loner_ends(ix: Index, holder: Holder, until: str, ttl: float | None) -> None:
    """Until when a holder surely held its identity, and until when it may have (docs/loner.md's table)."""
    runs = ix.jobs_runs.get(holder.job, [])
    status = ix.final_status(holder.job)
    if not runs:
        sure = ix.end if status in WAITING else holder.hi
        poss = ix.end
    elif until == 'finished':
        last = runs[-1]
        if last.end is not None:
            sure = ix.end if last.retry and status in WAITING else lo(last.end)
            poss = last.after
        else:
            sure = last.a
            death = death_after(ix, last.worker, last.lo)
            poss = death[1] + max(ix.bounds['worker_ttl'], ix.bounds['lease']) if death else ix.end
            if death and last.start.get('p') == last.worker:  # run in the worker's own process: its key's start ttl
                poss = max(poss, last.a + ix.bounds['in_process_ttl'])
    else:
        sure, poss = runs[0].lo, runs[0].hi
    if ttl:
        sure, poss = min(sure, holder.lo + ttl), min(poss, holder.hi + ttl)
    holder.sure_end, holder.poss_end = sure, poss


def check_payloads(ix: Index, result: Result, job: str, applied: list[Op], maybe: list[Op], what: str) -> None:
    """The job's first run carries the payload of the last call merged into it: ``applied`` are the ``ok`` calls
    surely merged into it (its admission, the replacing calls), ``maybe`` the calls of its identity whose outcome is
    unknown. A call is the last unless another surely took effect after it."""
    runs = ix.jobs_runs.get(job)
    if not runs or not applied:
        return
    run = runs[0]
    for op in applied:
        if op.verdict == 'replaced' and op.lo > run.hi:
            violation(result, f'{what}: job {job} was replaced by call {op.id} after it had started '
                              f'({fmt(run.start["t"])})', op.events + [run.start])
    before = [op for op in applied if op.lo <= run.hi]
    if not before:
        return
    latest = max(op.lo for op in before)
    last = [op for op in before if op.hi >= latest]
    last += [op for op in maybe if lo(op.invoke) <= run.hi]
    if payload_text(run.start.get('payload')) not in {payload_text(op.payload) for op in last}:
        shown = ', '.join(f'{payload_text(op.payload)} (call {op.id})' for op in last[:3])
        violation(result, f'{what}: job {job} ran payload {payload_text(run.start.get("payload"))}, not the last '
                          f'one merged into it: {shown}', [e for op in before[-4:] for e in op.events] + [run.start])


def loner(ix: Index) -> Result:
    """Per identity and queue: never two holders alive at once (a holder holds from its admission to its fetch with
    ``until='started'``, to its last run's end with ``until='finished'``; both surely alive at one instant); every
    drop or raise by the Loner had a holder that may have been alive at some instant of the call's window (the one
    it names, when it names one); a ``replace`` never loses the last payload. A second holder admitted after the
    first's worker froze or died for longer than the lease, or in a SIGKILL failover's lost window, is a lapse."""
    result = Result(4, 'Loner')
    groups: dict[tuple, list[Op]] = defaultdict(list)
    for op in ix.ops.values():
        policy = op.policy('loner')
        if policy is not None:
            groups[(op.queue, policy.get('identity'))].append(op)
    for (queue, identity), ops in groups.items():
        policy = ops[0].policy('loner')
        until, ttl = policy.get('until') or 'started', policy.get('ttl')
        holders: dict[str, Holder] = {}
        for op in ops:
            if op.kind == 'ok' and op.verdict in ('admitted', 'scheduled', 'parked'):
                holder = holders.setdefault(op.job, Holder(op.job, []))
                holder.hi = min(holder.hi, op.hi)
            elif op.kind == 'info' and op.invoke.get('job'):
                holder = holders.setdefault(op.invoke['job'], Holder(op.invoke['job'], []))
            else:
                continue
            holder.ops.append(op)
            holder.lo = min(holder.lo, op.lo)
        for holder in holders.values():
            loner_ends(ix, holder, until, ttl)
        # Two holders alive at once: sure intervals [admitted, sure end] that intersect.
        best: Holder | None = None
        for holder in sorted((h for h in holders.values() if h.hi < INF), key=lambda h: h.hi):
            if best is not None and holder.hi < best.sure_end:
                what = (f'identity {identity} on {queue} ({until}): job {holder.job} admitted at {fmt(holder.hi)} '
                        f'while job {best.job} held it (admitted {fmt(best.hi)}, held until {fmt(best.sure_end)})')
                evidence = [e for op in best.ops[:2] + holder.ops[:2] for e in op.events]
                runs = ix.jobs_runs.get(best.job, [])
                evidence += [e for run in runs[-1:] for e in run.events]
                fault = ix.lapse_from(runs[-1], holder.lo) if runs and until == 'finished' else None
                if fault is not None and holder.lo < fault.lo + max(ix.bounds['worker_ttl'], fault.lease(
                        ix.bounds['lease'])) * (1 - ix.bounds['refresh_fraction']):
                    fault = None  # the worker's key holds the identity too (docs/loner.md)
                fault = fault or ix.in_failover_window(best.lo, best.hi)
                if fault is not None:
                    lapse(result, what + f'; after {fault.action} at {fmt(fault.lo)}', evidence + fault.events, 1)
                else:
                    violation(result, what, evidence)
            if best is None or holder.sure_end > best.sure_end:
                best = holder
        # Every drop or raise had a live holder.
        for op in ops:
            if op.kind != 'ok' or op.verdict not in REFUSING:
                continue
            decider = op.done.get('policy')
            others = {p.get('kind') for p in op.invoke.get('policies') or ()} & {'throttle', 'fair'}
            if decider not in (None, 'loner') or (decider is None and others):
                continue
            named = op.done.get('holder')
            candidates = [holders[named]] if named in holders else ([] if named else list(holders.values()))
            if not any(h.lo <= op.hi and h.poss_end >= op.lo for h in candidates):
                said = f'its holder {named}' if named else 'any holder'
                if named and named not in holders:
                    said += ' (never admitted with this identity)'
                shown = candidates[0] if candidates else None
                evidence = op.events + ([e for o in shown.ops[:2] for e in o.events] if shown else [])
                evidence += [e for run in ix.jobs_runs.get(named, [])[:1] for e in run.events]
                violation(result, f'identity {identity} on {queue}: call {op.id} was {op.verdict} between '
                                  f'{fmt(op.lo)} and {fmt(op.hi)}, when {said} could not have held it', evidence)
        # replace never loses the last payload.
        if policy.get('on_conflict') == 'replace':
            maybe = [op for op in ops if op.kind == 'info']
            merged: dict[str, list[Op]] = defaultdict(list)
            for op in ops:
                if op.kind == 'ok' and op.verdict in ('admitted', 'scheduled', 'parked', 'replaced'):
                    merged[op.job].append(op)
            for job, applied in merged.items():
                check_payloads(ix, result, job, applied, maybe, f'identity {identity} on {queue}')
    result.figures['identities'] = len(groups)
    return result


# -- 5. QueueSlot and Concurrency ------------------------------------------------------------------------------------

def limit_over(timeline: Timeline, t0: float, t1: float, declared: Any) -> float | None:
    """The largest limit possibly in force over ``[t0, t1]`` (None: possibly no limit)."""
    values = timeline.possible(t0, t1, declared)
    if any(v is None for v in values):
        return None
    return max(values)


def sweep_limit(ix: Index, result: Result, label: str, runs: list[Run], cost_of: Any, timeline: Timeline,
                declared_of: Any) -> int:
    """Sweep the runs' sure intervals [start's latest instant, own end's earliest): at each start, the costs of the
    runs surely running plus its own must not exceed the largest limit possibly in force at the fetch of whichever of
    them was fetched last (so over [the earliest of their fetches, this start]). When the runs whose holds may have
    lapsed by then (their worker frozen or dead for a lease, or taken in a failover's lost window) account for the
    excess, it is a lapse. Returns the peak."""
    points = []
    for n, run in enumerate(runs):
        points.append((run.a, 1, n))
        if run.b is not None:
            points.append((run.b, 0, n))
    points.sort()
    open_runs: dict[int, Run] = {}
    used = peak = 0
    for t, kind, n in points:
        run = runs[n]
        if kind == 0:
            if open_runs.pop(n, None) is not None:
                used -= cost_of(run)
            continue
        cost = cost_of(run)
        total = used + cost
        peak = max(peak, total)
        if run.b is not None:
            open_runs[n] = run
            used += cost
        quick = limit_over(timeline, run.lo, t, declared_of([run]))
        if quick is None or total <= quick:
            continue
        members = [m for m in open_runs.values() if m is not run] + [run]
        limit = limit_over(timeline, min(m.lo for m in members), t, declared_of(members))
        if limit is None or total <= limit:
            continue
        shown = sorted(members, key=lambda m: m.a)[-12:]
        what = (f'{label}: {total} running at {fmt(t)} over a limit of {limit:g} (runs '
                + ', '.join(f'{m.job} on {m.worker} from {fmt(m.a)}' for m in shown) + ')')
        evidence = [m.start for m in shown] + [m.end for m in shown if m.end is not None]
        evidence += [c[3] for c in timeline.changes if c[0] <= t][-1:]  # the limit in force
        for m in shown:  # faults of their workers since they started: why they are, or are not, lapses
            worker = ix.workers.get(m.worker)
            evidence += [e for f in (worker.faults if worker else []) if m.lo <= f.lo <= t for e in f.events][:2]
        lapsed, faults = [], []
        for m in members:
            fault = None if m is run else (ix.lapse_from(m, t) or ix.in_failover_window(m.lo, m.hi))
            if fault is not None:
                lapsed.append(m)
                faults.append(fault)
        if lapsed and total - sum(cost_of(m) for m in lapsed) <= limit:
            lapse(result, what + '; lapsed: ' + ', '.join(f'{m.job} ({f.action} at {fmt(f.lo)})'
                                                          for m, f in zip(lapsed, faults)),
                  evidence + [e for f in faults[:3] for e in f.events if e not in evidence], total - limit)
        else:
            violation(result, what, evidence, total - limit)
    return peak


def caps(ix: Index) -> Result:
    """QueueSlot per queue (every run of the queue counts 1; the cap from ``setting`` cap events, else the
    ``queue_slot`` cap the jobs declare) and Concurrency per key (a run counts its ``cost``; the limit from
    ``setting`` key_limit events, else the declared one): see :func:`sweep_limit`."""
    result = Result(5, 'QueueSlot and Concurrency')
    by_queue: dict[str, list[Run]] = defaultdict(list)
    by_key: dict[tuple, list[Run]] = defaultdict(list)
    for run in ix.runs:
        by_queue[run.queue].append(run)
        policy = run.policy('concurrency')
        if policy is not None:
            by_key[key_id(policy)].append(run)
    peaks = {}
    for queue, runs in by_queue.items():
        declared = [p.get('cap') for p in (r.policy('queue_slot') for r in runs) if p and p.get('cap') is not None]
        timeline = ix.timeline('cap', queue, default=max(declared) if declared else None)
        if not timeline.changes and not declared:
            continue
        peaks[f'queue {queue}'] = sweep_limit(ix, result, f'queue {queue}', runs, lambda r: 1, timeline,
                                              lambda members: None)
    for (scope, key), runs in by_key.items():
        timeline = ix.timeline('key_limit', scope, key)

        def declared(members: list[Run]) -> Any:
            return max(m.policy('concurrency').get('limit') for m in members if m.policy('concurrency'))

        peaks[f'key {scope}:{key}'] = sweep_limit(ix, result, f'key {scope}:{key}', runs,
                                                  lambda r: r.policy('concurrency').get('cost') or 1, timeline,
                                                  declared)
    result.figures['peaks'] = dict(sorted(peaks.items())[:50])
    return result


# -- 6. QueueRate, Rate, Throttle, Debounce --------------------------------------------------------------------------

def rate_steps(timeline: Timeline, begin: float) -> tuple[list[float], list[float], float]:
    """The largest rate (starts per second; INF: unlimited) possibly in force from each step time on, and the
    largest burst possibly in force at any time."""
    def rate(value: Any) -> float:
        return INF if value is None else float(value[0]) / float(value[1])

    current = timeline.default
    times, rates = [begin], [rate(current)]
    bursts = [current[2] if current else 0]
    for c_lo, c_hi, value, _ in timeline.changes:
        value = timeline.default if value is None else value
        times += [c_lo, c_hi]
        rates += [max(rate(current), rate(value)), rate(value)]
        bursts.append(value[2] if value else 0)
        current = value
    order = sorted(range(len(times)), key=lambda k: times[k])
    return [times[k] for k in order], [rates[k] for k in order], float(max(bursts))


def rate_windows(ix: Index, runs: list[Run], cost_of: Any, timeline: Timeline, early: float = 0.0) -> list[tuple]:
    """The windows [x, y] in which the starts decided inside them (their fetch windows, each allowed to begin
    ``early`` sooner, inside it) cost more than ``rate x (y - x) + burst`` (+ the largest cost - 1: a costed start may
    overshoot by one job): (x, y, excess, the starts). With C the prefix sums of costs in order of the fetches'
    latest instants and A the integral of the largest possible rate, a window from start i to start j breaks the
    bound when ``(C(j) - A(hi_j)) - (C(i-1) - A(lo_i)) > allowance``: one pass keeps the smallest ``C(i-1) - A(lo_i)``
    so far (a two-pointer sweep reduced to its minimum), every window in O(n). ``lo_i`` is the earliest fetch instant
    of any start from i on, so widths that differ never flag a window wrongly. Windows touching a span with no limit
    are not checked; after a window is found, the next one begins after it."""
    times, rates, burst = rate_steps(timeline, ix.begin - 1)
    # Split into spans with a limit; a start whose fetch window meets an unlimited span is outside every window.
    spans, span_start = [], None
    for k, (t, r) in enumerate(zip(times, rates)):
        end = times[k + 1] if k + 1 < len(times) else INF
        if r < INF and span_start is None:
            span_start = t
        if r == INF and span_start is not None:
            spans.append((span_start, t))
            span_start = None
        if end == INF and span_start is not None:
            spans.append((span_start, INF))
    allowance = burst + max((cost_of(run) for run in runs), default=1) - 1
    found = []
    for s0, s1 in spans:
        items = sorted(((run.hi, run.lo - early, cost_of(run), run) for run in runs
                        if run.lo - early >= s0 and run.hi <= s1), key=lambda item: (item[0], item[1]))
        if sum(item[2] for item in items) <= allowance:
            continue
        # A(t) over the span, from s0: cumulative allowance of the largest rate.
        k0 = bisect.bisect_right(times, s0) - 1
        ts, rs, cs = [s0], [rates[k0]], [0.0]
        for k in range(k0 + 1, len(times)):
            if times[k] >= s1:
                break
            cs.append(cs[-1] + rs[-1] * (times[k] - ts[-1]))
            ts.append(times[k])
            rs.append(rates[k])

        def allowed(t: float, ts: list = ts, rs: list = rs, cs: list = cs) -> float:
            k = bisect.bisect_right(ts, t) - 1
            return cs[k] + rs[k] * (t - ts[k])

        suffix = [0.0] * len(items)
        m = INF
        for k in range(len(items) - 1, -1, -1):
            m = min(m, items[k][1])
            suffix[k] = m
        best, best_i, cum = INF, 0, 0.0
        for j, (j_hi, _, cost, _run) in enumerate(items):
            here = cum - allowed(max(suffix[j], s0))
            if here <= best + 1e-9:  # on a tie the later start: the shortest window shows it
                best, best_i = here, j
            cum += cost
            excess = cum - allowed(j_hi) - best - allowance
            if excess <= 1e-9:
                continue
            x, y = suffix[best_i], j_hi
            found.append((x, y, excess, allowed(y) - allowed(x) + allowance, [w[3] for w in items[best_i:j + 1]]))
            best, cum = INF, 0.0  # the next finding is a window after this one
            best_i = j + 1
    return found


def check_rate(ix: Index, result: Result, label: str, runs: list[Run], cost_of: Any, timeline: Timeline,
               paid_before: float = 0.0) -> None:
    """Report :func:`rate_windows`: a window over by at most ``burst`` across a SIGKILL failover is a lapse
    (docs/guarantees.md), and so, for a Rate key (``paid_before``), is one that holds once each start may have been
    paid up to ``given_back_lag`` before its fetch (a parked job's start is paid when it is given back); any other is
    a violation."""
    burst = rate_steps(timeline, ix.begin - 1)[2]
    loose = rate_windows(ix, runs, cost_of, timeline, paid_before) if paid_before else None
    for x, y, excess, allowed, window in rate_windows(ix, runs, cost_of, timeline):
        what = (f'{label}: {sum(cost_of(r) for r in window):g} start(s) decided within {fmt(x)}..{fmt(y)} '
                f'({y - x:.3f} s), over rate x window + burst = {allowed:.2f}')
        evidence = [r.start for r in window[:6]] + [r.start for r in window[6:][-6:]]
        fault = ix.in_failover_window(x, y)
        if fault is not None and excess <= burst:
            lapse(result, what + f'; across {fault.action} at {fmt(fault.lo)}', evidence + fault.events, excess)
        elif loose is not None and not any(a <= y and x - paid_before <= b for a, b, *_ in loose):
            lapse(result, what + f'; within what starts paid up to {paid_before:g} s before their fetch allow (a '
                                 f'parked job is paid when it is given back)', evidence, excess)
        else:
            violation(result, what, evidence, excess)


def throttle(ix: Index, result: Result) -> int:
    """At most one job per Throttle slot and identity: a leading job (``ok`` admitted) belongs to the slot its
    admission fell in, a trailing job (``ok`` scheduled: the slot's pending job) to the next slot (docs/throttle-
    debounce.md: it counts as the next slot's run); slots are ``[i x slot, (i + 1) x slot)`` of the server's clock.
    An admission window that crosses a slot edge could belong to either slot: the jobs must have distinct slots in
    some placement (a greedy matching over the candidate slots decides it exactly). A collision in a slot a SIGKILL
    failover touched is a lapse. Replacing calls into a pending trailing job keep its last payload."""
    groups: dict[tuple, list[Op]] = defaultdict(list)
    for op in ix.ops.values():
        policy = op.policy('throttle')
        if policy is not None:
            groups[(op.queue, policy.get('identity'))].append(op)
    for (queue, identity), ops in groups.items():
        slot = float(ops[0].policy('throttle').get('slot') or 0)
        if slot <= 0:
            continue  # no slot recorded: nothing to check against
        jobs: dict[str, dict] = {}
        for op in ops:
            if op.kind == 'ok' and op.verdict in ('admitted', 'scheduled', 'parked'):
                job, lead = op.job, op.verdict != 'scheduled'
            elif op.kind == 'info' and op.invoke.get('job') in ix.jobs_runs:
                job, lead = op.invoke['job'], None
            else:
                continue
            entry = jobs.setdefault(job, {'lo': INF, 'hi': INF, 'lead': set(), 'ops': []})
            entry['lo'] = min(entry['lo'], op.lo)
            if op.kind == 'ok':
                entry['hi'] = min(entry['hi'], op.hi)
            entry['lead'].add(lead)
            entry['ops'].append(op)
        ranges = []
        for job, entry in jobs.items():
            if entry['hi'] == INF:
                runs = ix.jobs_runs.get(job)
                entry['hi'] = runs[0].hi if runs else INF
            if entry['hi'] == INF:
                continue
            w0, w1 = math.floor(entry['lo'] / slot), math.floor(entry['hi'] / slot)
            lead = entry['lead'] - {None} or {None}  # an info call says nothing when an ok said which
            if lead == {False}:
                w0, w1 = w0 + 1, w1 + 1
            elif lead != {True}:
                w1 += 1
            ranges.append((w1, w0, job))
        owner: dict[int, str] = {}
        for w1, w0, job in sorted(ranges):
            free = next((w for w in range(w0, w1 + 1) if w not in owner), None)
            if free is not None:
                owner[free] = job
                continue
            rivals = [owner[w] for w in range(w0, w1 + 1)]
            what = (f'identity {identity} on {queue}: job {job} and job(s) {", ".join(rivals)} in Throttle({slot:g}) '
                    f'slot(s) {w0}..{w1} ({fmt(w0 * slot)}..{fmt((w1 + 1) * slot)}): one per slot')
            evidence = [e for j in [job] + rivals for op in jobs[j]['ops'][:2] for e in op.events]
            fault = ix.in_failover_window(w0 * slot, (w1 + 1) * slot)
            if fault is not None:
                lapse(result, what + f'; {fault.action} at {fmt(fault.lo)}', evidence + fault.events, 1)
            else:
                violation(result, what, evidence)
        maybe = [op for op in ops if op.kind == 'info']
        merged: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            if op.kind == 'ok' and op.verdict in ('scheduled', 'replaced'):
                merged[op.job].append(op)
        for job, applied in merged.items():
            if any(op.verdict == 'replaced' for op in applied):
                check_payloads(ix, result, job, applied, maybe, f'trailing identity {identity} on {queue}')
    return len(groups)


def debounce(ix: Index, result: Result, live: Availability) -> int:
    """Per identity, the pending job runs the last payload merged into it (:func:`check_payloads`), its run time
    (``ok``'s ``due``) is no later than ``max_wait`` after the call that started its pending period (rounded up to
    the whole second, or the time asked for if later); when the calls report no run time, it starts no later than
    that bound plus the liveness delay while a worker of its queue fetches (:meth:`Availability.late`; a server
    fault in the way is a lapse). When they do, liveness (9) checks the start against the run time."""
    groups: dict[tuple, list[Op]] = defaultdict(list)
    for op in ix.ops.values():
        policy = op.policy('debounce')
        if policy is not None:
            groups[(op.queue, policy.get('identity'))].append(op)
    delay = ix.bounds['due_delay']
    for (queue, identity), ops in groups.items():
        max_wait = ops[0].policy('debounce').get('max_wait')
        maybe = [op for op in ops if op.kind == 'info']
        pending: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            if op.kind == 'ok' and op.verdict in ('scheduled', 'admitted', 'replaced'):
                pending[op.job].append(op)
        for job, applied in pending.items():
            label = f'debounce identity {identity} on {queue}'
            check_payloads(ix, result, job, applied, maybe, label)
            first = [op for op in applied if op.verdict != 'replaced']
            if not max_wait or not first:
                continue
            asked = max((op.invoke.get('due') or 0 for op in applied), default=0)
            bound = max(math.ceil(min(op.hi for op in first) + max_wait), asked)
            for op in applied:
                due = op.done.get('due')
                if due is not None and due > bound + 1e-6:
                    violation(result, f'{label}: job {job} set to run at {fmt(due)}, later than max_wait '
                                      f'({max_wait}) after its first call: {fmt(bound)}', first[0].events + op.events)
            runs = ix.jobs_runs.get(job)
            if not runs or any(op.done.get('due') is not None for op in applied):
                continue  # with the door's run time, liveness (9) checks the start against it
            piece, excused = live.late(runs[0].start, bound, runs[0].lo)
            evidence = first[0].events + applied[-1].events + [runs[0].start]
            if piece is not None:
                violation(result, f'{label}: job {job} due by {fmt(bound)} (max_wait) started at '
                                  f'{fmt(runs[0].start["t"])}; a worker of {queue} was idle {fmt(piece[0])}..'
                                  f'{fmt(piece[1])} ({piece[1] - piece[0]:.2f} s > {delay:g} s)', evidence,
                          piece[1] - piece[0])
            elif excused is not None:
                lapse(result, f'{label}: job {job} due by {fmt(bound)} started at {fmt(runs[0].start["t"])}, late '
                              f'across a server fault ({excused[1] - excused[0]:.2f} s idle)', evidence,
                      excused[1] - excused[0])
    return len(groups)


def rates(ix: Index, live: Availability) -> Result:
    """QueueRate per queue (every start of the queue), Rate per key (its jobs' starts, each its ``cost``): see
    :func:`check_rate`; then :func:`throttle` and :func:`debounce`."""
    result = Result(6, 'QueueRate, Rate, Throttle, Debounce')
    by_queue: dict[str, list[Run]] = defaultdict(list)
    by_key: dict[tuple, list[Run]] = defaultdict(list)
    for run in ix.runs:
        by_queue[run.queue].append(run)
        policy = run.policy('rate')
        if policy is not None:
            by_key[key_id(policy)].append(run)
    for queue, runs in by_queue.items():
        declared = [(p['limit'], p['per'], p.get('burst') or 1)
                    for p in (r.policy('queue_rate') for r in runs) if p and p.get('limit')]
        timeline = ix.timeline('rate', queue, default=max(declared, key=lambda d: d[0] / d[1]) if declared else None)
        if timeline.changes or declared:
            check_rate(ix, result, f'queue {queue}', runs, lambda r: 1, timeline)
    for (scope, key), runs in by_key.items():
        p = runs[0].policy('rate')
        timeline = ix.timeline('key_rate', scope, key, default=(p['limit'], p['per'], p.get('burst') or 1))
        check_rate(ix, result, f'key {scope}:{key}', runs, lambda r: r.policy('rate').get('cost') or 1, timeline,
                   ix.bounds['given_back_lag'])
    result.figures['throttle_identities'] = throttle(ix, result)
    result.figures['debounce_identities'] = debounce(ix, result, live)
    return result


# -- what may hold a ready job back (liveness, Debounce) -------------------------------------------------------------

def steps(intervals: list[tuple[float, float, float]]) -> tuple[list[float], list[float]]:
    """A step function from weighted intervals: breakpoints and the sum in force from each one on."""
    points = sorted([(a, w) for a, b, w in intervals if b > a] + [(b, -w) for a, b, w in intervals if b > a])
    times, values, total = [], [], 0.0
    for t, w in points:
        total += w
        if times and times[-1] == t:
            values[-1] = total
        else:
            times.append(t)
            values.append(total)
    return times, values


def pieces_where(step: tuple[list[float], list[float]], t0: float, t1: float, test: Any) -> list[tuple[float, float]]:
    """The parts of ``[t0, t1]`` where ``test(value, a, b)`` holds for the step function's value on ``[a, b]``."""
    times, values = step
    out = []
    k = bisect.bisect_right(times, t0) - 1
    a = t0
    while a < t1:
        b = times[k + 1] if k + 1 < len(times) else INF
        b = min(b, t1)
        value = values[k] if k >= 0 else 0.0
        if b > a and test(value, a, b):
            out.append((a, b))
        a, k = b, k + 1
    return merge(out)


class Availability:
    """When a ready job of a queue should have been taken: a worker of the queue surely idle (alive, not frozen,
    not between a fetch that took a job and that job's end), the queue under its cap and the job's key under its
    limit (counting every hold possibly still held: from a run's fetch to its release, its worker's next fetch, or
    its worker's death plus the lease), its Fair key not possibly paused, its queue not possibly backed off; and,
    counted apart, no server fault (restart, outage, lost reply, failover, migration) in the way."""

    def __init__(self, ix: Index):
        self.ix = ix
        idle: dict[str, list] = defaultdict(list)
        for worker in ix.workers.values():
            if worker.hello is None or not worker.queues:
                continue
            alive = [(hi(worker.hello), worker.deaths[0][0] if worker.deaths else ix.end)]
            busy = []
            for i, run in enumerate(worker.runs):
                if run.end is not None:
                    stop = run.end_hi
                else:
                    stop = min([worker.runs[i + 1].lo] if i + 1 < len(worker.runs) else [ix.end])
                    death = death_after(ix, worker.name, run.lo)
                    stop = min(stop, death[0]) if death else stop
                busy.append((run.lo, max(stop, run.hi)))
            free = subtract(alive, merge(busy + [(a, b) for a, b, _ in worker.freezes]))
            for queue in worker.queues:
                idle[queue].append(free)
        #: Per queue, each worker's idle stretches apart: a job is late only when one worker stayed idle longer than
        #: the bound. Their union is not: several workers busy with a backlog each spend a moment between a job's end
        #: and their next fetch (its release, a heartbeat; longer on a loaded machine), and those moments, merged,
        #: made seconds of "idle" while every worker was taking other jobs ahead of the due one.
        self.idle = {queue: [merge(free) for free in found] for queue, found in idle.items()}
        self.faults = merge([(f.lo, f.hi if f.end is not None else ix.end) for f in ix.server_faults()])
        by_queue: dict[str, list[Run]] = defaultdict(list)
        by_key: dict[tuple, list[Run]] = defaultdict(list)
        for run in ix.runs:
            by_queue[run.queue].append(run)
            policy = run.policy('concurrency')
            if policy is not None:
                by_key[key_id(policy)].append(run)
        self.cap_blocked: dict[str, list] = {}
        for queue, runs in by_queue.items():
            declared = [p.get('cap') for p in (r.policy('queue_slot') for r in runs) if p and p.get('cap') is not None]
            timeline = ix.timeline('cap', queue, default=min(declared) if declared else None)
            if not timeline.changes and not declared:
                continue
            step = steps([(run.lo, run.after, 1.0) for run in runs])

            def full(value: float, a: float, b: float, timeline: Timeline = timeline) -> bool:
                caps_ = [c for c in timeline.possible(a, b) if c is not None]
                return bool(caps_) and value >= min(caps_)

            self.cap_blocked[queue] = pieces_where(step, ix.begin, ix.end, full) if step[0] else []
        self.key_steps = {key: steps([(r.lo, r.after, float(r.policy('concurrency').get('cost') or 1)) for r in runs])
                          for key, runs in by_key.items()}
        paused: dict[tuple, list] = defaultdict(list)
        for (what, scope, key), changes in ix.settings.items():
            if what == 'fair_pause':
                resumes = sorted(c[1] for c in ix.settings.get(('fair_resume', scope, key), []))
                for c_lo, _, _, _ in changes:
                    after = [r for r in resumes if r >= c_lo]
                    paused[(scope, key)].append((c_lo, after[0] if after else ix.end))
        self.paused = {key: merge(found) for key, found in paused.items()}
        backoff: dict[str, list] = defaultdict(list)
        for queue, runs in by_queue.items():
            for run in runs:
                if run.end is not None and run.end.get('outcome') == 'backoff':
                    due = run.end.get('due')
                    until = due + ix.bounds['due_rounding'] if due is not None else ix.end
                    backoff[queue].append((lo(run.end), until))
        self.backoff = {queue: merge(found) for queue, found in backoff.items()}
        self.rated = {scope for (what, scope, _) in ix.settings if what == 'rate'}

    def limited_by_rate(self, event: dict) -> bool:
        """Is the job rate-limited (its starts wait for the rate by design; property 6 bounds them)?"""
        return bool(policy_of(event, 'rate') or policy_of(event, 'queue_rate') or event.get('queue') in self.rated)

    def late(self, event: dict, t0: float, t1: float) -> tuple[tuple | None, tuple | None]:
        """The longest stretch of ``[t0, t1]`` in which the job (its ``start`` or ``invoke`` event names its queue
        and policies) should have been taken: (with no server fault in it, or None; only across a server fault, or
        None)."""
        delay = self.ix.bounds['due_delay']
        if t1 - t0 <= delay or self.limited_by_rate(event):
            return None, None
        queue = event.get('queue')
        strict = loose = None
        for free in self.idle.get(queue, []):
            one_strict, one_loose = self._late_on(free, event, t0, t1)
            if one_strict is not None and (strict is None or one_strict[1] - one_strict[0] > strict[1] - strict[0]):
                strict = one_strict
            if one_loose is not None and (loose is None or one_loose[1] - one_loose[0] > loose[1] - loose[0]):
                loose = one_loose
        if strict is not None and strict[1] - strict[0] > delay:
            return strict, None
        if loose is not None and loose[1] - loose[0] > delay:
            return None, loose
        return None, None

    def _late_on(self, free: list, event: dict, t0: float, t1: float) -> tuple[tuple | None, tuple | None]:
        """The longest stretches of ``[t0, t1]`` in one worker's idle stretches ``free`` in which the job should
        have been taken: (with no server fault in it, across server faults)."""
        queue = event.get('queue')
        ready = clip(free, t0, t1)
        if not ready:
            return None, None
        ready = subtract(ready, clip(self.cap_blocked.get(queue, []), t0, t1))
        ready = subtract(ready, clip(self.backoff.get(queue, []), t0, t1))
        policy = policy_of(event, 'concurrency')
        if ready and policy is not None:
            key = key_id(policy)
            cost = float(policy.get('cost') or 1)
            timeline = self.ix.timeline('key_limit', *key)

            def full(value: float, a: float, b: float) -> bool:
                limits = [v for v in timeline.possible(a, b, policy.get('limit')) if v is not None]
                return bool(limits) and value + cost > min(limits)

            step = self.key_steps.get(key)
            if step and step[0]:
                ready = subtract(ready, pieces_where(step, t0, t1, full))
        fair = policy_of(event, 'fair')
        if ready and fair is not None:
            ready = subtract(ready, clip(self.paused.get(key_id(fair), []), t0, t1))
        clean = subtract(ready, clip(self.faults, t0, t1))
        return longest(clean), longest(ready)


# -- 7. Fair ---------------------------------------------------------------------------------------------------------

@dataclass
class Turn:
    """A Fair turn: the first run of a job of a key (not scheduled), its fetch window's centre and half-width, and
    its share of the key's turns (1 / weight: the smallest and the largest the weight possibly in force allows)."""

    c: float
    h: float
    share_min: float
    share_max: float
    run: Run


def fair_jobs(ix: Index) -> tuple[dict, dict, set]:
    """Fair's jobs per (queue, scope, key): admitted calls (ok, not scheduled), and the turns (first runs of any
    call's job, not scheduled); and the keys whose jobs have a per-key limit (their turns park jobs whose starts come
    later: Fair shares turns, not starts, there)."""
    admitted: dict[tuple, list[Op]] = defaultdict(list)
    named: dict[str, tuple] = {}
    limited = set()
    for op in ix.ops.values():
        policy = op.policy('fair')
        if policy is None or op.invoke.get('due') is not None:
            continue
        group = (op.queue,) + key_id(policy)
        if op.policy('concurrency') or op.policy('rate'):
            limited.add(group)
        if op.kind == 'ok' and op.verdict in ('admitted', 'parked'):
            admitted[group].append(op)
            named[op.job] = group
        elif op.kind == 'info' and op.invoke.get('job'):
            named.setdefault(op.invoke['job'], group)
    turns: dict[tuple, list[Turn]] = defaultdict(list)
    for job, group in named.items():
        runs = ix.jobs_runs.get(job)
        if not runs:
            continue
        run = runs[0]
        policy = run.policy('fair') or {}
        weights = ix.timeline('fair_weight', group[1], group[2]).possible(run.lo, run.hi, policy.get('weight') or 1)
        weights = [float(w) for w in weights if w]
        turns[group].append(Turn((run.lo + run.hi) / 2, (run.hi - run.lo) / 2, 1 / max(weights), 1 / min(weights),
                                 run))
    for found in turns.values():
        found.sort(key=lambda turn: turn.c)
    return admitted, turns, limited


def intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


class KeyTurns:
    """One key's turns in order of their centres, with prefix sums of their shares (smallest and largest)."""

    def __init__(self, turns: list[Turn]):
        self.turns = turns
        self.c = [t.c for t in turns]
        self.small, self.large = [0.0], [0.0]
        for turn in turns:
            self.small.append(self.small[-1] + turn.share_min)
            self.large.append(self.large[-1] + turn.share_max)
        self.widest = max((t.h for t in turns), default=0.0)

    def near(self, t0: float, t1: float) -> list[Turn]:
        """The turns whose fetch window may meet ``[t0, t1]``."""
        return self.turns[bisect.bisect_left(self.c, t0 - self.widest):bisect.bisect_right(self.c, t1 + self.widest)]


def fair_excess(a: KeyTurns, b: KeyTurns, period: tuple[float, float], width: float) -> tuple | None:
    """The largest ``A_sure(I) - B_possible(I)`` over windows I inside ``period``: a's turns surely inside I (each
    its smallest share), less b's turns possibly inside I (each its largest share). Every fetch window is widened to
    ``width`` around its centre, so that "surely inside [c_i - w/2, c_j + w/2]" is "centre in [c_i, c_j]" and b's
    possible turns are its centres in [c_i - w, c_j + w]: prefix sums and one pass, O(turns). Returns (excess, first
    and last of a's turns, b's turns counted) or None."""
    half = width / 2
    i0 = bisect.bisect_left(a.c, period[0] + half)
    i1 = bisect.bisect_right(a.c, period[1] - half)
    best_pref, best_i, top = -INF, i0, None
    for j in range(i0, i1):
        c = a.c[j]
        pref = b.large[bisect.bisect_left(b.c, c - width)] - a.small[j]
        if pref > best_pref:
            best_pref, best_i = pref, j
        value = a.small[j + 1] - b.large[bisect.bisect_right(b.c, c + width)] + best_pref
        if top is None or value > top[0]:
            top = (value, best_i, j)
    if top is None:
        return None
    value, i, j = top
    counted = b.turns[bisect.bisect_left(b.c, a.c[i] - width):bisect.bisect_right(b.c, a.c[j] + width)]
    return value, a.turns[i], a.turns[j], counted


def fair(ix: Index) -> Result:
    """Over every stretch where two keys of a queue surely stay backlogged (each has an admitted job not yet
    possibly fetched, and is not possibly paused), their turns per weight differ by at most ``fair_lag x 2 / w``,
    ``w`` the lightest weight among the queue's keys (start-time fair queueing's bound: every active key's virtual
    time stays within one turn of the lightest key of the lowest, since a key joins at the lowest; docs/fair.md's
    "within one job", which for equal weights is ``1/w_a + 1/w_b``), counting one key's turns surely
    inside a window against the other's possibly inside it (:func:`fair_excess`, both ways). Keys with a per-key
    limit and scheduled Fair jobs are left out (their turns are not starts; docs/fair.md). Figures: Jain's index of
    the keys' turns per weight per second backlogged, per queue, and the longest a backlogged key waited for a
    turn."""
    result = Result(7, 'Fair')
    admitted, turns, limited = fair_jobs(ix)
    paused: dict[tuple, list] = defaultdict(list)
    for (what, scope, key), changes in ix.settings.items():
        if what == 'fair_pause':
            resumes = sorted(c[1] for c in ix.settings.get(('fair_resume', scope, key), []))
            for c_lo, _, _, _ in changes:
                after = [r for r in resumes if r >= c_lo]
                paused[(scope, key)].append((c_lo, after[0] if after else ix.end))
    backlog: dict[tuple, list] = {}
    for group, ops in admitted.items():
        if group in limited:
            continue
        points = []
        for op in ops:
            runs = ix.jobs_runs.get(op.job)
            if runs:
                points += [(op.hi, 1), (runs[0].lo, -1)]
            elif ix.final is None or ix.final_status(op.job) in WAITING:
                points.append((op.hi, 1))  # a job never started but still waiting; a lost one is property 1's
        points.sort(key=lambda p: (p[0], p[1]))
        periods, waiting, since = [], 0, None
        for t, step in points:
            waiting += step
            if waiting >= 1 and since is None:
                since = t
            elif waiting < 1 and since is not None:
                periods.append((since, t))
                since = None
        if since is not None:
            periods.append((since, ix.end))
        backlog[group] = subtract(merge(periods), merge(paused.get(group[1:], [])))
    lag = ix.bounds['fair_lag']
    # The lightest key's turn per queue (largest 1 / weight of any of its keys, limited ones included: they take
    # turns too). A key that becomes active joins at the lowest virtual time of all active keys, so every active key
    # stays within one such turn of the lowest, and two keys' turns per weight over a stretch differ by at most two.
    lightest: dict[str, float] = defaultdict(float)
    for group, found in turns.items():
        lightest[group[0]] = max([lightest[group[0]]] + [t.share_max for t in found])
    for group, ops in admitted.items():
        weights = [(op.policy('fair') or {}).get('weight') or 1 for op in ops]
        lightest[group[0]] = max(lightest[group[0]], 1 / min(weights))
    by_queue: dict[str, list[tuple]] = defaultdict(list)
    for group in backlog:
        by_queue[group[0]].append(group)
    jain, worst = {}, (0.0, None, None)
    keyed = {group: KeyTurns(turns.get(group, [])) for group in backlog}
    for queue, groups in by_queue.items():
        groups.sort()
        for x in range(len(groups)):
            for y in range(x + 1, len(groups)):
                ga, gb = groups[x], groups[y]
                ta, tb = keyed[ga], keyed[gb]
                bound = lag * 2 * lightest[queue]
                for period in intersect(backlog[ga], backlog[gb]):
                    near = ta.near(*period) + tb.near(*period)
                    if not near:
                        continue
                    width = 2 * max(t.h for t in near)
                    for one, other, g1, g2 in ((ta, tb, ga, gb), (tb, ta, gb, ga)):
                        top = fair_excess(one, other, period, width)
                        if top is None or top[0] <= bound + 1e-9:
                            continue
                        value, first, last, counted = top
                        theirs = sum(t.share_max for t in counted)
                        what = (f'queue {queue}: key {g1[1]}:{g1[2]} had {value + theirs:.2f} turns per weight '
                                f'between {fmt(first.c)} and {fmt(last.c)} against {theirs:.2f} for key '
                                f'{g2[1]}:{g2[2]}, both backlogged '
                                f'{fmt(period[0])}..{fmt(period[1])}: {value:.2f} over, bound {bound:.2f}')
                        evidence = [first.run.start, last.run.start] + [t.run.start for t in counted[:4]]
                        violation(result, what, evidence, value - bound)
                        break
        # Jain's index over the keys' turns per weight per second backlogged; the worst wait for a turn.
        rates_ = []
        for group in groups:
            periods, mine = backlog[group], keyed[group]
            span = sum(b - a for a, b in periods)
            got = 0.0
            for a, b in periods:
                i, j = bisect.bisect_left(mine.c, a), bisect.bisect_right(mine.c, b)
                got += mine.large[j] - mine.large[i]
                marks = [a] + mine.c[i:j] + [b]
                gap = max(q - p for p, q in zip(marks, marks[1:]))
                if b < ix.end and gap > worst[0]:
                    worst = (gap, queue, f'{group[1]}:{group[2]}')
            if span > 0:
                rates_.append(got / span)
        if len(rates_) >= 2 and sum(v * v for v in rates_) > 0:
            jain[queue] = round(sum(rates_) ** 2 / (len(rates_) * sum(v * v for v in rates_)), 4)
    result.figures['jain_index'] = jain
    result.figures['worst_wait'] = {'seconds': round(worst[0], 3), 'queue': worst[1], 'key': worst[2]}
    result.figures['keys'] = len(backlog)
    if limited:
        result.notes.append(f'{len(limited)} key(s) with a per-key limit left out (their turns park jobs)')
    return result


# -- 8. priority and pause -------------------------------------------------------------------------------------------

def priority_and_pause(ix: Index) -> Result:
    """Within a Fair key: no job starts (its fetch) while a job of higher priority of the same key surely waited
    (admitted surely before the fetch began, fetched surely after it ended): the key's line pops the highest first.
    Keys with a per-key limit are left out ("a slot is free": a limit parks jobs between their turn and their
    start). And no turn of a key starts surely between a pause's return and the next resume's call."""
    result = Result(8, 'priority and pause')
    admitted, turns, limited = fair_jobs(ix)
    for group, ops in admitted.items():
        if group in limited:
            continue
        jobs = []
        for op in ops:
            runs = ix.jobs_runs.get(op.job)
            if not runs and ix.final_status(op.job) not in WAITING:
                continue  # never started and not waiting: not ready (property 1 says why)
            policy = op.policy('fair') or {}
            prio = op.invoke.get('priority')
            prio = policy.get('priority', 0) if prio is None else prio
            jobs.append((op.hi, prio or 0, runs[0] if runs else None, op))
        # Ls in order of their fetch's end; Hs added once admitted by then, dropped once possibly fetched by then.
        order = sorted((j for j in jobs if j[2] is not None), key=lambda j: j[2].hi)
        waiting = sorted(jobs, key=lambda j: j[0])
        heap: list[tuple] = []
        k = 0
        for _, prio, run, op in order:
            while k < len(waiting) and waiting[k][0] < run.hi:
                w = waiting[k]
                heapq.heappush(heap, (-w[1], w[0], k, w))
                k += 1
            stash, found = [], None
            while heap:
                top = heap[0][3]
                if top[2] is not None and top[2].lo <= run.hi:
                    heapq.heappop(heap)  # possibly fetched by now: gone for every later L too
                    continue
                if top[0] >= run.lo:
                    stash.append(heapq.heappop(heap))  # not surely admitted before this fetch; maybe for later ones
                    continue
                found = top
                break
            for item in stash:
                heapq.heappush(heap, item)
            if found is not None and found[1] > prio:
                h_run = found[2]
                violation(result, f'queue {group[0]} key {group[1]}:{group[2]}: job {run.job} (priority {prio}) '
                                  f'started at {fmt(run.start["t"])} while job {found[3].job} (priority {found[1]}, '
                                  f'admitted {fmt(found[0])}) waited' + (f', started {fmt(h_run.start["t"])}'
                                                                        if h_run else ', never started'),
                          found[3].events + op.events + [run.start] + ([h_run.start] if h_run else []))
    # Pause: sure-paused spans (the pause returned, the resume not yet called).
    spans: dict[tuple, list] = defaultdict(list)
    for (what, scope, key), changes in ix.settings.items():
        if what != 'fair_pause':
            continue
        resumes = sorted(ix.settings.get(('fair_resume', scope, key), []), key=lambda c: c[0])
        for c_lo, c_hi, _, event in changes:
            after = [r for r in resumes if r[0] >= c_lo]
            spans[(scope, key)].append((c_hi, after[0][0] if after else INF, event, after[0][3] if after else None))
    checked = 0
    for group, found in turns.items():
        for span_lo, span_hi, pause, resume in spans.get(group[1:], []):
            for turn in found:
                checked += 1
                run = turn.run
                if span_lo < run.lo and run.hi < span_hi:
                    violation(result, f'key {group[1]}:{group[2]} paused at {fmt(pause["t"])}' +
                              (f' until {fmt(resume["t"])}' if resume else '') +
                              f': job {run.job} started at {fmt(run.start["t"])}',
                              [pause, run.start] + ([resume] if resume else []))
    result.figures['paused_keys'] = len(spans)
    return result


# -- 9. liveness -----------------------------------------------------------------------------------------------------

def due_jobs(ix: Index) -> list[tuple[str, float, dict, list[dict], int]]:
    """Each due job: (job, due time, the event naming its queue and policies, the events that set the due time, the
    index of the run that must follow it). Due: an admission with a ``due`` (enqueue_in/at), a pending job (``ok``
    scheduled: a Debounce's or a trailing Throttle's, its ``due`` or the slot's end; the latest of the calls merged
    into it), and a run that ended with a retry and a ``due`` (Snooze, a retry's interval, a BackOff)."""
    found: dict[str, list] = {}
    for op in admitting_ops(ix):
        due = op.done.get('due')
        if due is None:
            due = op.invoke.get('due')
        if due is None and op.verdict == 'scheduled':
            policy = op.policy('throttle')
            if policy is not None and policy.get('slot'):
                due = (math.floor(op.hi / float(policy['slot'])) + 1) * float(policy['slot'])
        if due is None:
            continue
        entry = found.get(op.job)
        if entry is None:
            found[op.job] = [op.job, due, op.invoke, op.events, 0]
        else:
            entry[1] = max(entry[1], due)
            entry[3] = entry[3] + op.events
    out = [tuple(entry) for entry in found.values()]
    for job, runs in ix.jobs_runs.items():
        for i, run in enumerate(runs):
            if not run.retry:
                continue
            due = run.end.get('due')
            if due is None and run.end.get('delay') is not None:
                due = run.end['t'] + float(run.end['delay'])  # the delay rq waits, from the end
            if due is not None:
                out.append((job, float(due), run.start, [run.end], i + 1))
    return out


def liveness(ix: Index, live: Availability) -> Result:
    """Each due job starts within ``due_delay`` of its due time (+ ``due_rounding``) while a worker of its queue
    fetches: it is late when, after that, some stretch longer than ``due_delay`` passed before its fetch with a worker
    of its queue surely idle and nothing holding it back (:class:`Availability`). A stretch that only a server fault
    (restart, outage, lost reply, failover, migration) interrupts is a lapse: after the fault ends, the job again has
    ``due_delay`` (README: "within about 2 s of the server answering"). A due job never started that ``final`` shows
    waiting is checked up to the final event. Rate-limited jobs are left out (their rate decides)."""
    result = Result(9, 'liveness')
    delay, rounding = ix.bounds['due_delay'], ix.bounds['due_rounding']
    delays, skipped = [], 0
    final_t = lo(ix.final) if ix.final is not None else None
    for job, due, event, evidence, k in due_jobs(ix):
        runs = ix.jobs_runs.get(job, [])
        if k < len(runs):
            run = runs[k]
            delays.append(run.start['t'] - due)
            until, shown = run.lo, [run.start]
        elif final_t is not None and ix.final_status(job) in WAITING:
            until, shown = final_t, [ix.final]
        else:
            continue
        if live.limited_by_rate(event):
            skipped += 1
            continue
        piece, excused = live.late(event, due + rounding, until)
        what = f'job {job} due at {fmt(due)} ' + (f'started at {fmt(runs[k].start["t"])}' if k < len(runs)
                                                   else 'never started')
        if piece is not None:
            violation(result, what + f'; a worker of {event.get("queue")} was idle {fmt(piece[0])}..{fmt(piece[1])} '
                                     f'({piece[1] - piece[0]:.2f} s > {delay:g} s)', evidence + shown,
                      piece[1] - piece[0])
        elif excused is not None:
            faults = [f for f in ix.server_faults() if f.lo <= excused[1] and f.hi >= excused[0]]
            healed = max((f.hi for f in faults if f.hi < INF), default=None)
            lapse(result, what + f', {until - due:.2f} s late across ' +
                  ', '.join(f'{f.action} {fmt(f.lo)}..{fmt(f.hi)}' for f in faults[:3]) +
                  (f'; fetched {until - healed:.2f} s after it ended' if healed is not None else ''),
                  evidence + shown + [e for f in faults[:2] for e in f.events], until - due)
    result.figures['delays'] = {'count': len(delays), 'p50': quantile(delays, 0.5), 'p99': quantile(delays, 0.99),
                                'max': max(delays, default=None)}
    if skipped:
        result.notes.append(f'{skipped} rate-limited due job(s) left out (their rate decides when they start)')
    return result


# -- the report ------------------------------------------------------------------------------------------------------

#: The properties, in issue 31's order.
PROPERTIES = (no_loss, no_double_run, no_phantom, loner, caps, rates, fair, priority_and_pause, liveness)


def check(ix: Index) -> list[Result]:
    """Run every property over the index."""
    live = Availability(ix)
    out = []
    for prop in PROPERTIES:
        if prop in (rates, liveness):
            out.append(prop(ix, live))
        else:
            out.append(prop(ix))
    return out


def figures(ix: Index) -> dict[str, Any]:
    jobs = set(ix.jobs_runs) | {job for job in ix.jobs_ops}
    actions: dict[str, int] = defaultdict(int)
    for fault in ix.faults:
        actions[fault.action] += 1
    # How much of the optional precision the recorder gave (each missing field widens an interval: docs/history.md).
    hellos = [e for e in ix.events if e.get('e') == 'hello']
    precision = {'starts_without_fetched': sum(1 for run in ix.runs if not run.start.get('fetched')),
                 'oks_without_now': sum(1 for op in ix.ops.values() if op.kind == 'ok' and op.done.get('now') is None),
                 'processes_without_dt': sum(1 for e in hellos if e.get('dt') is None),
                 'largest_dt': max((e.get('dt') or 0 for e in hellos), default=None)}
    return {'events': len(ix.events), 'files': len(ix.files), 'torn_lines': ix.torn, 'ops': len(ix.ops),
            'jobs': len(jobs), 'runs': len(ix.runs), 'workers': len(ix.workers),
            'nemeses': dict(sorted(actions.items())), 'span_seconds': round(ix.end - ix.begin, 3),
            'precision': precision}


#: An excerpt's line is cut after this many characters.
EXCERPT_CHARS = 1000


def excerpt(ix: Index, events: list[dict]) -> list[str]:
    """The events' own lines, as ``file:line-offset: line`` (read back from the files)."""
    out = []
    for event in events:
        path = ix.files[event['_f']]
        with path.open('rb') as handle:
            handle.seek(event['_o'])
            line = handle.readline().decode('utf-8', 'replace').rstrip('\n')
        if len(line) > EXCERPT_CHARS:  # a final event names every job
            line = f'{line[:EXCERPT_CHARS]}... ({len(line) - EXCERPT_CHARS} more characters)'
        out.append(f'{path.name}@{event["_o"]}: {line}')
    return out


def as_json(ix: Index, results: list[Result]) -> dict[str, Any]:
    def finding(f: Finding) -> dict:
        return {'what': f.what, 'size': f.size, 'lines': excerpt(ix, f.events)}

    return {
        'history': str(ix.folder), 'ok': all(r.ok for r in results), 'figures': figures(ix),
        'bounds': ix.bounds,
        'properties': [{
            'number': r.number, 'name': r.name, 'ok': r.ok, 'violations': [finding(f) for f in r.violations],
            'lapses': {'count': len(r.lapses), 'largest': max((f.size or 0 for f in r.lapses), default=None),
                       'items': [finding(f) for f in r.lapses]},
            'figures': r.figures, 'notes': r.notes,
        } for r in results],
    }


def as_text(ix: Index, results: list[Result], shown: int = 10) -> str:
    fig = figures(ix)
    lines = [f'history {ix.folder}: {fig["events"]} events in {fig["files"]} files ({fig["torn_lines"]} torn), '
             f'{fig["ops"]} calls, {fig["jobs"]} jobs, {fig["runs"]} runs, {fig["workers"]} workers, '
             f'nemeses {fig["nemeses"] or "none"}, over {fig["span_seconds"]} s',
             f'precision: {json.dumps(fig["precision"], sort_keys=True)}']
    for r in results:
        head = f'{r.number}. {r.name}: ' + ('ok' if r.ok else f'VIOLATED ({len(r.violations)})')
        if r.lapses:
            head += f'; {len(r.lapses)} documented lapse(s), largest {max(f.size or 0 for f in r.lapses):g}'
        lines.append(head)
        for note in r.notes:
            lines.append(f'   note: {note}')
        if r.figures:
            lines.append('   ' + json.dumps(r.figures, sort_keys=True, default=str))
        for kind, found in (('violation', r.violations), ('lapse', r.lapses)):
            for f in found[:shown]:
                lines.append(f'   {kind}: {f.what}')
                lines += [f'      {line}' for line in excerpt(ix, f.events)]
            if len(found) > shown:
                lines.append(f'   ... {len(found) - shown} more {kind}(s) (--json lists them)')
    lines.append('ok' if all(r.ok for r in results) else 'VIOLATIONS FOUND')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m tests.history.check', description=__doc__.split('\n\n')[0])
    parser.add_argument('history', help='the history folder (one *.jsonl file per recording process)')
    parser.add_argument('--json', action='store_true', help='print the report as JSON')
    parser.add_argument('--bounds', metavar='FILE', help='a JSON object of bound name -> value, over the defaults')
    opts = parser.parse_args(argv)
    gc.disable()  # millions of small dicts and no cycles among them: the collector would only rescan them
    ix = read_history(opts.history, load_bounds(opts.bounds))
    results = check(ix)
    if opts.json:
        print(json.dumps(as_json(ix, results), indent=1, default=str))
    else:
        print(as_text(ix, results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == '__main__':
    sys.exit(main())
