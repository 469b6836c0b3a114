"""BullMQ beside rq-policies on the same server: what each door costs the server and the caller, pairs interleaved.

    python bench/bullmq.py [--ops 300] [--rounds 5] [--smoke]

Needs node and npm: ``bullmq`` (major 5) is installed by the bench itself into a cache folder
(``$RQ_POLICIES_BULLMQ_DIR``, default ``~/.cache/rq-policies-bench/bullmq5``; the registry's newest 5.x, its version
printed). Without node or npm, or when the install fails (offline), the bench says so and exits 0: it skips, it does
not fail CI.

Doors, each run as a pair (BullMQ's, then ours, or the other way round in alternate rounds), ``--ops`` timed calls
each, on fresh queues:

* dedup admitted: BullMQ ``queue.add(name, data, {deduplication: {id}})`` of a new id, against a Loner enqueue that
  is admitted (``PolicyQueue.enqueue(f, i, policy=Loner())``);
* dedup dropped: the same deduplication id again, against a Loner duplicate (hinted: this process saw it held);
* plain add: ``queue.add`` without options, against ``PolicyQueue.enqueue`` of a job without a policy;
* fetch per job: BullMQ's ``worker.getNextJob(token, {block: false})`` (its ``moveToActive`` script) on a queue of
  waiting jobs, against our PolicySimpleWorker's fetch (``lua/fetch.lua``), and stock rq's SimpleWorker fetch.

Server time: INFO commandstats since a CONFIG RESETSTAT taken right before the timed calls. Ours is counted as
bench/commands.py counts it (top-level commands only, a script or a MULTI once, whole; the doors' leased sends
included; client and server counts checked against each other). BullMQ's side sends scripts only for these doors:
its server time is that of EVALSHA, EVAL, MULTI and EXEC (each including what it ran), and every other command it
sent at top level is listed (there should be none). Wall: the median of per-call times as each caller measured
them (Node's hrtime, Python's perf_counter). Round trips per call: ours as the client counts them (checked against
the server), BullMQ's its EVALSHA calls. Reported per door: medians over the rounds and their range, and the ratio
ours / BullMQ, median of the per-round ratios with their range.

Script time, median: each script call's own duration as the server's SLOWLOG records it (``slowlog-log-slower-than
0`` for the run), the median of a round's calls (an EVALSHA and its EVAL fallback), then the median of the rounds.
INFO commandstats gives a mean, which counts a call that the machine's other load preempted by its whole length (on a
loaded machine the same script read 69 to 90 us from one run to the next); the median is what a call costs when it
runs. Both sides of every door are one script per call (ours and BullMQ's; the fetch's row compares our fetch script
with ``moveToActive``; stock rq's fetch has no script, so its row has none).

``--smoke`` (CI): 30 calls, one round, the npm install included; it must finish well inside 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_jobs import work  # noqa: E402
from commands import Counting, server_cost  # noqa: E402  (importing it counts the doors' leased sends)
from common import add_smoke, run_main, server_url, smoke_defaults  # noqa: E402
from rq import Queue, SimpleWorker  # noqa: E402

from rq_policies import Loner, PolicyQueue, PolicySimpleWorker, QueueSlot  # noqa: E402

MAJOR = '5'
DOORS = (
    # (label, BullMQ op, our variants: label -> (setup, call))
    ('dedup admitted vs Loner admitted', 'dedup_admit'),
    ('dedup dropped vs Loner dropped (hinted)', 'dedup_drop'),
    ('plain add vs PolicyQueue.enqueue', 'plain_add'),
    ('moveToActive vs our fetch (and stock rq\'s)', 'fetch'),
)
#: Commands BullMQ's scripts cannot run: their time is BullMQ's top-level time.
TOP_LEVEL = ('evalsha', 'eval', 'evalsha_ro', 'eval_ro', 'multi', 'exec')
BENCH_OWN = ('config|resetstat', 'info', 'flushdb', 'flushall', 'config|set', 'config|get', 'client|setname',
             'client|setinfo', 'hello', 'ping', 'select', 'slowlog|reset', 'slowlog|get')
#: SLOWLOG entries kept (set for the run): enough for the most commands a door's timed calls send.
SLOWLOG_LEN = 20000


def bullmq_dir() -> Path:
    found = os.environ.get('RQ_POLICIES_BULLMQ_DIR')
    if found:
        return Path(found)
    cache = Path(os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache')
    return cache / 'rq-policies-bench' / f'bullmq{MAJOR}'


def install(timeout: float) -> tuple[Path | None, str]:
    """BullMQ's folder (installed now if it is not yet), and what happened; (None, why) when it cannot run."""
    node, npm = shutil.which('node'), shutil.which('npm')
    if not node or not npm:
        return None, f'node or npm not found (node: {node}, npm: {npm})'
    folder = bullmq_dir()
    package = folder / 'node_modules' / 'bullmq' / 'package.json'
    if not package.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            done = subprocess.run(
                [npm, 'install', '--prefix', str(folder), '--no-audit', '--no-fund', '--no-save', '--loglevel=error',
                 '--fetch-retries=1', '--fetch-timeout=20000', f'bullmq@{MAJOR}'],
                capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f'npm install bullmq@{MAJOR} took more than {timeout:.0f} s (offline?)'
        if done.returncode != 0 or not package.is_file():
            return None, f'npm install bullmq@{MAJOR} failed (offline?): {done.stderr.strip()[-300:]}'
        how = f'installed from npm in {time.monotonic() - started:.1f} s'
    else:
        how = 'from the cache'
    version = json.loads(package.read_text())['version']
    node_version = subprocess.run([node, '--version'], capture_output=True, text=True).stdout.strip()
    return folder, f'BullMQ {version} ({how}, {folder}), node {node_version}'


class Driver:
    """The Node process running BullMQ's side (bench/bullmq_driver.js)."""

    def __init__(self, folder: Path, url: str) -> None:
        parsed = urlparse(url)
        env = dict(os.environ, NODE_PATH=str(folder / 'node_modules'), BENCH_REDIS_HOST=parsed.hostname or '127.0.0.1',
                   BENCH_REDIS_PORT=str(parsed.port or 6379))
        self.proc = subprocess.Popen(['node', str(HERE / 'bullmq_driver.js')], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True, cwd=str(folder))

    def ask(self, **msg) -> dict:
        self.proc.stdin.write(json.dumps(msg) + '\n')
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f'the BullMQ driver ended (exit {self.proc.poll()})')
        reply = json.loads(line)
        if 'error' in reply:
            raise RuntimeError(f'the BullMQ driver failed: {reply["error"]}')
        return reply

    def close(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({'quit': True}) + '\n')
            self.proc.stdin.flush()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)


def script_durations(conn: Counting, n: int) -> tuple[float | None, float]:
    """The median SLOWLOG duration (us) of the scripts run since the last SLOWLOG RESET, and scripts per call."""
    found = [entry['duration'] for entry in conn.slowlog_get(SLOWLOG_LEN)
             if entry['command'].split(b' ', 1)[0].upper() in (b'EVALSHA', b'EVAL')]
    return (statistics.median(found) if found else None), len(found) / n


def bullmq_side(conn: Counting, driver: Driver, op: str, n: int, r: int) -> dict:
    driver.ask(op=op, n=n, round=r)
    conn.config_resetstat()
    conn.slowlog_reset()
    walls = driver.ask(go=True)['walls_us']
    script, per_call = script_durations(conn, n)
    stats = {key.replace('cmdstat_', ''): value for key, value in conn.info('commandstats').items()}
    usec = sum(float(stats[name]['usec']) for name in TOP_LEVEL if name in stats)
    scripts = sum(int(stats[name]['calls']) for name in ('evalsha', 'eval') if name in stats)
    others = {name: int(v['calls']) for name, v in stats.items()
              if name not in TOP_LEVEL and name not in BENCH_OWN and not _script_inner(name)}
    return {'usec': usec / n, 'wall': statistics.median(walls), 'trips': scripts / n, 'others': others,
            'script': script, 'scripts': per_call}


def _script_inner(name: str) -> bool:
    """A data command a BullMQ script runs (the scripts' inner commands are counted under their own names too)."""
    return '|' not in name and name not in ('client', 'script', 'info', 'bzpopmin', 'blmove', 'brpoplpush')


def ours_side(conn: Counting, setup, call, n: int) -> dict:
    state = setup()
    conn.slowlog_reset()
    conn.reset_counts()
    walls = []
    for i in range(n):
        start = time.perf_counter()
        call(state, i)
        walls.append((time.perf_counter() - start) * 1e6)
    trips = conn.round_trips[0]  # before server_cost's own INFO
    cost = server_cost(conn, skip=('client|setname', 'client|list', 'client|setinfo', 'slowlog|reset'))
    script, per_call = script_durations(conn, n)
    return {'usec': cost['usec'] / n, 'wall': statistics.median(walls), 'trips': trips / n, 'script': script,
            'scripts': per_call}


def our_variants(conn: Counting, op: str, n: int, r: int) -> dict:
    """Our side (and stock rq's, for the fetch) of door ``op``: label -> (setup, call)."""
    name = f'pq-{op}-{r}'
    q = lambda: PolicyQueue(name, connection=conn)  # noqa: E731
    if op == 'dedup_admit':
        def setup():
            pq = q()
            pq.enqueue(work, f'warm-{r}', policy=Loner())
            return pq
        return {'Loner admitted': (setup, lambda pq, i: pq.enqueue(work, f'a-{r}-{i}', policy=Loner()))}
    if op == 'dedup_drop':
        def held():
            pq = q()
            pq.enqueue(work, 'held', policy=Loner())
            pq.enqueue(work, 'held', policy=Loner())  # dropped: the hint is seen
            return pq
        return {'Loner dropped (hinted)': (held, lambda pq, i: pq.enqueue(work, 'held', policy=Loner()))}
    if op == 'plain_add':
        def plain():
            pq = q()
            pq.enqueue(work, -1)
            pq.enqueue(work, -2)  # the door's lease is taken from its second call on
            return pq
        return {'PolicyQueue.enqueue': (plain, lambda pq, i: pq.enqueue(work, i))}

    def filled(worker_class, queue_class, capped):
        def setup():
            if capped:
                QueueSlot.set(name, 10**6, connection=conn)
            Queue(name, connection=conn).enqueue_many(
                [Queue.prepare_data(work, (i,)) for i in range(n + 1)])
            worker = worker_class([queue_class(name, connection=conn)], connection=conn)
            fetch(worker, -1)  # its first fetch also runs rq's maintenance
            return worker
        return setup

    def fetch(worker, i):
        job, _queue = worker.dequeue_job_and_maintain_ttl(None)
        if job is None:
            raise RuntimeError('the fetch found no job')
        for token in QueueSlot.HELD.snapshot():  # no job runs here, so nothing releases its hold: forget it
            QueueSlot.HELD.discard(token)
        return job

    return {
        'our fetch, uncapped': (filled(PolicySimpleWorker, PolicyQueue, False), fetch),
        'our fetch, capped': (filled(PolicySimpleWorker, PolicyQueue, True), fetch),
        'stock rq fetch': (filled(SimpleWorker, Queue, False), fetch),
    }


def spread(values: list[float]) -> str:
    return f'{statistics.median(values):8.1f} ({min(values):.1f}..{max(values):.1f})'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--ops', type=int, default=300, help='timed calls per door and side in a round')
    parser.add_argument('--rounds', type=int, default=5, help='interleaved rounds')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, ops=30, rounds=1)
    folder, how = install(timeout=45 if opts.smoke else 300)
    if folder is None:
        print(f'bench/bullmq.py: SKIPPED, BullMQ cannot run here: {how}')
        return 0
    print(how)
    with server_url() as url:
        conn = Counting.from_url(url)
        conn.config_set('slowlog-log-slower-than', 0)
        conn.config_set('slowlog-max-len', SLOWLOG_LEN)
        info = conn.info('server')
        print(f'server {info.get("valkey_version") or info.get("redis_version")}; {opts.ops} calls per door and side, '
              f'{opts.rounds} rounds, pairs interleaved (the side that goes first alternates)\n')
        driver = Driver(folder, url)
        results: dict[str, dict[str, list[dict]]] = {label: {} for label, _ in DOORS}
        try:
            for r in range(opts.rounds):
                for label, op in DOORS:
                    conn.flushdb()
                    sides = [('BullMQ', None)] + list(our_variants(conn, op, opts.ops, r).items())
                    if r % 2:
                        sides.reverse()
                    for side, variant in sides:
                        if variant is None:
                            got = bullmq_side(conn, driver, op, opts.ops, r)
                        else:
                            got = ours_side(conn, *variant, opts.ops)
                        results[label].setdefault(side, []).append(got)
        finally:
            driver.close()
    print(f'{"door":44} {"side":24} {"server us/op (range)":>26} {"wall us/op (range)":>26} {"trips/op":>10}')
    for label, _ in DOORS:
        for side, samples in results[label].items():
            print(f'{label:44} {side:24} {spread([s["usec"] for s in samples]):>26} '
                  f'{spread([s["wall"] for s in samples]):>26} {statistics.median(s["trips"] for s in samples):10.2f}')
            scripts = [s['script'] for s in samples if s['script'] is not None]
            if scripts:
                print(f'{"":44} {"":24} script time, median of a call: {spread(scripts)} us, '
                      f'{statistics.median(s["scripts"] for s in samples):.2f} script(s) a call')
            others = {k: v for s in samples for k, v in s.get('others', {}).items()}
            if others:
                print(f'{"":44} BullMQ commands outside scripts: {others}')
    print('\nours / BullMQ, median of the per-round ratios (range): server time, wall')
    for label, _ in DOORS:
        base = results[label]['BullMQ']
        for side, samples in results[label].items():
            if side == 'BullMQ':
                continue
            server = sorted(s['usec'] / b['usec'] for s, b in zip(samples, base))
            wall = sorted(s['wall'] / b['wall'] for s, b in zip(samples, base))
            script = sorted(s['script'] / b['script'] for s, b in zip(samples, base)
                            if s['script'] is not None and b['script'])
            by_script = (f'  script median x{statistics.median(script):.2f} ({script[0]:.2f}..{script[-1]:.2f})'
                         if script else '')
            print(f'  {label:44} {side:24} server x{statistics.median(server):.2f} ({server[0]:.2f}..{server[-1]:.2f})'
                  f'  wall x{statistics.median(wall):.2f} ({wall[0]:.2f}..{wall[-1]:.2f}){by_script}')
    return 0


if __name__ == '__main__':
    run_main(main)
