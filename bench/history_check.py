"""The history checker's speed (issue 31: 1,000,000 events checked in at most 60 s): a simulated history of every
policy (tests/history/synth.py: producers, capped, rated, Fair and per-key queues, Loner, Throttle, enqueue_in, killed
horses and lost replies; a history that keeps every promise, so the checker walks every property to its end) is
written to a temporary folder, then checked as the command does (``python -m tests.history.check``), in this process.

    python bench/history_check.py [--events 1000000] [--rounds 3] [--smoke]

Each round first parses every line alone (``json.loads``, the floor any checker in Python pays), then reads, indexes
and checks the history; it prints both, events/s and the ratio check / parse; then the medians and spread over the
rounds, and the median against the issue's 60 s (scaled to the size asked for). Nothing here needs a server.
``--smoke`` checks 20,000 events once: CI's proof that the bench runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import add_smoke, run_main, smoke_defaults  # noqa: E402

from tests.history import check  # noqa: E402
from tests.history.synth import simulate  # noqa: E402

#: The issue's budget: seconds per 1,000,000 events.
BUDGET = 60.0


def parse_only(folder: Path) -> float:
    """Seconds to parse every line of the history and nothing more."""
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        events = []
        for path in sorted(folder.glob('*.jsonl')):
            with path.open('rb') as handle:
                events += [json.loads(line) for line in handle]
        return time.perf_counter() - began
    finally:
        del events
        gc.enable()


def one_round(folder: Path) -> tuple[float, float, int, bool]:
    """Read and check the history as ``main`` does (the collector off while loading); seconds to read, seconds to
    check, events, and whether every property held."""
    gc.collect()
    gc.disable()
    try:
        began = time.perf_counter()
        ix = check.read_history(folder, check.load_bounds(None))
        read = time.perf_counter()
        results = check.check(ix)
        done = time.perf_counter()
    finally:
        gc.enable()
    return read - began, done - read, len(ix.events), all(r.ok for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--events', type=int, default=1_000_000, help='events in the simulated history')
    parser.add_argument('--rounds', type=int, default=3, help='times the same history is checked')
    parser.add_argument('--seed', type=int, default=1)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, events=20_000, rounds=1)
    with tempfile.TemporaryDirectory(prefix='history-bench-') as tmp:
        began = time.perf_counter()
        history = simulate(opts.events, seed=opts.seed)
        folder = history.write(Path(tmp) / 'history')
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f'simulated {len(history):,} events ({size / 1e6:.0f} MB in {len(history.files)} files) in '
              f'{time.perf_counter() - began:.1f} s')
        del history
        totals, ratios = [], []
        for n in range(opts.rounds):
            floor = parse_only(folder)
            read, checked, events, ok = one_round(folder)
            total = read + checked
            totals.append(total)
            ratios.append(total / floor)
            print(f'round {n + 1}: parse alone {floor:.1f} s; read and index {read:.1f} s, properties {checked:.1f} s, '
                  f'total {total:.1f} s ({events / total:,.0f} events/s, x{total / floor:.2f} the parse), every '
                  f'property ' + ('held' if ok else 'NOT held'))
            if not ok:
                print('a simulated history that keeps every promise was flagged: a false alarm of the checker')
                return 1
    median = statistics.median(totals)
    spread = max(totals) - min(totals)
    budget = BUDGET * events / 1_000_000
    print(f'median {median:.1f} s (spread {spread:.1f} s over {len(totals)} round(s)), '
          f'{events / median:,.0f} events/s, '
          f'x{statistics.median(ratios):.2f} the parse alone; budget {budget:.1f} s for {events:,} events (60 s a '
          f'million): ratio {median / budget:.2f}' + (' within' if median <= budget else ' OVER'))
    return 0


if __name__ == '__main__':
    run_main(main)
