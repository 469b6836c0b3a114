"""Where the fetch script's server time goes: ``lua/fetch.lua`` and variants of it, timed on the server.

    python bench/fetch_parts.py [--calls 2000] [--rounds 7] [--baseline PATH] [--smoke]

A Lua profile by timing variants (the server cannot profile inside a script): each variant is the real fetch call
(the same KEYS and ARGV a PolicyWorker sends, each call with a fresh claim token, on a queue of ready jobs, each
hash as rq's own enqueue writes it: 15 fields on rq 3, all of which the fetch reads)
against a script built from fetch.lua's own expanded source, cut or changed, loaded with SCRIPT LOAD and sent by
EVALSHA. Server time is each call's duration as the server's SLOWLOG records it (threshold 0: the script's commands
included), the median of a round's calls (a call the machine's other load preempted counts once, not by its length,
as it did in INFO commandstats' mean), rounds interleaved, the medians of the rounds and their range. Variants:

* ``return 0``: an EVALSHA that does nothing, with the same KEYS and ARGV (the floor: the command itself);
* ``probe``: the script up to its probe (one EXISTS over the claim record, the state keys and the scheduled
  registries), then stop;
* ``fetch``: the real script, uncapped queue without any policy state (the probe finds nothing: no part is defined,
  no clock read), and ``fetch, capped`` (QueueSlot on the queue: the gates, parts and holds run);
* ``fetch, Loner job``: uncapped, every job carrying a Loner marker (loner's ``taken`` hook runs);
* ``fetch, no claim record``: the real script without the claim record's SET (the replay guard; not a change to
  make, a price to know);
* ``floor: the 6 commands alone``: a script that runs only the uncapped fetch's EXISTS, LMOVE, HGETALL, SET (the
  claim record), HSET and EXPIRE (the take: issue 31) and answers the same reply, no other Lua: what any script
  doing that work costs on this server;
* with ``--baseline PATH`` (a checkout of another revision, e.g. ``git worktree add /tmp/base main``), that
  checkout's fetch script and call, uncapped and capped, timed in the same rounds: the before and after of a change;
  and then both scripts call by call in turn on one queue, each call's CPU read inside the script (``os.clock``):
  the per-pair differences show a change of a few us on a machine whose rounds move by tens.

Then the commands the real fetch runs per call (INFO commandstats' inner calls), and stock rq's fetch for scale: LMOVE
onto the intermediate list and the job's HGETALL, as its worker sends them (our fetch reads the job hash inside the
script and hands it to the worker, which reads it no more: the two rows do the same work). The ratios printed are to
that stock row; issue 23's targets are x3 uncapped and x4 capped.

SLOWLOG times a command's execution only. What the server spends on each round trip besides (reading the request,
parsing it, writing the reply: the event loop's system calls) is not in it, and stock rq's fetch makes two round trips
where ours makes one. So the fetch, the capped fetch, the Loner job's fetch and stock's are also measured as the
server process's CPU (INFO cpu's user and system seconds, before and after the same calls sent again on a queue
prepared afresh, with SLOWLOG off): the whole of what a fetched job costs the server, against the same targets. An
``EVALSHA`` that returns 0 times about as long in SLOWLOG as stock's whole fetch on an idle server, so the SLOWLOG
ratios cannot reach x3 with any script; the CPU ratios are the server's capacity. ``--smoke`` runs each variant a few
times (CI).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import add_smoke, run_main, server_url, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402
from rq import Queue  # noqa: E402

from rq_policies.engine import keys, scripts  # noqa: E402
from rq_policies.engine.fetch import fetch_call  # noqa: E402

QUEUE = 'parts'
STOCK = 'stock rq: LMOVE + HGETALL'
TARGETS = {'fetch': 3.0, 'fetch, capped': 4.0}
#: The variants whose server CPU per fetch (INFO cpu, every round trip's I/O included) is measured beside the SLOWLOG.
CPU = ('fetch', 'fetch, capped', 'fetch, Loner job', STOCK)


#: The uncapped fetch's six commands and its reply with no other Lua (one queue): what any script doing that work
#: costs on this server, the floor under the ``fetch`` row.
FLOOR = '''local found = redis.call('EXISTS', KEYS[1], unpack(KEYS, tonumber(ARGV[14])))
local jid = redis.call('LMOVE', KEYS[2], KEYS[3], 'LEFT', 'RIGHT')
local hash = redis.call('HGETALL', ARGV[7] .. jid)
redis.call('SET', KEYS[1], '1:1' .. #jid .. ':' .. jid, 'EX', ARGV[3])
redis.call('HSET', KEYS[4], jid, ARGV[1] .. ' ')
redis.call('EXPIRE', KEYS[4], 3600)
return {'queue', 1, 'job', jid, 'holds', {}, 'hash', hash}'''


def variants() -> dict[str, str]:
    full = scripts.source('fetch')
    probe = full.index('\n-- replay\n')
    record = "rcall('SET', claim_key, record, 'EX', ARGV[3])\n"
    if full.count(record) != 2:  # the plain pop's and took()'s
        raise RuntimeError('fetch.lua changed shape: the no-claim-record variant could not be built')
    return {
        'return 0': 'return 0',
        'probe': full[:probe] + '\nreturn 0',
        'fetch': full,
        'fetch, capped': full,
        'fetch, Loner job': full,
        'fetch, no claim record': full.replace(record, '\n'),
        'floor: the 6 commands alone': FLOOR,
    }


def job_hash(conn: Redis) -> dict:
    """The hash of a job as rq's own enqueue writes it (every field rq writes: the fetch's HGETALL reads them all)."""
    job = Queue(QUEUE, connection=conn).enqueue('bench_jobs.work', 'x' * 50, job_id='template')
    found = conn.hgetall(job.key)
    conn.flushdb()
    return found


def prepare(conn: Redis, label: str, calls: int) -> None:
    template = job_hash(conn)
    ids = [f'j{i}' for i in range(calls + 1)]
    with conn.pipeline(transaction=False) as pipe:
        for jid in ids:
            job = dict(template)
            if label.endswith('Loner job'):
                job[keys.LONER_FIELD] = keys.loner(QUEUE, jid)
                pipe.set(keys.loner(QUEUE, jid), jid)
            pipe.hset(f'rq:job:{jid}', mapping=job)
        pipe.rpush(f'rq:queue:{QUEUE}', *ids)
        if label.endswith('capped'):
            pipe.hset(keys.CAPACITY, QUEUE, 10**6)  # what QueueSlot.set writes (without its warning)
        pipe.execute()


def our_calls(calls: int, round_: int) -> list[tuple[list, list]]:
    call = fetch_call([Queue(QUEUE, connection=Redis())], 'bench:0', 90)
    out = []
    for i in range(calls + 1):
        token = f'bench:{round_}:{i}:1'
        call.set_key('claim', keys.claim(token))
        call.arg('token', token)
        out.append((list(call.keys), call.argv()))
    return out


_DUMP = '''
import base64, json, sys
from redis import Redis
from rq import Queue
from rq_policies.engine import keys, scripts
from rq_policies.engine.fetch import fetch_call
calls, round_ = int(sys.argv[1]), int(sys.argv[2])
out = []
for i in range(calls + 1):
    token = f'base:{round_}:{i}:1'
    call = fetch_call([Queue('parts', connection=Redis())], token, 90)
    call.set_key('claim', keys.claim(token))
    wire = [x if isinstance(x, bytes) else str(x).encode() for x in call.argv()]
    out.append([list(call.keys), [base64.b64encode(x).decode() for x in wire]])
print(json.dumps({'source': scripts.source('fetch'), 'calls': out}))
'''


def baseline_calls(path: str, calls: int, round_: int) -> tuple[str, list[tuple[list, list]]]:
    """The fetch script and calls of the checkout at ``path`` (its own Python builds them)."""
    env = dict(os.environ, PYTHONPATH=path)
    raw = json.loads(subprocess.check_output([sys.executable, '-c', _DUMP, str(calls), str(round_)], env=env,
                                             cwd=path))
    return raw['source'], [(k, [base64.b64decode(x) for x in a]) for k, a in raw['calls']]


def stock_fetches(conn: Redis, calls: int) -> None:
    """A stock worker's fetch, ``calls`` times: LMOVE onto the intermediate list, then the job's HGETALL."""
    for _ in range(calls):
        jid = conn.lmove(f'rq:queue:{QUEUE}', f'rq:queue:{QUEUE}:intermediate', 'LEFT', 'RIGHT')
        conn.hgetall(b'rq:job:' + jid)


def server_cpu(conn: Redis) -> float:
    """The server process's CPU seconds (user and system), as INFO cpu reports them."""
    found = conn.info('cpu')
    return float(found['used_cpu_user']) + float(found['used_cpu_sys'])


def cpu_per_call(conn: Redis, label: str, calls: int, send) -> float:
    """The server's CPU (us) per call of ``send``'s ``calls`` fetches, on a queue prepared afresh, SLOWLOG off (its
    entries cost the server too, one per top-level command: two for stock's fetch, one for a script)."""
    prepare(conn, label, calls)
    conn.config_set('slowlog-log-slower-than', -1)
    try:
        before = server_cpu(conn)
        send()
        return (server_cpu(conn) - before) / calls * 1e6
    finally:
        conn.config_set('slowlog-log-slower-than', 0)


#: The script's own CPU time, read with ``os.clock`` (the server process's CPU clock, which Lua scripts may read) at its
#: first line and where it builds a taken job's reply, sent back as the reply's last field: :func:`paired`.
_CLOCK_START = 'local rcall = redis.call\n'
_CLOCK_REPLIES = ("local reply = {'queue', i, 'job', jid, 'holds', {}, 'hash', hash}",
                  "local reply = {'queue', i, 'job', jid, 'holds', holds, 'hash', hash}")


def clocked(source: str) -> str:
    """``source`` answering, after a taken job's fields, ``'cpu'`` and the CPU seconds its call took so far."""
    if _CLOCK_START not in source or not any(reply in source for reply in _CLOCK_REPLIES):
        raise RuntimeError('fetch.lua changed shape: the paired comparison could not place its clock')
    source = source.replace(_CLOCK_START, 'local __clock = os.clock()\n' + _CLOCK_START, 1)
    for reply in _CLOCK_REPLIES:
        source = source.replace(reply, reply[:-1] + ", 'cpu', tostring(os.clock() - __clock)}")
    return source


def paired(conn: Redis, opts: argparse.Namespace, base_source: str) -> list[tuple[str, float, float, list[float]]]:
    """This fetch against the baseline's, call by call: one queue of twice ``--calls`` jobs popped by the two scripts
    in turn (this one, then the baseline's, each with a fresh claim token), each call's CPU read inside the script by
    ``os.clock``. The machine's slow drifts (another process, the host's other tenants) hit both halves of a pair
    alike, so the per-pair differences show a change of a few us that interleaved rounds of SLOWLOG medians cannot.
    Returns (variant, this us, baseline us, the per-pair differences) for the uncapped, capped and Loner-job fetch."""
    ours_sha, base_sha = conn.script_load(clocked(scripts.source('fetch'))), conn.script_load(clocked(base_source))
    rows = []
    for label in ('fetch', 'fetch, capped', 'fetch, Loner job'):
        this, base, diffs = [], [], []
        for r in range(opts.rounds):
            ours = our_calls(2 * opts.calls, 1000 + r)
            theirs = baseline_calls(opts.baseline, 2 * opts.calls, 1000 + r)[1]
            prepare(conn, label, 2 * opts.calls)
            for i in range(opts.calls):
                spent = []
                for sha, (keys_, argv) in ((ours_sha, ours[2 * i]), (base_sha, theirs[2 * i + 1])):
                    reply = conn.evalsha(sha, len(keys_), *keys_, *argv)
                    spent.append(float(reply[reply.index(b'cpu') + 1]) * 1e6)
                this.append(spent[0])
                base.append(spent[1])
                diffs.append(spent[1] - spent[0])
        rows.append((label, statistics.median(this), statistics.median(base), diffs))
    return rows


def durations(conn: Redis, calls: int) -> dict[bytes, list[int]]:
    """The SLOWLOG's durations (us) since its reset, by command name."""
    found: dict[bytes, list[int]] = {}
    for entry in conn.slowlog_get(2 * calls + 100):
        found.setdefault(entry['command'].split(b' ', 1)[0].upper(), []).append(entry['duration'])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--calls', type=int, default=2000)
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--baseline', help='a checkout of another revision: its fetch timed beside this one')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, calls=30, rounds=1)
    texts = variants()
    base_source = None
    if opts.baseline:
        base_source, _ = baseline_calls(opts.baseline, 0, 0)
        texts['baseline: fetch'] = base_source
        texts['baseline: fetch, capped'] = base_source
    samples: dict[str, list[float]] = {label: [] for label in texts}
    samples[STOCK] = []
    inner: dict[str, dict[str, float]] = {}
    cpu: dict[str, list[float]] = {label: [] for label in CPU}
    with server_url() as url:
        conn = Redis.from_url(url)
        info = conn.info('server')
        # Every command's duration, for the rounds' medians (a few more entries than a round's commands); a
        # REDIS_URL server gets its settings back at the end.
        kept = {name: conn.config_get(name)[name] for name in ('slowlog-log-slower-than', 'slowlog-max-len')}
        conn.config_set('slowlog-log-slower-than', 0)
        conn.config_set('slowlog-max-len', 2 * opts.calls + 100)
        print(f'server {info.get("valkey_version") or info.get("redis_version")}; {opts.calls} calls per variant, '
              f'{opts.rounds} rounds interleaved, a fresh claim token each call')
        for r in range(opts.rounds):
            ours = our_calls(opts.calls, r)
            base = baseline_calls(opts.baseline, opts.calls, r)[1] if opts.baseline else []
            order = [*texts, STOCK]
            if r % 2:
                order.reverse()
            for label in order:
                prepare(conn, label, opts.calls)
                if label == STOCK:
                    conn.config_resetstat()
                    conn.slowlog_reset()
                    stock_fetches(conn, opts.calls)
                    took = durations(conn, opts.calls)
                    samples[STOCK].append(statistics.median(took[b'LMOVE']) + statistics.median(took[b'HGETALL']))
                    if label in CPU:
                        cpu[label].append(cpu_per_call(conn, label, opts.calls,
                                                       lambda: stock_fetches(conn, opts.calls)))
                    continue
                sha = conn.script_load(texts[label])
                calls = base if label.startswith('baseline') else ours
                keys_, argv = calls[-1]
                conn.evalsha(sha, len(keys_), *keys_, *argv)  # warm (the last token: never used below)
                conn.config_resetstat()
                conn.slowlog_reset()
                for keys_, argv in calls[:opts.calls]:
                    conn.evalsha(sha, len(keys_), *keys_, *argv)
                stats = {k[len('cmdstat_'):]: v for k, v in conn.info('commandstats').items()}
                samples[label].append(statistics.median(durations(conn, opts.calls)[b'EVALSHA']))
                if r == 0:
                    inner[label] = {k: v['calls'] / opts.calls for k, v in stats.items()
                                    if k not in ('evalsha', 'config|resetstat', 'info', 'slowlog|reset')}
                if label in CPU:
                    def send(calls=calls, sha=sha):
                        for keys_, argv in calls[:opts.calls]:
                            conn.evalsha(sha, len(keys_), *keys_, *argv)
                    cpu[label].append(cpu_per_call(conn, label, opts.calls, send))
        paired_rows = paired(conn, opts, base_source) if base_source is not None else []
        for name, value in kept.items():
            conn.config_set(name, value)
        conn.slowlog_reset()
        conn.close()
    stock = statistics.median(samples[STOCK])
    print(f'\n{"variant":34} {"server us/call":>15} {"range":>17} {"x stock":>8}  target')
    for label, values in samples.items():
        ratio = statistics.median(values) / stock
        target = TARGETS.get(label)
        mark = '' if target is None else f'<= x{target:g} ' + ('ok' if ratio <= target else 'MISSED')
        print(f'{label:34} {statistics.median(values):15.1f} {min(values):8.1f}..{max(values):<8.1f} '
              f'{ratio:8.2f}  {mark}')
    if opts.baseline:
        for label in ('fetch', 'fetch, capped'):
            pairs = [b / a for a, b in zip(samples[label], samples[f'baseline: {label}'])]
            print(f'{label}: baseline / this, per round: median x{statistics.median(pairs):.2f} '
                  f'({min(pairs):.2f}..{max(pairs):.2f})')
    if paired_rows:
        print(f'\nthis fetch against the baseline\'s, call by call (the script\'s own CPU by os.clock, {opts.calls} '
              f'pairs a round, {opts.rounds} rounds; us, 1 us steps)')
        print(f'{"variant":34} {"this":>8} {"baseline":>9} {"baseline - this, median (mean)":>32}')
        for label, this, base, diffs in paired_rows:
            print(f'{label:34} {this:8.1f} {base:9.1f} {statistics.median(diffs):22.1f} ({statistics.mean(diffs):.1f})')
    print(f'\nthe server process\'s CPU per fetched job (INFO cpu: the commands, the script and each round trip\'s '
          f'reading, parsing and replying; SLOWLOG off), {opts.calls} calls a round')
    print(f'{"variant":34} {"CPU us/fetch":>15} {"range":>17} {"x stock, per round (range)":>27}  target')
    for label, values in cpu.items():
        per_round = [ours / stock for ours, stock in zip(values, cpu[STOCK])]
        ratio = statistics.median(per_round)
        target = TARGETS.get(label)
        mark = '' if target is None else f'<= x{target:g} ' + ('ok' if ratio <= target else 'MISSED')
        print(f'{label:34} {statistics.median(values):15.1f} {min(values):8.1f}..{max(values):<8.1f} '
              f'{ratio:11.2f} ({min(per_round):.2f}..{max(per_round):.2f})  {mark}')
    for label in ('fetch', 'fetch, capped', 'fetch, Loner job', *(['baseline: fetch'] if opts.baseline else [])):
        detail = ', '.join(f'{k} {v:.2f}' for k, v in sorted(inner[label].items(), key=lambda kv: -kv[1]))
        print(f'\ncommands run per call by "{label}": {detail}')
    return 0


if __name__ == '__main__':
    run_main(main)
