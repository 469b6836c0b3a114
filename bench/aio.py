"""The asyncio doors' throughput, and what OpenTelemetry costs per door, measured in one run.

    python bench/aio.py [--rounds 7] [--jobs 2000] [--tasks 200] [--calls 300] [--smoke]

1. Throughput (jobs per second) of ``--jobs`` enqueues, admitted (every call a new identity) and dropped (every call
   the same, held identity): ``AsyncPolicyQueue`` from ``--tasks`` concurrent tasks, the synchronous
   ``PolicyQueue`` from as many threads, ``AsyncPolicyQueue`` from one task in a loop, and stock
   ``rq.Queue.enqueue`` from one thread (the baseline of the ratios). Rounds interleave the variants; medians and
   the spread (min / max of the rounds), and the client CPU per job (``time.process_time``, all threads). On a
   loaded machine read the CPU column: the scheduler shares CPU per thread, so 200 threads get a larger share than
   one event loop, which the jobs/s then show as a difference of the doors.

   The event loop's lag while the async variants enqueue: a ticker task on the same loop sleeps 1 ms at a time and
   records how late each wake-up is (what any other coroutine of the loop, a web handler, waits on top of its own
   work); "idle loop" is the ticker alone for as long, each round, as the baseline of what the machine adds. p50 and
   p99 of all the rounds' ticks, and the spread of the per-round p99s (min / max).
2. OpenTelemetry per door (sync enqueue admitted and dropped, async enqueue admitted and dropped), each mode in a
   fresh process, rounds interleaved: not installed (a meta-path hook refuses ``opentelemetry``; the process checks
   nothing imported it), disabled (the SDK imported, ``instrument()`` never called: the doors' one
   ``TRACER is None`` check) and enabled (the SDK, a BatchSpanProcessor to an
   exporter that drops the spans, and the metrics API's instruments). Median us per call and the ratio to "not
   installed", with the spread (p25 / p75), in wall time and in the calling thread's CPU time.

``--smoke`` runs every case a few times (CI: the bench still works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, connect, run_main, server_url, smoke_defaults  # noqa: E402

#: The ticker's sleep: each tick's lag is how much later than this it woke up.
TICK = 0.001

_BLOCK = '''
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'opentelemetry' or name.startswith('opentelemetry.'):
            raise ImportError('blocked for the bench: ' + name)
sys.meta_path.insert(0, _Block())
'''


# -- 1. throughput ---------------------------------------------------------------------------------------------------


async def _ticker(stop: asyncio.Event, lags: list[float]) -> None:
    """Sleep :data:`TICK` at a time until ``stop``, appending each wake-up's lateness (seconds) to ``lags``."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(TICK)
        lags.append(max(0.0, loop.time() - start - TICK))


def _idle_lag(seconds: float) -> list[float]:
    """The ticker's lags on a loop doing nothing else for ``seconds`` (what the machine adds on its own)."""

    async def main() -> list[float]:
        stop, lags = asyncio.Event(), []
        ticker = asyncio.ensure_future(_ticker(stop, lags))
        await asyncio.sleep(seconds)
        stop.set()
        await ticker
        return lags

    return asyncio.run(main())


def _async_batch(url: str, n: int, tasks: int, drop: bool, tag: str,
                 lags: list[float] | None = None) -> tuple[float, float]:
    from redis.asyncio import BlockingConnectionPool, Redis

    from rq_policies import Loner
    from rq_policies.surfaces.aio import AsyncPolicyQueue

    loner = Loner()

    async def main() -> tuple[float, float]:
        client = Redis(connection_pool=BlockingConnectionPool.from_url(url, max_connections=tasks + 2))
        q = AsyncPolicyQueue('bench_aio', connection=client)
        await q.enqueue(work, f'{tag}-held', policy=loner)  # warm, and the identity the dropped case hits

        async def run(index: int) -> None:
            for i in range(n // tasks):
                await q.enqueue(work, f'{tag}-held' if drop else f'{tag}-{index}-{i}', policy=loner)

        await asyncio.gather(*(q.enqueue(work, f'{tag}-warm-{i}', policy=None) for i in range(tasks)))
        stop, ticks = asyncio.Event(), []
        ticker = asyncio.ensure_future(_ticker(stop, ticks))
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(run(t) for t in range(tasks)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        stop.set()
        await ticker
        if lags is not None:
            lags.extend(ticks)
        await client.aclose()
        done = (n // tasks) * tasks
        return done / elapsed, cpu / done

    return asyncio.run(main())


def _sync_threads(url: str, n: int, threads: int, drop: bool, tag: str) -> tuple[float, float]:
    from redis import BlockingConnectionPool, Redis

    from rq_policies import Loner, PolicyQueue

    loner = Loner()
    client = Redis(connection_pool=BlockingConnectionPool.from_url(url, max_connections=threads + 2))
    q = PolicyQueue('bench_aio', connection=client)
    q.enqueue(work, f'{tag}-held', policy=loner)
    barrier = threading.Barrier(threads + 1)

    def run(index: int) -> None:
        barrier.wait()
        for i in range(n // threads):
            q.enqueue(work, f'{tag}-held' if drop else f'{tag}-{index}-{i}', policy=loner)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    for thread in pool:
        thread.join()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    client.close()
    done = (n // threads) * threads
    return done / elapsed, cpu / done


def _stock(url: str, n: int, tag: str) -> tuple[float, float]:
    from rq import Queue

    q = Queue('bench_aio_stock', connection=connect(url))
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        q.enqueue(work, f'{tag}-{i}')
    return n / (time.perf_counter() - start), (time.process_time() - cpu) / n


def _p(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float('nan')


def throughput(url: str, rounds: int, n: int, tasks: int) -> None:
    conn = connect(url)
    many, threads, one = f'async, {tasks} tasks', f'sync PolicyQueue, {tasks} threads', 'async, 1 task'
    lags: dict[str, list[list[float]]] = {}

    def batch(count: int, name: str, tag: str, drop: bool) -> tuple[float, float]:
        ticks: list[float] = []
        out = _async_batch(url, n, count, drop, tag, ticks)
        lags[name].append(ticks)
        return out

    variants = {
        'stock rq.Queue.enqueue, 1 thread': lambda tag, drop: _stock(url, n, tag),
        many: lambda tag, drop: batch(tasks, many, tag, drop),
        threads: lambda tag, drop: _sync_threads(url, n, tasks, drop, tag),
        one: lambda tag, drop: batch(1, one, tag, drop),
    }
    for drop in (False, True):
        print(f'\nthroughput, {"dropped" if drop else "admitted"} ({n} enqueues a round, {rounds} rounds): jobs/s')
        rates: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        lags.clear()
        lags.update({'idle loop': [], many: [], one: []})
        for r in range(rounds):
            order = list(variants.items())
            if r % 2:
                order.reverse()
            for name, run in order:
                conn.flushdb()
                rate, cpu = run(f'r{r}', drop if not name.startswith('stock') else False)
                rates[name].append(rate)
                cpus[name].append(cpu)
            lags['idle loop'].append(_idle_lag(min(2.0, n / rates[many][-1])))
        base = statistics.median(rates['stock rq.Queue.enqueue, 1 thread'])
        base_cpu = statistics.median(cpus['stock rq.Queue.enqueue, 1 thread'])
        print(f'{"variant":36} {"median":>9} {"min":>9} {"max":>9} {"x stock":>8} {"CPU us/job":>11} {"x stock":>8}')
        for name, values in rates.items():
            med, cpu = statistics.median(values), statistics.median(cpus[name])
            print(f'{name:36} {med:9.0f} {min(values):9.0f} {max(values):9.0f} {med / base:8.2f} {cpu * 1e6:11.0f} '
                  f'{cpu / base_cpu:8.2f}')
        a, s, o = (statistics.median(rates[k]) for k in (many, threads, one))
        ratios = [x / y for x, y in zip(rates[many], rates[threads])]
        print(f'async {tasks} tasks / sync {tasks} threads: {a / s:.2f} (per round {min(ratios):.2f}-'
              f'{max(ratios):.2f}); async {tasks} tasks / async 1 task: {a / o:.2f}')
        print(f'event-loop lag while enqueuing (a ticker sleeping {TICK * 1e3:.0f} ms on the same loop), ms:')
        print(f'{"loop":36} {"ticks":>7} {"p50":>7} {"p99":>7} {"max":>7} {"p99 min":>8} {"p99 max":>8}')
        for name, per_round in lags.items():
            ticks = [tick for part in per_round for tick in part]
            p99s = [_p(part, 0.99) for part in per_round if part]
            print(f'{name:36} {len(ticks):7} {_p(ticks, 0.5) * 1e3:7.2f} {_p(ticks, 0.99) * 1e3:7.2f} '
                  f'{max(ticks, default=0) * 1e3:7.2f} {min(p99s) * 1e3:8.2f} {max(p99s) * 1e3:8.2f}')
    conn.flushdb()


# -- 2. OpenTelemetry per door ---------------------------------------------------------------------------------------


def door_costs(url: str, calls: int, tag: str) -> dict[str, list[float]]:
    """Per-call seconds of each door case, in this process as it is (OTel on, off, or not importable)."""
    from redis.asyncio import Redis as AsyncRedis

    from rq_policies import Loner, PolicyQueue
    from rq_policies.surfaces.aio import AsyncPolicyQueue

    loner = Loner()
    q = PolicyQueue('bench_aio_otel', connection=connect(url))
    out: dict[str, list[float]] = {'sync admitted': [], 'sync dropped': [], 'async admitted': [],
                                   'async dropped': []}
    q.enqueue(work, f'{tag}-held', policy=loner)
    cpu = {case: [] for case in out}
    clock = time.thread_time
    for i in range(calls):
        start, used = time.perf_counter(), clock()
        q.enqueue(work, f'{tag}-s-{i}', policy=loner)
        out['sync admitted'].append(time.perf_counter() - start)
        cpu['sync admitted'].append(clock() - used)
        start, used = time.perf_counter(), clock()
        q.enqueue(work, f'{tag}-held', policy=loner)
        out['sync dropped'].append(time.perf_counter() - start)
        cpu['sync dropped'].append(clock() - used)

    async def main() -> None:
        client = AsyncRedis.from_url(url)
        aq = AsyncPolicyQueue('bench_aio_otel', connection=client)
        await aq.enqueue(work, f'{tag}-aheld', policy=loner)
        for i in range(calls):
            start, used = time.perf_counter(), clock()
            await aq.enqueue(work, f'{tag}-a-{i}', policy=loner)
            out['async admitted'].append(time.perf_counter() - start)
            cpu['async admitted'].append(clock() - used)
            start, used = time.perf_counter(), clock()
            await aq.enqueue(work, f'{tag}-aheld', policy=loner)
            out['async dropped'].append(time.perf_counter() - start)
            cpu['async dropped'].append(clock() - used)
        await client.aclose()

    asyncio.run(main())
    out.update({f'{case} cpu': values for case, values in cpu.items()})
    return out


_ENABLE = """
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
import rq_policies.surfaces.otel

class Drop(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Drop()))
rq_policies.surfaces.otel.instrument(tracer_provider=provider, meter_provider=MeterProvider())
"""

#: What each mode's process runs before the doors: opentelemetry refused, imported but off, or on.
_MODES = {'not installed': _BLOCK, 'disabled': 'import opentelemetry.sdk.trace, rq_policies.otel\n', 'enabled': _ENABLE}


def _in_subprocess(mode: str, url: str, calls: int, tag: str) -> dict[str, list[float]]:
    """:func:`door_costs` in a fresh process of ``mode`` (each mode starts alike: same imports, same heap)."""
    code = ('import sys, json\n' + _MODES[mode] + f'sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n'
            'import aio as bench\n'
            f'out = bench.door_costs({url!r}, {calls}, {tag!r})\n')
    if mode == 'not installed':
        code += "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'opentelemetry was imported'\n"
    code += 'print(json.dumps(out))\n'
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f'the {mode} run failed:\n{done.stderr}')
    return json.loads(done.stdout.strip().splitlines()[-1])


def otel_costs(url: str, rounds: int, calls: int) -> None:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        print('\nOpenTelemetry SDK not installed: the OpenTelemetry cases are skipped')
        return
    conn = connect(url)
    samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in _MODES}
    for r in range(rounds):
        order = list(_MODES)
        if r % 2:
            order.reverse()
        for mode in order:
            conn.flushdb()
            for case, values in _in_subprocess(mode, url, calls, f'{mode[0]}{r}').items():
                samples[mode].setdefault(case, []).extend(values)
    print(f'\nOpenTelemetry per door ({rounds} rounds x {calls} calls, each mode in a fresh process): median us '
          '(p25 / p75), ratio to not installed;')
    print('"cpu" rows: the calling thread\'s CPU per call (what a loaded machine does not inflate as much)')
    print(f'{"door":20} {"not installed":>26} {"disabled":>30} {"enabled":>30}')
    for case in samples['not installed']:
        base = statistics.median(samples['not installed'][case])
        cells = []
        for mode in _MODES:
            values = samples[mode][case]
            q1, med, q3 = statistics.quantiles(values, n=4)
            cells.append(f'{med * 1e6:6.1f} ({q1 * 1e6:5.1f}/{q3 * 1e6:5.1f}) x{med / base:5.3f}')
        print(f'{case:20} {cells[0]:>26} {cells[1]:>30} {cells[2]:>30}')
    conn.flushdb()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--jobs', type=int, default=2000)
    parser.add_argument('--calls', type=int, default=300)
    parser.add_argument('--tasks', type=int, default=200, help='concurrent tasks (and threads) of the throughput part')
    parser.add_argument('--no-otel', action='store_true', help='the throughput part only')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, jobs=400, calls=10)
    with server_url() as url:
        throughput(url, opts.rounds, opts.jobs, opts.tasks)
        if opts.no_otel:
            return 0
        otel_costs(url, opts.rounds, opts.calls)
    return 0


if __name__ == '__main__':
    run_main(main)
