"""Enqueue cost of the policy doors against stock rq.Queue.enqueue, measured in one run.

    python bench/enqueue.py [--rounds 15] [--calls 200] [--markers 100000] [--smoke]

Each variant enqueues the same function with the same kind of arguments; rounds interleave the variants and the
figure is the median per-call time, printed as a ratio to stock `Queue.enqueue`. Targets (issue 9; issue 2's were
1.0 and 0.5): Loner admitted <= 0.65, Loner dropped (hinted: this process saw the identity dropped) <= 0.35, a cold
drop (no identity hint: on a queue where this function's enqueues are mostly dropped, the drop-rate predictor of
rq_policies/engine/admission.py sends it to the probe first) <= 0.5, and the admitted ratio unchanged (within 1.1) with
100,000 live markers of other identities. A second table gives each case's spread (p25 / p75 of wall time) and its
median client CPU per call against stock's. The ratios depend on the machine's load: stock makes two round trips where
a policy door makes one, so a loaded machine (each round trip slower) favours the policy doors.
Issue 13: each lock mode against today's Loner, printed as ratios:
`until='finished'` admitted and `on_conflict='replace'` (admitted, and replacing a waiting holder) within 1.1x of
Loner admitted; `on_conflict='raise'` (a DuplicateJob raised) as cheap as a drop (within 1.1x of Loner dropped).
``--smoke`` runs every case a few times (CI: the bench still works).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, connect, interleaved, report, run_main, server_url, smoke_defaults  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies import DuplicateJob, Loner, PolicyQueue  # noqa: E402

#: Issue 9's targets (issue 2's were 1.0 admitted and 0.5 dropped).
TARGETS = {'Loner admitted': 0.65, 'Loner dropped': 0.35, 'Loner dropped, cold': 0.5}


def with_cpu(variants: dict, cpu: dict[str, list[float]]) -> dict:
    """Each variant, also recording its per-call client CPU (``time.process_time``) into ``cpu``."""
    def wrap(name, call):
        record = cpu.setdefault(name, []).append

        def timed(i):
            start = time.process_time()
            call(i)
            record(time.process_time() - start)
        return timed
    return {name: wrap(name, call) for name, call in variants.items()}


def spread(samples: dict[str, list[float]], cpu: dict[str, list[float]], baseline: str) -> None:
    """Per variant: the interquartile range of its wall time, and its median client CPU against the baseline's."""
    base_cpu = statistics.median(cpu[baseline])
    print(f'\n{"variant":44} {"p25 us":>8} {"p75 us":>8} {"CPU us":>8} {"CPU ratio":>9}')
    for name, values in samples.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        mine = statistics.median(cpu[name])
        print(f'{name:44} {q1 * 1e6:8.1f} {q3 * 1e6:8.1f} {mine * 1e6:8.1f} {mine / base_cpu:9.3f}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=15)
    parser.add_argument('--calls', type=int, default=200)
    parser.add_argument('--markers', type=int, default=100_000)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=2, calls=20, markers=200)

    with server_url() as url:
        conn = connect(url)
        conn.flushdb()
        stock = Queue('bench_stock', connection=conn)
        pq = PolicyQueue('bench_policy', connection=conn)
        loner = Loner()
        pq.enqueue(work, 'held', policy=loner)  # the identity every "dropped" call collides with
        finished = Loner(until='finished')
        replace = Loner(on_conflict='replace')
        raising = Loner(on_conflict='raise')
        modes = PolicyQueue('bench_modes', connection=conn)
        modes.enqueue(work, 'held', policy=raising)
        modes.enqueue(work, 'waiting', policy=replace)  # the waiting holder every "replacing" call rewrites

        def raised(i):
            try:
                modes.enqueue(work, 'held', policy=raising)
            except DuplicateJob:
                return None
            raise AssertionError('Loner(on_conflict=raise) admitted a duplicate')

        def flush_lists():
            conn.delete(stock.key)

        # Identities held by jobs this process admitted but never saw dropped: no identity hint, so each first
        # duplicate is a cold drop (what a producer that has not seen the identity pays: the probe once the predictor
        # has seen most enqueues of the function there dropped, the full path with the job built before that).
        cold_queue = PolicyQueue('bench_cold', connection=conn)
        for n in range(opts.rounds * opts.calls):
            cold_queue.enqueue(work, f'cold-{n}', policy=loner)
        cold = iter(range(opts.rounds * opts.calls))

        variants = {
            'stock Queue.enqueue': lambda i: stock.enqueue(work, i),
            'Loner admitted': lambda i: pq.enqueue(work, i, policy=loner),
            'Loner dropped': lambda i: pq.enqueue(work, 'held', policy=loner),
            'Loner dropped, cold': lambda i: cold_queue.enqueue(work, f'cold-{next(cold)}', policy=loner),
            "Loner(until='finished') admitted": lambda i: modes.enqueue(work, i, policy=finished),
            "Loner(on_conflict='replace') admitted": lambda i: modes.enqueue(work, -1 - i, policy=replace),
            "Loner(on_conflict='replace') replacing": lambda i: modes.enqueue(work, 'waiting', policy=replace),
            "Loner(on_conflict='raise') raised": raised,
        }
        info = conn.info('server')
        version = info.get('valkey_version') or info.get('redis_version')
        print(f'server: {version}; {opts.rounds} rounds x {opts.calls} calls\n')
        cpu: dict[str, list[float]] = {}
        samples = interleaved(with_cpu(variants, cpu), opts.rounds, opts.calls, before_round=flush_lists)
        ratios = report(samples, 'stock Queue.enqueue', TARGETS)
        spread(samples, cpu, 'stock Queue.enqueue')
        print('\nlock modes against today\'s Loner (issue 13):')
        for name, base, target in (
            ("Loner(until='finished') admitted", 'Loner admitted', 1.1),
            ("Loner(on_conflict='replace') admitted", 'Loner admitted', 1.1),
            ("Loner(on_conflict='replace') replacing", 'Loner admitted', 1.1),
            ("Loner(on_conflict='raise') raised", 'Loner dropped', 1.1),
        ):
            ratio = ratios[name] / ratios[base]
            print(f'  {name:42} / {base:15} {ratio:.3f} (target <= {target}: {"ok" if ratio <= target else "MISSED"})')

        if opts.markers:
            print(f'\nfilling {opts.markers:,} live loner markers of other identities ...')
            filler = PolicyQueue('bench_filler', connection=conn)
            for i in range(opts.markers):
                filler.enqueue(work, f'filler-{i}', policy=loner)
            live = sum(1 for _ in conn.scan_iter('rq:policies:loner:bench_filler:*', count=10_000))
            print(f'live markers: {live:,}\n')
            samples = interleaved(
                {k: variants[k] for k in ('stock Queue.enqueue', 'Loner admitted')}, opts.rounds, opts.calls,
                before_round=flush_lists,
            )
            with_markers = report(samples, 'stock Queue.enqueue')
            drift = with_markers['Loner admitted'] / ratios['Loner admitted']
            print(f'\nadmitted ratio with {opts.markers:,} markers / without: {drift:.3f} (target <= 1.1: '
                  f'{"ok" if drift <= 1.1 else "MISSED"})')
        conn.flushdb()


if __name__ == '__main__':
    run_main(main)
