"""Where the admission script's server time goes: ``lua/admit.lua`` and cuts of it, timed on the server.

    python bench/admit_parts.py [--calls 300] [--rounds 9] [--smoke]

A Lua profile by timing variants, as ``bench/fetch_parts.py`` does for the fetch: the real call of a Loner enqueue
(its KEYS and ARGV as ``PolicyQueue.enqueue(f, x, policy=Loner())`` builds them for ``lua/admit.lua``, and for the
narrow script, captured once), sent again with a
fresh job id, creation time, job key and marker key on every call (so every call is a first admission, never a
replay), against scripts built from admit.lua's own expanded source, cut after one of its steps, loaded with SCRIPT
LOAD and sent by EVALSHA. Server time is each call's duration as SLOWLOG records it, the median of a round's calls,
rounds interleaved; the medians of the rounds and their range. Variants:

* ``return 0``: an EVALSHA that does nothing, with the same KEYS and ARGV (the command itself);
* ``includes``: the script's shared functions defined (lib/*.lua included above the decode), then stop;
* ``decode``: ... and ARGV[1] decoded (cmsgpack), then stop;
* ``cmsgpack alone``: only the decode, nothing defined;
* ``parts and ctx``: ... and the policy parts' loaders, the clock loop (which loads each declared part) and the
  call's context built, then stop: the fixed cost every admission pays before a policy decides;
* ``admit, no policy``: the real script with the call's policy list emptied (PolicyQueue's plain enqueue);
* ``admit, Loner``: the real script, a first admission;
* ``return 0, flat ARGV``: an EVALSHA that does nothing, with the narrow script's KEYS and flat ARGV;
* ``narrow, no policy`` and ``narrow, Loner``: ``lua/admit_narrow.lua``, which the doors send these two calls to
  (rq_policies.engine.admission.narrow_call), with the real plain and Loner calls' flat ARGV, a first admission each;
* ``admit, Loner probe`` and ``narrow, Loner probe``: the hinted drop's probe (checks only) of a held identity, as
  ``lua/admit.lua`` took it and as the narrow script takes it now (rq_policies.engine.admission.probe_call): a drop
  each.

The admit.lua rows are what those calls cost before the narrow script (and what every other call still costs).

With ``--baseline PATH`` (a checkout of another revision whose calls have the same KEYS and ARGV, e.g. ``git worktree
add /tmp/base main``), its admit.lua and admit_narrow.lua, as its own Python expands them, are timed beside these
with the same calls, rounds interleaved, and the per-round ratios baseline / this printed.

It answers what a cheaper admission would cut first (issue 23's target: a Loner admission's script at most
BullMQ's deduplicated add, ``bench/bullmq.py``). ``--smoke`` runs each variant a few times (CI).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import msgpack  # noqa: E402
from bench_jobs import work  # noqa: E402
from common import add_smoke, run_main, server_url, smoke_defaults  # noqa: E402
from redis import Redis  # noqa: E402

from rq_policies import Loner, PolicyQueue  # noqa: E402
from rq_policies.engine import admission, identity, keys, scripts  # noqa: E402
from rq_policies.engine.policy import make_set  # noqa: E402

_pack = msgpack.Packer(use_bin_type=False, autoreset=True).pack


def captured_call(conn: Redis, narrow: bool = False, plain: bool = False) -> tuple[str, list[str], object]:
    """The script name, KEYS and arguments of one real Loner admission (``plain``: of one without a policy): the call
    ``lua/admit.lua`` gets (its ARGV[1] decoded), or with ``narrow`` the one ``lua/admit_narrow.lua`` gets (its flat
    ARGV)."""
    seen: list[tuple[str, list, list]] = []
    real, leased, real_narrow = scripts.run, scripts.run_leased, admission.narrow_call

    def spy(name, client, call_keys, argv, *rest):
        seen.append((name, list(call_keys), list(argv)))
        return real(name, client, call_keys, argv)

    scripts.run = scripts.run_leased = spy
    if not narrow:
        admission.narrow_call = lambda *args, **kwargs: None
    try:
        PolicyQueue('parts', connection=conn).enqueue(work, 'captured', policy=None if plain else Loner())
    finally:
        scripts.run, scripts.run_leased, admission.narrow_call = real, leased, real_narrow
    name, call_keys, argv = next(entry for entry in seen if entry[0].startswith('admit'))
    if narrow:
        return name, call_keys, argv
    return name, call_keys, msgpack.unpackb(argv[0], raw=True, strict_map_key=False)


def fresh(call_keys: list[str], args: dict, plain: bool) -> tuple[list[str], bytes]:
    """The captured call as a first admission: a new job id, creation time, job key and marker key."""
    a = copy.deepcopy(args)
    jid = str(uuid.uuid4()).encode()
    created = f'{time.time_ns()}'.encode() + jid[:8]
    a[b'jid'], a[b'created'] = jid, created
    fields = list(a[b'fields'])
    fields[fields.index(b'created_at') + 1] = created
    a[b'fields'] = fields
    k = list(call_keys)
    index = {name.decode(): i - 1 for name, i in a[b'k'].items()}
    k[index['job']] = k[index['job']].rsplit(':', 1)[0] + ':' + jid.decode()
    k[index['loner.marker']] = keys.PREFIX + 'bench-marker:' + jid.decode()
    if plain:
        a[b'order'] = []
    return k, _pack(a)


def fresh_flat(call_keys: list[str], args: list) -> tuple[list[str], list]:
    """A captured narrow call (flat ARGV) as a first admission: a new job id, creation time, job key (and marker)."""
    a = [item.encode() if isinstance(item, str) else item for item in args]
    jid = str(uuid.uuid4()).encode()
    created = f'{time.time_ns()}'.encode() + jid[:8]
    a[0], a[1] = jid, created
    a[a.index(b'created_at') + 1] = created
    k = list(call_keys)
    k[0] = k[0].rsplit(':', 1)[0] + ':' + jid.decode()
    if len(k) > 3:
        k[3] = keys.PREFIX + 'bench-marker:' + jid.decode()
    return k, a


#: The variants timed beside the baseline's with ``--baseline``.
COMPARED = ('admit, no policy', 'admit, Loner', 'narrow, no policy', 'narrow, Loner', 'admit, Loner probe',
            'narrow, Loner probe')


def variants(source: str, narrow: str) -> dict[str, tuple[str, str]]:
    """label -> (script source, call: 'loner' or 'plain' (admit.lua's), 'flat' or 'flat plain' (the narrow one's))."""
    decode = source.index('local a = decode_args(ARGV[1])')
    ctx_done = source.index('local order = a.order')
    return {
        'return 0': ('return 0', 'loner'),
        'includes': (source[:decode] + 'return 0\n', 'loner'),
        'cmsgpack alone': ('local a = cmsgpack.unpack(ARGV[1])\nreturn 0\n', 'loner'),
        'decode': (source[:decode] + 'local a = decode_args(ARGV[1])\nreturn 0\n', 'loner'),
        'parts and ctx': (source[:ctx_done] + 'return 0\n', 'loner'),
        'admit, no policy': (source, 'plain'),
        'admit, Loner': (source, 'loner'),
        'return 0, flat ARGV': ('return 0', 'flat'),
        'narrow, no policy': (narrow, 'flat plain'),
        'narrow, Loner': (narrow, 'flat'),
        'admit, Loner probe': (source, 'probe'),
        'narrow, Loner probe': (narrow, 'flat probe'),
    }


def timed(conn: Redis, sha: str, captured: dict, kind: str, calls: int) -> float:
    conn.slowlog_reset()
    for _ in range(calls):
        if kind in ('probe', 'flat probe'):
            k, argv = captured[kind]
            conn.evalsha(sha, len(k), *k, *argv)
        elif kind.startswith('flat'):
            k, argv = fresh_flat(*captured[kind])
            conn.evalsha(sha, len(k), *k, *argv)
        else:
            k, packed = fresh(*captured['loner'], kind == 'plain')
            conn.evalsha(sha, len(k), *k, packed)
    found = [entry['duration'] for entry in conn.slowlog_get(calls + 100)
             if entry['command'].split(b' ', 1)[0].upper() == b'EVALSHA']
    return statistics.median(found)


def probe_calls(conn: Redis) -> dict[str, tuple[list[str], list]]:
    """The hinted drop's probe of one identity (held by :func:`hold`): admit.lua's call and the narrow script's."""
    q = PolicyQueue('parts', connection=conn)
    spec = make_set(Loner())
    job = q.create_job(work, args=('held',))
    digest = identity.digest(identity.func_path(job), q.name, job.args, job.kwargs, spec.unique_context,
                             spec.policies)
    full = admission._policy_call(q, spec, digest, jid='', mode='N', score=0, ttl=-1, queue_key=q.key, probe=True)
    narrow = admission.probe_call(q, spec, digest)
    return {'probe': (full.keys, full.argv()), 'flat probe': (narrow.keys, narrow.args)}


def hold(conn: Redis) -> None:
    """The identity the probes find held (a queued job of it)."""
    assert PolicyQueue('parts', connection=conn).enqueue(work, 'held', policy=Loner()) is not None


def text(name: str, baseline: str | None = None) -> str:
    """Script ``name`` as this checkout loads it, or as the checkout at ``baseline`` does (its own Python)."""
    if baseline:
        dump = ('import sys; from rq_policies.engine import scripts; s = scripts.script(sys.argv[1]).script; '
                'sys.stdout.write(s.decode() if isinstance(s, bytes) else s)')
        return subprocess.check_output([sys.executable, '-c', dump, name], cwd=baseline, text=True,
                                       env=dict(os.environ, PYTHONPATH=baseline))
    source = scripts.script(name).script
    return source.decode() if isinstance(source, bytes) else source


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--calls', type=int, default=300)
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--baseline', help='a checkout of another revision: its scripts timed beside these')
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, calls=20, rounds=1)
    with server_url() as url:
        conn = Redis.from_url(url)
        try:
            info = conn.info('server')
            _, call_keys, args = captured_call(conn)
            captured = {'loner': (call_keys, args), 'flat': captured_call(conn, narrow=True)[1:],
                        'flat plain': captured_call(conn, narrow=True, plain=True)[1:], **probe_calls(conn)}
            texts = variants(text('admit'), text('admit_narrow'))
            if opts.baseline:
                base = variants(text('admit', opts.baseline), text('admit_narrow', opts.baseline))
                # Each baseline variant right after this one's, in every round.
                texts = {name: body for label, this in texts.items() for name, body in
                         ((label, this), *([(f'baseline: {label}', base[label])] if label in COMPARED else []))}
            shas = {label: conn.script_load(body) for label, (body, _) in texts.items()}
            kept = {name: conn.config_get(name)[name] for name in ('slowlog-log-slower-than', 'slowlog-max-len')}
            conn.config_set('slowlog-log-slower-than', 0)
            conn.config_set('slowlog-max-len', opts.calls + 100)
            samples: dict[str, list[float]] = {label: [] for label in texts}
            try:
                for _ in range(opts.rounds):
                    hold(conn)
                    for label, (_, kind) in texts.items():
                        samples[label].append(timed(conn, shas[label], captured, kind, opts.calls))
                    conn.flushdb()
            finally:
                for name, value in kept.items():
                    conn.config_set(name, value)
        finally:
            conn.close()
    print(f'server {info.get("valkey_version") or info.get("redis_version")}; {opts.calls} calls a variant, '
          f'{opts.rounds} rounds interleaved; SLOWLOG median of a round, then median of the rounds (range)\n')
    whole = statistics.median(samples['admit, Loner'])
    for label, values in samples.items():
        median = statistics.median(values)
        print(f'{label:32} {median:7.1f} us  ({min(values):.1f}..{max(values):.1f})  {median / whole:6.0%} of a Loner '
              f'admission')
    print('\nper round, narrow / admit.lua (median, range):')
    for narrow, full in (('narrow, Loner', 'admit, Loner'), ('narrow, no policy', 'admit, no policy'),
                         ('narrow, Loner probe', 'admit, Loner probe')):
        ratios = [a / b for a, b in zip(samples[narrow], samples[full])]
        print(f'  {narrow:20} x{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})')
    if opts.baseline:
        print('\nper round, baseline / this (median, range):')
        for label in COMPARED:
            ratios = [b / a for a, b in zip(samples[label], samples[f'baseline: {label}'])]
            print(f'  {label:20} x{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})')
    return 0


if __name__ == '__main__':
    run_main(main)
