"""Histories made without a server: :class:`History` writes events by hand (the checker's tests), and
:func:`simulate` runs a small simulation of producers, PolicyWorkers and their policies that keeps every promise, so
that its history must pass every property (the checker's no-false-alarm test, and bench/history_check.py's input).

The simulation is one event loop on one clock (the server's): producers call doors (Loner, Throttle, enqueue_in,
Debounce, Fair keys with weights and priorities, per-key Concurrency), the door decides at the server instant it
reports as ``now``, workers each serving one queue fetch by the queue's rule (FIFO; a cap of 2; a start rate; the
queue's list, then Fair's virtual time; a per-key limit), run the job, end it and release; now and then a horse is
killed (the job is retried after a second) or a reply is lost (the call ends ``info``, the job admitted all the
same). ``broken=`` breaks one promise as a faulty build would (:data:`BREAKS`), for the checker to catch.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

T0 = 1_700_000_000.0


class History:
    """Events of a history, by process, written as one ``<process>.jsonl`` each (:meth:`write`).

    Args:
        dt: every process's calibration round trip (its stamps' uncertainty is half of it).
    """

    def __init__(self, dt: float = 0.0, topology: str = 'single'):
        self.dt, self.topology = dt, topology
        self.files: dict[str, list[dict]] = defaultdict(list)
        self.ops = itertools.count(1)
        self.runs = itertools.count(1)

    def emit(self, p: str, t: float, e: str, **fields: Any) -> dict:
        if not self.files[p] and e != 'hello':
            role = 'horse' if p.startswith('horse-') else p.split('-')[0]
            self.emit(p, t - 0.5, 'hello', role=role, pid=len(self.files), dt=self.dt, topology=self.topology,
                      **({'worker': p[len('horse-'):]} if role == 'horse' else {}))
        event = {'t': round(t, 6), 'p': p, 'e': e, **fields}
        self.files[p].append(event)
        return event

    def worker(self, name: str, t: float, queues: list[str]) -> None:
        """A worker process (``name`` is both its process and its rq name) saying hello at ``t``."""
        self.emit(name, t, 'hello', role='worker', pid=len(self.files), dt=self.dt, topology=self.topology,
                  worker=name, queues=list(queues))

    def call(self, p: str, t0: float, t1: float, *, job: str | None = None, queue: str = 'q', door: str = 'enqueue',
             payload: Any = None, policies: list[dict] | None = None, due: float | None = None,
             priority: int | None = None, result: str = 'ok', verdict: str = 'admitted', op: str | None = None,
             into: str | None = None, runs_at: float | None = None, **done: Any) -> str:
        """A door call: ``invoke`` at ``t0`` and its completion (``result``: ok, fail or info; None: none) at
        ``t1``; ``due`` is the time the caller asked for (enqueue_in/at), ``runs_at`` the run time the door answered
        (the ``ok``'s ``due``); the ``ok`` names ``into`` (the job the call merged into) or ``job``; ``done`` adds
        fields to the completion (``now``, ``holder``, ``policy``)."""
        op = op or f'{p}:{next(self.ops)}'
        job = job or f'job-{op}'
        self.emit(p, t0, 'invoke', op=op, door=door, queue=queue, job=job, func='tasks.f', payload=payload,
                  due=due, priority=priority, policies=list(policies or ()))
        if result == 'ok':
            done['job'] = into or job
            if runs_at is not None:
                done['due'] = runs_at
            self.emit(p, t1, 'ok', op=op, verdict=verdict, **done)
        elif result is not None:
            self.emit(p, t1, result, op=op, error='TimeoutError' if result == 'info' else 'ValueError', **done)
        return op

    def run(self, worker: str, job: str, t0: float, t1: float | None = None, *, queue: str = 'q',
            policies: list[dict] | None = None, payload: Any = None, outcome: str = 'ok', retry: bool = False,
            fetched: tuple[float, float] | None = None, end_by: str | None = None, due: float | None = None,
            release: float | None = None, attempt: int = 0, run: str | None = None,
            in_process: bool = False) -> str:
        """A run on ``worker``: ``start`` at ``t0`` (and its ``fetched`` window), ``end`` at ``t1`` (None: none),
        recorded by the horse (``end_by='worker'``: by the worker, as for a killed horse; ``in_process``: the worker
        runs it in its own process, a SimpleWorker); a ``release`` at ``release``."""
        run = run or f'{worker}:{next(self.runs)}'
        horse = worker if in_process else f'horse-{worker}'
        fields = {'fetched': [round(fetched[0], 6), round(fetched[1], 6)]} if fetched else {}
        self.emit(horse, t0, 'start', job=job, run=run, worker=worker, pid=1, claim=f'claim-{run}', queue=queue,
                  payload=payload, attempt=attempt, policies=list(policies or ()), **fields)
        if t1 is not None:
            extra = {'due': due} if due is not None else {}
            self.emit(worker if end_by == 'worker' else horse, t1, 'end', job=job, run=run, outcome=outcome,
                      retry=retry, **extra)
        if release is not None:
            self.emit(worker, release, 'release', job=job, claim=f'claim-{run}')
        return run

    def nemesis(self, t0: float, action: str, t1: float | None = None, *, workers: list[str] = (),
                lease: float | None = None, target: Any = None) -> None:
        target = target if target is not None else (workers[0] if workers else 'server')
        fields = {'target': target, 'workers': list(workers)}
        if lease is not None:
            fields['lease'] = lease
        self.emit('nemesis', t0, 'nemesis', action=action, phase='begin', **fields)
        if t1 is not None:
            self.emit('nemesis', t1, 'nemesis', action=action, phase='end', **fields)

    def setting(self, t: float, what: str, value: Any, *, queue: str | None = None, scope: str | None = None,
                key: Any = None, t0: float | None = None) -> None:
        fields = {'queue': queue} if queue is not None else {'scope': scope}
        if t0 is not None:
            fields['t0'] = t0
        self.emit('runner', t, 'setting', what=what, key=key, value=value, **fields)

    def exit(self, t: float, worker: str, code: int = -9) -> None:
        self.emit('runner', t, 'exit', worker=worker, pid=0, code=code)

    def final(self, t: float, jobs: dict[str, str]) -> None:
        self.emit('runner', t, 'final', jobs=jobs)

    def write(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for p, events in self.files.items():
            events.sort(key=lambda e: (e['e'] != 'hello', e['t']))
            with (folder / f'{p}.jsonl').open('w') as handle:
                handle.writelines(json.dumps(e, separators=(',', ':')) + '\n' for e in events)
        return folder

    def __len__(self) -> int:
        return sum(len(events) for events in self.files.values())


# -- the simulation --------------------------------------------------------------------------------------------------

#: The queues the simulation serves, each with its workers and how it is fetched.
QUEUES = {'default': 3, 'capped': 3, 'rated': 2, 'fair': 1, 'keyed': 3}
CAP = 2
RATE = (20, 1, 5)  # limit, per, burst
KEY_LIMIT = 2
FAIR_WEIGHTS = {'k0': 1, 'k1': 1, 'k2': 2, 'k3': 3}


#: What ``simulate(broken=...)`` can break, as a faulty build would: the cap check removed, the Loner check removed,
#: a lost reply's replay that writes the job twice, Fair's turns by name instead of virtual time, a Debounce that
#: runs the first payload of its burst.
BREAKS = ('cap', 'loner', 'replay', 'fair', 'debounce')


def simulate(events: int, seed: int = 1, dt: float = 0.002, broken: str | None = None) -> History:
    """A history of about ``events`` events that keeps every promise the checker checks, but the one ``broken``
    names (:data:`BREAKS`)."""
    if broken not in (None,) + BREAKS:
        raise ValueError(f'broken must be one of {BREAKS}, got {broken!r}')
    rng = random.Random(seed)
    h = History(dt=dt)
    clock = [T0]
    heap: list[tuple] = []
    seq = itertools.count()

    def at(t: float, what: str, *args: Any) -> None:
        heapq.heappush(heap, (t, next(seq), what, args))

    workers = {}
    for queue, count in QUEUES.items():
        for n in range(count):
            name = f'worker-{queue}-{n}'
            workers[name] = {'queue': queue, 'busy': False}
            h.worker(name, T0 - 0.1, [queue])
    h.setting(T0 - 0.05, 'cap', CAP, queue='capped', t0=T0 - 0.06)
    h.setting(T0 - 0.05, 'rate', list(RATE), queue='rated', t0=T0 - 0.06)
    idle: dict[str, set] = {queue: set(w for w, info in workers.items() if info['queue'] == queue) for queue in QUEUES}
    ready: dict[str, deque] = {queue: deque() for queue in QUEUES}
    fair_lines: dict[str, list] = defaultdict(list)  # key -> heap of (-prio, seq, job)
    fair_vt: dict[str, float] = {}
    running: dict[str, int] = defaultdict(int)  # queue or key -> holds
    tat = [0.0]
    held: dict[str, str] = {}  # loner identity -> job waiting
    windows: dict[tuple, str] = {}  # (identity, slot index) -> job
    pending: dict[str, str] = {}  # debounce identity -> its pending job
    jobs: dict[str, dict] = {}
    status: dict[str, str] = {}
    producers = [f'producer-{n}' for n in range(3)]

    def wake(queue: str, t: float) -> None:
        for name in list(idle[queue]):
            idle[queue].discard(name)
            at(t + 0.001, 'fetch', name)

    def admit(t: float, job: str, queue: str, again: bool = False) -> None:
        info = jobs[job]
        if queue == 'fair' and not again:  # a retry joins the queue's list, not the key's line (docs/fair.md)
            key = info['key']
            if not fair_lines[key]:
                active = [fair_vt[k] for k, line in fair_lines.items() if line]
                fair_vt[key] = min(active) if active else fair_vt.get(key, 0.0)
            heapq.heappush(fair_lines[key], (-info['priority'], next(seq), job))
        else:
            ready[queue].append(job)
        status[job] = 'queued'
        wake(queue, t)

    def pick(queue: str, t: float) -> tuple[str | None, float | None]:
        """The job a fetch at ``t`` takes, or None and when to look again (None: at the next news)."""
        if queue == 'capped' and running['capped'] >= CAP and broken != 'cap':
            return None, None
        if queue == 'rated':
            interval = RATE[1] / RATE[0]
            if ready[queue] and max(tat[0], t) - t > (RATE[2] - 1) * interval:
                return None, max(tat[0], t) - (RATE[2] - 1) * interval + 1e-4
            if ready[queue]:
                tat[0] = max(tat[0], t) + interval
        if queue == 'fair' and not ready[queue]:  # the list first, then the turns
            active = [k for k, line in fair_lines.items() if line]
            if not active:
                return None, None
            key = min(active, key=lambda k: (fair_vt[k], k)) if broken != 'fair' else min(active)
            fair_vt[key] += 1 / FAIR_WEIGHTS[key]
            return heapq.heappop(fair_lines[key])[2], None
        if queue == 'keyed':
            for job in ready[queue]:
                if running[jobs[job]['key']] < KEY_LIMIT:
                    ready[queue].remove(job)
                    return job, None
            return None, None
        return (ready[queue].popleft(), None) if ready[queue] else (None, None)

    def call(t: float) -> None:
        p = rng.choice(producers)
        kind = rng.random()
        queue, policies, due, priority, payload = 'default', [], None, None, rng.randrange(1000)
        # The door decides at t, the instant this event is handled (so decisions and their `now` keep one order);
        # the call was invoked a little before and returns a little after.
        latency = rng.uniform(0.001, 0.004)
        now, t = t, t - latency / 2
        job = f'j{next(seq)}'
        op = f'{p}:{next(h.ops)}'
        verdict, holder = 'admitted', None
        info = {'queue': queue, 'policies': policies, 'payload': payload, 'priority': 0, 'key': None, 'due': None}
        if kind < 0.25:
            pass
        elif kind < 0.35:
            ident = f'L{rng.randrange(8)}'
            policies.append({'kind': 'loner', 'identity': ident, 'until': 'started', 'on_conflict': 'drop'})
            if ident in held and broken != 'loner':
                verdict, holder = 'dropped', held[ident]
            else:
                held[ident] = job
                info['loner'] = ident
        elif kind < 0.42:
            ident = f'T{rng.randrange(6)}'
            policies.append({'kind': 'throttle', 'identity': ident, 'slot': 1, 'trailing': False})
            window = (ident, int(now // 1))
            if window in windows:
                verdict, holder = 'dropped', windows[window]
            else:
                windows[window] = job
        elif kind < 0.46:
            due = round(now + rng.uniform(0.5, 3.0), 6)
            info['due'] = due
        elif kind < 0.5:
            ident = f'D{rng.randrange(4)}'
            policies.append({'kind': 'debounce', 'identity': ident, 'wait': 1, 'max_wait': 3})
            held_job = pending.get(ident)
            if held_job is not None and jobs[held_job]['due'] > now:
                first = jobs[held_job]['first']
                runs_at = math.ceil(min(now + 1, first + 3))
                jobs[held_job]['due'] = runs_at
                if broken != 'debounce':
                    jobs[held_job]['payload'] = payload
                h.call(p, t, t + latency, job=job, queue=queue, payload=payload, policies=policies, op=op,
                       verdict='replaced', into=held_job, now=round(now, 6), runs_at=runs_at)
                return
            runs_at = math.ceil(now + 1)
            pending[ident] = job
            jobs[job] = dict(info, due=runs_at, first=now, debounce=ident)
            h.call(p, t, t + latency, job=job, queue=queue, payload=payload, policies=policies, op=op,
                   verdict='scheduled', now=round(now, 6), runs_at=runs_at)
            status[job] = 'scheduled'
            at(runs_at, 'due', job)
            return
        elif kind < 0.62:
            queue = 'capped'
        elif kind < 0.72:
            queue = 'rated'
        elif kind < 0.86:
            queue = 'fair'
            key = rng.choice(list(FAIR_WEIGHTS))
            priority = rng.choice([0, 0, 0, 5])
            policies.append({'kind': 'fair', 'scope': 'tasks.f', 'key': key, 'weight': FAIR_WEIGHTS[key]})
            info.update(key=key, priority=priority)
        else:
            queue = 'keyed'
            key = f'c{rng.randrange(4)}'
            policies.append({'kind': 'concurrency', 'scope': 'tasks.f', 'key': key, 'limit': KEY_LIMIT, 'cost': 1})
            info['key'] = key
        info['queue'] = queue
        lost = rng.random() < 0.01 and verdict == 'admitted'
        h.call(p, t, t + latency, job=job, queue=queue, payload=payload, policies=policies, due=due,
               priority=priority, op=op, verdict=verdict, result='info' if lost else 'ok',
               **({} if lost else {'now': round(now, 6)}), **({'holder': holder} if holder else {}),
               **({'policy': policies[0]['kind']} if holder else {}))
        if verdict != 'admitted':
            return
        jobs[job] = info
        if due is not None:
            status[job] = 'scheduled'
            at(due, 'due', job)
        else:
            admit(now, job, queue)
            if lost and broken == 'replay':
                admit(now + 0.5, job, queue)  # the resend wrote it again

    def promote(t: float, job: str) -> None:
        info = jobs[job]
        if info.get('debounce'):
            if info['due'] > t + 1e-9:  # moved later by a replacing call
                at(info['due'], 'due', job)
                return
            if pending.get(info['debounce']) == job:
                del pending[info['debounce']]
        admit(t, job, info['queue'], again=info.get('attempt', 0) > 0)

    def fetch(t: float, name: str) -> None:
        queue = workers[name]['queue']
        job, again = pick(queue, t)
        if job is None:
            idle[queue].add(name)
            if again is not None:
                idle[queue].discard(name)
                at(again, 'fetch', name)
            return
        info = jobs[job]
        if info.get('loner') and held.get(info['loner']) == job:
            del held[info['loner']]
        if queue == 'capped':
            running['capped'] += 1
        if queue == 'keyed':
            running[info['key']] += 1
        start = t + 0.003
        # Capped and Fair jobs run longer: their queues back up now and then, so caps bind and keys take turns.
        duration = rng.uniform(0.05, 0.3) if queue == 'capped' else rng.uniform(0.1, 0.3) if queue == 'fair' \
            else rng.uniform(0.01, 0.2)
        killed = rng.random() < 0.003
        attempt = info.get('attempt', 0)
        status[job] = 'started'
        if killed:
            end = start + duration / 2
            h.emit('nemesis', end - 0.001, 'nemesis', action='kill_horse', phase='begin', target=name, workers=[name])
            h.run(name, job, start, end + 0.002, queue=queue, policies=info['policies'], payload=info['payload'],
                  outcome='failed', retry=True, due=round(end + 1.0, 6), end_by='worker',
                  fetched=(t - 0.0005, t + 0.0005), release=end + 0.003 if queue in ('capped', 'keyed') else None,
                  attempt=attempt)
            info['attempt'] = attempt + 1
            at(end + 0.004, 'done', name, job, True)
            at(end + 1.0, 'due', job)
        else:
            end = start + duration
            h.run(name, job, start, end, queue=queue, policies=info['policies'], payload=info['payload'],
                  fetched=(t - 0.0005, t + 0.0005), release=end + 0.001 if queue in ('capped', 'keyed') else None,
                  attempt=attempt)
            at(end + 0.002, 'done', name, job, False)

    def done(t: float, name: str, job: str, again: bool) -> None:
        queue = workers[name]['queue']
        if queue == 'capped':
            running['capped'] -= 1
            wake('capped', t)
        if queue == 'keyed':
            running[jobs[job]['key']] -= 1
            wake('keyed', t)
        status[job] = 'scheduled' if again else 'finished'
        at(t, 'fetch', name)

    at(T0, 'call')
    rate = 40.0  # calls per second
    while len(h) < events and heap:
        t, _, what, args = heapq.heappop(heap)
        clock[0] = t
        if what == 'call':
            call(t)
            at(t + rng.expovariate(rate), 'call')
        elif what == 'fetch':
            fetch(t, *args)
        elif what == 'done':
            done(t, *args)
        elif what == 'due':
            promote(t, args[0])
    # Drain: no more calls; let the workers finish.
    heap = [item for item in heap if item[2] != 'call']
    heapq.heapify(heap)
    while heap:
        t, _, what, args = heapq.heappop(heap)
        clock[0] = t
        if what == 'fetch':
            fetch(t, *args)
        elif what == 'done':
            done(t, *args)
        elif what == 'due':
            promote(t, args[0])
    h.final(clock[0] + 1.0, {job: status.get(job, 'missing') for job in jobs})
    return h
