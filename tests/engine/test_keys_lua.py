"""Each key family's shape is written twice, in ``rq_policies/engine/keys.py`` and in ``lua/lib/keys.lua``: the two
build the same key from the same prefix, family by family, under rq's default prefix and under ``{app}``; and no
script builds a key of its own beside the library."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rq_policies.engine.compat import RQ3

LUA_ROOT = Path(__file__).resolve().parents[2] / 'lua'

#: Every family of ours (each ``keys.Space``, called with one part and two), the numbered ones, and rq's own that the
#: scripts extend (the job hash, its dependents and dependencies, a queue, the deferred registry, a worker), as
#: ``[family, prefix, parts, python's key]``; a numbered part is an integer.
PROBE = '''
import json
from redis import Redis
from rq.job import Job
from rq.queue import Queue
from rq.registry import DeferredJobRegistry
from rq.worker import Worker
from rq_policies.engine import keys
parts = ['q', 'a:b{x}\u00fc']
rows = []
for name, space in sorted(vars(keys).items()):
    if isinstance(space, keys.Space):
        rows += [[name, str(space), parts[:1], space(parts[0])], [name, str(space), parts, space(*parts)]]
window = keys.throttle_prefix('q:1', 'ab12')
rows += [['throttle window', window, [2951479051], keys.numbered(window, 2951479051)],
         ['drops-minute', str(keys.DROPS_MINUTE_PREFIX), [29514790], keys.numbered(keys.DROPS_MINUTE_PREFIX, 29514790)],
         ['rq job', Job.redis_job_namespace_prefix, ['j1'], Job.key_for('j1')],
         ['rq dependents', Job.redis_job_namespace_prefix, ['j1', 'dependents'], Job.dependents_key_for('j1')],
         ['rq dependencies', Job.redis_job_namespace_prefix, ['j1', 'dependencies'],
          Job('j1', connection=Redis()).dependencies_key],
         ['rq queue', Queue.redis_queue_namespace_prefix, ['q:1'], Queue('q:1', connection=Redis()).key],
         ['rq deferred', DeferredJobRegistry.key_template.format(''), ['q:1'],
          DeferredJobRegistry.key_template.format('q:1')],
         ['rq worker', Worker.redis_worker_namespace_prefix, ['w1'], Worker.redis_worker_namespace_prefix + 'w1']]
print(json.dumps({'rows': rows, 'families': sorted(n for n, v in vars(keys).items() if isinstance(v, keys.Space)),
                  'parse': keys.THROTTLE_KEYS.parse(keys.numbered(window, 2951479051))}))
'''

#: One row's key, built by lua/lib/keys.lua: ARGV = prefix, then the parts (a leading '#' marks a number).
LUA = '''
local parts = {}
for i = 2, #ARGV do
  parts[#parts + 1] = ARGV[i]
end
if string.sub(ARGV[2], 1, 1) == '#' then
  return key_num(ARGV[1], tonumber(string.sub(ARGV[2], 2)))
end
return key_of(ARGV[1], parts[1], parts[2])
'''


def _probe(worker_env: dict, prefix: str) -> dict:
    out = subprocess.run([sys.executable, '-c', PROBE], env=dict(worker_env, RQ_KEY_PREFIX=prefix),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _lua_key(connection, space: str, parts: list) -> str:
    args = [f'#{part}' if isinstance(part, int) else part for part in parts]
    return connection.eval((LUA_ROOT / 'lib' / 'keys.lua').read_text(encoding='utf-8') + LUA, 0, space, *args).decode()


@pytest.mark.parametrize('prefix', ['rq', '{app}'])
def test_python_and_lua_build_every_family_alike(connection, worker_env, prefix):
    found = _probe(worker_env, prefix)
    # The families the scripts build: a change that adds one to keys.py without a Space shows here.
    assert {'KEY_HOLDS_PREFIX', 'KEY_PARKED_PREFIX', 'KEY_BLOCK_PREFIX', 'KEY_UNITS_PREFIX', 'KEY_TAT_PREFIX',
            'SUPERSEDED_PREFIX', 'ALIVE_PREFIX', 'DROPS_MINUTE_PREFIX', 'FAIR_WAIT', 'FAIR_SEQ', 'FAIR_ACTIVE',
            'FAIR_PAUSED_IN', 'wake'} <= set(found['families'])
    for family, space, parts, python_key in found['rows']:
        if family == 'rq dependencies':
            continue  # rq's own spelling (rq:job::<id>:dependencies): tests/worker/test_promotion.py
        assert _lua_key(connection, space, parts) == python_key, (family, parts)
        assert python_key.startswith(space) and space.startswith(f'{prefix if RQ3 else "rq"}:'), (family, space)
    assert found['parse'] == ['q:1', 'ab12', '2951479051']


def test_no_script_builds_a_key_beside_the_library():
    """A key argument concatenated in a call, or a local built from a prefix by ``..``, outside lib/keys.lua."""
    inline = re.compile(r"(?:rcall|redis\.call)\('\w+', [^,()]*\.\.")
    built = re.compile(r'local \w+ = [\w.]*(?:prefix|kp|keyed|tomb|wake|waits|actives)\w*(?:\.\w+)? *\.\.')
    found = []
    for path in sorted([*LUA_ROOT.glob('*.lua'), *LUA_ROOT.glob('lib/*.lua'), *LUA_ROOT.glob('policies/*.lua')]):
        if path.name == 'keys.lua':
            continue
        for n, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
            code = line.split('--', 1)[0]
            if inline.search(code) or built.search(code):
                found.append(f'{path.relative_to(LUA_ROOT)}:{n}: {line.strip()}')
    assert not found, found

