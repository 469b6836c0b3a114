"""Soak: the policies together under kills, shutdowns and a Redis restart, checked from records the jobs write.

    python tests/soak.py --seconds 600            # a long run; prints the figures and exits non-zero on a violation

Against a real server with AOF on, it runs producer processes enqueuing a mix of policy kinds (see KINDS) into a
capped and an uncapped queue, and forking PolicyWorker processes. Throughout the run a chaos loop SIGKILLs work
horses and whole workers, sends warm and cold shutdowns, and starts replacements; once, mid-run, it restarts the
Redis server. A cold shutdown is two SIGTERMs 1.3 s apart (rq ignores a second one within 1 s) to a worker running
a 4 s job the chaos enqueued for it; the report counts the cold shutdowns the workers logged. Then it lets the
queues drain and checks, from the records jobs and producers append to local files (files, so that the records
survive the restart):

* cap: the capped queue never ran more than CAP jobs at any instant (a horse that was SIGKILLed has no end record;
  its end is the last moment a 10 ms poll saw it alive, so the check has that resolution). The workers record when
  they reaped each horse and released each hold; an overlap is classified as real, or as within the watcher's
  resolution when the earlier job's worker had reaped its horse and released its hold before the later job
  started. Only real ones fail the check. Every chaos action is timestamped in the report's timeline;
* lost: every admitted job ran at least once or sits where rq can recover it (a queue, the intermediate list, the
  scheduled, started, deferred or failed registry);
* loner: no two jobs of one loner identity waited at once (waiting is measured from the producer's return to the
  job's start, a sub-interval of the true wait, so an overlap found is a real one);
* throttle: no slot of a throttled identity ran more than one leading job;
* leaks: once the queues drain and the slots end, no policy key is left but configuration and counters.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import soak_jobs  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.registry import (  # noqa: E402
    DeferredJobRegistry,
    FailedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from rq_policies import PolicyQueue, QueueSlot, keys  # noqa: E402
from rq_policies.testing import RedisServer  # noqa: E402

CAP = 2
QUEUES = ('soak_capped', 'soak_open')
HOLD_TTL = soak_jobs.SoakWorker.hold_ttl


def KINDS():  # noqa: N802 - a table, built lazily so a kind whose policy is missing is simply absent
    return soak_jobs.kinds()


# -- producers ----------------------------------------------------------------------------------------------------

def producer(index: int, url: str, run_dir: str, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    conn = Redis.from_url(url, socket_timeout=5)
    queues = {name: PolicyQueue(name, connection=conn) for name in QUEUES}
    kinds = KINDS()
    with open(Path(run_dir) / f'producer-{index}.log', 'a', buffering=1) as out:
        while time.time() < deadline:
            kind = rng.choice(list(kinds))
            func = kinds[kind]
            identity = f'id{rng.randrange(6)}'
            queue = rng.choice(QUEUES)
            job_id = f'p{index}-{rng.getrandbits(48):x}'
            called = time.time()
            try:
                job = queues[queue].enqueue(func, identity, rng.choice((0.05, 0.2, 0.4)), job_id=job_id)
            except Exception as exc:  # the restart: the call may or may not have landed
                out.write(json.dumps(['maybe', job_id, queue, kind, identity, time.time(), called, repr(exc)[:80]])
                          + '\n')
                time.sleep(0.2)
                continue
            verdict = 'admit' if job is not None else 'drop'
            out.write(json.dumps([verdict, job_id, queue, kind, identity, time.time(), called]) + '\n')
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
    args = [sys.executable, '-m', 'rq.cli', 'worker', '-w', 'soak_jobs.SoakWorker', '--url', url,
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


class Chaos:
    def __init__(self, url: str, env: dict, run_dir: Path, workers: int, rng: random.Random):
        self.url, self.env, self.run_dir, self.rng = url, env, run_dir, rng
        self.counter = 0
        self.procs: list[subprocess.Popen] = []
        self.events: dict[str, int] = defaultdict(int)
        self.asked: set[int] = set()  # workers the chaos told to stop or killed
        self.died_unasked = 0
        self.cold_jobs = 0
        self.timeline: list[list] = []  # [epoch s, action, victim pid] for every chaos action
        self.conn: Redis | None = None
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
                os.kill(pid, signal.SIGKILL)
        elif action == 'kill_worker':
            os.kill(victim.pid, signal.SIGKILL)
        elif action == 'warm':
            os.kill(victim.pid, signal.SIGTERM)
        else:
            # rq (2.12 and 3.x) ignores a second shutdown signal within 1 s of the first: a cold shutdown needs the
            # second one later. A worker that is gone by then was idle, and its warm shutdown was the whole story.
            os.kill(victim.pid, signal.SIGTERM)
            time.sleep(COLD_SECOND_SIGNAL_AFTER)
            if victim.poll() is None:
                os.kill(victim.pid, signal.SIGTERM)
                self.events['cold_second_signal'] += 1
        self.events[action] += 1

    def busy_with_long_job(self, wait: float = 5.0) -> subprocess.Popen | None:
        """Enqueue a 4 s plain job on the uncapped queue and return the worker whose horse runs it (None when no
        worker took it within ``wait`` seconds, or the enqueue failed: the Redis restart)."""
        self.cold_jobs += 1
        job_id = f'cold-{self.cold_jobs}'
        try:
            if self.conn is None:
                self.conn = Redis.from_url(self.url, socket_timeout=5)
            PolicyQueue('soak_open', connection=self.conn).enqueue(soak_jobs.soak_plain, 'cold', 4.0, job_id=job_id)
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


def check(conn: Redis, run_dir: Path, policy_keys_left: list[str]) -> dict:
    produced, started, ended, popped = read_records(run_dir)
    horses = json.loads((run_dir / 'horses.json').read_text())  # 'pid-start' -> last seen alive
    results: dict = {}

    # cap: each overlap is real (the earlier job's horse was surely alive when the later one started: its own end
    # record is later, or its worker had not yet reaped it and released its hold), or within the watcher's
    # resolution (its end is only the watcher's last sight of it, and its worker had reaped it and released its hold
    # by the later start: the hold did its job, the 10 ms poll did not see the end sooner).
    reaped, released = {}, {}
    for path in run_dir.glob('events-*.log'):
        for line in path.read_text().splitlines():
            kind, job_id, at = json.loads(line)
            (reaped if kind == 'reaped' else released)[job_id] = at
    events = []
    for job_id, runs in started.items():
        for run in runs:
            queue, pid, t0, horse = run[2], run[5], run[6], run[7]
            if queue != 'soak_capped':
                continue
            ends = [e[2] for e in ended.get(job_id, []) if e[3] == pid]
            span = (job_id, horse, t0, ends[0] if ends else horses.get(horse, t0), 'record' if ends else 'last seen')
            events += [(t0, 1, span), (span[3], -1, span)]
    def within_resolution(span, at):
        job_id, _, _, _, how = span
        done = max(reaped.get(job_id, float('inf')), released.get(job_id, float('inf')))
        return how == 'last seen' and done <= at

    running, peak, over, open_spans = 0, 0, [], set()
    real = resolution = 0
    for at, delta, span in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        (open_spans.add if delta > 0 else open_spans.discard)(span)
        peak = max(peak, running)
        if running > CAP and delta > 0:
            earlier = [sp for sp in open_spans if sp is not span]
            alive_then = [sp for sp in earlier if not within_resolution(sp, at)]
            kind = 'real' if len(alive_then) + 1 > CAP else 'resolution'
            real, resolution = real + (kind == 'real'), resolution + (kind == 'resolution')
            if len(over) < 5:  # the evidence: which runs overlapped, how each one's end is known, when it was reaped
                over.append({'at': at, 'kind': kind, 'runs': [
                    [*sp, reaped.get(sp[0]), released.get(sp[0])] for sp in sorted(open_spans, key=lambda sp: sp[2])
                ]})
    results['cap'] = {'ok': real == 0, 'peak': peak, 'cap': CAP, 'runs': len(events) // 2, 'over': over,
                      'overlaps_real': real, 'overlaps_within_resolution': resolution}

    # lost
    recoverable = set()
    for name in QUEUES:
        q = Queue(name, connection=conn)
        recoverable |= set(q.job_ids) | {x.decode() for x in conn.lrange(q.intermediate_queue_key, 0, -1)}
        for registry in (ScheduledJobRegistry, StartedJobRegistry, DeferredJobRegistry, FailedJobRegistry):
            recoverable |= set(registry(queue=q).get_job_ids())
    admitted = [p for p in produced if p[0] == 'admit']
    # A replaced (debounced or trailing) job is deleted by design; only the latest of each identity must run.
    latest = {}
    for p in sorted(admitted, key=lambda p: p[5]):
        if p[3] in soak_jobs.REPLACING:
            latest[(p[2], p[3], p[4])] = p[1]
    must_run = [p for p in admitted if p[3] not in soak_jobs.REPLACING or latest[(p[2], p[3], p[4])] == p[1]]
    lost = [p[1] for p in must_run if p[1] not in started and p[1] not in recoverable
            and not Job.exists(p[1], connection=conn)]
    results['lost'] = {'ok': not lost, 'admitted': len(admitted), 'ran': sum(1 for p in admitted if p[1] in started),
                       'recoverable': sum(1 for p in admitted if p[1] not in started and p[1] in recoverable),
                       'lost': lost[:10], 'maybe': sum(1 for p in produced if p[0] == 'maybe'),
                       'dropped': sum(1 for p in produced if p[0] == 'drop')}

    # loner: each job surely waited from the producer's return to the moment before the fetch that took it, a
    # sub-interval of its true wait; two such intervals of one identity that intersect are a real violation.
    waits = defaultdict(list)
    for p in admitted:
        if p[3] == 'loner' and p[1] in popped:
            waits[(p[2], p[4])].append((p[5], popped[p[1]]))
    overlaps = 0
    for intervals in waits.values():
        intervals.sort()
        for i, (_a0, a1) in enumerate(intervals):
            overlaps += sum(1 for b0, b1 in intervals[i + 1:] if b0 < a1 and b0 < b1)
    results['loner'] = {'ok': overlaps == 0, 'overlapping_waits': overlaps, 'jobs': sum(map(len, waits.values()))}

    # throttle: an admission happened between the producer's call and return; when both fall in one slot, that is
    # the slot it won. No slot may have two leading winners (nor run two).
    leading = defaultdict(set)
    for p in admitted:
        if p[3] == 'throttle':
            first, last = int(p[6] // soak_jobs.SLOT_SECONDS), int(p[5] // soak_jobs.SLOT_SECONDS)
            if first == last:
                leading[(p[2], p[4], first)].add(p[1])
    doubles = {k: v for k, v in leading.items() if len(v) > 1}
    ran_twice = {k: v for k, v in leading.items() if len(v & set(started)) > 1}
    results['throttle'] = {'ok': not doubles and not ran_twice, 'slots': len(leading),
                           'slots_with_two_winners': len(doubles), 'slots_that_ran_two': len(ran_twice)}

    # keyed: runs of one identity that both recorded their end never overlap beyond the per-key limit (a run
    # without an end, its horse killed, is left out: the check can only find real overlaps)
    runs = defaultdict(list)
    for job_id, records in started.items():
        for rec in records:
            ends = [e[2] for e in ended.get(job_id, []) if e[3] == rec[5]]
            if rec[3] == 'keyed' and ends:
                runs[rec[4]].append((rec[6], ends[0]))
    worst = 0
    for spans in runs.values():
        for t0, _ in spans:
            worst = max(worst, sum(1 for s0, s1 in spans if s0 <= t0 < s1))
    results['keyed'] = {'ok': worst <= soak_jobs.KEY_LIMIT, 'peak_per_key': worst, 'limit': soak_jobs.KEY_LIMIT,
                        'runs': sum(map(len, runs.values()))}

    results['leaks'] = {'ok': not policy_keys_left, 'left': policy_keys_left[:10]}
    return results


def backlog(conn: Redis) -> dict:
    out = {}
    for name in QUEUES:
        q = Queue(name, connection=conn)
        out[name] = {'queued': q.count, 'scheduled': ScheduledJobRegistry(queue=q).count,
                     'parked': DeferredJobRegistry(queue=q).count}  # per-key parked jobs must run too
        # A job popped by a worker that died before starting it sits in the intermediate list until rq's maintenance
        # fails it into the FailedJobRegistry: at least a minute later, and up to 15 minutes when the worker died
        # holding rq's per-queue maintenance lock. It is in rq's hands (counted as recoverable), not backlog.
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
    claim records and the tombstones of superseded pending jobs while they expire by themselves (``keys.CLAIM_TTL``,
    ``keys.SUPERSEDED_SECONDS``)."""
    allowed = {keys.CAPACITY, keys.DROPS, keys.LAPSES}
    left = []
    for raw in conn.scan_iter('rq:policies:*', count=1000):
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
        left.append(f'{key} (ttl {ttl})')
    return sorted(left)


def run(seconds: float, producers: int = 3, workers: int = 4, seed: int = 1, restart: bool = True,
        keep: bool = False) -> dict:
    rng = random.Random(seed)
    server = RedisServer(appendonly=True, extra_args=['--appendfsync', 'always']).start()
    run_dir = server.dir / 'records'
    run_dir.mkdir()
    env = dict(os.environ, SOAK_RUN_DIR=str(run_dir),
               PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get('PYTHONPATH', '')]))
    os.environ['SOAK_RUN_DIR'] = str(run_dir)
    conn = Redis.from_url(server.url)
    QueueSlot.set_capacity('soak_capped', CAP, connection=conn)
    started_at = time.time()
    deadline = started_at + seconds
    ctx = multiprocessing.get_context('spawn')
    stop_watch = ctx.Event()
    watcher = ctx.Process(target=watch_horses, args=(run_dir, stop_watch))
    watcher.start()
    chaos = Chaos(server.url, env, run_dir, workers, rng)
    prods = [ctx.Process(target=producer, args=(i, server.url, str(run_dir), deadline, seed * 100 + i))
             for i in range(producers)]
    for p in prods:
        p.start()
    restarted = False
    restarts = 0
    try:
        while time.time() < deadline:
            time.sleep(rng.uniform(0.5, 2.0))
            chaos.act()
            chaos.reap()
            if restart and not restarted and time.time() > started_at + seconds / 2:
                server.restart()  # same port, AOF on: producers and workers must reconnect
                restarted = True
                restarts += 1
        for p in prods:
            p.join(60)
        drained, drain_seconds, left, assists = drain(conn, 180)
        chaos.stop_all()
        time.sleep(max(HOLD_TTL, soak_jobs.SLOT_SECONDS) + 2)  # let killed workers' holds and the last slots end
        stop_watch.set()
        watcher.join(10)
        results = check(conn, run_dir, policy_keys(conn))
        results['run'] = {
            'seconds': round(time.time() - started_at, 1), 'drained': drained, 'drain_seconds': round(drain_seconds, 1),
            'backlog_left': left, 'scheduler_assists': assists, 'redis_restarts': restarts,
            'kills': dict(chaos.events), 'workers_started': chaos.counter, 'kinds': sorted(KINDS()),
            'cold_shutdowns': cold_shutdowns(run_dir),
            'timeline': [[round(at - started_at, 3), action, pid] for at, action, pid in chaos.timeline],
        }
        results['ok'] = all(v.get('ok', True) for v in results.values() if isinstance(v, dict)) and drained
        # A worker that dies at start (a bad setting) would make a soak that proves nothing: respawns are chaos only.
        # (rq's own work loop also quits on a Redis error in the middle of a job, so the restart accounts for some.)
        results['run']['workers_died_unasked'] = chaos.died_unasked
        return results
    finally:
        stop_watch.set()
        for p in prods:
            if p.is_alive():
                p.kill()
        chaos.stop_all()
        if keep:
            print(f'records kept in {run_dir}', file=sys.stderr)
            server.stop()
        else:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--seconds', type=float, default=60)
    parser.add_argument('--producers', type=int, default=3)
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--keep', action='store_true', help='keep the records folder')
    opts = parser.parse_args()
    results = run(opts.seconds, opts.producers, opts.workers, opts.seed, keep=opts.keep)
    print(json.dumps(results, indent=2))
    sys.exit(0 if results['ok'] else 1)


if __name__ == '__main__':
    main()
