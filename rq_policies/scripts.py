"""Loading the Lua scripts in ``lua/`` and running them by EVALSHA.

Each script is read once from the package, its ``-- @include "lib/x.lua"`` lines expanded (BullMQ's
convention, so shared snippets such as the job-hash write live in one file), and kept as redis-py's ``Script`` (its
source and SHA1).

A direct call runs EVALSHA and, when the server answers NOSCRIPT (its cache was flushed, or it restarted or failed
over), EVAL with the source, which loads the script and runs it in one command: no SCRIPT FLUSH landing between a
SCRIPT LOAD and the EVALSHA after it (redis-py's own fallback) can make the call fail, and NOSCRIPT means the script
did not run, so sending it again is safe. A call riding a pipeline is sent as EVAL: redis-py would load the pipeline's
scripts first and then send it, and a flush in between made ``execute()`` raise after the pipeline's other commands
had run (the worker's heartbeat, where rq itself executes the pipeline). Scripts that ride pipelines are small (a
hold refresh, a release), and this also saves redis-py's SCRIPT EXISTS round trip before each such pipeline.
"""

from __future__ import annotations

import functools
import re
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

_INCLUDE = re.compile(r'^--\s*@include\s+"([^"]+)"\s*$', re.MULTILINE)
#: ``-- @policies`` in a framework script (admit.lua, fetch.lua) includes every policy's part, ``lua/policies/*.lua``,
#: so a new policy adds its file and no framework script changes.
#: ``-- @policies lazy`` includes each part inside a loader, ``PARTS[name] = function() ... end``, which the script
#: runs when it first reads ``P[name]`` (admit.lua): a call then defines the functions of the parts it uses only,
#: where defining every part's (about 80 closures) cost a Loner admission a third of its script time.
_POLICIES = re.compile(r'^--\s*@policies(\s+lazy)?\s*$', re.MULTILINE)
_lock = threading.Lock()
_cache: dict[str, Script] = {}


def _lua_root() -> Any:
    """The folder holding the scripts: the installed ``rq_policies.lua`` package data, or ``lua/`` in a checkout."""
    try:
        root = resources.files('rq_policies.lua')
        if root.joinpath('lib/codec.lua').is_file():
            return root
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / 'lua'


@functools.cache
def source(name: str) -> str:
    """The full text of script ``name`` (without ``.lua``), includes expanded.

    Each included file is expanded once per script, where it is first included, so a policy's part can include the
    shared functions it uses without defining them twice beside another part that uses them too.
    """
    root = _lua_root()
    scope = [set()]  # the includes already expanded where the text being read is (a lazy part has its own scope)

    def read(rel: str, seen: tuple[str, ...]) -> str:
        if rel in seen:
            raise RuntimeError(f'circular @include of {rel!r} in {seen[0]!r}')
        text = root.joinpath(rel).read_text(encoding='utf-8')

        def include(match: re.Match) -> str:
            target = match.group(1)
            if target in scope[-1]:
                return ''
            scope[-1].add(target)
            return read(target, seen + (rel,))

        def lazy(part: str) -> str:
            # Inside its loader a part sees what was included before it, and its own includes are its own.
            scope.append(set(scope[-1]))
            try:
                body = read(f'policies/{part}', seen + (rel,))
            finally:
                scope.pop()
            return f'PARTS[{part[:-4]!r}] = function()\n{body}\nend'

        def policies(match: re.Match) -> str:
            parts = sorted(item.name for item in root.joinpath('policies').iterdir() if item.name.endswith('.lua'))
            if match.group(1):
                return '\n'.join(lazy(part) for part in parts)
            return '\n'.join(read(f'policies/{part}', seen + (rel,)) for part in parts)

        text = _INCLUDE.sub(include, text)
        return _POLICIES.sub(policies, text)

    return read(f'{name}.lua', ())


def script(name: str) -> Script:
    """The cached ``Script`` for ``lua/<name>.lua``; call it as ``script(name)(keys=..., args=..., client=conn)``."""
    found = _cache.get(name)
    if found is None:
        with _lock:
            found = _cache.get(name)
            if found is None:
                found = Script(None, source(name).encode("utf-8"))
                _cache[name] = found
    return found


def run(name: str, client: Any, keys: list[str] | tuple = (), args: list[Any] | tuple = ()) -> Any:
    """Run ``lua/<name>.lua`` on ``client`` (a Redis connection or a pipeline), whatever the server's script cache.

    On a connection: EVALSHA, then EVAL with the source once if the server answered NOSCRIPT (two attempts at
    most). On a pipeline: EVAL, queued; the reply arrives with ``execute()``.
    """
    found = script(name)
    keys = list(keys)
    argv = [*keys, *args]
    if _is_pipeline(client):
        return client.eval(found.script, len(keys), *argv)
    try:
        return client.evalsha(found.sha, len(keys), *argv)
    except NoScriptError:
        return client.eval(found.script, len(keys), *argv)


def _is_pipeline(client: Any) -> bool:
    return hasattr(client, 'command_stack') and hasattr(client, 'execute')
