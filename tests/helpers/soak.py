"""Soak: the policies together under kills, shutdowns, lost replies and Redis restarts, checked from records the jobs
write.

    python -m tests.helpers.soak --seconds 600 --seed 7   # a long run, from the repository's root; prints the
                                                          # figures and exits non-zero on a violation

Against a real server with AOF on, it runs producer processes enqueuing a mix of policy kinds (``soak_jobs.kinds()``)
into a capped and an uncapped queue, and forking PolicyWorker processes. Producers and workers reach the server
through a fault-injecting proxy (helpers/faultproxy.py) with retrying clients, as production clients retry: producers
with a 1 s socket timeout, so a reply held 1.5 s or a dropped connection makes redis-py send the call again; workers
with rq's own timeout (rq raises a worker's to its dequeue timeout plus 10 s), so a dropped connection makes them
resend. Throughout the run a chaos loop SIGKILLs work horses and whole workers, sends warm and cold shutdowns, starts
replacements, and arms a lost reply (a late admission reply, a dropped admission, fetch or any script reply, a stall
of every connection); at a third of the run it restarts the Redis server with its data (AOF), at two thirds without
(the dataset is lost: CONFIG SET appendonly no, SHUTDOWN NOSAVE, the AOF files removed, started again on the same
port), and then sets the cap again as an operator would. A cold shutdown is two SIGTERMs 1.3 s apart (rq ignores a
second one within 1 s) to a worker running a 4 s job the chaos enqueued for it; the report counts the cold shutdowns
the workers logged. Then it lets the queues drain and checks, from the records jobs and producers append to local
files (files, so that the records survive the restarts):

* cap: the capped queue never ran more than CAP jobs at any instant (a horse that was SIGKILLed has no end record;
  its end is the last moment a 10 ms poll saw it alive, so the check has that resolution). The workers record when
  they reaped each horse and released each hold; an overlap is classified as real, as within the watcher's
  resolution when the earlier job's worker had reaped its horse and released its hold before the later job
  started, or as within the restart window: a job started in the RECOUNT_WINDOW seconds after the restart without
  persistence, beside a job that was running across it (that job's hold was lost with the data and is counted
  again at its worker's next refresh; until then the ledger does not know it). Only real ones fail the check;
* lost: every admitted job ran at least once or sits where rq can recover it (a queue, the intermediate list, the
  scheduled, started, deferred or failed registry); a job whose admission began before the restart without
  persistence and that had not started is lost with the data (counted, not a failure);
* double runs: no job id ran twice (each run is a start record), except across the restart without persistence,
  which also forgets that an admission happened (a replay of it then admits the id again);
* stranded: at the end, no id on an intermediate list (nothing runs then) but those taken by a worker that was
  killed, died or was stopped before it could start them (rq's own cleanup fails such a job after a minute; a
  PolicyWorker stopped in between logs the job it gives up);
* per kind (``KIND_CHECKS``): loner, no two jobs of one loner identity waited at once (waiting is measured from the
  producer's return to the job's start, a sub-interval of the true wait, so an overlap found is a real one);
  throttle, no slot of a throttled identity ran more than one leading job (a slot across the restart without
  persistence is forgotten with the data, and may have two); keyed, no two runs of one key (Concurrency(1) keyed
  on the identity, whatever the queue) that recorded their end overlapped;
* leaks: once the queues drain and the slots end, no policy key is left but configuration, counters and records on
  their way out.

Every chaos action, fault and restart is timestamped in the report's timeline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Queue
from rq.job import Job
from rq.registry import (
    DeferredJobRegistry,
    FailedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from rq_policies import PolicyQueue, QueueSlot
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import unpack_strings
from rq_policies.surfaces.testing import RedisServer
from tests.helpers import soak_jobs, with_root
from tests.helpers.faultproxy import FaultProxy, retrying

CAP = 2
QUEUES = ('soak_capped', 'soak_open')
HOLD_TTL = soak_jobs.SoakWorker.hold_ttl

#: Seconds after the restart without persistence within which a job may start beside one that ran across it,
#: uncounted: the running job's hold went with the data and comes back at its worker's next refresh (every
#: job_monitoring_interval, 3 s in the soak), plus 2 s for a starved machine and the reconnect.
RECOUNT_WINDOW = soak_jobs.SoakWorker.monitoring_interval + 2

#: Seconds of the capped job the soak starts just before the restart without persistence, to run across it.
LONG_ACROSS_SECONDS = 8.0

#: The producers' socket timeout (seconds): a reply later than this is given up and the call sent again.
PRODUCER_TIMEOUT = 1.0

#: What only an admission that writes a job carries (its fields, ``created_at`` among them: tests.helpers.faults),
#: and only a fetch (its claim record's key, KEYS[1] of lua/fetch.lua).
ADMIT_WRITE = (b'EVAL', b'created_at')
FETCH = (b'EVAL', keys.claim('').encode())


def KINDS():  # noqa: N802 - a table, built lazily so a kind whose policy is missing is simply absent
    return soak_jobs.kinds()


def replacing() -> set[str]:
    """The kinds whose pending job a later enqueue replaces (deleted by design)."""
    return {name for name, kind in KINDS().items() if kind.replacing}


# -- producers ----------------------------------------------------------------------------------------------------

def producer(index: int, url: str, run_dir: str, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    # Through the proxy, retrying as production clients do: a late or lost reply sends the same call again.
    conn = Redis.from_url(url, socket_timeout=PRODUCER_TIMEOUT, socket_connect_timeout=2, retry=retrying())
    queues = {name: PolicyQueue(name, connection=conn) for name in QUEUES}
    kinds = KINDS()
    with open(Path(run_dir) / f'producer-{index}.log', 'a', buffering=1) as out:
        while time.time() < deadline:
            kind = rng.choice(list(kinds))
            func = kinds[kind].func
            identity = f'id{rng.randrange(6)}'
            queue = rng.choice(QUEUES)
            job_id = f'p{index}-{rng.getrandbits(48):x}'
            called = time.time()
            try:
                job = queues[queue].enqueue(func, identity, rng.choice((0.05, 0.2, 0.4)), job_id=job_id)
            except Exception as exc:  # a restart, or retries used up: the call may or may not have landed
                out.write(json.dumps(['maybe', job_id, queue, kind, identity, time.time(), called, repr(exc)[:80]])
                          + '\n')
                time.sleep(0.2)
                continue
            verdict = 'admit' if job is not None else 'drop'
            # The id that will run: a Debounce or trailing Throttle call that replaces a pending job is merged into it
            # (rewritten in place) and the door returns that job, with the pending job's id.
            admitted = job.id if job is not None else job_id
            out.write(json.dumps([verdict, admitted, queue, kind, identity, time.time(), called]) + '\n')
            time.sleep(rng.uniform(0.05, 0.25))  # below what the workers drain, so a long run can end drained


# -- workers and chaos --------------------------------------------------------------------------------------------

#: Seconds between the two SIGTERMs of a cold shutdown: more than the 1 s within which rq ignores a second one.
COLD_SECOND_SIGNAL_AFTER = 1.3

#: What rq logs (WARNING) when it performs a cold shutdown.
COLD_SHUTDOWN_LOG = ': cold shut down'


def cold_shutdowns(log_dir: Path) -> int:
    """How many cold shutdowns the workers performed, from their logs."""
    return sum(path.read_text(errors='replace').count(COLD_SHUTDOWN_LOG) for path in log_dir.glob('worker-*.log'))


def start_worker(url: str, env: dict, log_dir: Path, n: int, scheduler: bool) -> subprocess.Popen:
    args = [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'tests.helpers.soak_jobs.SoakWorker', '--url', url,
            '--connection-class', 'tests.helpers.faultproxy.RetryingRedis',  # a dropped connection resends the call
            '--logging_level', 'WARNING', *(['--with-scheduler'] if scheduler else []),
            # rq retries a dead scheduler's lock and cleans its registries only in maintenance (every 10 minutes by
            # default); the soak kills workers every few seconds, so it asks for maintenance every 5 s.
            '--maintenance-interval', '5', *QUEUES]
    with open(log_dir / f'worker-{n}.log', 'ab') as log:  # the child keeps its own descriptor
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def children(pid: int) -> list[int]:
    try:
        text = Path(f'/proc/{pid}/task/{pid}/children').read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def alive(pid: int, start: str) -> bool:
    """Is this process (pid and start time) alive and not a zombie? A reused pid is another process."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(') ', 1)[1].split()
    except OSError:
        return False
    return fields[0] != 'Z' and fields[19] == start


#: The lost replies the chaos arms, one at a time: (name, how). A producer gives a late reply up after
#: PRODUCER_TIMEOUT and resends; a dropped reply (the server ran the command, the connection closes) makes producers
#: and workers resend; a stall holds every byte of every connection (none is lost) past the producers' timeout.
NET_FAULTS = (
    ('late_admission', lambda proxy: proxy.delay_reply(PRODUCER_TIMEOUT + 0.5, match=ADMIT_WRITE)),
    ('lost_admission', lambda proxy: proxy.drop_reply(match=ADMIT_WRITE)),
    ('lost_fetch', lambda proxy: proxy.drop_reply(match=FETCH)),
    ('lost_script_reply', lambda proxy: proxy.drop_reply(match=b'EVAL')),
    ('stall', lambda proxy: proxy.stall(PRODUCER_TIMEOUT + 0.3)),
)


class Chaos:
    def __init__(self, url: str, admin_url: str, env: dict, run_dir: Path, workers: int, rng: random.Random,
                 proxy: FaultProxy | None = None):
        self.url, self.admin_url, self.env, self.run_dir, self.rng = url, admin_url, env, run_dir, rng
        self.proxy = proxy
        self.counter = 0
        self.procs: list[subprocess.Popen] = []
        self.events: dict[str, int] = defaultdict(int)
        self.asked: set[int] = set()  # workers the chaos told to stop or killed
        self.died_unasked = 0
        self.died: set[int] = set()  # workers that were SIGKILLed, cold-shut-down or died unasked
        self.cold_jobs = 0
        self.timeline: list[list] = []  # [epoch s, action, victim pid] for every chaos action
        self.conn: Redis | None = None
        self.takers: dict[str, int] = {}  # job id -> pid of the worker whose fetch took it (from claim records)
        # One worker runs rq's scheduler (trailing and debounced jobs) and is never a victim: rq takes over a dead
        # scheduler's lock only after the lock expires and in maintenance, which is rq's recovery, not ours.
        self.scheduler = self.spawn(scheduler=True)
        for _ in range(workers - 1):
            self.spawn()

    def spawn(self, scheduler: bool = False) -> subprocess.Popen:
        self.counter += 1
        proc = start_worker(self.url, self.env, self.run_dir, self.counter, scheduler=scheduler)
        self.procs.append(proc)
        return proc

    def reap(self) -> None:
        for proc in list(self.procs):
            if proc.poll() is not None:
                self.procs.remove(proc)
                if proc.pid not in self.asked:
                    self.died_unasked += 1
                    self.died.add(proc.pid)
                if proc is self.scheduler:
                    self.scheduler = self.spawn(scheduler=True)
                else:
                    self.spawn()

    def act(self) -> None:
        live = [p for p in self.procs if p.poll() is None and p is not self.scheduler]
        if not live:
            return
        action = self.rng.choice(('kill_horse', 'kill_horse', 'kill_worker', 'warm', 'cold'))
        victim = self.rng.choice(live)
        if action == 'cold':
            victim = self.busy_with_long_job() or victim  # a cold shutdown needs a job still running after 1.3 s
        if action != 'kill_horse':
            self.asked.add(victim.pid)
        self.timeline.append([round(time.time(), 3), action, victim.pid])
        if action == 'kill_horse':
            horses = children(victim.pid)
            if not horses:
                return
            for pid in horses:
                with contextlib.suppress(ProcessLookupError):  # the horse ended since children() listed it
                    os.kill(pid, signal.SIGKILL)
        elif action == 'kill_worker':
            self.died.add(victim.pid)
            os.kill(victim.pid, signal.SIGKILL)
        elif action == 'warm':
            os.kill(victim.pid, signal.SIGTERM)
        else:
            # rq (2.12 and 3.x) ignores a second shutdown signal within 1 s of the first: a cold shutdown needs the
            # second one later. A worker that is gone by then was idle, and its warm shutdown was the whole story.
            os.kill(victim.pid, signal.SIGTERM)
            time.sleep(COLD_SECOND_SIGNAL_AFTER)
            if victim.poll() is None:
                self.died.add(victim.pid)  # its horse is killed: a job it took and had not started stays taken
                os.kill(victim.pid, signal.SIGTERM)
                self.events['cold_second_signal'] += 1
        self.events[action] += 1

    def lose_a_reply(self) -> None:
        """Arm one lost reply on the proxy (forgetting one armed earlier that found nothing to fire on)."""
        if self.proxy is None:
            return
        name, arm = self.rng.choice(NET_FAULTS)
        self.proxy.disarm()
        arm(self.proxy)
        self.timeline.append([round(time.time(), 3), f'net:{name}', 0])
        self.events[f'armed:{name}'] += 1

    def note_takers(self) -> None:
        """Which worker took each job on an intermediate list: a fetch's claim record (``keys.claim``, 60 s) names
        the claim token, ``<host>:<pid>:<tid>:<n>``, and the job. Read every chaos tick, well within the 60 s."""
        try:
            conn = self.admin()
            names = list(conn.scan_iter(keys.claim('*'), count=1000))
            values = conn.mget(names) if names else []
        except RedisConnectionError:
            return  # a restart
        for name, value in zip(names, values):
            if value is not None:
                pid = int(name.decode()[len(keys.claim('')):].split(':')[-3])
                self.takers[claimed_job(value.decode())] = pid

    def admin(self) -> Redis:
        """The chaos's own connection, straight to the server (not through the proxy)."""
        if self.conn is None:
            self.conn = Redis.from_url(self.admin_url, socket_timeout=5)
        return self.conn

    def busy_with_long_job(self, wait: float = 5.0) -> subprocess.Popen | None:
        """Enqueue a 4 s plain job on the uncapped queue and return the worker whose horse runs it (None when no
        worker took it within ``wait`` seconds, or the enqueue failed: the Redis restart)."""
        self.cold_jobs += 1
        return self.start_long_job('soak_open', f'cold-{self.cold_jobs}', 4.0, wait)

    def start_long_job(self, queue: str, job_id: str, seconds: float, wait: float = 5.0) -> subprocess.Popen | None:
        """Enqueue a plain job of ``seconds`` on ``queue`` and return the worker whose horse runs it (None when no
        worker took it within ``wait`` seconds, or the enqueue failed)."""
        try:
            PolicyQueue(queue, connection=self.admin()).enqueue(soak_jobs.soak_plain, 'long', seconds, job_id=job_id,
                                                                at_front=True)
        except Exception:
            return None
        needle = f'"{job_id}"'
        deadline = time.time() + wait
        while time.time() < deadline:
            for path in self.run_dir.glob('jobs-*.log'):
                if needle in path.read_text(errors='replace'):
                    horse = int(path.stem.split('-')[1])
                    try:
                        parent = int(Path(f'/proc/{horse}/stat').read_text().rsplit(') ', 1)[1].split()[1])
                    except (OSError, IndexError, ValueError):
                        return None
                    found = [p for p in self.procs if p.pid == parent and p.poll() is None and p is not self.scheduler]
                    return found[0] if found else None
            time.sleep(0.05)
        return None

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                self.died.add(proc.pid)
                proc.kill()
                proc.wait()


def watch_horses(run_dir: Path, stop: multiprocessing.Event) -> None:
    """Every 10 ms, note the last moment each running job's horse was seen alive (end of a killed job).

    A horse is its pid and start time (the name of its record file), so a pid reused later is not taken for it.
    """
    seen: dict[str, float] = {}  # 'pid-start' -> last seen alive
    live: set[str] = set()
    last_scan = 0.0
    while not stop.is_set():
        now = time.time()
        if now - last_scan > 0.05:
            last_scan = now
            for path in run_dir.glob('jobs-*.log'):
                horse = path.stem.split('-', 1)[1]
                if horse not in seen:
                    seen[horse] = now
                    live.add(horse)
        for horse in list(live):
            pid, start = horse.split('-')
            if alive(int(pid), start):
                seen[horse] = time.time()
            else:
                live.discard(horse)  # a process does not come back
        time.sleep(0.01)
    (run_dir / 'horses.json').write_text(json.dumps(seen))


# -- checks -------------------------------------------------------------------------------------------------------

def read_records(run_dir: Path):
    produced, started, ended, popped = [], {}, {}, {}
    for path in run_dir.glob('pops-*.log'):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            popped.setdefault(rec[1], rec[2])
    for path in run_dir.glob('producer-*.log'):
        produced += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for path in run_dir.glob('jobs-*.log'):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec[0] == 'start':
                started.setdefault(rec[1], []).append(rec)
            else:
                ended.setdefault(rec[1], []).append(rec)
    return produced, started, ended, popped


def last_pops(run_dir: Path) -> dict[str, int]:
    """Job id -> the pid of the worker that took it last: the pops records a worker writes as it begins a job it
    fetched (``pops-<pid>.log``, ``['pop', job id, the moment before its fetch]``). The chaos's reading of the claim
    records, once a tick, misses a claim its worker deleted with its next pipeline in between."""
    found: dict[str, tuple[float, int]] = {}
    for path in run_dir.glob('pops-*.log'):
        pid = int(path.name[len('pops-'):-len('.log')])
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec[1] not in found or rec[2] > found[rec[1]][0]:
                found[rec[1]] = (rec[2], pid)
    return {job_id: pid for job_id, (_, pid) in found.items()}


class Run:
    """What a check reads: the records, the server, what the chaos did, and the restarts.

    Attributes:
        produced: the producers' records, ``[verdict, job id, queue, kind, identity, returned at, called at, ...]``.
        started, ended: job id -> its start / end records (one per run).
        popped: job id -> the moment before the fetch that took it.
        restarts: ``{'kind': 'aof' | 'empty', 'began': epoch s, 'ended': epoch s}`` in order.
    """

    def __init__(self, conn: Redis, run_dir: Path, restarts: list[dict], chaos: Chaos | None = None,
                 policy_keys_left: list[str] | None = None):
        self.conn, self.run_dir, self.restarts = conn, run_dir, restarts
        self.produced, self.started, self.ended, self.popped = read_records(run_dir)
        self.horses = json.loads((run_dir / 'horses.json').read_text())  # 'pid-start' -> last seen alive
        # Who took each job: the claim records the chaos read, and the workers' own pops records (the later word).
        self.takers = {**(chaos.takers if chaos is not None else {}), **last_pops(run_dir)}
        self.timeline = chaos.timeline if chaos is not None else []  # [epoch s, action, pid]
        self.died = chaos.died if chaos is not None else set()
        self.policy_keys_left = policy_keys_left or []
        self.admitted = [p for p in self.produced if p[0] == 'admit']
        self.empty = [r for r in restarts if r['kind'] == 'empty']

    def before_data_loss(self, at: float) -> bool:
        """Could something that happened at ``at`` have been forgotten by a restart without persistence?"""
        return any(at < r['ended'] for r in self.empty)

    def across_data_loss(self, first: float, last: float) -> bool:
        """Do two moments lie on either side of a restart without persistence?"""
        return any(first < r['ended'] and last > r['began'] for r in self.empty)

    def in_recount_window(self, at: float) -> dict | None:
        """The restart without persistence whose recount window holds ``at``, if any."""
        return next((r for r in self.empty if r['began'] <= at <= r['ended'] + RECOUNT_WINDOW), None)


def check_cap(run: Run) -> dict:
    """Cap: each overlap is real (the earlier job's horse was surely alive and counted when the later one started),
    within the watcher's resolution (its end is only the watcher's last sight of it, and its worker had reaped it
    and released its hold by the later start: the hold did its job, the 10 ms poll did not see the end sooner), or
    within the restart window (the later job started within RECOUNT_WINDOW of the restart without persistence,
    beside a job that ran across it and was not counted yet)."""
    reaped, released = {}, {}
    for path in run.run_dir.glob('events-*.log'):
        for line in path.read_text().splitlines():
            kind, job_id, at = json.loads(line)
            (reaped if kind == 'reaped' else released)[job_id] = at
    events = []
    for job_id, runs in run.started.items():
        for rec in runs:
            queue, pid, t0, horse = rec[2], rec[5], rec[6], rec[7]
            if queue != 'soak_capped':
                continue
            ends = [e[2] for e in run.ended.get(job_id, []) if e[3] == pid]
            end = ends[0] if ends else run.horses.get(horse, t0)
            span = (job_id, horse, t0, end, 'record' if ends else 'last seen')
            events += [(t0, 1, span), (span[3], -1, span)]

    def within_resolution(span, at):
        job_id, _, _, _, how = span
        done = max(reaped.get(job_id, float('inf')), released.get(job_id, float('inf')))
        return how == 'last seen' and done <= at

    running, peak, peak_counted, over, open_spans = 0, 0, 0, [], set()
    counts = {'real': 0, 'resolution': 0, 'restart_window': 0}
    for at, delta, span in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        (open_spans.add if delta > 0 else open_spans.discard)(span)
        peak = max(peak, running)
        if delta < 0:
            continue
        alive_then = [sp for sp in open_spans if sp is span or not within_resolution(sp, at)]
        window = run.in_recount_window(at)
        uncounted = [sp for sp in alive_then if window is not None and sp[2] < window['began']]
        peak_counted = max(peak_counted, len(alive_then) - len(uncounted))
        if running <= CAP:
            continue
        if len(alive_then) <= CAP:
            kind = 'resolution'
        elif len(alive_then) - len(uncounted) <= CAP:
            kind = 'restart_window'
        else:
            kind = 'real'
        counts[kind] += 1
        if len(over) < 5 and kind != 'resolution':  # the evidence: which runs overlapped, how each end is known
            over.append({'at': at, 'kind': kind, 'runs': [
                [*sp, reaped.get(sp[0]), released.get(sp[0])] for sp in sorted(open_spans, key=lambda sp: sp[2])
            ]})
    return {'ok': counts['real'] == 0, 'peak': peak, 'peak_outside_windows': peak_counted, 'cap': CAP,
            'runs': len(events) // 2, 'over': over, 'overlaps_real': counts['real'],
            'overlaps_within_resolution': counts['resolution'], 'overlaps_in_restart_window': counts['restart_window']}


def check_lost(run: Run) -> dict:
    """Lost: every admitted job ran or sits where rq can recover it; one admitted before the restart without
    persistence that had not started is lost with the data. A replacing (debounced or trailing) call is merged into
    the pending job by design (recorded under the id the door returned, the pending job's): only the latest of each
    identity must run."""
    conn = run.conn
    recoverable = set()
    for name in QUEUES:
        q = Queue(name, connection=conn)
        recoverable |= set(q.job_ids) | {x.decode() for x in conn.lrange(q.intermediate_queue_key, 0, -1)}
        for registry in (ScheduledJobRegistry, StartedJobRegistry, DeferredJobRegistry, FailedJobRegistry):
            recoverable |= set(registry(queue=q).get_job_ids())
    replaced = replacing()
    latest = {}
    for p in sorted(run.admitted, key=lambda p: p[5]):
        if p[3] in replaced:
            latest[(p[2], p[3], p[4])] = p[1]
    must_run = [p for p in run.admitted if p[3] not in replaced or latest[(p[2], p[3], p[4])] == p[1]]
    missing = [p for p in must_run if p[1] not in run.started and p[1] not in recoverable
               and not Job.exists(p[1], connection=conn)]
    with_data = [p for p in missing if run.before_data_loss(p[6])]
    lost = [p[1] for p in missing if p not in with_data]
    return {'ok': not lost, 'admitted': len(run.admitted),
            'ran': sum(1 for p in run.admitted if p[1] in run.started),
            'recoverable': sum(1 for p in run.admitted if p[1] not in run.started and p[1] in recoverable),
            'lost': lost[:10], 'lost_with_the_data': len(with_data),
            'maybe': sum(1 for p in run.produced if p[0] == 'maybe'),
            'dropped': sum(1 for p in run.produced if p[0] == 'drop')}


def check_double_runs(run: Run) -> dict:
    """Double runs: a job id that started more than once (its runs are its start records). Across the restart
    without persistence an admission's replay may admit the id again, as nothing remembers the first attempt."""
    twice = {job_id: [rec[6] for rec in runs] for job_id, runs in run.started.items() if len(runs) > 1}
    with_data = {job_id for job_id, starts in twice.items() if run.across_data_loss(min(starts), max(starts))}
    real = sorted(set(twice) - with_data)
    produced = {p[1]: p for p in run.produced}
    # The evidence: the runs (queue, kind, pid, start, horse), the producer's record, the chaos actions around them.
    examples = [{'job': job_id, 'runs': [rec[2:] for rec in run.started[job_id]], 'produced': produced.get(job_id),
                 'timeline': [t for t in run.timeline if min(twice[job_id]) - 3 <= t[0] <= max(twice[job_id]) + 1]}
                for job_id in real[:5]]
    return {'ok': not real, 'ids_run_twice': len(real), 'across_the_data_loss': len(with_data), 'examples': examples}


def claimed_job(record: str) -> str:
    """The job id in a fetch's claim record (lua/fetch.lua's ``record``: the queue's index, the job id, then one hold
    flag per fetch policy)."""
    return unpack_strings(record)[1]


#: Job statuses of a run that is over: an id of such a job left on an intermediate list is rq's bookkeeping, not a job
#: waiting for nothing.
ENDED = {'finished', 'failed', 'stopped', 'canceled'}


def check_stranded(run: Run) -> dict:
    """Stranded: at the end (nothing runs then), an id on an intermediate list of a job that has not ended, and that
    no dying worker explains: it waits for nothing (no worker will take it; rq's cleanup fails it after a minute,
    unrun). A worker SIGKILLed (or cold-shut-down, or dead of a Redis error) between its fetch and the job's start
    leaves the id there: counted apart, as rq's recovery, and so is the id of a job whose run already ended (a horse
    SIGKILLed right after the fork: rq failed the job but left its id listed until its cleanup)."""
    conn = run.conn
    given_up = set(given_up_jobs(run.run_dir))
    stranded, by_dead, by_stopped, ended = [], 0, 0, 0
    for name in QUEUES:
        for raw in conn.lrange(Queue(name, connection=conn).intermediate_queue_key, 0, -1):
            job_id = raw.decode()
            status = conn.hget(Job.key_for(job_id), 'status')
            status = status.decode() if status else None
            if run.takers.get(job_id) in run.died:
                by_dead += 1
            elif job_id in given_up:
                by_stopped += 1  # a stop request landed between its fetch and its start: the worker logged it
            elif status in ENDED:
                ended += 1  # its run was handled (a horse killed right after the fork fails it); rq lists it still
            else:
                stranded.append([name, job_id, status, run.takers.get(job_id)])
    return {'ok': not stranded, 'stranded': len(stranded), 'taken_by_a_worker_that_died': by_dead,
            'taken_by_a_worker_that_stopped': by_stopped, 'ended_but_still_listed': ended, 'examples': stranded[:5]}


#: The warning a PolicyWorker logs when a stop request lands between a fetch and the job's start (worker_mixin's
#: ``_drop_claim``): the job it names stays on the intermediate list for rq's cleanup.
GIVEN_UP = re.compile(r"rq-policies: job (\S+) was taken from '[^']*' but not started")


def given_up_jobs(run_dir: Path) -> list[str]:
    """The ids of jobs the workers' logs say were taken and never started (see ``GIVEN_UP``)."""
    return [m.group(1) for log in sorted(run_dir.glob('worker-*.log'))
            for m in GIVEN_UP.finditer(log.read_text(errors='replace'))]


def check_loner(run: Run) -> dict:
    """Loner: each job surely waited from the producer's return to the moment before the fetch that took it, a
    sub-interval of its true wait; two such intervals of one identity that intersect are a real violation."""
    waits = defaultdict(list)
    for p in run.admitted:
        if p[3] == 'loner' and p[1] in run.popped:
            waits[(p[2], p[4])].append((p[5], run.popped[p[1]]))
    overlaps = 0
    for intervals in waits.values():
        intervals.sort()
        for i, (_a0, a1) in enumerate(intervals):
            overlaps += sum(1 for b0, b1 in intervals[i + 1:] if b0 < a1 and b0 < b1)
    return {'ok': overlaps == 0, 'overlapping_waits': overlaps, 'jobs': sum(map(len, waits.values()))}


def check_throttle(run: Run) -> dict:
    """Throttle: an admission happened between the producer's call and return; when both fall in one slot, that is
    the slot it won. No slot may have two leading winners (nor run two), but a slot the restart without persistence
    cut in two, which the server forgot."""
    leading = defaultdict(list)
    for p in run.admitted:
        if p[3] == 'throttle':
            first, last = int(p[6] // soak_jobs.SLOT_SECONDS), int(p[5] // soak_jobs.SLOT_SECONDS)
            if first == last:
                leading[(p[2], p[4], first)].append(p)

    def forgotten(winners):
        return run.across_data_loss(min(p[6] for p in winners), max(p[5] for p in winners))

    doubles = {k: v for k, v in leading.items() if len(v) > 1}
    ran_twice = {k: v for k, v in leading.items() if len([p for p in v if p[1] in run.started]) > 1}
    real = {k for k in set(doubles) | set(ran_twice) if not forgotten(leading[k])}
    return {'ok': not real, 'slots': len(leading), 'slots_with_two_winners': len([k for k in doubles if k in real]),
            'slots_that_ran_two': len([k for k in ran_twice if k in real]),
            'slots_forgotten_by_the_data_loss': len((set(doubles) | set(ran_twice)) - real)}


def check_keyed(run: Run) -> dict:
    """Keyed: runs of one key that both recorded their end never overlap beyond the per-key limit (a run without an
    end, its horse killed, is left out: the check can only find real overlaps)."""
    runs = defaultdict(list)
    for job_id, records in run.started.items():
        for rec in records:
            ends = [e[2] for e in run.ended.get(job_id, []) if e[3] == rec[5]]
            if rec[3] == 'keyed' and ends:
                runs[rec[4]].append((rec[6], ends[0]))
    worst = 0
    for spans in runs.values():
        for t0, _ in spans:
            worst = max(worst, sum(1 for s0, s1 in spans if s0 <= t0 < s1))
    return {'ok': worst <= soak_jobs.KEY_LIMIT, 'peak_per_key': worst, 'limit': soak_jobs.KEY_LIMIT,
            'runs': sum(map(len, runs.values()))}


def check_leaks(run: Run) -> dict:
    return {'ok': not run.policy_keys_left, 'left': run.policy_keys_left[:10]}


#: The invariants every run checks, by name (each reads a Run, returns a dict with 'ok').
CHECKS = {'cap': check_cap, 'lost': check_lost, 'double_runs': check_double_runs, 'stranded': check_stranded,
          'leaks': check_leaks}

#: The per-kind invariants, by the name a kind lists in ``soak_jobs.Kind.checks``.
KIND_CHECKS = {'loner': check_loner, 'throttle': check_throttle, 'keyed': check_keyed}


def check(run: Run) -> dict:
    """Every invariant of CHECKS, and each per-kind one that some kind of the run names."""
    results = {name: fn(run) for name, fn in CHECKS.items()}
    for name in sorted({c for kind in KINDS().values() for c in kind.checks}):
        results[name] = KIND_CHECKS[name](run)
    return results


def backlog(conn: Redis) -> dict:
    out = {}
    for name in QUEUES:
        q = Queue(name, connection=conn)
        out[name] = {'queued': q.count, 'scheduled': ScheduledJobRegistry(queue=q).count,
                     'parked': DeferredJobRegistry(queue=q).count}  # per-key parked jobs must run too
        # A job popped by a worker that died before starting it sits in the intermediate list until a PolicyWorker
        # hands it back to its queue (its take lapses hold_ttl after the fetch: rq_policies.engine.fetch.hand_back), or,
        # its take lost with the data, rq's maintenance fails it: recoverable, not backlog.
        out[name + ':intermediate'] = {'awaiting_rq_recovery': conn.llen(q.intermediate_queue_key)}
    return out


def move_due_scheduled(conn: Redis) -> int:
    """What rq's scheduler does each second: push scheduled jobs whose time has come to their queue."""
    moved = 0
    for name in QUEUES:
        q = Queue(name, connection=conn)
        registry = ScheduledJobRegistry(queue=q)
        for job_id in registry.get_jobs_to_schedule(int(time.time())):
            job = Job.fetch(job_id, connection=conn) if Job.exists(job_id, connection=conn) else None
            with conn.pipeline() as pipe:
                if job is not None:
                    q._enqueue_job(job, pipeline=pipe)
                    moved += 1
                registry.remove(job_id, pipeline=pipe)
                pipe.execute()
    return moved


def drain(conn: Redis, timeout: float) -> tuple[bool, float, dict, int]:
    """Wait for the backlog to drain. rq takes over a dead scheduler's lock only once the lock expires and in
    maintenance; if due scheduled jobs are still waiting after 30 s, the soak moves them as rq's scheduler would
    (counted and reported as scheduler assists: rq's recovery latency, not a policy's)."""
    started = time.time()
    assists = 0
    while True:
        left = backlog(conn)
        if not any(v for name, q in left.items() if not name.endswith(':intermediate') for v in q.values()):
            return True, time.time() - started, left, assists
        if time.time() - started > timeout:
            return False, time.time() - started, left, assists
        if time.time() - started > 30:
            assists += move_due_scheduled(conn)
        time.sleep(0.5)


def policy_keys(conn: Redis) -> list[str]:
    """Policy keys left that would not go away: configuration and counters are allowed, and so are the fetches'
    claim records, the tombstones of superseded pending jobs, the records of dropped enqueues, the push records of
    short-lived jobs and the admin calls' kept answers while they expire by themselves (``keys.CLAIM_TTL``,
    ``keys.SUPERSEDED_SECONDS``, ``keys.DROPPED_SECONDS``, ``keys.PUSHED_SECONDS``, ``keys.ANSWER_TTL``)."""
    allowed = {keys.CAPACITY, keys.DROPS, keys.LAPSES}
    left = []
    for raw in conn.scan_iter(f'{RQ}:policies:*', count=1000):
        key = raw.decode()
        if key in allowed:
            continue
        ttl = conn.ttl(key)
        if ttl == -2 or (key.startswith(keys.claim('')) and 0 <= ttl <= keys.CLAIM_TTL):
            continue  # gone since the scan, or a claim record on its way out
        if keys.is_drop_counter(key) and 0 <= ttl <= (keys.DROPS_MINUTE_KEEP + 1) * 60:
            continue  # a per-minute drop counter, which expires an hour after its minute
        if key.startswith(keys.SUPERSEDED_PREFIX) and 0 <= ttl <= keys.SUPERSEDED_SECONDS:
            continue  # a superseded pending job's tombstone on its way out
        if key.startswith(keys.dropped('')) and 0 <= ttl <= keys.DROPPED_SECONDS:
            continue  # the record of a dropped enqueue (the producers choose their job ids) on its way out
        if key.startswith(keys.pushed('')) and 0 <= ttl <= keys.PUSHED_SECONDS:
            continue  # the push record of a job with a short result_ttl on its way out
        if keys.is_answer(key) and 0 <= ttl <= keys.ANSWER_TTL:
            continue  # an admin call's kept answer (the soak clears nothing today) on its way out
        if key.startswith(keys.taken('')) and ttl == -1 and _takes_listed(conn, key):
            continue  # the takes of ids still on their intermediate list (the stranded check counts those)
        left.append(f'{key} (ttl {ttl})')
    return sorted(left)


def _takes_listed(conn: Redis, key: str) -> bool:
    """Does every take in ``key`` (``rq:policies:taken:<queue>``) name an id still on its queue's intermediate list:
    one a worker took and never started, which a PolicyWorker hands back once the take lapses (or the run ended
    before that)?"""
    listed = {raw.decode() for raw in conn.lrange(Queue(key[len(keys.taken('')):], connection=conn)
                                                  .intermediate_queue_key, 0, -1)}
    return all(jid.decode() in listed for jid in conn.hkeys(key))


def restart_without_persistence(server: RedisServer) -> None:
    """Restart the server empty on the same port: its data is really lost (no AOF, no RDB is read back)."""
    conn = server.client(socket_timeout=5)
    try:
        conn.config_set('appendonly', 'no')
        conn.config_set('save', '')
        conn.shutdown(nosave=True)
    except RedisConnectionError:
        pass  # the server went away while answering SHUTDOWN: that is the point
    finally:
        conn.close()
    server.stop()
    for leftover in ('appendonlydir', 'appendonly.aof', 'dump.rdb'):
        path = server.dir / leftover
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    server.start()  # AOF on again, from an empty dataset


#: The restarts of a run, in order: (kind, at which fraction of the run). 'aof' keeps the data, 'empty' loses it.
RESTARTS = (('aof', 1 / 3), ('empty', 2 / 3))


def run(seconds: float, producers: int = 3, workers: int = 4, seed: int = 1, restarts=RESTARTS,
        lost_replies: bool = True, keep: bool = False) -> dict:
    rng = random.Random(seed)
    server = RedisServer(appendonly=True, extra_args=['--appendfsync', 'always']).start()
    run_dir = server.dir / 'records'
    run_dir.mkdir()
    env = with_root(dict(os.environ, SOAK_RUN_DIR=str(run_dir)))
    os.environ['SOAK_RUN_DIR'] = str(run_dir)
    conn = Redis.from_url(server.url)
    QueueSlot.set('soak_capped', CAP, connection=conn)
    proxy = FaultProxy('127.0.0.1', server.port, lifetime=seconds + 1200, record=False).start() if lost_replies \
        else None
    url = proxy.url if proxy is not None else server.url  # producers and workers; the checks go straight
    started_at = time.time()
    deadline = started_at + seconds
    passed = False  # until every check says so: a failed or interrupted run keeps its records
    ctx = multiprocessing.get_context('spawn')
    stop_watch = ctx.Event()
    watcher = ctx.Process(target=watch_horses, args=(run_dir, stop_watch))
    watcher.start()
    chaos = Chaos(url, server.url, env, run_dir, workers, rng, proxy)
    prods = [ctx.Process(target=producer, args=(i, url, str(run_dir), deadline, seed * 100 + i))
             for i in range(producers)]
    for p in prods:
        p.start()
    planned = sorted(restarts, key=lambda r: r[1])
    done: list[dict] = []
    try:
        while time.time() < deadline:
            time.sleep(rng.uniform(0.5, 2.0))
            chaos.act()
            if rng.random() < 0.6:
                chaos.lose_a_reply()
            chaos.note_takers()
            chaos.reap()
            if planned and time.time() > started_at + seconds * planned[0][1]:
                kind = planned.pop(0)[0]
                if kind == 'empty':
                    # A capped job that runs across the data loss: its hold goes with the data and must be counted
                    # again (a lapse, item 7), and jobs started beside it meanwhile are the restart window's.
                    chaos.start_long_job('soak_capped', 'across-the-restart', LONG_ACROSS_SECONDS)
                began = time.time()
                if kind == 'empty':
                    restart_without_persistence(server)
                    QueueSlot.set('soak_capped', CAP, connection=conn)  # the operator sets the cap again
                else:
                    server.restart()  # same port, AOF on: producers and workers must reconnect
                done.append({'kind': kind, 'began': began, 'ended': time.time()})
                chaos.timeline.append([round(began, 3), f'restart:{kind}', 0])
        for p in prods:
            p.join(60)
        if proxy is not None:
            proxy.disarm()  # the drain runs without new faults
        drained, drain_seconds, left, assists = drain(conn, 180)
        chaos.note_takers()
        chaos.stop_all()
        time.sleep(max(HOLD_TTL, soak_jobs.SLOT_SECONDS) + 2)  # let killed workers' holds and the last slots end
        stop_watch.set()
        watcher.join(10)
        results = check(Run(conn, run_dir, done, chaos, policy_keys(conn)))
        fired: dict[str, int] = defaultdict(int)
        for kind, _ in (proxy.fired if proxy is not None else []):
            fired[kind] += 1
        results['run'] = {
            'seconds': round(time.time() - started_at, 1), 'seed': seed, 'drained': drained,
            'drain_seconds': round(drain_seconds, 1), 'backlog_left': left, 'scheduler_assists': assists,
            'redis_restarts': len(done), 'restarts': [[r['kind'], round(r['began'] - started_at, 1),
                                                      round(r['ended'] - r['began'], 2)] for r in done],
            'kills': dict(chaos.events), 'lost_replies_fired': dict(fired), 'workers_started': chaos.counter,
            'kinds': sorted(KINDS()), 'cold_shutdowns': cold_shutdowns(run_dir),
            'hold_lapses_detected': {k.decode(): int(v) for k, v in conn.hgetall(keys.LAPSES).items()},
            'timeline': [[round(at - started_at, 3), action, pid] for at, action, pid in chaos.timeline],
        }
        results['ok'] = all(v.get('ok', True) for v in results.values() if isinstance(v, dict)) and drained
        # A worker that dies at start (a bad setting) would make a soak that proves nothing: respawns are chaos only.
        # (rq's own work loop also quits on a Redis error in the middle of a job, so the restarts account for some.)
        results['run']['workers_died_unasked'] = chaos.died_unasked
        passed = results['ok']
        return results
    finally:
        stop_watch.set()
        for p in prods:
            if p.is_alive():
                p.kill()
        chaos.stop_all()
        if proxy is not None:
            proxy.close()
        if keep or not passed:  # a failed run keeps what its workers and jobs wrote, to find out why
            print(f'records kept in {run_dir}' + ('' if passed else ' (a check failed)'), file=sys.stderr)
            server.stop()
        else:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--producers', type=int, default=3)
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--keep', action='store_true',
                        help='keep the records folder (a run whose checks fail keeps it anyway)')
    parser.add_argument('--no-lost-replies', action='store_true', help='connect straight to the server, no proxy')
    opts = parser.parse_args()
    results = run(opts.seconds, opts.producers, opts.workers, opts.seed, lost_replies=not opts.no_lost_replies,
                  keep=opts.keep)
    print(json.dumps(results, indent=2))
    sys.exit(0 if results['ok'] else 1)


if __name__ == '__main__':
    main()
