"""Redis cost of each door, from the server's own command statistics, plus round trips seen by the client.

    python bench/commands.py [--ops 2000] [--rounds 11] [--smoke]

For each door it runs N operations against a fresh server, then reads INFO commandstats and reports per operation:
client round trips, server commands executed (those a script runs included) and server microseconds (the time the
server's single thread spent). Then a job's whole life (enqueue, fetch, run, finish) through a SimpleWorker, stock and
PolicyWorker, in interleaved rounds, as medians and ratios to stock, with the server process's CPU per job beside
(INFO cpu: reading requests and writing replies included, which commandstats leaves out). These figures feed
docs/scaling.md. ``--smoke`` runs every door a few times (CI).

How the time is counted: INFO commandstats counts an EVALSHA with the time of the commands its script runs included,
and an EXEC with the time of the commands queued in its MULTI included, and it counts those inner commands again
under their own names (Valkey 9 and Redis 7 alike: one EVALSHA running 1,000 SETs shows evalsha 1 call ~1,100 usec
and set 1,000 calls ~260 usec; a MULTI of 1,000 SETs, exec ~300 usec and set ~240). Summing every line counts that
work twice, so the time here is that of the top-level commands only, as the server's event loop ran them: the
client counts each command it sends by name, outside a transaction (top-level) and inside one (run by EXEC), and of
every name only the top-level share of its calls, and of its usec pro rata, is counted. A command no script can run
(EVALSHA, EVAL, MULTI, a handshake, pub/sub) is counted from the server's own figure, less the calls the client queued
inside a transaction: a command the counting client does not see still counts.

The client counts every send: redis-py's commands and pipelines, and the enqueue doors' sends on their leased connection
(``rq_policies.engine.scripts._send``, which bypasses redis-py's command path; before this was counted the doors read
0.00 round trips and almost no server time). Each measurement checks the client's count of EVALSHA and EVAL against the
server's and stops the bench if they differ: a door that finds another way to the server cannot go uncounted again.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_jobs import work  # noqa: E402
from common import add_smoke, run_main, server_url, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402
from redis.client import Pipeline  # noqa: E402
from rq import Queue, SimpleWorker  # noqa: E402

from rq_policies import Debounce, Loner, PolicyQueue, PolicySimpleWorker, QueueSlot, Throttle, UnknownQueueWarning  # noqa: E402
from rq_policies.engine import scripts  # noqa: E402

# A bench caps and limits fresh queues before their first job, on purpose.
warnings.simplefilter('ignore', UnknownQueueWarning)

#: The many-queue life: a worker over this many queues, the first MANY_FULL of them capped at 1 and full (a hold
#: of another worker's), the rest uncapped and empty but the last, which the jobs go to (issue 34's case).
MANY_QUEUES, MANY_FULL = 50, 40


MANY_LABEL = f'lifecycle: PolicyWorker, {MANY_QUEUES} queues ({MANY_FULL} full)'

#: Commands no script can run: when the counting client did not see one go out (a new connection's handshake,
#: pub/sub, redis-py's UNWATCH), the server still ran it at top level.
NOT_FROM_SCRIPTS = {'eval', 'evalsha', 'eval_ro', 'evalsha_ro', 'fcall', 'fcall_ro', 'multi', 'exec', 'discard',
                    'watch', 'unwatch', 'subscribe', 'unsubscribe', 'psubscribe', 'punsubscribe', 'ssubscribe',
                    'sunsubscribe', 'hello', 'auth', 'select', 'info', 'blmove', 'blpop', 'brpop', 'bzpopmin'}
NOT_FROM_SCRIPTS_CONTAINERS = {'client', 'script', 'config', 'function', 'slowlog', 'latency', 'memory'}
#: The bench's own reads and resets, not the door's.
BENCH_OWN = ('config|resetstat', 'info')


def command_name(args: tuple) -> str:
    """The commandstats name of a command as redis-py sends it: 'HSET' is hset, 'CLIENT SETNAME' client|setname."""
    first = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
    words = first.lower().split()
    if len(words) == 1 and words[0] in NOT_FROM_SCRIPTS_CONTAINERS and len(args) > 1:
        sub = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
        words.append(sub.lower())
    return '|'.join(words[:2])


def from_clients_only(name: str) -> bool:
    return name in NOT_FROM_SCRIPTS or name.split('|')[0] in NOT_FROM_SCRIPTS_CONTAINERS


class CountingPipeline(Pipeline):
    def immediate_execute_command(self, *args, **options):
        # a command sent at once, not queued: under WATCH (rq's dependency checks), or redis-py's SCRIPT EXISTS
        self.counter[0] += 1
        self.sent[command_name(args)] += 1
        return super().immediate_execute_command(*args, **options)

    def execute(self, raise_on_error: bool = True):
        if self.command_stack:
            self.counter[0] += 1
            names = [command_name(args) for args, _ in self.command_stack]
            # a PolicyWorker's successful end sends its WATCH and end guard in front of the MULTI, in the same write
            # (rq_policies.engine.compat.GuardedEnd)
            self.sent.update(command_name(args) for args in getattr(self, 'sent_before', ()))
            if self.transaction or self.explicit_transaction:
                # redis-py wraps the stack in MULTI ... EXEC: EXEC runs the stack, and its usec includes theirs
                self.sent.update(('multi', 'exec'))
                self.queued.update(names)
            else:
                self.sent.update(names)
        return super().execute(raise_on_error)


#: The counting clients (a door's leased send names no client: every live one counts it; the bench has one).
_COUNTERS: list = []
_leased_send = scripts._send


def _counted_send(connection: Any, packed: Any) -> Any:
    """``scripts._send`` (a door's EVALSHA on its leased connection), counted as one round trip of its command."""
    head = bytes(packed[0][:64]) if isinstance(packed, (list, tuple)) else bytes(packed[:64])
    name = 'evalsha' if b'EVALSHA' in head.upper() else 'eval'
    for counter in _COUNTERS:
        counter.round_trips[0] += 1
        counter.sent[name] += 1
    return _leased_send(connection, packed)


scripts._send = _counted_send


class Counting(Redis):
    """A client that counts its round trips (a command, or a pipeline's execute) and the commands it sends.

    ``sent`` counts the commands the server runs at top level, ``queued`` those it runs inside an EXEC.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.round_trips = [0]
        self.sent: Counter[str] = Counter()
        self.queued: Counter[str] = Counter()
        _COUNTERS.append(self)

    def execute_command(self, *args, **options):
        self.round_trips[0] += 1
        self.sent[command_name(args)] += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction=True, shard_hint=None):
        pipe = CountingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.counter = self.round_trips
        pipe.sent = self.sent
        pipe.queued = self.queued
        return pipe

    def reset_counts(self) -> None:
        self.config_resetstat()
        self.round_trips[0] = 0
        self.sent.clear()
        self.queued.clear()


def server_cost(conn: Counting, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Read INFO commandstats since ``reset_counts``: every command run, and the top-level commands' usec.

    Returns calls (all commands, those run by scripts and by EXEC included), inner (those run by scripts), usec
    (top-level time only, each script and transaction counted once, whole) and per-command calls.
    """
    stats = {key.replace('cmdstat_', ''): value for key, value in conn.info('commandstats').items()}
    calls = inner = 0
    usec = 0.0
    per_command = {}
    for name, value in stats.items():
        if name in BENCH_OWN or name in skip:
            continue
        total = int(value['calls'])
        if from_clients_only(name):  # no script runs it: every call the server counts is top-level or in an EXEC
            top = max(0, total - conn.queued.get(name, 0))
        else:
            top = min(total, conn.sent.get(name, 0))
        in_exec = min(total - top, conn.queued.get(name, 0))
        calls += total
        inner += total - top - in_exec
        usec += float(value['usec']) * top / total if total else 0.0
        per_command[name] = total
    for name in ('evalsha', 'eval'):
        server = int(stats.get(name, {}).get('calls', 0))
        client = conn.sent.get(name, 0) + conn.queued.get(name, 0)
        if server != client:
            raise RuntimeError(f'the server ran {server} {name.upper()} and the client counted {client} sent: a '
                               f'send this bench does not see (sent {dict(conn.sent)}, queued {dict(conn.queued)})')
    if inner and 'evalsha' not in stats and 'eval' not in stats:
        raise RuntimeError(f'commands no client sent and no script ran: sent {dict(conn.sent)}, '
                           f'queued {dict(conn.queued)}, server {stats}')
    return {'calls': calls, 'inner': inner, 'usec': usec, 'per_command': per_command}


def check_commandstats(conn: Counting, sets: int = 1000) -> str:
    """Check the premise of :func:`server_cost` on this server: one EVALSHA running ``sets`` SETs, one MULTI of as many.

    Their inner commands must be counted under their own name, and the EVALSHA's and EXEC's usec must include theirs.
    """
    seen = []
    for wrapper in ('evalsha', 'exec'):
        conn.flushdb()
        sha = conn.script_load("for i = 1, tonumber(ARGV[1]) do redis.call('SET', 'k' .. i, i) end return 1")
        conn.reset_counts()
        if wrapper == 'evalsha':
            conn.evalsha(sha, 0, sets)
        else:
            with conn.pipeline(transaction=True) as pipe:
                for i in range(sets):
                    pipe.set(f'k{i}', i)
                pipe.execute()
        stats = conn.info('commandstats')
        outer, inner = stats[f'cmdstat_{wrapper}'], stats['cmdstat_set']
        if outer['calls'] != 1 or inner['calls'] != sets or outer['usec'] < inner['usec']:
            raise RuntimeError(f'INFO commandstats does not count {wrapper} as this bench assumes: {outer}, {inner}')
        seen.append(f'{wrapper} 1 call {outer["usec"]} usec, set {sets} calls {inner["usec"]} usec')
    conn.flushdb()
    return f'{sets} SETs in a script, then in a MULTI: ' + '; '.join(seen) + ' (the inner time is in the outer)'


def measure(conn: Counting, label: str, ops: int, setup, action) -> dict:
    conn.flushdb()
    state = setup()
    conn.reset_counts()
    for i in range(ops):
        action(state, i)
    trips = conn.round_trips[0]
    cost = server_cost(conn)
    top = sorted(((n / ops, name) for name, n in cost['per_command'].items()), reverse=True)
    return {'door': label, 'round_trips': trips / ops, 'commands': cost['calls'] / ops, 'inner': cost['inner'] / ops,
            'usec': cost['usec'] / ops, 'detail': ', '.join(f'{name} {n:.2g}' for n, name in top[:6])}


def measure_lifecycle(conn: Counting, label: str, jobs: int, worker_class, queue_class, policy, cap,
                      many: bool = False) -> dict:
    """One job's whole life (enqueue, fetch, start, finish, heartbeats) through an in-process worker, per job, past
    the worker's maintenance pass.

    ``many``: the worker's queues are MANY_QUEUES, MANY_FULL of them capped and full, the jobs on the last one."""
    conn.flushdb()
    if cap:
        QueueSlot.set('life', cap, connection=conn)
    q = queue_class('life', connection=conn)
    queues = [q]
    if many:
        queues = [queue_class(f'many{i}', connection=conn) for i in range(MANY_QUEUES - 1)] + [q]
        for other in queues[:MANY_FULL]:
            QueueSlot.set(other.name, 1, connection=conn)
            QueueSlot.acquire(other.name, capacity=1, ttl=3600, token=f'elsewhere:{other.name}', connection=conn)
            QueueSlot.HELD.discard(f'elsewhere:{other.name}')  # another worker's hold: not this process's to refresh
    worker = worker_class(queues, connection=conn)
    # rq's maintenance pass (its registries' cleanup, a few commands per queue), which a worker runs as it starts and
    # then every 10 minutes, is run before the count: over a burst of a few hundred jobs it would be charged to each
    # job (50 queues: 1.6 round trips a job), where a long-lived worker spreads it over ten minutes of jobs.
    worker.run_maintenance_tasks()
    cpu_before = server_cpu(conn)
    conn.reset_counts()
    for i in range(jobs):
        if policy is None:
            q.enqueue(work, i)
        else:
            q.enqueue(work, i, policy=policy)
    worker.work(burst=True, logging_level='WARNING')
    trips = conn.round_trips[0]
    cpu = server_cpu(conn) - cpu_before
    cost = server_cost(conn, skip=('client|setname', 'client|list'))
    return {'door': label, 'round_trips': trips / jobs, 'commands': cost['calls'] / jobs,
            'inner': cost['inner'] / jobs, 'usec': cost['usec'] / jobs, 'cpu_usec': cpu * 1e6 / jobs,
            'detail': f'{jobs} jobs through a SimpleWorker burst'}


def server_cpu(conn: Redis) -> float:
    """The server process's CPU seconds so far (INFO cpu: every thread, I/O and the event loop included)."""
    info = conn.info('cpu')
    return float(info['used_cpu_user']) + float(info['used_cpu_sys'])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--ops', type=int, default=2000)
    parser.add_argument('--rounds', type=int, default=11, help='interleaved rounds of the whole-life measurement')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, ops=30, rounds=1)
    rows = []
    with server_url() as url:
        conn = Counting.from_url(url)
        info = conn.info('server')
        print(f'server {info.get("valkey_version") or info.get("redis_version")}, {opts.ops} operations per door')
        print(check_commandstats(conn) + '\n')
        stock = lambda: Queue('s', connection=conn)  # noqa: E731
        pq = lambda: PolicyQueue('p', connection=conn)  # noqa: E731
        n = opts.ops
        rows.append(measure(conn, 'stock Queue.enqueue', n, stock, lambda q, i: q.enqueue(work, i)))
        rows.append(measure(conn, 'enqueue, no policy (PolicyQueue)', n, pq, lambda q, i: q.enqueue(work, i)))
        rows.append(measure(conn, 'Loner admitted', n, pq, lambda q, i: q.enqueue(work, i, policy=Loner())))

        def held(policy):
            def setup():
                q = pq()
                q.enqueue(work, 'held', policy=policy)
                return q
            return setup

        rows.append(measure(conn, 'Loner dropped (fast path)', n, held(Loner()),
                            lambda q, i: q.enqueue(work, 'held', policy=Loner())))
        rows.append(measure(conn, 'Throttle win', n, pq, lambda q, i: q.enqueue(work, i, policy=Throttle(3600))))
        rows.append(measure(conn, 'Throttle dropped (fast path)', n, held(Throttle(3600)),
                            lambda q, i: q.enqueue(work, 'held', policy=Throttle(3600))))
        rows.append(measure(conn, 'Throttle trailing replace', n, held(Throttle(3600, trailing=True)),
                            lambda q, i: q.enqueue(work, 'held', policy=Throttle(3600, trailing=True))))
        rows.append(measure(conn, 'Debounce replace', n, held(Debounce(3600)),
                            lambda q, i: q.enqueue(work, 'held', policy=Debounce(3600))))

        def filled(worker_class, capped: bool):
            """A worker over a queue of n + 1 jobs, past its first fetch (which also runs rq's maintenance)."""
            def setup():
                if capped:
                    QueueSlot.set('p', 10**6, connection=conn)
                for i in range(n + 1):
                    Queue('p', connection=conn).enqueue(work, i)
                worker = worker_class([pq() if worker_class is PolicySimpleWorker else Queue('p', connection=conn)],
                                      connection=conn)
                fetch(worker, -1)
                return worker
            return setup

        def fetch(worker, i):
            job, _queue = worker.dequeue_job_and_maintain_ttl(None)
            # The claim's hold stays in the ledger (this bench runs no job, so nothing releases it); forget it here
            # (no Redis command) so the next fetch's heartbeat does not refresh a growing set of holds.
            for token in QueueSlot.HELD.snapshot():
                QueueSlot.HELD.discard(token)
            return job

        rows.append(measure(conn, 'worker fetch, stock SimpleWorker', n, filled(SimpleWorker, False), fetch))
        rows.append(measure(conn, 'worker fetch, PolicySimpleWorker uncapped', n, filled(PolicySimpleWorker, False),
                            fetch))
        rows.append(measure(conn, 'worker fetch, PolicySimpleWorker capped', n, filled(PolicySimpleWorker, True),
                            fetch))

        def holds(k):
            def setup():
                tokens = [f'holder-{j}' for j in range(k)]
                for t in tokens:
                    assert QueueSlot.acquire('p', capacity=10**6, token=t, connection=conn)
                return tokens
            return setup

        rows.append(measure(conn, 'release (ZREM + wake)', n, holds(n),
                            lambda tokens, i: QueueSlot.release('p', token=tokens[i], connection=conn)))
        for t in QueueSlot.HELD.snapshot():
            QueueSlot.HELD.discard(t)

        def beat(tokens, i):
            with conn.pipeline() as pipe:
                pipe.expire('rq:worker:x', 100)
                QueueSlot.refresh_in(pipe, ttl=90)
                pipe.execute()

        rows.append(measure(conn, 'heartbeat refresh of 1 hold (rides the beat)', n, holds(1), beat))
        for t in QueueSlot.HELD.snapshot():
            QueueSlot.HELD.discard(t)

        lives = (
            ('lifecycle: stock rq', SimpleWorker, Queue, None, None),
            ('lifecycle: PolicyWorker, no policy', PolicySimpleWorker, PolicyQueue, None, None),
            ('lifecycle: PolicyWorker, Loner', PolicySimpleWorker, PolicyQueue, Loner(), None),
            ('lifecycle: PolicyWorker, capped queue', PolicySimpleWorker, PolicyQueue, None, 10**6),
            (MANY_LABEL, PolicySimpleWorker, PolicyQueue, None, None),
        )
        # Whole lives in interleaved rounds (the order rotates): a shared machine's load drifts, and the ratio of
        # each round's lives to stock's in that round cancels most of it.
        life_rounds: list[dict[str, dict]] = []
        for r in range(opts.rounds):
            order = lives[r % len(lives):] + lives[:r % len(lives)]
            life_rounds.append({label: measure_lifecycle(conn, label, min(n, 500), wc, qc, pol, cap,
                                                         many=label == MANY_LABEL)
                                for label, wc, qc, pol, cap in order})
        for label, *_ in lives:
            samples = [got[label] for got in life_rounds]
            row = dict(samples[0])
            for field in ('round_trips', 'commands', 'inner', 'usec', 'cpu_usec'):
                row[field] = statistics.median(sample[field] for sample in samples)
            row['detail'] += f', median of {len(samples)} rounds; server process CPU {row["cpu_usec"]:.0f} us a job'
            rows.append(row)

    print(f'{"door":46} {"round trips":>11} {"commands":>9} {"in scripts":>10} {"server us":>10}  commands per op')
    for r in rows:
        print(f'{r["door"]:46} {r["round_trips"]:11.2f} {r["commands"]:9.2f} {r["inner"]:10.2f} {r["usec"]:10.1f}  '
              f'{r["detail"]}')
    print('\nserver time of a whole life against stock rq (top-level commands only: a script or a MULTI counted once, '
          'whole); median of the per-round ratios, and their range:')
    for label, *_ in lives:
        ratios = sorted(got[label]['usec'] / got['lifecycle: stock rq']['usec'] for got in life_rounds)
        cpu = sorted(got[label]['cpu_usec'] / got['lifecycle: stock rq']['cpu_usec'] for got in life_rounds)
        print(f'  {label[len("lifecycle: "):]:36} x{statistics.median(ratios):.2f}  (x{ratios[0]:.2f} .. '
              f'x{ratios[-1]:.2f});  server process CPU x{statistics.median(cpu):.2f} '
              f'(x{cpu[0]:.2f} .. x{cpu[-1]:.2f})')
    # Against one queue without policy state (the fetch's plain path), and against one capped queue (the same
    # stateful path a worker over capped queues takes: what the queue count alone costs).
    print(f'\na PolicyWorker over {MANY_QUEUES} queues ({MANY_FULL} capped and full, the jobs on the last) against '
          f'one queue, per job; median of the per-round ratios and their range (target <= 1.2, issue 34):')
    for one in ('lifecycle: PolicyWorker, no policy', 'lifecycle: PolicyWorker, capped queue'):
        ratios = sorted(got[MANY_LABEL]['usec'] / got[one]['usec'] for got in life_rounds)
        cpu = sorted(got[MANY_LABEL]['cpu_usec'] / got[one]['cpu_usec'] for got in life_rounds)
        mark = 'ok' if statistics.median(ratios) <= 1.2 else 'MISSED'
        print(f'  against {one[len("lifecycle: PolicyWorker, "):]:12} server time x{statistics.median(ratios):.2f} '
              f'(x{ratios[0]:.2f} .. x{ratios[-1]:.2f}) {mark}; server process CPU x{statistics.median(cpu):.2f} '
              f'(x{cpu[0]:.2f} .. x{cpu[-1]:.2f})')
    return 0


if __name__ == '__main__':
    run_main(main)
