"""Where the fetch script's server time goes: ``lua/fetch.lua`` and variants of it, timed on the server.

    python bench/fetch_parts.py [--calls 2000] [--rounds 7] [--smoke]

A Lua profile by timing variants (the server cannot profile inside a script): each variant is the real fetch call
(the same KEYS and ARGV a PolicyWorker sends, each call with a fresh claim token, on a queue of ready job ids)
against a script built from fetch.lua's own expanded source, cut or changed, loaded with SCRIPT LOAD and sent by
EVALSHA. Server time is INFO commandstats' usec of EVALSHA per call (the script's commands included), rounds
interleaved, medians and range. Variants:

* ``return 0``: an EVALSHA that does nothing, with the same ARGV (the floor: the command itself);
* ``decode``: codec.lua and ``decode_args`` only (msgpack, one map of about 20 entries);
* ``prologue``: decode, the claim record's GET, then stop before any policy part is defined;
* ``prologue + every part defined``: the same, after ``-- @policies`` defined every policy's part (about 80
  closures, which every fetch defines whether its queues use them or not);
* ``fetch``: the real script, uncapped queue, and ``fetch, capped`` (QueueSlot on the queue);
* ``fetch, parts lazily``: the real script with each part defined when first used (admit.lua's ``@policies lazy``;
  loner's ``taken`` hook loaded always), to size what that change would save;
* ``fetch, no claim record``: the real script without the claim record's GET and SET (the replay guard; not a
  change to make, a price to know).

Then the commands the real fetch runs per call (INFO commandstats' inner calls: the keys read per queue), and stock
rq's fetch commands for scale (LMOVE onto the intermediate list and the job's HGETALL, as its worker sends them).
``--smoke`` runs each variant a few times (CI).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import add_smoke, run_main, server_url, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies import QueueSlot, keys, scripts  # noqa: E402
from rq_policies.fetch import fetch_call  # noqa: E402

LAZY_LOADER = '''local PARTS = {}
-- @policies lazy
setmetatable(P, {__index = function(t, name)
  local load = PARTS[name]
  if load then
    PARTS[name] = nil
    load()
  end
  return rawget(t, name)
end})
'''


def _lazy_source() -> str:
    """fetch.lua with its parts defined lazily (expanded by scripts.source from a copy of lua/)."""
    root = scripts._lua_root()
    folder = Path(tempfile.mkdtemp(prefix='fetch-lazy-'))
    try:
        shutil.copytree(str(root), str(folder / 'lua'))
        text = (folder / 'lua' / 'fetch.lua').read_text()
        text = text.replace('local P = {}\n-- @policies\n', 'local P = {}\n' + LAZY_LOADER, 1)
        text = text.replace('for name, part in pairs(P) do\n  if part.taken then',
                            "for _, name in ipairs({'loner'}) do\n  local part = P[name]\n  if part.taken then", 1)
        if 'LAZY' in text or '@policies lazy' not in text or "ipairs({'loner'})" not in text:
            raise RuntimeError('fetch.lua changed shape: the lazy variant could not be built')
        (folder / 'lua' / 'fetch_lazy.lua').write_text(text)
        original = scripts._lua_root
        scripts._lua_root = lambda: folder / 'lua'
        try:
            return scripts.source.__wrapped__('fetch_lazy')
        finally:
            scripts._lua_root = original
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def variants() -> dict[str, str]:
    full = scripts.source('fetch')
    before_parts = full.index('local P = {}')
    after_parts = full.index('-- The hooks that exist')
    decoded = full.index('local claim_key')
    no_claim = full.replace("local recorded = rcall('GET', claim_key)", 'local recorded = nil', 1).replace(
        "rcall('SET', claim_key, record(reply), 'EX', a.claim_ttl)", '', 1)
    if no_claim.count('claim_key') != full.count('claim_key') - 2:
        raise RuntimeError('fetch.lua changed shape: the no-claim-record variant could not be built')
    return {
        'return 0': 'return 0',
        'decode': full[:decoded] + '\nreturn 0',
        'prologue (decode, claim GET)': full[:before_parts] + '\nreturn 0',
        'prologue + every part defined': full[:after_parts] + '\nreturn 0',
        'fetch': full,
        'fetch, capped': full,
        'fetch, parts lazily': _lazy_source(),
        'fetch, no claim record': no_claim,
    }


def prepare(conn: Redis, label: str, calls: int):
    conn.flushdb()
    name = 'parts'
    ids = [f'j{i}' for i in range(calls + 1)]
    with conn.pipeline(transaction=False) as pipe:
        for jid in ids:
            pipe.hset(f'rq:job:{jid}', mapping={'status': 'queued', 'origin': name})
        pipe.rpush(f'rq:queue:{name}', *ids)
        pipe.execute()
    if label.endswith('capped'):
        QueueSlot.set(name, 10**6, connection=conn)
    return fetch_call([Queue(name, connection=conn)], 'bench:0', 90)


def fresh(call, r: int, i: int):
    token = f'bench:{r}:{i}:1'
    call.set_key('claim', keys.claim(token))
    call.arg('token', token)
    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--calls', type=int, default=2000)
    parser.add_argument('--rounds', type=int, default=7)
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, calls=30, rounds=1)
    texts = variants()
    samples: dict[str, list[float]] = {label: [] for label in texts}
    inner: dict[str, dict[str, float]] = {}
    with server_url() as url:
        conn = Redis.from_url(url)
        info = conn.info('server')
        print(f'server {info.get("valkey_version") or info.get("redis_version")}; {opts.calls} calls per variant, '
              f'{opts.rounds} rounds interleaved, a fresh claim token each call')
        shas = {label: conn.script_load(text) for label, text in texts.items()}
        for r in range(opts.rounds):
            order = list(texts) if r % 2 == 0 else list(reversed(texts))
            for label in order:
                call = prepare(conn, label, opts.calls)
                argv = [*call.keys]
                conn.evalsha(shas[label], len(call.keys), *argv, *fresh(call, r, -1).argv())  # warm
                conn.config_resetstat()
                for i in range(opts.calls):
                    fresh(call, r, i)
                    conn.evalsha(shas[label], len(call.keys), *call.keys, *call.argv())
                stats = {k[len('cmdstat_'):]: v for k, v in conn.info('commandstats').items()}
                samples[label].append(stats['evalsha']['usec'] / stats['evalsha']['calls'])
                if r == 0:
                    inner[label] = {k: v['calls'] / opts.calls for k, v in stats.items()
                                    if k not in ('evalsha', 'config|resetstat', 'info')}
            # stock rq's fetch commands, for scale: LMOVE to the intermediate list, then HGETALL of the job
            conn.flushdb()
            prepare(conn, 'stock', opts.calls)
            conn.config_resetstat()
            for _ in range(opts.calls):
                jid = conn.lmove('rq:queue:parts', 'rq:queue:parts:intermediate', 'LEFT', 'RIGHT')
                conn.hgetall(b'rq:job:' + jid)
            stats = {k[len('cmdstat_'):]: v for k, v in conn.info('commandstats').items()}
            samples.setdefault('stock rq: LMOVE + HGETALL', []).append(
                (stats['lmove']['usec'] + stats['hgetall']['usec']) / opts.calls)
    base = statistics.median(samples['stock rq: LMOVE + HGETALL'])
    print(f'\n{"variant":34} {"server us/call":>15} {"range":>17} {"x stock":>8}')
    for label, values in samples.items():
        print(f'{label:34} {statistics.median(values):15.1f} {min(values):8.1f}..{max(values):<8.1f} '
              f'{statistics.median(values) / base:8.2f}')
    for label in ('fetch', 'fetch, capped'):
        detail = ', '.join(f'{k} {v:.2f}' for k, v in sorted(inner[label].items(), key=lambda kv: -kv[1]))
        print(f'\ncommands run per call by "{label}": {detail}')
    return 0


if __name__ == '__main__':
    run_main(main)
