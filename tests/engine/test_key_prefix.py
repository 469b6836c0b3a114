"""rq's key prefix (``RQ_KEY_PREFIX``, rq 3) moves every key of rq-policies with rq's own; rq 2.12 ignores it.

rq reads the prefix once, when it is imported, so each check runs a process of its own with the variable set. The
whole suite runs under a prefix too: ``RQ_KEY_PREFIX='{app}' pytest`` (tests/conftest.py then checks, after every
test, that no key of rq's or of ours was written outside it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from redis import Redis

from rq_policies.engine.compat import RQ3


def _env(worker_env: dict, prefix: str) -> dict:
    env = dict(worker_env, RQ_KEY_PREFIX=prefix)
    return env


def test_every_key_of_ours_derives_from_rqs_prefix(worker_env):
    """keys.py's constants and builders, the prefixes the scripts get in ARGV, and rq's own, in a process where
    ``RQ_KEY_PREFIX='{app}'``."""
    probe = '''
import json
from rq.job import Job
from rq.queue import Queue
from rq.worker import Worker
from rq_policies.engine import keys
from rq_policies.engine.compat import KEY_PREFIX
from rq_policies.engine.keyed import keyed_args
from rq_policies.policies.loner.rules import Loner
from rq_policies.engine.ops import Call
built = [keys.CAPACITY, keys.RATE, keys.BACKOFF, keys.DROPS, keys.LAPSES, keys.DROPS_MINUTE_PREFIX, keys.KEY_DUE,
         keys.KEY_LIMITS, keys.KEY_RATES, keys.LCW_INDEX, keys.superseded('j'), keys.dropped('j'), keys.loner('q', 'd'),
         keys.throttle_prefix('q', 'd'), keys.trailing('q', 'd'), keys.debounce('q', 'd'), keys.holds('q'),
         keys.rate_tat('q'), keys.claim('t'), keys.alive('j'), keys.wake('q'), keys.woken('r'), keys.lcw_state('c'),
         keys.lcw_running('c'), keys.lcw_queued('c'), keys.lcw_finish('s'), keys.pushed('j'),
         keys.KEY_HOLDS_PREFIX, keys.KEY_PARKED_PREFIX, keys.KEY_BLOCK_PREFIX, keys.KEY_TAT_PREFIX,
         *keyed_args().values()]
call = Call('admit')
class Q:
    name = 'q'
part = Loner(until='finished').admit_part(call, Q(), 'd')
print(json.dumps({'prefix': KEY_PREFIX, 'ours': keys.PREFIX, 'built': built, 'loner_part': part,
                  'rq': [Job.redis_job_namespace_prefix, Queue.redis_queue_namespace_prefix,
                         Worker.redis_worker_namespace_prefix]}))
'''
    out = subprocess.run([sys.executable, '-c', probe], env=_env(worker_env, '{app}'), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    expected = '{app}' if RQ3 else 'rq'  # rq 2.12 has no prefix setting: nothing changes there
    assert found['prefix'] == expected
    assert found['ours'] == f'{expected}:policies:'
    assert all(key.startswith(f'{expected}:') for key in found['built'] + found['rq']), found
    assert all(key.startswith(f'{expected}:policies:') for key in found['built'] if ':policies:' in key)
    # the Lua side cannot know the prefix: the loner part carries the worker's and the liveness key's prefixes
    assert found['loner_part']['worker_prefix'] == f'{expected}:worker:'
    assert found['loner_part']['alive_prefix'] == f'{expected}:policies:alive:'


@pytest.mark.long
def test_a_run_under_a_prefix_writes_no_key_outside_it(worker_env, redis_url):
    """Every door, Loner, Throttle, Debounce, Concurrency, a cap, a rate, a forking PolicyWorker running them all,
    ``rq-policies info`` and the page's data, under ``RQ_KEY_PREFIX='{app}'``: then a SCAN of the whole server finds
    no key outside ``{app}:`` but the test jobs' own (``test:``). On rq 2.12 the same run stays under ``rq:``."""
    conn = Redis.from_url(redis_url)
    try:
        conn.flushdb()
        out = subprocess.run([sys.executable, '-m', 'tests.helpers.prefix_run'], env=_env(worker_env, '{app}'),
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-4000:]
        found = json.loads(out.stdout)
        head = '{app}:' if RQ3 else 'rq:'
        assert found['prefix'] == head + 'policies:' and found['job_key'] == head + 'job:x'
        assert found['worker'] == 0, found['worker_output']
        assert found['cli'] == 0, found['cli_output']
        statuses = found['statuses']
        dropped = {'loner': 1, 'throttle': 1}  # the second enqueue of each is dropped
        for name, seen in statuses.items():
            assert seen.count(None) == dropped.get(name, 0), (name, seen)
            assert all(s == 'finished' for s in seen if s is not None), (name, seen)
        # the debounced pair is one job (the second merged into the pending one), run once
        assert len(set(statuses['debounce'])) == 1
        info = json.loads(found['cli_output'])
        assert info['queues']['pfx']['drops'] == dropped and info['queues']['pfx-capped']['capacity'] == 1
        assert {'pfx', 'pfx-capped', 'pfx-rated'} <= set(found['page_queues'])
        stray = sorted(k.decode() for k in conn.scan_iter(count=1000)
                       if not k.decode().startswith((head, 'test:')))
        assert stray == []
        written = [k.decode() for k in conn.scan_iter(match=head + 'policies:*', count=1000)]
        assert written, 'the run wrote no key of ours at all'
    finally:
        conn.flushdb()
        conn.close()

