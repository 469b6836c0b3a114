"""The history check on real topologies (issue 31): a short run of each topology under every one of its nemeses,
read by the checker, and runs of deliberately broken builds that the checker must flag.

Each test runs ``python -m tests.history.run`` (its own servers on free ports, workers started as users start them,
producers, nemeses) and then the checker, ``python -m tests.history.check DIR --json``. They take minutes, so they
are marked ``history`` and run only with ``RQ_POLICIES_HISTORY=1`` (CI runs them in a lane of their own:
``.ci/run``); a failed run keeps its history folder and names it.

Known breaks: violations that other work of issue 31 is fixing are listed in :data:`KNOWN_BREAKS`, each matched on
the events the checker gives as evidence; a run may show them (the test prints each one it excused) and fails on
any other violation. Remove an entry when its fix lands: the runs then hold the property unexcused.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import ROOT, with_root
from tests.history.run import INTERMEDIATE_SECONDS

pytestmark = pytest.mark.history

#: Door calls a topology's short run makes at least (issue 31: >= 3,000 jobs per topology).
JOBS = 3000

#: The short runs' shape: producers' rate (calls a second each), seconds between nemeses, the drain's bound (a job
#: whose worker was killed with it is failed by rq's maintenance once its heartbeat expired, 60 s and more after; a
#: job taken by a worker killed after rq wrote its execution is handed back once that expires, 150 s and more after:
#: run.INTERMEDIATE_SECONDS). A drain ends as soon as nothing is left, so the bound costs only a run that needs it.
RUN_ARGS = ['--rate', '20', '--forking', '2', '--simple', '3', '--gap', '0.5', '2', '--drain', '200']


def history_run(folder: Path, *args: str, timeout: float = 900) -> dict:
    """Run ``python -m tests.history.run --out folder ARGS`` and return its summary (the JSON it prints)."""
    proc = subprocess.run([sys.executable, '-m', 'tests.history.run', '--out', str(folder), *args], cwd=ROOT,
                          env=with_root(dict(os.environ)), capture_output=True, text=True, timeout=timeout)
    start = proc.stdout.find('{')
    assert start >= 0, f'no summary (exit {proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-3000:]}'
    summary = json.loads(proc.stdout[start:])
    assert 'error' not in summary, (summary['error'], proc.stderr[-3000:])
    return summary


def need_checker() -> None:
    """Skip (before any run) when the checker, ``tests/history/check.py``, is not in this tree yet."""
    if importlib.util.find_spec('tests.history.check') is None:
        pytest.skip('tests/history/check.py (the checker) is not in this tree yet')


def checked(folder: Path) -> dict:
    """The checker's report of the history in ``folder`` (``--json``)."""
    proc = subprocess.run([sys.executable, '-m', 'tests.history.check', str(folder), '--json'], cwd=ROOT,
                          env=with_root(dict(os.environ)), capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads(proc.stdout)


def evidence(violation: dict) -> list[dict]:
    """The events a violation names (its ``lines``: ``file@offset: {json}``)."""
    found = []
    for line in violation.get('lines', []):
        try:
            found.append(json.loads(line.split(': ', 1)[1]))
        except (IndexError, ValueError):  # an excerpt cut at the checker's line limit (a final event)
            continue
    return found


class History:
    """The history of a run, as far as the known breaks' matchers need it."""

    def __init__(self, folder: Path) -> None:
        self.events = []
        for path in sorted(folder.glob('*.jsonl')):
            for line in path.read_text(encoding='utf-8').splitlines():
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue
        final = next((e for e in self.events if e['e'] == 'final'), {'jobs': {}})
        self.final: dict[str, str] = final['jobs']
        self.started = {e['job'] for e in self.events if e['e'] == 'start'}
        #: The jobs a worker gave up because their start could not be recorded and their fetch did not stand once the
        #: server answered (its log: "job ... is not run by this worker").
        self.given_up: set[str] = set()
        #: The jobs rq's cleanup of a started registry failed as abandoned (a worker's log: "StartedJobRegistry
        #: cleanup: <id> Moved to FailedJobRegistry, due to AbandonedJobError"): started, and their worker gone.
        self.abandoned: set[str] = set()
        for path in sorted((folder / 'logs').glob('*.log')):
            for line in path.read_text(encoding='utf-8', errors='replace').splitlines():
                if 'is not run by this worker' in line:
                    found = re.search(r'rq-policies: job (\S+) is not run by this worker', line)
                    if found:
                        self.given_up.add(found.group(1))
                elif 'AbandonedJobError' in line:
                    found = re.search(r'StartedJobRegistry cleanup: (\S+) Moved to FailedJobRegistry', line)
                    if found:
                        self.abandoned.add(found.group(1))
        #: The operator's settings of a key (a per-key limit or rate, a Fair pause, resume or weight): (time, key).
        self.settings = [(e['t'], e['key']) for e in self.events if e['e'] == 'setting' and e.get('key')]
        #: The operator's settings of a queue (QueueSlot's cap, QueueRate's rate): (time, queue, what, value).
        self.queue_settings = [(e['t'], e['queue'], e.get('what'), e.get('value')) for e in self.events
                               if e['e'] == 'setting' and not e.get('key') and e.get('queue')]
        self.failovers = [(e['t'], e['phase']) for e in self.events
                          if e['e'] == 'nemesis' and e['action'] in ('failover_kill', 'failover_graceful')]
        #: The server faults that stop a write: a restart, an outage, and a slot migration, whose TRYAGAIN outlasts the
        #: adopted client's 10 s of retries when it moves tens of thousands of keys (rq's end-of-run pipeline in the
        #: work horse then fails: "failed to persist failure of job ..."): (begin, end) each.
        self.server_faults = [(e['t'], next((x['t'] for x in self.events if x['e'] == 'nemesis' and x.get('id') ==
                                             e.get('id') and x['phase'] == 'end'), e['t'] + 30))
                              for e in self.events if e['e'] == 'nemesis' and e['phase'] == 'begin'
                              and e['action'] in ('outage', 'restart_aof', 'migrate_slot')]
        #: The workers that died during the run: killed (a nemesis), or quit on a Redis error (exit 0 or 1).
        self.died = {e['worker'] for e in self.events if e['e'] == 'exit' and not e.get('asked')}
        #: When each worker was killed or frozen by a nemesis, or seen exiting.
        self.deaths: dict[str, list[float]] = {}
        for e in self.events:
            if e['e'] == 'nemesis' and e['phase'] == 'begin' and e['action'].startswith(('kill_', 'stop_')):
                for worker in e.get('workers') or []:
                    self.deaths.setdefault(worker, []).append(e['t'])
            elif e['e'] == 'exit' and not e.get('asked'):
                self.deaths.setdefault(e['worker'], []).append(e['t'])

    def during_failover(self, t: float, before: float = 3.0, after: float = 15.0) -> bool:
        """Did ``t`` fall within a failover: from ``before`` seconds ahead of its begin (writes the replica had not
        received yet) to ``after`` seconds past its end (the fetches and admissions on the promoted primary decide on
        its older state: a rate's arrival time, a Fair key's virtual time, a hold, a marker, a job's status; a 5-minute
        Sentinel run showed such effects 10 s after a failover ended)?"""
        begins = [at for at, phase in self.failovers if phase == 'begin']
        ends = [at for at, phase in self.failovers if phase == 'end']
        return any(b - before <= t <= next((e for e in ends if e >= b), float('inf')) + after for b in begins)


def _job_of(violation: dict) -> tuple[str | None, dict | None]:
    """The job a no-loss violation is about, and its acknowledging ``ok``."""
    for event in evidence(violation):
        if event['e'] == 'ok' and event.get('job'):
            return event['job'], event
    return None, None


@dataclass(frozen=True)
class Known:
    """A break another part of issue 31 is fixing: the property, what it is, and how to recognise its violations."""

    property: int | None  # None: any property
    what: str
    matches: Callable[[dict, History], bool]


def _retry_lost(violation: dict, history: History) -> bool:
    """The job's last run ended asking for another (a Snooze, a retry), and the run's worker died within a minute
    after: the end of run that schedules it again was cut. (A server fault no longer cuts it: the worker writes the
    end once the server answers.)"""
    job, _ = _job_of(violation)
    ends = [e for e in evidence(violation) if e['e'] == 'end' and e['job'] == job]
    runs = [e for e in evidence(violation) if e['e'] == 'start' and e['job'] == job]
    if not ends or ends[-1].get('retry') is not True or history.final.get(job) not in ('failed', 'started'):
        return False
    at = ends[-1]['t']
    return bool(runs) and any(at - 1 <= died <= at + 60 for died in history.deaths.get(runs[-1]['worker'], []))


def _scheduled_in_no_registry(violation: dict, history: History) -> bool:
    """A due job (a retry) rq shows scheduled that never started, whose last run's worker died within a second of
    that run's end: rq's ``Job.retry`` writes the status before its pipeline, which the kill cut."""
    job = next((e['job'] for e in evidence(violation) if e['e'] in ('invoke', 'start', 'end')), None)
    ends = [e for e in evidence(violation) if e['e'] == 'end' and e.get('job') == job]
    runs = [e for e in history.events if e['e'] == 'start' and e['job'] == job]
    if job is None or history.final.get(job) != 'scheduled' or not runs:
        return False
    ended = max([e['t'] for e in ends] or [e['t'] for e in history.events if e['e'] == 'end' and e['job'] == job]
                or [0.0])
    return any(ended - 1 <= died <= ended + 1 for died in history.deaths.get(runs[-1]['worker'], []))


def _end_cut(job: str, history: History) -> bool:
    """Did the job's last run end (its horse recorded the end) without rq recording it: rq shows the job started, or
    failed by its cleanup as abandoned, and the end fell just before its worker died? (A server fault no longer cuts
    it: the worker writes the end once the server answers.)"""
    runs = [e for e in history.events if e['e'] == 'start' and e['job'] == job]
    ends = [e for e in history.events if e['e'] == 'end' and e['job'] == job]
    if not runs or not ends or history.final.get(job) not in ('started', 'failed'):
        return False
    at = ends[-1]['t']
    return any(at - 1 <= died <= at + 60 for died in history.deaths.get(runs[-1]['worker'], []))


def _held_by_a_job_whose_end_was_cut(violation: dict, history: History) -> bool:
    """A Loner drop or raise named a holder that ran and ended, but whose end rq never recorded (:func:`_end_cut`):
    rq shows it started while its worker's key lives, which ``holder_running`` reads as running."""
    holders = {e.get('holder') for e in evidence(violation) if e['e'] == 'ok' and e.get('holder')}
    return any(_end_cut(holder, history) for holder in holders)


def _handed_back_ahead(violation: dict, history: History) -> bool:
    """A Fair job started while a job of higher priority of its key was off the key's line: taken by a fetch whose
    worker died or stopped, or could not record the start in a server fault, and handed back (then filed again in
    its key's line, docs/fair.md) just as the lower one started. The history has no event of that fetch. (A handed
    back job itself no longer runs ahead of its key's line: the fetch files it again.)"""
    faults = [begin for begin, _ in history.server_faults]
    faults += [at for times in history.deaths.values() for at in times]
    found = re.search(r'job (\S+) \(priority \S+\) started at ([0-9.]+) while job', violation['what'])
    if not found:
        return False
    started = float(found.group(2))
    higher = re.search(r'while job (\S+) \(priority \S+, admitted ([0-9.]+)\)(?:.*started ([0-9.]+))?',
                       violation['what'])
    if not higher or higher.group(3) is None:
        return False
    admitted_higher, started_higher = float(higher.group(2)), float(higher.group(3))
    # Off the line from a fault after its admission until its hand-back (run.INTERMEDIATE_SECONDS at most).
    bound = INTERMEDIATE_SECONDS
    return 0 <= started_higher - started <= bound and any(admitted_higher < at < started and started - at <= bound
                                                           for at in faults)


def _backlogged_only_by_a_dead_takers_job(violation: dict, history: History) -> bool:
    """A Fair key counted backlogged only because of jobs a fetch had taken, whose worker died or stopped before
    starting them: such a job is off its key's line (its turn was taken) and waits on the queue's intermediate list
    until it is handed back (hold_ttl, or once the execution its taker wrote expired), but the history has no event of
    that fetch. Each job of the key waiting through the stretch was admitted before a worker's death or freeze (or a
    server fault) that came before the stretch ended, and started after it ended (more than a second: not by a
    normal turn) within the hand-back's bound of that fault, or never (a cluster short run: t0's producer-1-690,
    parked 0.2 s before kill_group-24, handed back and started 123 s later; a Redis 7 one: t0's producer-3-483,
    taken by worker-13, frozen at 1796647732.98 past hold_ttl, handed back and started 8 s after the stretch)."""
    found = re.search(r'for key (\S+), both backlogged ([0-9.]+)\.\.([0-9.]+)', violation['what'])
    if not found:
        return False
    key, end = found.group(1), float(found.group(3))
    scope, _, name = key.partition(':')
    invoked = {e['op']: e for e in history.events if e['e'] == 'invoke'}
    first_start: dict[str, float] = {}
    for e in history.events:
        if e['e'] == 'start':
            first_start[e['job']] = min(first_start.get(e['job'], e['t']), e['t'])
    waiting = []
    for e in history.events:
        call = invoked.get(e.get('op')) if e['e'] == 'ok' else None
        policy = next((p for p in (call or {}).get('policies') or [] if p.get('kind') == 'fair'), None)
        if policy is None or policy.get('scope') != scope or str(policy.get('key')) != name or not e.get('job'):
            continue
        if e['t'] <= end and first_start.get(e['job'], float('inf')) > end:
            waiting.append((e['job'], e['t'], first_start.get(e['job'], float('inf'))))
    faults = [at for times in history.deaths.values() for at in times] + [at for at, _ in history.server_faults]
    # Off its line from its take (before a fault that came before the stretch ended) until its hand-back, which is
    # hold_ttl after the take (or the taker's execution's life): it starts after the stretch, not in it.
    return bool(waiting) and all(job in history.given_up or (started > end + 1 and any(
        admitted < at < end and started - at <= INTERMEDIATE_SECONDS for at in faults))
        for job, admitted, started in waiting)


def _setting_rolled_back(violation: dict, history: History) -> bool:
    """A setting written during a failover (a queue's cap or rate; a key's limit, its rate, a Fair pause or resume, a
    weight) was lost with the old master, so the promoted one kept the previous value until the next setting of that
    queue or key: the violation names a queue or a key whose last setting before the violation fell within a
    failover, and the checker holds the lost value (the Sentinel long run: ck0's limit set to 1 and rk0's rate to 1/s
    during a 20 s SENTINEL FAILOVER; the key ran 2 at once and its rate over 1/s for the next 55 s; a Fair resume lost
    the same way left its key paused, starved, until the operator's next pause and resume; and the capped queue's cap
    lowered from 3 to 2 while a SENTINEL FAILOVER ran: it ran 3 at once 14 to 32 s after the failover had
    ended, until the cap's next setting, runs 7597d11 and 962ea40)."""
    what = violation['what']
    times = [float(x) for x in re.findall(r'\b1[0-9]{9}\.[0-9]+', what)]
    if not times:
        return False
    at = min(times)
    for name in set(re.findall(r'key h[a-z]+:([A-Za-z0-9_]+)', what)):
        last = max((t for t, key in history.settings if key == name and t <= at), default=None)
        if last is not None and history.during_failover(last, after=0.0):
            return True
    # A queue's: a cap's violation by the queue's caps, whose value in force before the lost one must allow what ran
    # ("3 running ... over a limit of 2" after a cap lowered from 3 to 2 and lost: a lost raise explains no
    # overshoot); any other (a rate's) by the queue's other settings.
    cap_over = re.search(r'\bqueue [A-Za-z0-9_.-]+: ([0-9]+) running at', what)
    for name in set(re.findall(r'\bqueue ([A-Za-z0-9_.-]+):', what)):
        before = sorted((t, value) for t, queue, kind, value in history.queue_settings
                        if queue == name and t <= at and (kind == 'cap') == bool(cap_over))
        if not before or not history.during_failover(before[-1][0], after=0.0):
            continue
        if cap_over is None or len(before) < 2:  # the first cap lost: none was in force before it
            return True
        if isinstance(before[-2][1], int) and before[-2][1] >= int(cap_over.group(1)):
            return True
    return False


def _paid_when_given_back(violation: dict, history: History) -> bool:
    # A start paid when given back was decided before its fetch: the first such start widens the window, a later one
    # may leave it, and either way the window's count or its width is not what the fetches show.
    return any(e.get('paid') for e in evidence(violation) if e['e'] == 'start')


def _in_a_failover(violation: dict, history: History) -> bool:
    """A call or a run the violation names happened within a failover: what the promoted replica missed is rolled
    back (an acknowledged admission, a fetch's pop, a run's end, a hold, a rate's arrival time)."""
    return any(history.during_failover(e['t']) for e in evidence(violation)
               if e['e'] in ('invoke', 'ok', 'info', 'start', 'end', 'release'))


def _started_by_a_worker_that_died(violation: dict, history: History) -> bool:
    """A job rq shows started whose last run's worker died; or, with no run recorded at all, a job rq shows started
    while a worker died within a few seconds after its admission (the whole tree SIGKILLed between rq's start write
    and the job's first line, where it records its start: the cluster's short run, producer-3-839, parked at
    1796644564.358 and started by worker-6, whose group was SIGKILLed 0.4 s later). Or such a job rq has failed as
    abandoned already (its started registry's cleanup ran before the drain ended: the one-server long run on b2c50d9,
    producer-3-2442, admitted at 1796665925.36, its forking worker SIGKILLed 0.25 s later)."""
    job, _ = _job_of(violation)
    final = history.final.get(job)
    if final != 'started' and not (final == 'failed' and job in history.abandoned):
        return False
    runs = [e for e in evidence(violation) if e['e'] == 'start' and e['job'] == job]
    if runs:
        return runs[-1]['worker'] in history.died
    if any(e['e'] == 'start' and e['job'] == job for e in history.events):
        return False
    admitted = [e['t'] for e in evidence(violation) if e['e'] == 'ok']
    deaths = [at for times in history.deaths.values() for at in times]
    return bool(admitted) and any(admitted[-1] <= at <= admitted[-1] + 10 for at in deaths)


#: The breaks the runs still show, each named with why it is tolerated (see the module docstring).
KNOWN_BREAKS = (
    Known(4, "rq's own bound: a Loner(until='finished') holder whose run ended just before its worker died (the "
             'group SIGKILLed as the horse wrote the end): rq shows it started, and holder_running counts it as '
             'running while its worker\'s key lives (rq\'s cleanup fails it as abandoned about a minute on): calls '
             'are dropped though it has ended', _held_by_a_job_whose_end_was_cut),
    Known(1, "rq's own bound: a run that ended with a Snooze or a retry just before its worker died (the group "
             'SIGKILLed as the horse wrote the end) leaves its job failed, never run again: the job stays started, and '
             'rq fails it as abandoned', _retry_lost),
    Known(9, "rq's own: rq's Job.retry sets the status scheduled outside the pipeline that adds the job to the "
             'scheduled registry; a worker killed in between leaves the job scheduled in no registry, never promoted, '
             'never failed', _scheduled_in_no_registry),
    Known(6, "not the product's: a Rate start the checker counts at its fetch was paid when its parked job was given "
             'back (start.paid), earlier than the checker allows after a stall or a busy spell (the checker reads '
             'paid: its own branch)', _paid_when_given_back),
    Known(8, 'a Fair job of higher priority off its key\'s line (taken by a fetch whose worker died, stopped or '
             'could not record the start in a server fault) while a lower one of its key started: handed back and '
             'filed again in the line only then', _handed_back_ahead),
    Known(7, 'a Fair key counted backlogged only by jobs a fetch took whose worker died or stopped before starting '
             'them: off the key\'s line (their turn taken), on the intermediate list until handed back (hold_ttl, or '
             'once the execution the taker wrote expired); the history has no event of that fetch',
          _backlogged_only_by_a_dead_takers_job),
    Known(None, 'a queue\'s or a key\'s setting (a cap, a rate, a limit, a Fair pause or resume, a weight) written '
                'during a failover was rolled back with the old master: the promoted one keeps the previous value '
                'until the next setting of that queue or key',
          _setting_rolled_back),
    Known(None, 'a failover rolled back what the replica missed (asynchronous replication: acknowledged admissions '
                'lost, popped jobs run again, a Loner marker or a hold gone; durable admission is being added, and '
                'the loss bound measured per topology). SENTINEL FAILOVER promotes without waiting for the replica, '
                'and the old master takes writes until the sentinels reconfigure it: seconds of writes',
          _in_a_failover),
    Known(1, 'not a loss, rq\'s own bound: a job left started by a run whose worker died with it (the whole tree '
             'SIGKILLed, a worker quit on a Redis error in the middle of a job): rq fails it as abandoned once its '
             'heartbeat expired (60 s and more) and a maintenance runs, which the drain does not wait for (or has '
             'failed it so already: no one can know whether its function ran)',
          _started_by_a_worker_that_died),
)


def unexplained(report: dict, history: History) -> tuple[list[str], list[str]]:
    """(violations no known break explains, the known ones seen), each as the property and the checker's words."""
    bad, known = [], []
    for prop in report['properties']:
        for violation in prop['violations']:
            match = next((k for k in KNOWN_BREAKS if k.property in (None, prop['number'])
                          and k.matches(violation, history)), None)
            line = f'{prop["number"]}. {prop["name"]}: {violation["what"]}'
            (known if match else bad).append(line + (f'  [known: {match.what}]' if match else ''))
    return bad, known


def keep_on_failure(folder: Path, passed: bool) -> None:
    """Remove a passed run's history; move a failed one's where pytest's own clean-up of old temporary folders does
    not reach (``<tmp>/rq-policies-history/``), and name it."""
    if passed:
        shutil.rmtree(folder, ignore_errors=True)
        return
    kept = Path(tempfile.gettempdir()) / 'rq-policies-history' / f'{folder.name}-{os.getpid()}'
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(folder), str(kept))
    print(f'history kept in {kept}', file=sys.stderr)


TOPOLOGIES = [
    pytest.param('single', 'valkey', id='one-server-valkey'),
    pytest.param('single', 'redis', id='one-server-redis7',
                 marks=pytest.mark.skipif(not Path('/usr/bin/redis-server').exists() and
                                          not os.environ.get('REDIS_SERVER'), reason='no Redis 7 binary')),
    pytest.param('sentinel', 'valkey', id='sentinel-with-a-replica'),
    pytest.param('cluster', 'valkey', id='cluster-3-and-3'),
]


#: The seeds of a topology's short run: a run whose checker finds anything is run once more with the next seed, and the
#: test fails only if that one does too (the faults' timing differs from run to run, so one run is one sample: a
#: systematic break shows in both, and the first run's findings are printed and its history kept all the same).
SEEDS = ('7', '8')


def _short_run(topology: str, server: str, folder: Path, seed: str) -> list[str]:
    """One short run of ``topology``, read by the checker: what is wrong with it (nothing: [])."""
    summary = history_run(folder, '--topology', topology, '--server', server, '--jobs', str(JOBS), '--seed', seed,
                          *RUN_ARGS)
    figures = {k: summary[k] for k in ('door_calls', 'calls_per_second', 'producing_seconds', 'runs', 'events',
                                      'nemeses', 'worker_exits', 'drain_seconds', 'lapses_counted_by_the_server')}
    print(f'\n{topology}/{server} (seed {seed}): {json.dumps(figures)}', file=sys.stderr)
    wrong = []
    if summary['door_calls'] < JOBS:
        wrong.append(f'{summary["door_calls"]} door calls, fewer than {JOBS}')
    if not summary['every_nemesis_fired']:
        wrong.append(f'not every nemesis fired: {summary["nemeses"]}')
    if summary['nemesis_errors']:
        wrong.append(f'nemesis errors: {summary["nemesis_errors"]}')
    # Drained; or, after a failover, per-key jobs parked in the lost window left parked (their due-index entry lost
    # with them: they wait for their key's next job or release, docs/guarantees.md), visibly waiting. After a
    # failover, an id whose take was lost with it stays on the intermediate list for rq's cleanup.
    if not (summary['drained'] or (topology != 'single' and all(name.endswith((':deferred', ':intermediate'))
                                                               for name in summary['left']))):
        wrong.append(f'not drained: {summary["left"]} {summary.get("stuck")}')
    report = checked(folder)
    bad, known = unexplained(report, History(folder))
    for line in known:
        print(f'  known break: {line}'[:400], file=sys.stderr)
    return wrong + bad


@pytest.mark.parametrize(('topology', 'server'), TOPOLOGIES)
def test_a_short_run_under_every_nemesis_keeps_every_property(topology, server, tmp_path_factory):
    """>= 3,000 door calls on the topology, every one of its nemeses at least once (worker kills and stops of each
    shape, and the topology's server faults), every fault healed, the queues drained: the checker finds no violation
    but the known breaks' (in one run of two: :data:`SEEDS`)."""
    need_checker()
    for seed in SEEDS:
        folder = tmp_path_factory.mktemp(f'history-{topology}-{server}-{seed}')
        wrong = ['the run raised']
        try:
            wrong = _short_run(topology, server, folder, seed)
        finally:
            keep_on_failure(folder, not wrong)
        if not wrong:
            return
        print(f'  FOUND with seed {seed} (history kept): ' + '\n    '.join(wrong[:20]), file=sys.stderr)
    pytest.fail(f'every seed of {SEEDS} found something; the last:\n' + '\n'.join(wrong[:20]))


#: Each broken build, the focused run that exposes it, and the property the checker must flag.
BREAKS = [
    pytest.param('cap', ['--nemeses', 'none', '--only', 'plain'], 5, id='cap-check-removed'),
    pytest.param('replay', ['--nemeses', 'lost_reply', '--gap', '0.5', '1.5', '--only', 'plain'], 2,
                 id='replay-writes-twice'),
    pytest.param('release', ['--nemeses', 'none', '--only', 'plain,keyed', '--drain', '15'], 9,
                 id='release-dropped'),
]


@pytest.mark.parametrize(('broken', 'args', 'number'), BREAKS)
def test_a_broken_build_is_flagged(broken, args, number, tmp_path_factory):
    """A copy of the package with one change (a release dropped, QueueSlot's cap check removed from the fetch's Lua,
    the admission's replay check removed) first on the workers' and producers' PYTHONPATH: the checker flags the
    property it breaks."""
    need_checker()
    folder = tmp_path_factory.mktemp(f'history-break-{broken}')
    passed = False
    try:
        history_run(folder, '--topology', 'single', '--seconds', '25', '--seed', '3', '--break', broken,
                    '--rate', '10', '--simple', '3', *args)
        report = checked(folder)
        flagged = next(prop for prop in report['properties'] if prop['number'] == number)
        assert flagged['violations'], (broken, flagged)
        assert not report['ok']
        passed = True
    finally:
        keep_on_failure(folder, passed)
