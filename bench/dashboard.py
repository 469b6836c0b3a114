"""What a dashboard page costs with 100,000 live identities (the issue's bound: <= 300 ms a page).

Loads 100,000 waiting loner markers on one queue, 10 capped and rate-limited queues with 5 live holds each, a few
throttle windows, and drop counters; then times, in interleaved rounds, through Flask's test client (the whole view:
Redis reads, rendering, no network):

* ``page``: the full page (``/``);
* ``partial``: what the live refresh fetches every few seconds (``/partial``);
* ``search``: the page narrowed to one queue (``/?q=bench3``), a SCAN with a MATCH;
* ``state.json``: the JSON endpoint;
* ``rq-dashboard queues.json``: rq-dashboard's own queue list on the same server (when rq-dashboard is installed),
  the reference the ratios are taken against: what an operator's page already costs.

Prints per variant the median in milliseconds, the 10th-90th percentile spread, and the ratio to the reference.

Usage: ``python bench/dashboard.py [--rounds N] [--identities N] [--smoke]``; uses REDIS_URL when set, else a
throwaway server. ``--smoke`` loads 10,000 identities and takes 3 rounds (CI: the bench still works).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import add_smoke, interleaved, run_main, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402

from rq_policies import PolicyQueue, QueueRate, QueueSlot, Throttle, UnknownQueueWarning  # noqa: E402
from rq_policies.engine import keys  # noqa: E402
from rq_policies.surfaces.dashboard import create_app  # noqa: E402

# A bench caps and limits fresh queues before their first job, on purpose.
warnings.simplefilter('ignore', UnknownQueueWarning)

QUEUES = [f'bench{i}' for i in range(10)]
TARGET_MS = 300.0


def load(conn: Redis, identities: int) -> None:
    conn.flushdb()
    with conn.pipeline(transaction=False) as pipe:
        for i in range(identities):
            pipe.set(keys.loner('many', f'{i:064x}'), f'job-{i}')
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
    for name in QUEUES:
        q = PolicyQueue(name, connection=conn)
        QueueSlot.set(name, 10, connection=conn)
        QueueRate.set(name, 100, 60, connection=conn)
        for i in range(5):
            QueueSlot.acquire(name, 10, token=f'bench-host:{i}:1:1', connection=conn)
        for i in range(3):
            q.enqueue('os.getcwd', i, policy=Throttle(600))
            q.enqueue('os.getcwd', i, policy=Throttle(600))  # a drop, for the chart


def reference(url: str):
    """rq-dashboard's queues.json on the same server, or None when rq-dashboard is not installed."""
    try:
        from rq_dashboard.cli import make_flask_app
        from rq_dashboard.web import setup_rq_connection
    except ImportError:
        return None
    app = make_flask_app(None, None, None, '/rq')
    app.config['RQ_DASHBOARD_REDIS_URL'] = url
    setup_rq_connection(app)
    client = app.test_client()
    return lambda _: _ok(client.get('/rq/0/data/queues.json'))


def _ok(response) -> None:
    assert response.status_code == 200, response.status_code
    response.close()


def run(url: str, rounds: int, identities: int) -> None:
    conn = Redis.from_url(url)
    load(conn, identities)
    client = create_app(conn).test_client()
    variants = {
        'page': lambda _: _ok(client.get('/')),
        'partial': lambda _: _ok(client.get('/partial')),
        'search': lambda _: _ok(client.get('/?q=bench3')),
        'state.json': lambda _: _ok(client.get('/state.json')),
    }
    stock = reference(url)
    if stock:
        variants['rq-dashboard queues.json'] = stock
    for call in variants.values():
        call(0)  # warm: script loads, template compilation
    samples = interleaved(variants, rounds, 5)
    print(f'{identities} loner identities, {len(QUEUES)} capped and rate-limited queues with 5 holds each')
    base = statistics.median(samples[stock and 'rq-dashboard queues.json' or 'page'])
    print(f'{"variant":28} {"median ms":>10} {"p10-p90 ms":>16} {"ratio":>7}')
    for name, values in samples.items():
        ordered = sorted(values)
        med = statistics.median(ordered) * 1e3
        low, high = ordered[len(ordered) // 10] * 1e3, ordered[(len(ordered) * 9) // 10] * 1e3
        print(f'{name:28} {med:10.1f} {f"{low:.1f}-{high:.1f}":>16} {med / (base * 1e3):7.2f}')
    page = statistics.median(samples['page']) * 1e3
    print(f'page median {page:.1f} ms, target <= {TARGET_MS:.0f} ms: {"ok" if page <= TARGET_MS else "MISSED"}')
    if not stock:
        print('(rq-dashboard is not installed: ratios are to the page itself)')
    conn.flushdb()
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=20)
    parser.add_argument('--identities', type=int, default=100_000)
    add_smoke(parser)
    args = parser.parse_args()
    smoke_defaults(args, rounds=3, identities=10_000)
    url = os.environ.get('REDIS_URL')
    if url:
        run(url, args.rounds, args.identities)
        return 0
    from rq_policies.surfaces.testing import RedisServer

    with RedisServer() as server:
        run(server.url, args.rounds, args.identities)
    return 0


if __name__ == '__main__':
    run_main(main)
