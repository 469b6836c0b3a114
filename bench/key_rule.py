"""A key's limit under two producers with different code: rq's own ``RateLimit(key, concurrency)`` against our
Concurrency with a scope rule (``Concurrency.set_rule(scope, Tiers(...))``), the same workload, rounds interleaved.

    python bench/key_rule.py [--rounds 3] [--jobs 8] [--workers 4] [--seconds 0.2] [--smoke]

Uses REDIS_URL when it is set (flushed between runs: point it at a scratch database), otherwise starts its own server.

The workload (tests/helpers/drift.py): producer A's code limits every key to 6, producer B's (a later release) to 1;
both enqueue ``--jobs`` jobs per key at once, in subprocesses, for three keys, while ``--workers`` forking workers run
them (``--seconds`` each): rq's Worker for rq's side, PolicyWorker for ours. The limit each key should have is the
rule's: premium:a 3, free:b 1, other 2. Each job records its start and end (server clock); the sweep over those
records counts, per key, the starts that found the key's limit already running (over-admissions) and the most
running at once. rq's side has no rule to state: each enqueue registers its own number (the last registrant wins
the release's refill) and the enqueue's promotion uses the job's own, so the key's limit drifts with whichever
producer enqueued last. Ours reads the rule in the fetch script; the numbers the producers declare do not count.
A third side, ``declared``, is ours without a rule (each job checked against the limit its own producer declared, as
before rules existed): no last-registrant drift, but a key runs up to the loosest producer's number.
Prints each round and the median over rounds; rq's side needs rq 3 (rq.rate_limit; rq 2.12 has none), else it is
skipped, saying so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import add_smoke, connect, run_main, server_url, smoke_defaults  # noqa: E402

from tests.helpers import drift, with_root  # noqa: E402


def has_rate_limit() -> bool:
    try:
        from rq.rate_limit import RateLimit  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--jobs', type=int, default=8, help='jobs per key per producer')
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--seconds', type=float, default=0.2, help='each job runs this long')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=1, jobs=2)
    sides = ['ours', 'declared', 'rq'] if has_rate_limit() else ['ours', 'declared']
    if 'rq' not in sides:
        print('this rq has no RateLimit (rq 3 has it): only our sides run')
    totals: dict[str, list[int]] = {side: [] for side in sides}
    peaks: dict[str, dict[str, list[int]]] = {side: {key: [] for key in drift.LIMITS} for side in sides}
    with server_url() as url:
        conn = connect(url)
        env = with_root(dict(os.environ, REDIS_URL=url))
        for r in range(opts.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                conn.flushdb()
                found = drift.run(side, conn, url, env, f'bench-{side}-{r}', per_producer=opts.jobs,
                                  seconds=opts.seconds, workers=opts.workers)
                result = drift.summary(found)
                totals[side].append(result['over_admitted'])
                for key, row in result['keys'].items():
                    peaks[side][key].append(row['max_running'])
                words = ', '.join(f'{key} max {row["max_running"]}/{row["limit"]} over {row["over_admitted"]}'
                                  for key, row in result['keys'].items())
                print(f'round {r + 1} {side:8}: {result["over_admitted"]} over-admitted starts ({words})')
        conn.flushdb()
    jobs = 2 * opts.jobs * len(drift.LIMITS)
    print(f'\n{jobs} jobs a round, {opts.workers} workers, {opts.rounds} rounds; median over rounds [min, max]')
    print(f'{"side":8} {"over-admitted starts":>22} ' + ' '.join(f'{key + " max running":>22}' for key in drift.LIMITS))
    for side in sides:
        cells = [f'{statistics.median(totals[side]):g} [{min(totals[side])}, {max(totals[side])}]']
        cells += [f'{statistics.median(v):g}/{drift.LIMITS[k]} [{min(v)}, {max(v)}]' for k, v in peaks[side].items()]
        print(f'{side:8} ' + ' '.join(f'{c:>22}' for c in cells))
    return 0


if __name__ == '__main__':
    run_main(main)
