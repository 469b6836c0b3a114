"""The cost of Batch: a fetch on a queue with a Batch policy against an uncapped fetch, and a member's admission
against a plain Loner admission, in one run.

    python bench/batch.py [--rounds 15] [--calls 200] [--size 10] [--smoke]

Rounds interleave the variants of each table (the order reversed every other round); each variant's setup runs
before its block of calls, untimed; the figure is the median per-call wall time (client side: the round trip and
the script), with p25 / p75, printed as a ratio to the table's baseline.

Fetch (the real ``lua/fetch.lua`` call a PolicyWorker sends, a fresh claim token per call, built before its timer):

* ``uncapped fetch``: a queue of plain jobs, no policy state anywhere (the probe finds nothing: the baseline);
* ``fetch, a Batch key waiting``: the same queue while one Batch key has a member waiting for its ``max_wait`` (an
  hour): the fetch's state phase runs (the due index is read) and forms nothing;
* ``fetch forming a batch of SIZE``: one key with ``calls x SIZE`` members parked and due: each call forms one batch
  (takes SIZE members off the key, writes the batch job, pushes it) and takes it.

Admission (``PolicyQueue.enqueue``, the whole call):

* ``Loner admitted``: a new identity each call (the baseline);
* ``Batch member admitted``: parked on its key (one key, its batch not due: ``size`` above the calls);
* ``Batch member completing a batch``: every second call fills a batch of 2 (due now, the queue's idle workers
  woken).

``--smoke`` runs every case a few times (CI: the bench still works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, connect, run_main, server_url, smoke_defaults  # noqa: E402
from rq.queue import Queue  # noqa: E402

from rq_policies import Batch, Loner, PolicyQueue  # noqa: E402
from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.fetch import fetch_call  # noqa: E402
from rq_policies.policies.batch.rules import MAX_SIZE  # noqa: E402

#: A variant: its setup (untimed, before its block of calls) and, per call, what to time (built untimed).
Variant = tuple[Callable[[], object], Callable[[int], Callable[[], object]]]


def by_payload(args: tuple, kwargs: dict) -> str:
    """The bench's Batch key: the payload's ``key``."""
    return args[0]['key']


def rounds(variants: dict[str, Variant], count: int, calls: int) -> dict[str, list[float]]:
    """Per-call seconds of every variant, rounds interleaved (the order reversed every other round)."""
    import time

    samples: dict[str, list[float]] = {name: [] for name in variants}
    counter = itertools.count()
    for r in range(count):
        order = list(variants.items())
        if r % 2:
            order.reverse()
        for name, (setup, make) in order:
            setup()
            for _ in range(calls):
                run = make(next(counter))
                start = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - start)
    return samples


def table(samples: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(samples[baseline])
    print(f'{"variant":44} {"median us":>10} {"p25 us":>8} {"p75 us":>8} {"ratio":>7}')
    for name, values in samples.items():
        q1, med, q3 = statistics.quantiles(values, n=4)
        print(f'{name:44} {med * 1e6:10.1f} {q1 * 1e6:8.1f} {q3 * 1e6:8.1f} {med / base:7.3f}')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=15)
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--size', type=int, default=10)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, calls=10)
    size = opts.size

    with server_url() as url:
        conn = connect(url)
        conn.flushdb()
        q = PolicyQueue('bench_batch', connection=conn)
        queues = [Queue('bench_batch', connection=conn)]
        # never fills within a round (a round clears the server first, and enqueues fewer than MAX_SIZE members)
        waiting = Batch(key=by_payload, size=MAX_SIZE, max_wait=3600, scope='bench-wait')
        forming = Batch(key=by_payload, size=size, max_wait=3600, scope='bench-form')
        tokens = itertools.count()
        checks = {'taken': 0}

        def clear() -> None:
            conn.flushdb()

        def plain_jobs() -> None:
            clear()
            for i in range(opts.calls):
                q.enqueue(work, i)

        def one_key_waiting() -> None:
            plain_jobs()
            q.enqueue(work, {'key': 'w', 'n': 0}, policy=waiting)

        def members_due() -> None:
            clear()
            for i in range(opts.calls * size):
                q.enqueue(work, {'key': 'f', 'n': i}, policy=forming)

        def fetch(i: int) -> Callable[[], object]:
            call = fetch_call(queues, f'bench:{next(tokens)}', 90)

            def run() -> object:
                reply = call.run(conn)
                if reply and b'job' in reply:
                    checks['taken'] += 1
                return reply

            return run

        fetches: dict[str, Variant] = {
            'uncapped fetch': (plain_jobs, fetch),
            'fetch, a Batch key waiting': (one_key_waiting, fetch),
            f'fetch forming a batch of {size}': (members_due, fetch),
        }
        info = conn.info('server')
        print(f'server: {info.get("valkey_version") or info.get("redis_version")}; {opts.rounds} rounds x '
              f'{opts.calls} calls; batch size {size}\n')
        samples = rounds(fetches, opts.rounds, opts.calls)
        table(samples, 'uncapped fetch')
        expected_taken = opts.rounds * opts.calls * 3
        taken = checks['taken']

        # The check: every forming fetch of one more block formed a batch of `size` and took it.
        members_due()
        formed = 0
        for i in range(opts.calls):
            parked = keys.KEY_PARKED_PREFIX('batch', 'bench-form:f')
            before = conn.llen(parked)
            reply = fetch(i)()
            formed += before - conn.llen(parked) == size and reply is not None and b'job' in reply

        loner = Loner()
        pair = Batch(key=by_payload, size=2, max_wait=3600, scope='bench-pair')
        pairs = itertools.count()
        admissions: dict[str, Variant] = {
            'Loner admitted': (clear, lambda i: lambda: q.enqueue(work, i, policy=loner)),
            'Batch member admitted': (clear, lambda i: lambda: q.enqueue(work, {'key': 'w', 'n': i},
                                                                          policy=waiting)),
            'Batch member completing a batch': (clear, lambda i: lambda: q.enqueue(
                work, {'key': f'p{next(pairs) // 2}', 'n': i}, policy=pair)),
        }
        print()
        samples = rounds(admissions, opts.rounds, opts.calls)
        table(samples, 'Loner admitted')
        print(f'\ncheck: {taken} of {expected_taken} fetches took a job; {formed} of {opts.calls} forming fetches '
              f'formed a batch of {size} and took it')
        conn.flushdb()
        return 0 if taken == expected_taken and formed == opts.calls else 1


if __name__ == '__main__':
    run_main(main)
