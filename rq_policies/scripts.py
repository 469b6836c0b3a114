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
hold refresh, a release, a push), and this also saves redis-py's SCRIPT EXISTS round trip before each such pipeline.
An EVAL carries its source every time, so on a real server it carries the lean one (:func:`lean_source`: no comments,
and cmsgpack's decoder instead of the pure-Lua one fakeredis needs): a fifth of the bytes, which the server hashes on
every call (the push rides every enqueue of a job without a policy).
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


#: ``lib/codec.lua`` in a lean source: the servers that have cmsgpack (Redis, Valkey) need none of its fallback.
_LEAN_CODEC = """local function decode_args(data)
  if cmsgpack then return cmsgpack.unpack(data) end
  error('rq-policies: this server has no cmsgpack; a lean script was sent to it')
end
"""
#: A comment that fills its lines: a ``--[[ ... ]]`` block opening a line, or a line that is only a ``--`` comment.
_COMMENT_LINES = re.compile(r'^[ \t]*--\[\[.*?\]\][ \t]*\n|^[ \t]*--[^\n]*\n', re.MULTILINE | re.DOTALL)


@functools.cache
def source(name: str, lean: bool = False) -> str:
    """The full text of script ``name`` (without ``.lua``), includes expanded.

    Each included file is expanded once per script, where it is first included, so a policy's part can include the
    shared functions it uses without defining them twice beside another part that uses them too. ``lean``: see
    :func:`lean_source`.
    """
    root = _lua_root()
    scope = [set()]  # the includes already expanded where the text being read is (a lazy part has its own scope)

    def read(rel: str, seen: tuple[str, ...]) -> str:
        if rel in seen:
            raise RuntimeError(f'circular @include of {rel!r} in {seen[0]!r}')
        if lean and rel == 'lib/codec.lua':
            return _LEAN_CODEC
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

    text = read(f'{name}.lua', ())
    if lean:
        text = '\n'.join(line.strip() for line in _COMMENT_LINES.sub('', text).splitlines() if line.strip())
    return text


def lean_source(name: str) -> bytes:
    """Script ``name`` as a pipeline's EVAL sends it to a server that has cmsgpack: without its comment lines and
    indentation, and with ``lib/codec.lua`` reduced to cmsgpack's decoder (the pure-Lua fallback is for fakeredis)."""
    return _lean(name)


@functools.cache
def _lean(name: str) -> bytes:
    return source(name, lean=True).encode('utf-8')


def eval_source(name: str, client: Any) -> bytes:
    """The source an EVAL of script ``name`` on ``client`` (a connection or a pipeline) carries: the lean one, unless
    the client is fakeredis (no cmsgpack) or of a kind whose server cannot be told (then the full one, which runs
    everywhere)."""
    pool = getattr(client, 'connection_pool', None)
    connection_class = getattr(pool, 'connection_class', None)
    if connection_class is None or connection_class.__module__.startswith('fakeredis'):
        return script(name).script
    return _lean(name)


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
    most). On a pipeline: EVAL of :func:`eval_source`, queued; the reply arrives with ``execute()``.
    """
    found = script(name)
    keys = list(keys)
    argv = [*keys, *args]
    if _is_pipeline(client):
        return client.eval(eval_source(name, client), len(keys), *argv)
    try:
        return client.evalsha(found.sha, len(keys), *argv)
    except NoScriptError:
        return client.eval(found.script, len(keys), *argv)


def _is_pipeline(client: Any) -> bool:
    return hasattr(client, 'command_stack') and hasattr(client, 'execute')


def preload() -> None:
    """Read, expand and hash every script in ``lua/`` now, into this process's caches.

    A forking worker calls it once before its first fork: a work horse inherits the caches, so it never reads and
    expands a script's files itself (the end-of-run script it rides on rq's pipeline, every job, was read from disk
    again in each new horse: about 0.7 ms a job). Both forms are cached: the full one (EVALSHA, and EVAL on a
    NOSCRIPT) and the lean one a pipeline's EVAL carries, which is the one the horse's end-of-run pipeline sends.
    """
    root = _lua_root()
    for item in sorted(root.iterdir(), key=lambda entry: entry.name):
        if item.name.endswith('.lua'):
            script(item.name[:-len('.lua')])
            _lean(item.name[:-len('.lua')])
