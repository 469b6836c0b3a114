"""A history run: the workload of :mod:`tests.history.jobs` on a real topology under the nemeses of
:mod:`tests.history.nemesis`, recorded as a history (:mod:`tests.history.events`) and read by the checker.

    python -m tests.history.run --topology single|sentinel|cluster [--server valkey|redis] \\
        (--jobs N | --seconds S) --seed K --out DIR [--break release|cap|replay] [--nemeses a,b,...]

What it does, in order:

1. starts the topology's servers on free ports (one server with AOF behind the fault proxy; a master, a replica and
   three sentinels; 3 primaries and 3 replicas with ``RQ_KEY_PREFIX='{rq}'``), Valkey (the bundled binary) or
   Redis 7 (``--server redis``: ``/usr/bin/redis-server``, or ``REDIS_SERVER``);
2. sets the queues' cap and rate (``setting`` events) and starts the workers as users do, ``rq worker -w
   tests.history.jobs.HistoryWorker`` (forking) and ``...HistorySimpleWorker`` (in-process), each named
   ``worker-N``, restarting any that exits (an ``exit`` event each, as a supervisor would);
3. starts the producers (processes: sync ones, and one on the asyncio doors) and, while they run, the nemeses (one
   at a time, seeded: every nemesis of the topology fires at least once) and an operator changing settings at run
   time (cap, rates, a key's limit and rate, Fair weights, Fair pause and resume: ``setting`` events);
4. once the producers are done (``--jobs`` door calls, or ``--seconds``) and every nemesis has fired, heals every
   fault, resumes every paused Fair key, lets the queues drain, stops the workers and writes the ``final`` event
   (where rq shows every job the history names);
5. runs the checker (``python -m tests.history.check DIR --json``), prints a summary (JSON) and exits 1 on a
   violation (2 when the run itself could not be made: a topology that did not start).

``--break`` runs a deliberately broken build that the checker must flag: a copy of the package in a temporary
folder with one change, first on the workers' and producers' ``PYTHONPATH`` (nothing in ``rq_policies/`` changes):
``release`` (the end-of-run release of a claim's holds is dropped: a finished job's cap and key holds linger until
they expire), ``cap`` (QueueSlot's cap check removed from the fetch's Lua) or ``replay`` (the admission scripts'
replay check removed: a resent admission writes and pushes its job again).

Records are written outside the server under test (local files, one per process, in ``DIR``); the servers' and
workers' logs go to ``DIR/logs``. Every process the run starts is ended by it, by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.history import record
from tests.history.nemesis import Nemesis, Worker, actions

#: Where the repository's root is (workers and producers import ``tests.history`` from it).
ROOT = Path(__file__).resolve().parents[2]

#: The key prefix a cluster run uses (hash-tagged: every key of rq's and ours in one slot).
CLUSTER_PREFIX = '{rq}'

#: Debian's Redis 7, for ``--server redis`` (``REDIS_SERVER`` wins when set).
REDIS_7 = '/usr/bin/redis-server'

#: How the run's workers are made: forking and in-process, alternately.
WORKER_CLASSES = ('tests.history.jobs.HistoryWorker', 'tests.history.jobs.HistorySimpleWorker')

#: The broken builds ``--break`` makes: (file of the package copy, text to find, its replacement).
BREAKS = {
    'release': [('rq_policies/engine/fetch.py',
                 '    connection = compat.adopt_cluster(connection)\n    for hold in claim.holds:',
                 '    return  # BROKEN BUILD: the release is dropped\n'
                 '    connection = compat.adopt_cluster(connection)\n    for hold in claim.holds:')],
    'cap': [('rq_policies/lua/policies/queue_slot.lua',
             'if count >= cap and ledger_live(ledger, ctx.now) >= cap then',
             'if false then  -- BROKEN BUILD: the cap check is removed')],
    'replay': [('rq_policies/lua/admit.lua',
                "  if prior == a.created or (not prior and a.k.record and rcall('GET', KEYS[a.k.record]) == a.created) "
                'then',
                '  if false then  -- BROKEN BUILD: a replay writes again'),
               ('rq_policies/lua/admit_narrow.lua',
                "  if prior == created or (not prior and record and rcall('GET', record) == created) then",
                '  if false then  -- BROKEN BUILD: a replay writes again')],
}


def broken_build(name: str, into: Path) -> Path:
    """A copy of the package (its Lua included, where the installed package keeps it) in ``into`` with the one
    change ``BREAKS[name]``; returns the folder to put first on ``PYTHONPATH``."""
    import rq_policies
    from rq_policies.engine import scripts

    package = into / 'rq_policies'
    shutil.copytree(Path(rq_policies.__file__).parent, package, ignore=shutil.ignore_patterns('__pycache__'))
    lua = Path(str(scripts._lua_root()))
    if (package / 'lua').exists():
        shutil.rmtree(package / 'lua')
    shutil.copytree(lua, package / 'lua', ignore=shutil.ignore_patterns('__pycache__'))
    for path, find, replace in BREAKS[name]:
        target = into / path
        text = target.read_text()
        if text.count(find) != 1:
            raise RuntimeError(f'--break {name}: {path} no longer holds the line to change ({find!r})')
        target.write_text(text.replace(find, replace))
    return into


# -- topologies ----------------------------------------------------------------------------------------------------

class Topology:
    """The servers of a run and how each kind of process reaches them."""

    kind = ''
    proxy = None

    def start(self, logs: Path) -> Topology:
        raise NotImplementedError

    def admin(self) -> Any:
        """The runner's own client (straight to the servers, never through the proxy)."""
        raise NotImplementedError

    def clock(self) -> list[tuple[str, int]]:
        """Where a recorder reads ``TIME``."""
        raise NotImplementedError

    def worker_args(self) -> list[str]:
        """``rq worker``'s connection options."""
        raise NotImplementedError

    def producer_spec(self) -> str:
        """``--connect`` of :mod:`tests.history.producers`."""
        raise NotImplementedError

    def heal(self) -> None:
        """Every server up again (a fault left none down, but a nemesis that failed half-way may have)."""

    def close(self) -> None:
        raise NotImplementedError


class Single(Topology):
    """One server, AOF on (``appendfsync always``), reached by workers and producers through the fault proxy."""

    kind = 'single'

    def start(self, logs: Path) -> Single:
        from rq_policies.surfaces.testing import RedisServer
        from tests.helpers.faultproxy import FaultProxy

        self.server = RedisServer(appendonly=True, extra_args=['--appendfsync', 'always']).start()
        self.proxy = FaultProxy('127.0.0.1', self.server.port, lifetime=7 * 24 * 3600, record=False).start()
        return self

    def admin(self) -> Any:
        from redis import Redis

        return Redis.from_url(self.server.url, socket_timeout=5)

    def clock(self) -> list[tuple[str, int]]:
        return [('127.0.0.1', self.server.port)]

    def worker_args(self) -> list[str]:
        return ['--url', self.proxy.url, '--connection-class', 'tests.helpers.faultproxy.RetryingRedis']

    def producer_spec(self) -> str:
        return f'single:{self.proxy.url}'

    def heal(self) -> None:
        self.proxy.disarm()
        if self.server.process is None or self.server.process.poll() is not None:
            self.server.start()

    def close(self) -> None:
        self.proxy.close()
        self.server.close()


class SentinelGroup(Topology):
    """A master, a replica and three sentinels; every client finds the master through the sentinels."""

    kind = 'sentinel'

    def start(self, logs: Path) -> SentinelGroup:
        from tests.helpers.sentinel_cluster import SentinelCluster

        # AOF on, as the one server's: a SIGKILLed server comes back with its data, not its last full sync's RDB
        self.sentinel = SentinelCluster(appendonly=True).start()
        self.logs = logs
        self.settings = logs / 'history_sentinel_settings.py'
        self.settings.write_text(f'SENTINEL = {{"INSTANCES": {self.sentinel.instances!r}, "MASTER_NAME": '
                                 f'"{self.sentinel.master_name}", "SOCKET_TIMEOUT": 2}}\n')
        return self

    def admin(self) -> Any:
        return self.sentinel.sentinel().master_for(self.sentinel.master_name, socket_timeout=5)

    def clock(self) -> list[tuple[str, int]]:
        return [('127.0.0.1', self.sentinel.master.port), ('127.0.0.1', self.sentinel.replica.port)]

    def worker_args(self) -> list[str]:
        return ['-c', 'history_sentinel_settings']

    def producer_spec(self) -> str:
        addresses = ','.join(f'{host}:{port}' for host, port in self.sentinel.instances)
        return f'sentinel:{addresses}/{self.sentinel.master_name}'

    def heal(self) -> None:
        for server in (self.sentinel.master, self.sentinel.replica):
            if server.process is None or server.process.poll() is not None:
                self.sentinel.restart(server)

    def close(self) -> None:
        for server in (self.sentinel.master, self.sentinel.replica, *self.sentinel.sentinels):
            for log in server.dir.glob('*.log'):  # the servers' own words on each failover, kept with the history
                shutil.copy(log, self.logs / f'server-{server.port}-{log.name}')
        self.sentinel.close()


class Cluster(Topology):
    """3 primaries and 3 replicas (``RQ_KEY_PREFIX='{rq}'``); rq's own ``--connection-class`` for the workers."""

    kind = 'cluster'

    def start(self, logs: Path) -> Cluster:
        from tests.helpers.cluster import ValkeyCluster

        self.cluster = ValkeyCluster(primaries=3, replicas=1).start()
        return self

    def _live_url(self) -> str:
        node = next(n for n in self.cluster.nodes if n.process is not None and n.process.poll() is None)
        return f'redis://127.0.0.1:{node.port}/0'

    def admin(self) -> Any:
        return self.cluster.client()

    def clock(self) -> list[tuple[str, int]]:
        return [('127.0.0.1', port) for port in self.cluster.ports]

    def worker_args(self) -> list[str]:
        return ['--url', self._live_url(), '--connection-class', 'redis.cluster.RedisCluster']

    def producer_spec(self) -> str:
        return f'cluster:{self._live_url()}'

    def heal(self) -> None:
        for node in self.cluster.nodes:
            if node.process is None or node.process.poll() is not None:
                self.cluster.rejoin(node)

    def close(self) -> None:
        self.cluster.close()


TOPOLOGIES = {'single': Single, 'sentinel': SentinelGroup, 'cluster': Cluster}


def retry(call: Any, what: str, seconds: float = 60.0) -> Any:
    """``call()`` until it succeeds (a restart, an outage or a failover in progress), for at most ``seconds``. Only
    the server's errors are waited out: any other is the caller's bug, raised at once."""
    from redis.exceptions import RedisError

    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except (RedisError, OSError):
            if time.monotonic() > deadline:
                raise RuntimeError(f'{what}: the servers did not answer within {seconds} s') from None
            time.sleep(0.2)


# -- the workers -----------------------------------------------------------------------------------------------------

class Fleet:
    """The run's workers: started as ``rq worker`` subprocesses, each in a session of its own, and replaced when
    one exits (an ``exit`` event, with its code: -9 for a SIGKILL)."""

    def __init__(self, rec: record.Recorder, topology: Topology, env: dict, logs: Path, forking: int,
                 simple: int) -> None:
        from tests.history import jobs

        self.rec, self.topology, self.env, self.logs = rec, topology, env, logs
        self.queues = list(jobs.QUEUES)
        self.counts = (forking, simple)
        self.workers: list[Worker] = []
        self.exits: list[dict] = []
        self.started = 0
        self._lock = threading.Lock()
        self._respawn: list[tuple[float, bool]] = []  # (when, forking) of replacements to start
        self.stopping = False

    def spawn(self, forking: bool) -> Worker:
        self.started += 1
        name = f'worker-{self.started}'
        # rq cleans its registries (a SIGKILLed worker's started jobs are failed as abandoned once their heartbeat
        # expires) in maintenance, every 10 minutes by default: every 5 s here, as the soak does, so a run's final
        # look finds a killed run's job where rq's recovery puts it.
        # Each worker serves the queues in an order of its own (rotated by its number): with one order for all, the
        # last queue starves whenever the others have a backlog (after an outage), and its due jobs wait on that.
        turn = self.started % len(self.queues)
        queues = self.queues[turn:] + self.queues[:turn]
        args = [sys.executable, '-m', 'rq.cli', 'worker', '-w', WORKER_CLASSES[0 if forking else 1], '--name', name,
                '--logging_level', 'WARNING', '--maintenance-interval', str(MAINTENANCE_SECONDS),
                *self.topology.worker_args(), *queues]
        with open(self.logs / f'{name}.log', 'ab') as log:
            proc = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=str(self.logs))
        worker = Worker(name, proc, forking, index=self.started)
        worker.born = time.monotonic()
        with self._lock:
            self.workers.append(worker)
        return worker

    def start(self) -> None:
        kinds = [True] * self.counts[0]
        for i in range(self.counts[1]):  # forking and in-process in turn
            kinds.insert(min(2 * i + 1, len(kinds)), False)
        for forking in kinds:
            self.spawn(forking)

    def live(self) -> list[Worker]:
        with self._lock:
            return list(self.workers)

    def supervise(self) -> None:
        """Record the workers that exited and start a replacement of each (of the same kind), as a supervisor
        would: after a second, or after 3 s when the one it replaces lived less than 5 s (it could not connect:
        an outage, a failover), so a worker that cannot start is not restarted in a tight loop."""
        now = time.monotonic()
        for worker in self.live():
            code = worker.proc.poll()
            if code is None:
                continue
            with self._lock:
                self.workers.remove(worker)
            self.rec.event('exit', worker=worker.name, pid=worker.proc.pid, code=code, asked=self.stopping)
            self.exits.append({'worker': worker.name, 'code': code, 'asked': self.stopping})
            if not self.stopping:
                self._respawn.append((now + (3.0 if now - worker.born < 5 else 1.0), worker.forking))
        for item in [item for item in self._respawn if item[0] <= now]:
            self._respawn.remove(item)
            if not self.stopping:
                self.spawn(item[1])

    def stop(self, timeout: float = 60.0) -> None:
        """A warm shutdown of every worker (SIGTERM; SIGKILL of its tree past ``timeout``)."""
        from tests.history.nemesis import signal_all, tree

        self.stopping = True
        for worker in self.live():
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.send_signal(signal.SIGCONT)
                    worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for worker in self.live():
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_all(tree(worker.proc.pid), signal.SIGKILL)
                worker.proc.wait()
        self.supervise()


# -- the operator: settings changed at run time ---------------------------------------------------------------------

class Operator:
    """Changes the policies' settings while the run goes on, as an operator would, recording each as a ``setting``
    event stamped once the server acknowledged it, with ``t0`` the stamp just before its first attempt (the change
    took effect in between); a call that fails (the server away) is sent again until acknowledged."""

    def __init__(self, rec: record.Recorder, topology: Topology, rng: random.Random) -> None:
        self.rec, self.topology, self.rng = rec, topology, rng
        self.conn = topology.admin()
        self.paused: dict[str, float] = {}  # tenant -> when to resume
        self.changed: dict[str, Any] = {}
        self.changes = 0

    def _call(self, what: str, fn: Any) -> Any:
        def attempt() -> Any:
            try:
                return fn(self.conn)
            except Exception:
                with contextlib.suppress(Exception):
                    self.conn.close()
                self.conn = self.topology.admin()
                raise

        return retry(attempt, what, seconds=120)

    def setting(self, what: str, loosens: bool, fn: Any, **fields: Any) -> None:
        """Make one change (``loosens``: whether it loosens a limit, for the reader; both kinds are stamped the
        same way) and record it."""
        t0 = round(self.rec.now(), 6)
        self._call(what, fn)
        self.rec.event('setting', what=what, t0=t0, **fields)
        self.changes += 1

    def initial(self) -> None:
        """The run's starting settings: the cap and the queue's rate."""
        from rq_policies import QueueRate, QueueSlot
        from tests.history import jobs

        self.setting('cap', False, lambda c: QueueSlot.set(jobs.CAPPED, jobs.CAP, connection=c),
                     queue=jobs.CAPPED, value=jobs.CAP)
        self.setting('rate', False, lambda c: QueueRate.set(jobs.RATED, *jobs.QUEUE_RATE, connection=c),
                     queue=jobs.RATED, value=list(jobs.QUEUE_RATE))

    def tick(self) -> None:
        """One change at random, and the resumes that are due."""
        from rq_policies import Concurrency, Fair, QueueRate, QueueSlot, Rate
        from tests.history import jobs

        now = time.time()
        for tenant, at in list(self.paused.items()):
            if now >= at:
                self.resume(tenant)
        choice = self.rng.choice(('cap', 'rate', 'key_limit', 'key_rate', 'fair_weight', 'fair_pause'))
        flip = not self.changed.get(choice)
        if choice == 'cap':
            cap = jobs.CAP + 1 if flip else jobs.CAP
            self.setting('cap', flip, lambda c: QueueSlot.set(jobs.CAPPED, cap, connection=c),
                         queue=jobs.CAPPED, value=cap)
        elif choice == 'rate':
            rate = (jobs.QUEUE_RATE[0] // 2, 1, 1) if flip else jobs.QUEUE_RATE
            self.setting('rate', not flip, lambda c: QueueRate.set(jobs.RATED, *rate, connection=c),
                         queue=jobs.RATED, value=list(rate))
        elif choice == 'key_limit':
            if flip:
                self.setting('key_limit', True, lambda c: Concurrency.set(jobs.KEY_SCOPE, 'ck0', 2, connection=c),
                             scope=jobs.KEY_SCOPE, key='ck0', value=2)
            else:
                self.setting('key_limit', False, lambda c: Concurrency.clear(jobs.KEY_SCOPE, 'ck0', connection=c),
                             scope=jobs.KEY_SCOPE, key='ck0', value=jobs.KEY_LIMIT, cleared=True)
        elif choice == 'key_rate':
            if flip:
                self.setting('key_rate', False, lambda c: Rate.set(jobs.RATE_SCOPE, 'rk0', 1, 1, 1, connection=c),
                             scope=jobs.RATE_SCOPE, key='rk0', value=[1, 1, 1])
            else:
                self.setting('key_rate', True, lambda c: Rate.clear(jobs.RATE_SCOPE, 'rk0', connection=c),
                             scope=jobs.RATE_SCOPE, key='rk0', value=list(jobs.KEY_RATE), cleared=True)
        elif choice == 'fair_weight':
            weight = 3 if flip else jobs.TENANTS['t0']
            if flip:
                fn = lambda c: Fair.set(jobs.FAIR_SCOPE, 't0', weight, connection=c)  # noqa: E731
            else:
                fn = lambda c: Fair.clear(jobs.FAIR_SCOPE, 't0', connection=c)  # noqa: E731
            self.setting('fair_weight', False, fn, scope=jobs.FAIR_SCOPE, key='t0', value=weight)
        elif choice == 'fair_pause':
            tenant = self.rng.choice([t for t in jobs.TENANTS if t not in self.paused] or list(jobs.TENANTS))
            if tenant not in self.paused:
                self.setting('fair_pause', False, lambda c: Fair.pause(jobs.FAIR_SCOPE, tenant, connection=c),
                             scope=jobs.FAIR_SCOPE, key=tenant, value=None)
                self.paused[tenant] = now + self.rng.uniform(2, 6)
            return
        self.changed[choice] = flip

    def resume(self, tenant: str) -> None:
        from rq_policies import Fair
        from tests.history import jobs

        self.setting('fair_resume', True, lambda c: Fair.resume(jobs.FAIR_SCOPE, tenant, connection=c),
                     scope=jobs.FAIR_SCOPE, key=tenant, value=None)
        self.paused.pop(tenant, None)

    def resume_all(self) -> None:
        for tenant in list(self.paused):
            self.resume(tenant)


# -- the drain and the final look -------------------------------------------------------------------------------------

#: Seconds between two maintenance runs of the run's workers (rq's ``--maintenance-interval``, 600 by default): rq
#: cleans its registries there, a killed run's job failed as abandoned among them.
MAINTENANCE_SECONDS = 5


class Runs:
    """Which runs the history shows ended: the last ``start`` of each job (read once, at the drain's start) and, for a
    job asked about, whether that run's process recorded its ``end`` since (its own file read again, small)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.last: dict[str, tuple[str, str]] = {}  # job id -> (process, run) of its last start
        for event in read_history(folder):
            if event['e'] == 'start':
                self.last[event['job']] = (event['p'], event['run'])

    def running(self, job_id: str) -> bool | None:
        """Does the history show ``job_id``'s last run started and not ended? None when no run of it started."""
        found = self.last.get(job_id)
        if found is None:
            return None
        process, run = found
        try:
            text = (self.folder / f'{process}.jsonl').read_text(encoding='utf-8')
        except OSError:
            return None
        ended = False
        for line in text.splitlines():
            if f'"{run}"' in line:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event['e'] == 'end' and event.get('run') == run:
                    ended = True
        return not ended


def backlog(conn: Any, live: set[str] | None = None, runs: Runs | None = None) -> dict[str, int]:
    """What still waits to run or to be settled, per queue: its list, its intermediate list (ids taken and not started
    yet, handed back by the PolicyWorkers), its scheduled registry, its deferred registry (Fair's lines and parked
    per-key jobs), and its started registry's jobs still started on a worker of ``live``
    (None: on any worker) whose run the history (``runs``) does not show ended (a job whose end of run rq could not
    record, the writes lost in a failover, stays started though nothing runs it). A job left started by a worker
    that died is not waited for either: rq fails it as abandoned
    only once its execution's heartbeat expired (the job's timeout plus 60 s for an in-process worker, 180 s by
    default; 60 s and more for a forking one) and a maintenance runs, which a worker that died in maintenance holds
    off up to 15 minutes; the final look shows it started."""
    from rq.job import Job
    from rq.registry import DeferredJobRegistry, ScheduledJobRegistry, StartedJobRegistry

    from rq_policies import PolicyQueue
    from tests.history import jobs

    left = {}
    for name in jobs.QUEUES:
        q = PolicyQueue(name, connection=conn)
        # Each entry's score is when its heartbeat expires (rq 3 names an execution, '<job id>:<execution id>').
        entries = conn.zrange(StartedJobRegistry(queue=q).key, 0, -1)
        started = sorted({(m.decode() if isinstance(m, bytes) else m).split(':', 1)[0] for m in entries})
        if started:  # rq leaves an entry of a job that ended behind when its worker died before removing it
            with conn.pipeline(transaction=False) as pipe:
                for job_id in started:
                    pipe.hmget(Job.key_for(job_id), 'status', 'worker_name')
                found = pipe.execute()
            started = [job_id for job_id, (status, worker) in zip(started, found) if status in (b'started', 'started')
                       and (live is None or (worker.decode() if isinstance(worker, bytes) else worker) in live)
                       and (runs is None or runs.running(job_id) is not False)]
        # An id on the intermediate list: taken by a fetch whose worker died, or could not record the start, before
        # it started the job; a PolicyWorker hands it back within hold_ttl, or once the execution its taker wrote
        # expired (rq's heartbeat ttl: the monitoring interval plus 60 s) when it died after writing it.
        intermediate = conn.llen(q.intermediate_queue_key)
        for where, count in (('queued', q.count), ('scheduled', ScheduledJobRegistry(queue=q).count),
                             ('deferred', DeferredJobRegistry(queue=q).count), ('started', len(started)),
                             ('intermediate', intermediate)):
            if count:
                left[f'{name}:{where}'] = count
    return left


def stuck(conn: Any) -> dict[str, Any]:
    """What a drain that did not finish found: each worker's state and job, each queue's first jobs."""
    from rq import Worker
    from rq.job import Job
    from rq.registry import StartedJobRegistry

    from rq_policies import PolicyQueue
    from tests.history import jobs

    found: dict[str, Any] = {'workers': {}, 'heads': {}, 'started': {}}
    for worker in Worker.all(connection=conn):
        found['workers'][worker.name] = [worker.get_state(), worker.get_current_job_id()]
    now = time.time()
    for name in jobs.QUEUES:
        for member, score in conn.zrange(StartedJobRegistry(queue=PolicyQueue(name, connection=conn)).key, 0, -1,
                                         withscores=True):
            job_id = (member.decode() if isinstance(member, bytes) else member).split(':', 1)[0]
            fields = conn.hmget(Job.key_for(job_id), 'status', 'worker_name')
            found['started'][job_id] = [round(score - now, 1), *[(v.decode() if v else None) for v in fields]]
    for name in jobs.QUEUES:
        heads = []
        for job_id in PolicyQueue(name, connection=conn).get_job_ids(0, 4):
            fields = conn.hmget(Job.key_for(job_id), 'status', 'description')
            heads.append([job_id, *[(v.decode()[:80] if v else None) for v in fields]])
        if heads:
            found['heads'][name] = heads
    return found


#: Seconds a backlog of parked jobs alone may stay unchanged before the drain stops waiting for it.
STALL_SECONDS = 20.0

#: Seconds ids on an intermediate list may stay unchanged before the drain stops waiting for them: a taker that died
#: after writing the job's execution leaves it until the execution expires (rq 3 scores it its heartbeat ttl, the
#: monitoring interval plus 60 s, plus 60 s more: 150 s by default, docs/reliability.md), then a PolicyWorker hands
#: it back within its hand-back period (up to 10 s).
INTERMEDIATE_SECONDS = 175.0


def drain(topology: Topology, fleet: Fleet, timeout: float, folder: Path) -> tuple[bool, float, dict]:
    """Wait until nothing is left to run (for 3 s in a row), restarting workers that exit meanwhile; or until only
    parked jobs are left and nothing changed for ``STALL_SECONDS`` (after a failover, a per-key job parked in the
    lost window, its due-index entry lost with it, waits for its key's next job or release: docs/guarantees.md);
    returns (drained, seconds, what was left)."""
    started = time.monotonic()
    quiet_since = None
    same_since, last = None, None
    conn = topology.admin()
    left: dict = {}
    runs = Runs(folder)
    try:
        while True:
            fleet.supervise()
            try:
                left = backlog(conn, {worker.name for worker in fleet.live() if worker.alive()}, runs)
            except Exception:
                conn = topology.admin()
                left = {'unreachable': 1}
            if not any(left.values()):
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= 3:
                    return True, time.monotonic() - started, left
            else:
                quiet_since = None
            if left and left == last and all(name.endswith((':deferred', ':intermediate')) for name in left):
                same_since = same_since or time.monotonic()
                # An intermediate id waits for its taker's execution to expire (about 70 s) before it is handed
                # back; after a failover one whose take was lost stays for rq's cleanup (docs/guarantees.md).
                patience = STALL_SECONDS if all(name.endswith(':deferred') for name in left) else INTERMEDIATE_SECONDS
                if time.monotonic() - same_since >= patience:
                    return False, time.monotonic() - started, left
            else:
                same_since, last = None, dict(left)
            if time.monotonic() - started > timeout:
                return False, time.monotonic() - started, left
            time.sleep(0.5)
    finally:
        with contextlib.suppress(Exception):
            conn.close()


def read_history(folder: Path) -> list[dict]:
    """Every event of the history's files (a torn last line skipped)."""
    events = []
    for path in sorted(folder.glob('*.jsonl')):
        with open(path, encoding='utf-8') as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    return events


def named_jobs(events: list[dict]) -> set[str]:
    """Every job id an ``ok``, ``info`` (its ``invoke``'s job) or ``start`` event names."""
    invoked = {e['op']: e['job'] for e in events if e['e'] == 'invoke'}
    found: set[str] = set()
    for e in events:
        if e['e'] == 'ok' and e.get('job'):
            found.add(e['job'])
        elif e['e'] == 'info' and invoked.get(e['op']):
            found.add(invoked[e['op']])
        elif e['e'] == 'start':
            found.add(e['job'])
    return found


def where(conn: Any, job_ids: set[str]) -> dict[str, str]:
    """Where rq shows each job: its hash's status, refined: ``intermediate`` (queued, but on a queue's
    intermediate list: taken by a fetch and not started), ``waiting`` (deferred in a Fair line), ``parked``
    (deferred on a per-key policy's parked list), ``missing`` (no hash)."""
    from rq.job import Job

    from rq_policies import Concurrency, PolicyQueue, Rate
    from rq_policies.engine import keys
    from tests.history import jobs

    ids = sorted(job_ids)
    statuses: dict[str, str | None] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        with conn.pipeline(transaction=False) as pipe:
            for job_id in chunk:
                pipe.hget(Job.key_for(job_id), 'status')
            for job_id, status in zip(chunk, pipe.execute()):
                statuses[job_id] = status.decode() if isinstance(status, bytes) else status
    taken: set[str] = set()
    for name in jobs.QUEUES:
        taken |= {x.decode() for x in conn.lrange(PolicyQueue(name, connection=conn).intermediate_queue_key, 0, -1)}
    waiting: set[str] = set()
    for tenant in jobs.TENANTS:
        line = keys.FAIR_WAIT(jobs.FAIR, f'{jobs.FAIR_SCOPE}:{tenant}')
        waiting |= {x.decode() for x in conn.zrange(line, 0, -1)}
    parked = {j for key in ('ck0', 'ck1', 'ck2') for j in Concurrency.parked(jobs.KEY_SCOPE, key, connection=conn)}
    parked |= {j for key in ('rk0', 'rk1') for j in Rate.parked(jobs.RATE_SCOPE, key, connection=conn)}
    found = {}
    for job_id, status in statuses.items():
        if status is None:
            found[job_id] = 'missing'
        elif status == 'queued' and job_id in taken:
            found[job_id] = 'intermediate'
        elif status == 'deferred' and job_id in waiting:
            found[job_id] = 'waiting'
        elif status == 'deferred' and job_id in parked:
            found[job_id] = 'parked'
        else:
            found[job_id] = status
    return found


def failed_unrun(conn: Any, events: list[dict], placed: dict[str, str]) -> dict[str, str]:
    """The jobs rq shows failed that no run of the history started, with the last line of the error rq recorded
    (a diagnosis for the report: a job taken by a worker that was killed before it could start it is failed by
    rq's cleanup of the intermediate list)."""
    from rq.job import Job

    started = {e['job'] for e in events if e['e'] == 'start'}
    found = {}
    for job_id in sorted(j for j, status in placed.items() if status == 'failed' and j not in started):
        raw = conn.hget(Job.key_for(job_id), 'exc_info')
        text = ''
        if raw:
            try:
                import zlib

                text = zlib.decompress(raw).decode(errors='replace')
            except Exception:
                text = raw.decode(errors='replace') if isinstance(raw, bytes) else str(raw)
        lines = [line for line in text.strip().splitlines() if line.strip()]
        found[job_id] = lines[-1][:300] if lines else ''
    return found


# -- the checker ------------------------------------------------------------------------------------------------------

def run_checker(folder: Path) -> dict:
    """The checker's report (``python -m tests.history.check DIR --json``): ``{'available': False}`` until it
    exists; else its JSON and its exit code (``exit``: 0 clean, 1 a violation)."""
    import importlib.util

    if importlib.util.find_spec('tests.history.check') is None:
        return {'available': False}
    proc = subprocess.run([sys.executable, '-m', 'tests.history.check', str(folder), '--json'], capture_output=True,
                          text=True, cwd=str(ROOT), env=with_root(dict(os.environ)))
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {'output': proc.stdout[-4000:], 'stderr': proc.stderr[-4000:]}
    return {'available': True, 'exit': proc.returncode, 'report': report}


def with_root(env: dict, *first: Any) -> dict:
    from tests.helpers import with_root as helper

    return helper(env, *first)


# -- the run -----------------------------------------------------------------------------------------------------------

def run(topology_name: str, out: Path, seed: int = 1, jobs_total: int | None = None, seconds: float | None = None,
        server: str = 'valkey', broken: str | None = None, nemeses: list[str] | None = None, producers: int = 3,
        rate: float = 12.0, forking: int = 2, simple: int = 2, drain_timeout: float = 120.0,
        gap: tuple[float, float] = (2.0, 6.0), only: list[str] | None = None) -> dict:
    """One run (see the module docstring); returns the summary."""
    from tests.history import jobs

    out.mkdir(parents=True, exist_ok=True)
    logs = out / 'logs'
    logs.mkdir(exist_ok=True)
    rng = random.Random(seed)
    topology: Topology = TOPOLOGIES[topology_name]()
    work = Path(tempfile.mkdtemp(prefix='history-run-'))
    procs: list[subprocess.Popen] = []
    fleet: Fleet | None = None
    nemesis: Nemesis | None = None
    summary: dict[str, Any] = {'topology': topology_name, 'server': server, 'seed': seed, 'break': broken}
    try:
        topology.start(logs)
        clock = ','.join(f'{h}:{p}' for h, p in topology.clock())
        env = dict(os.environ, **{record.DIR_ENV: str(out), record.CLOCK_ENV: clock,
                                  record.TOPOLOGY_ENV: topology_name, 'RQ_POLICIES_HOLD_TTL': str(jobs.HOLD_TTL)})
        first = [logs]  # the Sentinel settings module
        if broken:
            first.insert(0, broken_build(broken, work))
        env = with_root(env, *first)
        os.environ.update({record.DIR_ENV: str(out), record.CLOCK_ENV: clock, record.TOPOLOGY_ENV: topology_name})
        rec = record.from_env('runner', 'runner', servers=clock, server=server_version(topology), seed=seed,
                              broken=broken)
        nem_rec = record.Recorder(out, 'nemesis', 'nemesis', clock=rec.clock, topology=topology_name)
        operator = Operator(rec, topology, random.Random(seed + 1))
        operator.initial()
        fleet = Fleet(rec, topology, env, logs, forking, simple)
        fleet.start()
        conn = topology.admin()
        deadline = time.monotonic() + 60
        while retry(lambda: conn.scard(f'{jobs_prefix()}:workers'), 'workers') < forking + simple:
            fleet.supervise()
            if time.monotonic() > deadline:
                raise RuntimeError('the workers did not start: ' + (logs / 'worker-1.log').read_text()[-2000:])
            time.sleep(0.2)
        began = time.monotonic()
        stop_file = logs / 'producers.stop'
        for i in range(1, producers + 1):
            args = [sys.executable, '-m', 'tests.history.producers', '--index', str(i), '--connect',
                    topology.producer_spec(), '--seed', str(seed * 100 + i), '--until', str(time.time() + 7 * 86400),
                    '--rate', str(rate), '--stop-file', str(stop_file)]
            if only:
                args += ['--only', ','.join(only)]
            if i == producers:
                args.append('--asyncio')
            with open(logs / f'producer-{i}.log', 'ab') as log:
                # Not from the repository's root: ``python -m`` puts the working folder first on sys.path, ahead of
                # PYTHONPATH, where a broken build must come first (the root is on PYTHONPATH after it).
                procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, cwd=str(logs)))
        nemesis = Nemesis(nem_rec, topology, fleet, out, seed, jobs.HOLD_TTL, gap=gap)
        if nemeses == ['none']:
            nemeses = []
            nemesis.only(['none'])
        elif nemeses:
            unknown = set(nemeses) - set(actions(topology_name))
            if unknown:
                raise ValueError(f'--nemeses: {sorted(unknown)} are not nemeses of {topology_name}: '
                                 f'{actions(topology_name)}')
            nemesis.only(nemeses)
        nemesis.start()
        next_tick = time.monotonic() + rng.uniform(3, 8)
        calls = Calls(out)
        enough_at = None
        while True:
            fleet.supervise()
            if time.monotonic() >= next_tick:
                operator.tick()
                next_tick = time.monotonic() + rng.uniform(3, 8)
            enough = (calls.count() >= jobs_total if jobs_total is not None
                      else time.monotonic() - began >= seconds)
            if enough:
                # The size asked for is reached; the producers go on until every nemesis has fired (a horse is only
                # killed while it runs a job), for at most MAX_OVERTIME more seconds.
                enough_at = enough_at or time.monotonic()
                if nemesis.all_fired() or time.monotonic() - enough_at > MAX_OVERTIME:
                    break
            if not any(p.poll() is None for p in procs):
                break  # the producers died: nothing more to run
            time.sleep(0.2)
        stop_file.touch()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        nemesis.stop()
        topology.heal()
        operator.resume_all()
        drained, drain_seconds, left = drain(topology, fleet, drain_timeout, out)
        if not drained:
            with contextlib.suppress(Exception):
                summary['stuck'] = stuck(topology.admin())
        fleet.stop()
        final_conn = topology.admin()
        events = read_history(out)
        placed = retry(lambda: where(final_conn, named_jobs(events)), 'the final look')
        rec.event('final', jobs=placed, drained=drained)
        unrun = retry(lambda: failed_unrun(final_conn, events, placed), 'the failed jobs')
        (logs / 'failed_unrun.json').write_text(json.dumps(unrun, indent=1))
        lapses = retry(lambda: {k.decode(): int(v) for k, v in final_conn.hgetall(lapses_key()).items()}, 'lapses')
        events = read_history(out)
        summary['server_version'] = server_version(topology)
        summary.update(figures(events))
        summary.update({
            'drained': drained, 'drain_seconds': round(drain_seconds, 1), 'left': left,
            'nemeses': dict(nemesis.fired), 'nemesis_errors': nemesis.errors,
            'every_nemesis_fired': nemesis.all_fired(),
            'settings_changed': operator.changes, 'workers_started': fleet.started,
            'worker_exits': summarize_exits(fleet.exits), 'lapses_counted_by_the_server': lapses,
            'producer_exit_codes': [p.returncode for p in procs],
            'failed_without_a_start': len(unrun),
        })
        (logs / 'summary.json').write_text(json.dumps(summary, indent=1, default=str))  # before the checker's verdict
        summary['checker'] = run_checker(out)
        return summary
    finally:
        if nemesis is not None:
            nemesis.stop(timeout=30)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if fleet is not None:
            fleet.stop(timeout=20)
        with contextlib.suppress(Exception):
            topology.close()
        shutil.rmtree(work, ignore_errors=True)


#: Seconds the producers may run past the size asked for, waiting for the nemeses that have not fired yet.
MAX_OVERTIME = 120.0


class Calls:
    """How many door calls the producers have made so far, counted from their history files as they grow."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.total = 0

    def count(self) -> int:
        for path in self.folder.glob('producer-*.jsonl'):
            at = self.offsets.get(path, 0)
            with open(path, 'rb') as f:
                f.seek(at)
                chunk = f.read()
            end = chunk.rfind(b'\n') + 1  # whole lines only
            self.total += chunk[:end].count(b'"e":"invoke"')
            self.offsets[path] = at + end
        return self.total


def server_version(topology: Topology) -> str | None:
    """The servers' product and version (``valkey 9.0.0``, ``redis 7.0.15``), from ``INFO server``."""
    try:
        conn = topology.admin()
        info = conn.info('server')
        if isinstance(info, dict) and 'redis_version' not in info:  # a cluster client: one node's answer each
            info = next(iter(info.values()))
        conn.close()
    except Exception:
        return None
    if info.get('valkey_version'):
        return f'valkey {info["valkey_version"]}'
    return f'redis {info.get("redis_version")}'


def jobs_prefix() -> str:
    from rq_policies.engine.compat import KEY_PREFIX

    return KEY_PREFIX


def lapses_key() -> str:
    from rq_policies.engine import keys

    return keys.LAPSES


def summarize_exits(exits: list[dict]) -> dict[str, int]:
    """How many workers exited during the run (not asked to by the runner's final stop), by exit code: -9 a
    SIGKILL, 1 a start that could not connect, 0 a worker that quit by itself."""
    counts: dict[str, int] = {}
    for item in exits:
        if not item['asked']:
            counts[str(item['code'])] = counts.get(str(item['code']), 0) + 1
    return counts


def figures(events: list[dict]) -> dict[str, Any]:
    """What the history holds, counted (no property is checked here: that is the checker's); the rates are over
    the producers' span, from the first door call to the last."""
    counts: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    span = [float('inf'), float('-inf')]
    for e in events:
        counts[e['e']] = counts.get(e['e'], 0) + 1
        if e['e'] == 'ok':
            verdicts[e['verdict']] = verdicts.get(e['verdict'], 0) + 1
        elif e['e'] == 'invoke':
            span = [min(span[0], e['t']), max(span[1], e['t'])]
    runs = counts.get('start', 0)
    elapsed = max(span[1] - span[0], 1e-9)
    return {'events': len(events), 'by_type': counts, 'verdicts': verdicts, 'door_calls': counts.get('invoke', 0),
            'runs': runs, 'producing_seconds': round(elapsed, 1), 'runs_per_second': round(runs / elapsed, 1),
            'calls_per_second': round(counts.get('invoke', 0) / elapsed, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--topology', choices=sorted(TOPOLOGIES), required=True)
    parser.add_argument('--server', choices=('valkey', 'redis'), default='valkey')
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument('--jobs', type=int, help='door calls in all (the producers share them)')
    size.add_argument('--seconds', type=float, help='how long the producers run')
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--out', type=Path, required=True,
                        help='the history folder (made if missing; a relative path is read from here)')
    parser.add_argument('--break', dest='broken', choices=sorted(BREAKS), help='run a deliberately broken build')
    parser.add_argument('--nemeses', help='only these nemeses, comma-separated, or none (default: every one of the '
                                          'topology)')
    parser.add_argument('--producers', type=int, default=3, help='producer processes (the last on asyncio)')
    parser.add_argument('--rate', type=float, default=12.0, help='door calls a second per producer, on average')
    parser.add_argument('--forking', type=int, default=2, help='forking workers (HistoryWorker)')
    parser.add_argument('--simple', type=int, default=2, help='in-process workers (HistorySimpleWorker)')
    parser.add_argument('--drain', type=float, default=120.0, help='seconds the final drain may take')
    parser.add_argument('--gap', type=float, nargs=2, default=(2.0, 6.0), metavar=('MIN', 'MAX'),
                        help='seconds between two nemeses')
    parser.add_argument('--only', help='only calls of these job functions of tests/history/jobs.py, comma-separated '
                                       '(a focused run)')
    opts = parser.parse_args(argv)
    # Before anything imports rq or rq_policies (each reads these once): the server binary and the key prefix.
    if opts.server == 'redis' and not os.environ.get('REDIS_SERVER'):
        os.environ['REDIS_SERVER'] = REDIS_7
    if opts.topology == 'cluster':
        prefix = os.environ.setdefault('RQ_KEY_PREFIX', CLUSTER_PREFIX)
        if '{' not in prefix:
            parser.error(f"--topology cluster needs a hash-tagged RQ_KEY_PREFIX (such as '{CLUSTER_PREFIX}'), "
                         f'got {prefix!r}')
    try:
        summary = run(opts.topology, opts.out.resolve(), opts.seed, opts.jobs, opts.seconds, opts.server, opts.broken,
                      opts.nemeses.split(',') if opts.nemeses else None, opts.producers, opts.rate, opts.forking,
                      opts.simple, opts.drain, tuple(opts.gap), opts.only.split(',') if opts.only else None)
    except Exception as exc:
        print(json.dumps({'error': repr(exc)[:2000]}), flush=True)
        sys.exit(2)
    print(json.dumps(summary, indent=2, default=str), flush=True)
    checker = summary['checker']
    sys.exit(1 if checker.get('available') and checker.get('exit') else 0)


if __name__ == '__main__':
    main()
