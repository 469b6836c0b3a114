"""Throttle and Debounce enqueue costs as ratios against stock ``rq.Queue.enqueue``, and the throttle's memory check.

    python bench/enqueue_throttle.py [--rounds 10] [--calls 300] [--identities 100000]

One run, the cases interleaved call by call (so drift in the machine's load hits every case alike), the median of
per-call wall time per case, each divided by the median of stock ``rq.Queue.enqueue`` of the same function and
arguments. Targets from issue 3: throttle win <= 1.0, throttle drop <= 0.5.

Then the memory check: a burst of distinct identities claims their slots (the script ``Throttle.admit`` runs,
pipelined so the burst is short), and once the slot has ended no throttle key is left and the server's memory is
back where it started, with no reaper.

Starts a throwaway server (rq_policies.testing.RedisServer) unless REDIS_URL is set; a REDIS_URL database must be
empty, because the bench flushes it between rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import rq  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402
from throttle_bench_jobs import debounced, throttled, trailing  # noqa: E402

from rq_policies import PolicyQueue, Throttle, identity, keys, scripts  # noqa: E402
from rq_policies import throttle as throttle_module  # noqa: E402
from rq_policies.testing import RedisServer  # noqa: E402

TARGETS = {'throttle win': 1.0, 'throttle drop': 0.5}


def server_now(conn: Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def enqueue_costs(conn: Redis, rounds: int, calls: int) -> dict[str, list[float]]:
    stock = Queue('bench-stock', connection=conn)
    win_q = PolicyQueue('bench-win', connection=conn)
    drop_q = PolicyQueue('bench-drop', connection=conn)
    cold_q = PolicyQueue('bench-cold', connection=conn)
    trail_q = PolicyQueue('bench-trailing', connection=conn)
    deb_q = PolicyQueue('bench-debounce', connection=conn)
    counter = iter(range(10**9))
    cold_hint = throttle_module.hint_key(cold_q.name, throttled.__rq_policies__.get(Throttle).slot, throttled, (0,), {})

    def forget_cold_hint():
        throttle_module._hints.pop(cold_hint, None)

    cases = [
        ('stock Queue.enqueue', lambda i: stock.enqueue(throttled, next(counter)), None),
        ('throttle win', lambda i: win_q.enqueue(throttled, next(counter)), None),
        ('throttle drop', lambda i: drop_q.enqueue(throttled, 0), None),
        ('throttle drop, cold', lambda i: cold_q.enqueue(throttled, 0), forget_cold_hint),
        ('trailing replace', lambda i: trail_q.enqueue(trailing, 0, i), None),
        ('debounce replace', lambda i: deb_q.enqueue(debounced, 0, i), None),
    ]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for round_no in range(rounds + 1):
        conn.flushdb()
        throttle_module._hints.clear()
        # each round's setup (untimed): the slot winners, the first trailing and debounce jobs
        assert drop_q.enqueue(throttled, 0) is not None and cold_q.enqueue(throttled, 0) is not None
        trail_q.enqueue(trailing, 0, -1)
        deb_q.enqueue(debounced, 0, -1)
        for i in range(calls):
            # every case once per step, starting at a different case each step: load drift hits them alike
            for k in range(len(cases)):
                name, fn, before = cases[(i + k) % len(cases)]
                if before is not None:
                    before()
                start = time.perf_counter()
                fn(i)
                elapsed = time.perf_counter() - start
                if round_no:  # round 0 warms up (script loading, imports, connection)
                    samples[name].append(elapsed)
    # the drops really were drops and the replaces replaced
    assert drop_q.count == 1 and cold_q.count == 1, (drop_q.count, cold_q.count)
    assert trail_q.count == 1 and deb_q.count == 0
    return samples


def memory_check(conn: Redis, identities: int, slot: int) -> dict[str, float]:
    conn.flushdb()
    prefix_of = [keys.throttle_prefix('bench-memory', identity.digest('bench.burst', 'bench-memory', (i,), {}))
                 for i in range(identities)]
    base = conn.info('memory')['used_memory']
    # start just after a slot boundary so the whole burst lands in one or two slots
    while server_now(conn) % slot > 0.2:
        time.sleep(0.02)
    started = time.monotonic()
    admitted = 0
    for start in range(0, identities, 1000):
        with conn.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + 1000, identities)):
                scripts.run('throttle_slot', pipe, [prefix_of[i], f'rq:job:m{i}', '', '', '', keys.DROPS],
                            [f'm{i}', slot, 'N', 0, -1, '', '', 0, 'throttle:bench-memory', '', ''])
            admitted += sum(1 for code, *_ in pipe.execute() if code == 1)
    burst_seconds = time.monotonic() - started
    live = conn.info('keyspace').get('db0', {}).get('expires', 0)
    peak = conn.info('memory')['used_memory']
    last_end = (int(server_now(conn) // slot) + 1) * slot
    while server_now(conn) < last_end:
        time.sleep(0.05)
    ended = time.monotonic()
    while True:
        left_hidden = len(conn.keys('rq:policies:throttle:*'))
        left = conn.info('keyspace').get('db0', {}).get('expires', 0)
        if left == 0 or time.monotonic() - ended > 60:
            break
        time.sleep(0.1)
    return {
        'identities': identities, 'admitted': admitted, 'burst_seconds': burst_seconds, 'live_after_burst': live,
        'peak_mb': (peak - base) / 2**20, 'seconds_to_empty': time.monotonic() - ended, 'keys_left': left,
        'visible_keys_left': left_hidden, 'after_mb': (conn.info('memory')['used_memory'] - base) / 2**20,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=10)
    parser.add_argument('--calls', type=int, default=300, help='calls per case per round')
    parser.add_argument('--identities', type=int, default=100_000)
    parser.add_argument('--slot', type=int, default=20, help='slot width of the memory check, seconds')
    opts = parser.parse_args()

    server = None
    url = os.environ.get('REDIS_URL')
    if not url:
        server = RedisServer().start()
        url = server.url
    try:
        conn = Redis.from_url(url)
        if server is None and conn.dbsize():
            print(f'REDIS_URL {url} is not empty; the bench flushes its database: point it at an empty one')
            return 2
        version = conn.info('server')
        print(f'rq {rq.__version__}, server {version.get("valkey_version") or version.get("redis_version")}, '
              f'python {sys.version.split()[0]}; {opts.rounds} rounds x {opts.calls} calls per case, interleaved')
        samples = enqueue_costs(conn, opts.rounds, opts.calls)
        base = statistics.median(samples['stock Queue.enqueue'])
        print(f'\n{"case":<24}{"median":>12}{"ratio":>9}   target')
        missed = False
        for name, got in samples.items():
            median = statistics.median(got)
            ratio = median / base
            target = TARGETS.get(name)
            verdict = ''
            if target is not None:
                ok = ratio <= target
                missed |= not ok
                verdict = f'<= {target}  {"ok" if ok else "MISSED"}'
            print(f'{name:<24}{median * 1e6:>10.1f}us{ratio:>9.2f}   {verdict}')
        print('\n"throttle drop" is the common case, a process enqueuing an identity whose slot it has seen taken; '
              '"cold" is\na drop in a process that has not (the full admission script, with the job built).')

        mem = memory_check(conn, opts.identities, opts.slot)
        print(f'\nmemory: {mem["identities"]:,} distinct identities, slot={opts.slot}s: {mem["admitted"]:,} admitted '
              f'in {mem["burst_seconds"]:.1f}s; {mem["live_after_burst"]:,} slot keys live after the burst '
              f'(+{mem["peak_mb"]:.1f} MB)')
        print(f'        slot ended: {mem["keys_left"]} throttle keys left {mem["seconds_to_empty"]:.1f}s later '
              f'({mem["visible_keys_left"]} visible), memory {mem["after_mb"]:+.2f} MB against the start')
        missed |= mem['keys_left'] != 0
        conn.flushdb()
        return 1 if missed else 0
    finally:
        if server is not None:
            server.close()


if __name__ == '__main__':
    sys.exit(main())
