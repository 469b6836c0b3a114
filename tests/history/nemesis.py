"""The nemeses of a history run: faults scheduled at random (seeded) while the workload runs, each recorded as a
``nemesis`` event at its beginning and at its end (:mod:`tests.history.events`).

On every topology, against the workers (real signals to real processes):

* ``kill_worker``: SIGKILL of the worker's own pid (``kill -9 PID``, an OOM kill of the parent): a forking worker's
  horse and hold guard run on, each in a process group of its own;
* ``kill_group``: SIGKILL of the worker's whole tree, the worker, its hold guard and its horse (a container killed,
  systemd's ``KillMode=control-group``): the running job dies with it;
* ``kill_horse``: SIGKILL of a forking worker's running horse (the job dies; the worker records its end);
* ``stop_worker``, ``stop_group``, ``stop_horse``: SIGSTOP of the same processes, then SIGCONT after 1 to 3 s, or
  after the hold lease plus 1 to 3 s (a freeze long enough for a hold to lapse); the ``end`` event is the SIGCONT.

A kill or stop names the rq workers whose runs it ended or froze (``workers``) and the hold lease (``lease``: seconds
a hold outlives its last refresh, the workers' ``hold_ttl``).

Against the servers, per topology:

* one server: ``restart_aof`` (SIGKILL of the server, started again on its port from its AOF, ``appendfsync
  always``), ``outage`` (20 s with every connection through the fault proxy closed and new ones refused),
  ``lost_reply`` (one of the soak's lost replies armed on the proxy: an admission reply held past the producers'
  timeout, a dropped admission, fetch or script reply, a stall of every connection; ``fired`` says whether it found
  its request within 10 s);
* Sentinel: ``failover_kill`` (SIGKILL of the master, the replica promoted, the old master restarted as its
  replica), ``failover_graceful`` (``SENTINEL FAILOVER``);
* the cluster: ``failover_kill`` (SIGKILL of the primary serving the prefix's slot, its replica promoted, the old
  primary restarted as a replica), ``failover_graceful`` (``CLUSTER FAILOVER`` on its replica), ``migrate_slot``
  (the prefix's slot moved to another primary, key batch by key batch, while clients run).

The servers, the proxy and the clusters are the test harnesses' own (:class:`rq_policies.surfaces.testing.RedisServer`,
:class:`tests.helpers.faultproxy.FaultProxy`, :class:`tests.helpers.sentinel_cluster.SentinelCluster`,
:class:`tests.helpers.cluster.ValkeyCluster`); the nemesis only decides when.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.history.record import Recorder

#: The nemeses against the workers, on every topology.
PROCESS_ACTIONS = ('kill_worker', 'kill_group', 'kill_horse', 'stop_worker', 'stop_group', 'stop_horse')
#: The nemeses against the servers, per topology.
SERVER_ACTIONS = {
    'single': ('restart_aof', 'outage', 'lost_reply'),
    'sentinel': ('failover_kill', 'failover_graceful'),
    'cluster': ('failover_kill', 'failover_graceful', 'migrate_slot'),
}
#: Seconds of the outage through the proxy.
OUTAGE_SECONDS = 20.0
#: Seconds an armed lost reply waits for a request to fire on before it is disarmed.
LOST_REPLY_WAIT = 10.0


def actions(topology: str) -> tuple[str, ...]:
    """Every nemesis of ``topology``."""
    return PROCESS_ACTIONS + SERVER_ACTIONS[topology]


@dataclass
class Worker:
    """One worker process of the run: its rq name (``worker-3``), its process, and how it runs jobs."""

    name: str
    proc: Any
    forking: bool
    index: int = 0
    #: When it was started (``time.monotonic()``).
    born: float = 0.0
    #: The highest job number whose horse file this nemesis has seen (where to look for the current horse).
    seen: int = field(default=0, repr=False)

    def alive(self) -> bool:
        return self.proc.poll() is None


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc, no subprocess)."""
    try:
        return [int(p) for p in Path(f'/proc/{pid}/task/{pid}/children').read_text().split()]
    except OSError:
        return []


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a worker, its hold guard, its horse)."""
    found, todo = [pid], [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Nemesis:
    """Schedules and performs the faults of a run, one at a time, in a thread of the runner.

    Args:
        rec: the nemesis's recorder (``p`` = ``nemesis``).
        topology: the run's topology object (:class:`tests.history.run.Topology`): its ``kind`` and its servers.
        fleet: the runner's workers (:class:`tests.history.run.Fleet`): ``live()`` lists :class:`Worker`.
        folder: the history's folder (a forking worker's current horse is found from its horse's file).
        seed: the schedule's seed.
        lease: the workers' hold TTL (seconds).
        gap: (min, max) seconds between two faults.
    """

    def __init__(self, rec: Recorder, topology: Any, fleet: Any, folder: Path, seed: int, lease: int,
                 gap: tuple[float, float] = (2.0, 6.0)) -> None:
        self.rec, self.topology, self.fleet, self.folder = rec, topology, fleet, Path(folder)
        self.rng = random.Random(seed)
        self.lease, self.gap = lease, gap
        self.fired: dict[str, int] = {}
        self.errors: list[str] = []
        self._stopped: set[int] = set()  # pids SIGSTOPped and not yet continued
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._plan: list[str] = []
        self._only: list[str] = []
        self._count = 0
        self._id: str | None = None  # the fault in progress (``id`` on its begin and its end)

    # -- the schedule ------------------------------------------------------------------------------------------------

    def all_fired(self) -> bool:
        """Has every nemesis of the topology fired at least once?"""
        if self._only == ['none']:
            return True
        return all(self.fired.get(name) for name in self._only or actions(self.topology.kind))

    def none(self) -> None:
        """No fault at all (``--nemeses none``: a run that only shows the workload and the recording)."""

    def only(self, names: list[str]) -> None:
        """Perform only these nemeses (a broken build's run that needs one kind of fault, a focused run)."""
        self._only = list(names)
        self._plan = []

    def next_action(self) -> str:
        """The next fault: every nemesis of the topology once in a random order, then again in another."""
        if not self._plan:
            self._plan = list(self._only or actions(self.topology.kind))
            self.rng.shuffle(self._plan)
        return self._plan.pop()

    def start(self) -> Nemesis:
        self._thread = threading.Thread(target=self._loop, name='nemesis', daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.gap)):
            name = self.next_action()
            self._id = None
            try:
                if getattr(self, name)() is False:  # nothing to do it to now (no horse busy): later in this round
                    self._plan.insert(0, name)
            except Exception as exc:  # a fault that could not be performed: recorded, the run goes on
                self.errors.append(f'{name}: {exc!r}'[:300])
                self.rec.event('nemesis', action=name, phase='end', id=self._id, target=None, error=repr(exc)[:300])

    def stop(self, timeout: float = 120.0) -> None:
        """Let the fault in progress end (an outage runs its 20 s), then heal everything still faulty."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.heal()

    def heal(self) -> None:
        """SIGCONT whatever is still stopped, disarm the proxy: nothing of a fault is left."""
        if self._stopped:
            signal_all(sorted(self._stopped), signal.SIGCONT)
            self._stopped.clear()
        proxy = getattr(self.topology, 'proxy', None)
        if proxy is not None:
            proxy.disarm()

    def _begin(self, action: str, **fields: Any) -> None:
        self.fired[action] = self.fired.get(action, 0) + 1
        self._count += 1
        self._id = f'{action}-{self._count}'
        self.rec.event('nemesis', action=action, phase='begin', id=self._id, **fields)

    def _end(self, action: str, **fields: Any) -> None:
        self.rec.event('nemesis', action=action, phase='end', id=self._id, **fields)

    # -- against the workers -----------------------------------------------------------------------------------------

    def _victim(self, forking: bool = False) -> Worker | None:
        live = [w for w in self.fleet.live() if w.alive() and (w.forking or not forking)]
        return self.rng.choice(live) if live else None

    def horse_of(self, worker: Worker) -> int | None:
        """The pid of the horse running a job for ``worker`` now (from the newest horse file of the worker whose
        ``hello`` pid is a live child of it), or None."""
        n = worker.seen
        while (self.folder / f'horse-{worker.index}-{n + 1}.jsonl').exists():
            n += 1
        worker.seen = n
        if n == 0:
            return None
        path = self.folder / f'horse-{worker.index}-{n}.jsonl'
        try:
            first = path.read_text(encoding='utf-8').split('\n', 1)[0]
            import json

            pid = int(json.loads(first)['pid'])
        except (OSError, ValueError, KeyError):
            return None
        return pid if pid in children(worker.proc.pid) else None

    def _busy_horse(self, wait: float = 5.0) -> tuple[Worker, int] | None:
        """A forking worker and the pid of its horse, running a job now (looked for up to ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not self._stop.is_set():
            live = [w for w in self.fleet.live() if w.alive() and w.forking]
            self.rng.shuffle(live)
            for worker in live:
                pid = self.horse_of(worker)
                if pid is not None:
                    return worker, pid
            time.sleep(0.05)
        return None

    def kill_worker(self) -> None:
        worker = self._victim()
        if worker is None:
            return
        self._begin('kill_worker', target=worker.proc.pid, workers=[worker.name], lease=self.lease)
        signal_all([worker.proc.pid], signal.SIGKILL)
        self._end('kill_worker', target=worker.proc.pid, workers=[worker.name], lease=self.lease)

    def kill_group(self) -> None:
        worker = self._victim()
        if worker is None:
            return
        pids = tree(worker.proc.pid)
        self._begin('kill_group', target=pids, workers=[worker.name], lease=self.lease)
        signal_all(pids, signal.SIGKILL)
        self._end('kill_group', target=pids, workers=[worker.name], lease=self.lease)

    def kill_horse(self) -> bool:
        found = self._busy_horse()
        if found is None:
            return False
        worker, pid = found
        self._begin('kill_horse', target=pid, workers=[worker.name], lease=self.lease)
        signal_all([pid], signal.SIGKILL)
        self._end('kill_horse', target=pid, workers=[worker.name], lease=self.lease)
        return True

    def _freeze(self, action: str, worker: Worker, pids: list[int]) -> None:
        seconds = (self.rng.uniform(1, 3) if self.rng.random() < 0.6
                   else self.lease + self.rng.uniform(1, 3))  # long enough for an unkept hold to lapse
        self._begin(action, target=pids, workers=[worker.name], lease=self.lease, seconds=round(seconds, 2))
        self._stopped.update(pids)
        signal_all(pids, signal.SIGSTOP)
        self._stop.wait(seconds)
        signal_all(pids, signal.SIGCONT)
        self._stopped.difference_update(pids)
        self._end(action, target=pids, workers=[worker.name], lease=self.lease)

    def stop_worker(self) -> None:
        worker = self._victim()
        if worker is not None:
            self._freeze('stop_worker', worker, [worker.proc.pid])

    def stop_group(self) -> None:
        worker = self._victim()
        if worker is not None:
            self._freeze('stop_group', worker, tree(worker.proc.pid))

    def stop_horse(self) -> bool:
        found = self._busy_horse()
        if found is None:
            return False
        self._freeze('stop_horse', found[0], [found[1]])
        return True

    # -- against one server ------------------------------------------------------------------------------------------

    def restart_aof(self) -> None:
        server = self.topology.server
        target = f'127.0.0.1:{server.port}'
        self._begin('restart_aof', target=target)
        server.process.kill()
        server.process.wait()
        server.start()
        self._end('restart_aof', target=target)

    def outage(self) -> None:
        proxy = self.topology.proxy
        self._begin('outage', target=f'proxy:{proxy.port}', seconds=OUTAGE_SECONDS)
        proxy.outage(OUTAGE_SECONDS)
        time.sleep(OUTAGE_SECONDS)  # the whole outage, even when the run is stopping: it heals by itself
        self._end('outage', target=f'proxy:{proxy.port}')

    def lost_reply(self) -> None:
        from tests.helpers.soak import NET_FAULTS

        proxy = self.topology.proxy
        name, arm = self.rng.choice(NET_FAULTS)
        before = len(proxy.fired)
        self._begin('lost_reply', target=name)
        proxy.disarm()
        arm(proxy)
        deadline = time.monotonic() + LOST_REPLY_WAIT
        while len(proxy.fired) == before and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        fired = len(proxy.fired) > before or name == 'stall'  # a stall holds every connection at once
        if name == 'late_admission' or name == 'stall':
            time.sleep(2.0)  # the held bytes reach their clients before the fault is over
        proxy.disarm()
        self._end('lost_reply', target=name, fired=fired)

    # -- against Sentinel and the cluster ---------------------------------------------------------------------------

    def failover_kill(self) -> None:
        if self.topology.kind == 'sentinel':
            group = self.topology.sentinel
            old = group.current_master()
            self._begin('failover_kill', target=f'127.0.0.1:{old.port}')
            old, new = group.kill_master()
            group.restart(old)
        else:
            from rq_policies.engine import keys

            group = self.topology.cluster
            old, _ = group.owner_of(keys.PREFIX)
            self._begin('failover_kill', target=f'127.0.0.1:{old.port}')
            old, new = group.kill_primary(keys.PREFIX)
            group.rejoin(old)
        self._end('failover_kill', target=f'127.0.0.1:{old.port}', promoted=f'127.0.0.1:{new.port}')

    def failover_graceful(self) -> None:
        if self.topology.kind == 'sentinel':
            group = self.topology.sentinel
            old = group.current_master()
            self._begin('failover_graceful', target=f'127.0.0.1:{old.port}')
            old, new = group.fail_over()
        else:
            from rq_policies.engine import keys

            group = self.topology.cluster
            old, _ = group.owner_of(keys.PREFIX)
            self._begin('failover_graceful', target=f'127.0.0.1:{old.port}')
            old, new = group.fail_over(keys.PREFIX)
        self._end('failover_graceful', target=f'127.0.0.1:{old.port}', promoted=f'127.0.0.1:{new.port}')

    def migrate_slot(self) -> None:
        from redis.crc import key_slot

        from rq_policies.engine import keys

        group = self.topology.cluster
        slot = key_slot(keys.PREFIX.encode())
        source, _ = group.owner_of(keys.PREFIX)
        targets = [node for node in group.nodes if node is not source and node.process is not None
                   and node.process.poll() is None and group.role(node.port) == 'master']
        target = self.rng.choice(targets)
        self._begin('migrate_slot', target=f'{slot}:127.0.0.1:{source.port}->127.0.0.1:{target.port}')
        moved = group.migrate_slot(slot, target)
        self._end('migrate_slot', target=f'{slot}:127.0.0.1:{source.port}->127.0.0.1:{target.port}', keys=moved)
