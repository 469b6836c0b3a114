"""Loading the Lua scripts in ``lua/`` and running them by EVALSHA.

Each script is read once from the package, its ``-- @include "lib/x.lua"`` lines expanded (BullMQ's
convention, so shared snippets such as the job-hash write live in one file), and kept as redis-py's ``Script`` (its
source and SHA1).

A direct call runs EVALSHA and, when the server answers NOSCRIPT (its cache was flushed, or it restarted or failed
over), EVAL with the source, which loads the script and runs it in one command: no SCRIPT FLUSH landing between a
SCRIPT LOAD and the EVALSHA after it (redis-py's own fallback) can make the call fail, and NOSCRIPT means the script
did not run, so sending it again is safe.

A call riding a pipeline (rq's end-of-run transaction, the worker's heartbeat, rq's enqueue pipeline that carries
the push) is queued as EVALSHA too, never as an EVAL carrying the source (an EVAL hashes its whole source on the
server every call: 20-50 us of server time per job on the end-of-run pipeline). redis-py's own ``Script`` in a
pipeline sends SCRIPT EXISTS before every such pipeline, a round trip each; instead (:func:`_pipeline_sends`):

* the scripts are loaded once per connection pool: the first pipeline on a pool that carries a script the pool has
  not loaded sends SCRIPT LOAD for it first, on the pipeline's connection (before its MULTI, so inside no
  transaction); a worker loads every script before its first fork (:func:`preload`), so no work horse loads one;
* when the cache was emptied between the load and the pipeline (SCRIPT FLUSH, a restart, a failover), the server
  answers NOSCRIPT for that command only: in a MULTI/EXEC an error at EXEC aborts nothing else, so the pipeline's
  other commands ran and only the script did not. Each such script alone is then sent again as an EVAL with its
  source, on the same connection, before ``execute()`` returns, and its reply takes the NOSCRIPT's place: the
  caller (rq) never sees the error. What this rare path gives up is that the script runs right after the
  transaction instead of inside it; every script that rides a pipeline is written for that (a release reads the
  job's status the transaction left, and is safe to run twice), and a lost reply still replays the whole pipeline
  as redis-py always does.

A fakeredis pipeline (no cmsgpack) still gets an EVAL of the full source, and a pipeline of another shape than
redis-py's ``Pipeline`` an EVAL of the lean one (:func:`lean_source`).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

from redis.commands.core import Script
from redis.connection import BlockingConnectionPool, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from .keys import SLOT_GUARD, is_cluster

_INCLUDE = re.compile(r'^--\s*@include\s+"([^"]+)"\s*$', re.MULTILINE)
#: ``-- @policies`` in a framework script (admit.lua, fetch.lua) includes every policy's part, ``lua/policies/*.lua``,
#: so a new policy adds its file and no framework script changes.
#: ``-- @policies lazy`` defines one loader, ``local function load_part(name)``, a branch per part holding its source,
#: which the script runs when it first reads ``P[name]``: a call then defines the functions of the parts it uses only,
#: where defining every part's (about 80 closures) cost a Loner admission a third of its script time (and a loader
#: per part, a closure and a table entry each, cost a capped fetch about 3 us).
#: ``-- @policies fields`` defines, without defining any part, what the parts' declarations say of the job hash
#: (:func:`part_fields`): ``JOB_FIELDS``, the fields of a popped job the fetch reads (``status`` first, then each
#: part's ``fields`` in part order), ``JOB_FIELD_AT`` (field -> its index there), ``has_hook(name, hook)`` (does
#: part ``name`` define ``hook``: from every hook the parts define, so a script can tell which parts to load, answered
#: by string compares with no table built), and
#: ``JOB_PARTS``, ``{name, index of its first field, count}`` per part that
#: declares any (fetch.lua: a job carrying none of them runs no part).
_POLICIES = re.compile(r'^--\s*@policies(\s+lazy|\s+fields)?\s*$', re.MULTILINE)
#: A part's declaration, ``P.<name> = {...}`` on one line, and the ``fields = {'a', 'b'}`` in it.
_DECLARATION = re.compile(r'^P\.(\w+)\s*=\s*\{(.*)\}\s*(?:--.*)?$', re.MULTILINE)
_DECLARED_FIELDS = re.compile(r'\bfields\s*=\s*\{([^}]*)\}')
#: A part's hook definition, ``function P.<name>.<hook>(``.
_HOOK = re.compile(r'^function P\.(\w+)\.(\w+)\(', re.MULTILINE)
_lock = threading.Lock()
_cache: dict[str, Script] = {}
#: The text of each file of ``lua/`` read so far (by root and path in it): a part or a library included by several
#: scripts is read from disk once per process (the scripts themselves are cached once expanded: :func:`source`).
_texts: dict[tuple[str, str], str] = {}


@functools.cache
def _lua_root() -> Any:
    """The folder holding the scripts: the installed ``rq_policies.lua`` package data, or ``lua/`` in a checkout
    (found once per process)."""
    try:
        root = resources.files('rq_policies.lua')
        if root.joinpath('lib/codec.lua').is_file():
            return root
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / 'lua'


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
        text = _text(root, rel)

        def include(match: re.Match) -> str:
            target = match.group(1)
            if target in scope[-1]:
                return ''
            scope[-1].add(target)
            return read(target, seen + (rel,))

        def lazy(part: str) -> str:
            # Inside its branch a part sees what was included before it, and its own includes are its own.
            scope.append(set(scope[-1]))
            try:
                body = read(f'policies/{part}', seen + (rel,))
            finally:
                scope.pop()
            return f'name == {part[:-4]!r} then\n{body}\n'

        def policies(match: re.Match) -> str:
            parts = sorted(item.name for item in root.joinpath('policies').iterdir() if item.name.endswith('.lua'))
            if match.group(1) and match.group(1).strip() == 'fields':
                found = sorted((name, hook) for part in parts for name, hook in
                               _HOOK.findall(_text(root, f'policies/{part}')))
                by_part: dict[str, list[str]] = {}
                for name, hook in found:
                    by_part.setdefault(name, []).append(hook)
                # Compares of interned strings, no table: a call asks a few times, and building a table of every
                # part's hooks cost a capped fetch about 7 us of server time.
                chain = '\n'.join(
                    f"  {'if' if n == 0 else 'elseif'} name == '{name}' then\n"
                    f"    return {' or '.join(f'hook == {hook!r}' for hook in hooks)}"
                    for n, (name, hooks) in enumerate(by_part.items()))
                return (_fields_source(part_fields(root)) + "\nlocal function has_hook(name, hook)\n"
                        + (chain + '\n  end\n' if chain else '') + "  return false\nend")
            if match.group(1):
                # One loader, a branch per part: no table and no closure per part made on each call that loads any.
                if not parts:
                    return 'local function load_part(name) end'
                return ('local function load_part(name)\n  if '
                        + '  elseif '.join(lazy(part) for part in parts) + '  end\nend')
            return '\n'.join(read(f'policies/{part}', seen + (rel,)) for part in parts)

        if '@include' in text:  # a plain search first: most files include nothing, and the regex costs more
            text = _INCLUDE.sub(include, text)
        return _POLICIES.sub(policies, text) if '@policies' in text else text

    text = read(f'{name}.lua', ())
    if lean:
        text = '\n'.join(line.strip() for line in _COMMENT_LINES.sub('', text).splitlines() if line.strip())
    return text


def _text(root: Any, rel: str) -> str:
    """The text of ``lua/<rel>`` (read once per process and root)."""
    key = (str(root), rel)
    found = _texts.get(key)
    if found is None:
        found = _texts[key] = root.joinpath(rel).read_text(encoding='utf-8')
    return found


def part_fields(root: Any = None) -> dict[str, tuple[str, ...]]:
    """Per policy part (in part order) that declares any, the job hash fields its fetch hooks read: the ``fields``
    of its one-line declaration ``P.<name> = {fields = {...}}`` (the first says the job is under the policy)."""
    root = root or _lua_root()
    found: dict[str, tuple[str, ...]] = {}
    for item in sorted(root.joinpath('policies').iterdir(), key=lambda entry: entry.name):
        if not item.name.endswith('.lua'):
            continue
        for name, body in _DECLARATION.findall(_text(root, f'policies/{item.name}')):
            declared = _DECLARED_FIELDS.search(body)
            if declared:
                fields = tuple(re.findall(r"'([^']*)'", declared.group(1)))
                if fields:
                    found[name] = fields
    return found


def _fields_source(parts: dict[str, tuple[str, ...]]) -> str:
    fields, rows = ['status'], []
    for name, declared in parts.items():
        rows.append(f"{{'{name}', {len(fields) + 1}, {len(declared)}}}")
        fields.extend(declared)
    listed = ', '.join(f"'{field}'" for field in fields)
    at = ', '.join(f"['{field}'] = {n}" for n, field in enumerate(fields, 1))
    return (f"local JOB_FIELDS = {{{listed}}}\nlocal JOB_FIELD_AT = {{{at}}}\n"
            f"local JOB_PARTS = {{{', '.join(rows)}}}")


def lean_source(name: str) -> bytes:
    """Script ``name`` as an EVAL on a pipeline that cannot carry EVALSHA (one of another shape than redis-py's
    ``Pipeline``, whose NOSCRIPT could not be recovered) sends it to a server that has cmsgpack: without its comment
    lines and indentation, and with ``lib/codec.lua`` reduced to cmsgpack's decoder (the pure-Lua fallback is for
    fakeredis)."""
    return _lean(name)


@functools.cache
def _lean(name: str) -> bytes:
    return source(name, lean=True).encode('utf-8')


def eval_source(name: str, client: Any) -> bytes:
    """The source an EVAL of script ``name`` on ``client`` (a connection or a pipeline) carries: the lean one, unless
    the client is fakeredis (no cmsgpack) or of a kind whose server cannot be told (then the full one, which runs
    everywhere)."""
    if is_cluster(client):  # a cluster's nodes have cmsgpack
        return _lean(name)
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
                _by_sha[found.sha] = name
                _by_sha[found.sha.encode()] = name
                _cache[name] = found
    return found


def run(name: str, client: Any, keys: list[str] | tuple = (), args: list[Any] | tuple = ()) -> Any:
    """Run ``lua/<name>.lua`` on ``client`` (a Redis connection or a pipeline), whatever the server's script cache.

    On a connection: EVALSHA, then EVAL with the source once if the server answered NOSCRIPT (two attempts at
    most). On a pipeline: EVALSHA, queued (the reply arrives with ``execute()``; the script is loaded once per pool
    and a NOSCRIPT is recovered inside ``execute()``: see the module's docstring). On a Redis Cluster the call names
    :data:`rq_policies.engine.keys.SLOT_GUARD` last in KEYS, so that it never runs while the prefix's slot is being
    migrated (the adopted client sends it again until the slot settles:
    :func:`rq_policies.engine.compat.adopt_cluster`).
    """
    found = script(name)
    keys = list(keys)
    if is_cluster(client):  # no script runs while the slot migrates (rq_policies.engine.keys.SLOT_GUARD)
        keys.append(SLOT_GUARD)
    argv = [*keys, *args]
    if _is_pipeline(client):
        if not _sha_pipeline(client):
            return client.eval(eval_source(name, client), len(keys), *argv)
        return client.evalsha(found.sha, len(keys), *argv)
    try:
        return client.evalsha(found.sha, len(keys), *argv)
    except NoScriptError:
        return client.eval(found.script, len(keys), *argv)


def evalsha_commands(name: str, client: Any, keys: list[str] | tuple = (), args: list[Any] | tuple = ()) -> tuple:
    """The commands that run ``lua/<name>.lua`` by EVALSHA in a write of the caller's own making on ``client`` (a
    redis-py connection to one server): its EVALSHA, after a SCRIPT LOAD when ``client``'s pool has not loaded it
    (taken as loaded from then on; :func:`forget` it when the server answered NOSCRIPT)."""
    found = script(name)
    call = ('EVALSHA', found.sha, len(keys), *keys, *args)
    loaded = _pool_loaded(client.connection_pool)
    if found.sha in loaded:
        return (call,)
    loaded.add(found.sha)
    return (('SCRIPT', 'LOAD', found.script), call)


def forget(name: str, client: Any) -> None:
    """``client``'s server answered NOSCRIPT for ``lua/<name>.lua``: the next :func:`evalsha_commands` loads it."""
    _pool_loaded(client.connection_pool).discard(script(name).sha)


#: SHA1 (hex, as bytes and str) -> script name, for every script this process has read.
_by_sha: dict[Any, str] = {}
#: Per connection pool: the SHA1s this process has loaded on its server (or found there). A forked work horse
#: inherits its worker's, so what the worker loaded before its first fork is never loaded again per job.
_loaded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_loaded_lock = threading.Lock()


def _pool_loaded(pool: Any) -> set:
    with _loaded_lock:
        found = _loaded.get(pool)
        if found is None:
            found = _loaded[pool] = set()
        return found


def _sha_pipeline(pipeline: Any) -> bool:
    """Can ``pipeline`` carry EVALSHA (a redis-py pipeline on a real server)? Installs, once per pipeline, the
    wrappers of its two send methods that load missing scripts first and recover a NOSCRIPT (:func:`_pipeline_sends`).
    """
    if getattr(pipeline, '_rqp_sha', False):
        return True
    pool = getattr(pipeline, 'connection_pool', None)
    connection_class = getattr(pool, 'connection_class', None)
    if connection_class is None or connection_class.__module__.startswith('fakeredis'):
        return False
    kind = type(pipeline)
    if not (callable(getattr(kind, '_execute_transaction', None)) and callable(getattr(kind, '_execute_pipeline', None))
            and callable(getattr(kind, 'parse_response', None))):
        return False  # a cluster or other pipeline of another shape: EVAL, which needs nothing of it
    try:
        pipeline._execute_transaction = _pipeline_sends(pipeline, kind._execute_transaction.__get__(pipeline))
        pipeline._execute_pipeline = _pipeline_sends(pipeline, kind._execute_pipeline.__get__(pipeline))
        pipeline._rqp_sha = True
    except (AttributeError, TypeError):  # a pipeline with __slots__: EVAL
        return False
    return True


def _ours(args: tuple) -> str | None:
    """The name of our script an EVALSHA command's ``args`` runs, else None."""
    if len(args) < 2 or args[0] not in ('EVALSHA', b'EVALSHA', 'evalsha'):
        return None
    return _by_sha.get(args[1])


def _pipeline_sends(pipeline: Any, send: Any) -> Any:
    """Wrap a pipeline's ``_execute_transaction``/``_execute_pipeline`` (``send(connection, commands, raise_on_error)``)
    so that it loads the pool's missing scripts first and resends a NOSCRIPT script as EVAL (the module's docstring)."""

    def sends(connection: Any, commands: list, raise_on_error: bool) -> list:
        ours = [(i, name) for i, (args, _) in enumerate(commands) if (name := _ours(args)) is not None]
        if not ours:
            return send(connection, commands, raise_on_error)
        loaded = _pool_loaded(pipeline.connection_pool)
        missing = sorted({name for _, name in ours if script(name).sha not in loaded})
        if missing:
            # Before the pipeline's MULTI (a WATCH already sent stays in force: SCRIPT LOAD touches no key).
            connection.send_packed_command(
                connection.pack_commands([('SCRIPT', 'LOAD', script(name).script) for name in missing]))
            for _name in missing:
                connection.read_response()
            loaded.update(script(name).sha for name in missing)
        replies = send(connection, commands, False)
        lost = [(i, name) for i, name in ours if isinstance(replies[i], NoScriptError)]
        if lost:
            loaded.difference_update(script(name).sha for _, name in lost)
            for i, name in lost:  # NOSCRIPT: this script did not run; alone, with its source, it runs once
                args, options = commands[i]
                connection.send_command('EVAL', script(name).script, *args[2:])
                try:
                    reply = pipeline.parse_response(connection, 'EVAL', **options)
                except ResponseError as exc:
                    reply = exc
                replies[i] = reply
            loaded.update(script(name).sha for _, name in lost)  # an EVAL leaves the script in the cache
        if raise_on_error:
            pipeline.raise_first_error(commands, replies)
        return replies

    return sends


def run_leased(name: str, client: Any, keys: list[str] | tuple = (), args: list[Any] | tuple = (),
               wire: list | None = None) -> Any:
    """:func:`run` for an enqueue door: on a connection this thread keeps out of ``client``'s pool (:class:`Lease`)
    once it has made a door call on that pool before, otherwise :func:`run` itself.

    ``wire``: a one-item list that a call sent many times keeps (:class:`rq_policies.engine.ops.Packed`, a hint's
    probe): the EVALSHA is packed into it once per pool and sent as it is after that.
    """
    lease = _lease(client)
    if lease is None:
        return run(name, client, keys, args)
    found = script(name)
    connection = lease.connection
    try:
        try:
            cached = wire[0] if wire is not None else None
            if cached is not None and cached[0] is lease.pool:
                packed = cached[1]
            else:
                packed = pack_command(connection, ('EVALSHA', found.sha, len(keys), *keys, *args))
                if wire is not None:
                    wire[0] = (lease.pool, packed)
            reply = _send(connection, packed)
        except NoScriptError:  # the script did not run: sending it again with its source is safe
            reply = _send(connection, pack_command(connection, ('EVAL', found.script, len(keys), *keys, *args)))
    except ResponseError:
        raise  # the reply was read to its end: the connection is clean
    except BaseException:
        # A reply may be left unread (an interrupt, a send cut midway): it must never be read as another call's.
        # redis-py's read closes the connection itself on any exception; this covers the rest of the call.
        connection.disconnect()
        raise
    reconnect = getattr(connection, 'should_reconnect', None)  # redis-py 6+
    if reconnect is not None and reconnect():  # a server's maintenance notice, honoured as redis-py's path does
        connection.disconnect()
    return reply


def pack_command(connection: Any, args: tuple) -> list:
    """``connection.pack_command(*args)`` for a door's script call, in one pass: the command as one buffer.

    redis-py's packer encodes each argument through a chain of type checks and grows its buffer by one concatenation
    per argument: about 0.85 us an argument, 48 us for a narrow admission's 57 (the job's fields travel as arguments
    there, ``lua/admit_narrow.lua``), where this takes 7.4. Each argument is encoded as
    the connection's own encoder would (str with its encoding and error handler, a str enum by its text, bytes as
    they are, an int in decimal; a short str found packed in :data:`_PACKED`) and joined once. Any other type (a
    float, a bool, a memoryview) takes redis-py's packer, which also raises redis-py's own error for what it refuses.
    """
    encoder = getattr(connection, 'encoder', None)
    if encoder is None:
        return connection.pack_command(*args)
    encoding, errors = encoder.encoding, encoder.encoding_errors
    cache = _PACKED.get((encoding, errors))
    if cache is None:
        cache = _PACKED[(encoding, errors)] = {}
    elif len(cache) >= _PACKED_MAX:
        cache.clear()
    get = cache.get
    pieces = [b'*%d\r\n' % len(args)]
    append = pieces.append
    for arg in args:
        kind = type(arg)
        if kind is str:
            found = get(arg)
            if found is None:
                raw = arg.encode(encoding, errors)
                found = b'$%d\r\n%b\r\n' % (len(raw), raw)
                if len(raw) <= _PACKED_LENGTH:
                    cache[arg] = found
            append(found)
            continue
        if kind is int:
            arg = b'%d' % arg
        elif kind is not bytes:
            if not isinstance(arg, str):
                return connection.pack_command(*args)
            arg = arg.encode(encoding, errors)  # a str enum (rq's JobStatus): its text, as redis-py encodes it
        append(b'$%d\r\n%b\r\n' % (len(arg), arg))
    return [b''.join(pieces)]


#: Per (encoding, error handler): short str arguments as :func:`pack_command` packed them. Most of a door's call is
#: the same strings every time (key prefixes, the job's field names, empty values, the queue's keys): a lookup is a
#: third of packing one. Emptied when it holds :data:`_PACKED_MAX` (the per-call ones, ids and times, churn it).
_PACKED: dict[tuple[str, str], dict[str, bytes]] = {}
_PACKED_MAX = 4096
_PACKED_LENGTH = 100


def _send(connection: Any, packed: Any) -> Any:
    # A connection kept open from an earlier call may have been closed by the server since: its ``timeout`` setting,
    # a restart, a failover, a proxy's idle cut. redis-py's pool finds that on checkout (a readiness poll) and
    # reconnects; the lease skips the checkout, and finds it on the send instead: the server's end is gone, so the
    # read meets the closed socket. The first attempt on a kept connection that fails so is sent once more, at once,
    # on a new connection, whatever the client's Retry allows (a ``Redis.from_url`` client has none): the same as
    # the pool's reconnect, found after the fact. That costs the common call nothing (a poll per call would cost a
    # system call, a fifth of what the lease saves), and it is safe: every door script is safe to run twice (a
    # resend after a lost reply already relies on that), and a connection the server closed while idle never
    # carried the command to it at all. A timeout is not such a close: it is left to the Retry.
    kept = [getattr(connection, '_sock', None) is not None]

    def once() -> Any:
        if kept[0]:
            kept[0] = False
            try:
                connection.send_packed_command(packed)
                return connection.read_response()
            except RedisConnectionError:
                connection.disconnect()
        # connect() first, as the pool's checkout does: a Sentinel connection looks its master up there (a send
        # reconnects to the address it had, which after a failover is the old master's).
        connection.connect()
        connection.send_packed_command(packed)
        return connection.read_response()
    # The connection's own Retry, as redis-py's command path uses it: a lost reply resends (every script that writes
    # is safe to run twice), after closing the connection so a late reply is never read.
    return connection.retry.call_with_retry(once, lambda error: connection.disconnect())


class Lease:
    """One connection of a pool that a thread keeps for its enqueue doors' scripts, given back when the thread ends.

    redis-py checks a connection out of its pool and back in around every command: a readiness poll of the socket
    (a system call), two lock round trips and four metric updates, about 15 us of client CPU, a sixth of a hinted
    drop's whole cost. A door call sends straight on its lease instead. The connection is read to the end of each
    reply, or closed when a call is interrupted, so the readiness check has only one thing to find: a connection the
    server closed while it sat in the lease (its ``timeout``, a restart), which the call finds on its send instead
    and sends once more on a new connection (:func:`_send`); redis-py's retry, reconnect and Sentinel failover live
    in the connection and apply unchanged.

    What it costs: a thread that makes door calls holds one connection of the pool more than it would (the pool
    serves its other commands), and gives it back when the thread ends. A thread leases from its second door call on
    a pool (a work horse enqueuing one job opens no extra connection), a process forked with a lease drops it (the
    child's pool starts afresh), and no lease is taken from a pool that blocks or limits connections tightly: a
    ``BlockingConnectionPool``, or a pool where leases would hold more than a quarter of ``max_connections``. A
    client with ``single_connection_client=True``, client-side caching, a pipeline or fakeredis takes redis-py's
    own path.

    Attributes:
        pool: the pool the connection came from.
        connection: the leased connection.
        pid: the process that leased it.
    """

    __slots__ = ('pool', 'connection', 'pid')

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.connection = pool.get_connection()
        self.pid = os.getpid()

    def give_back(self) -> None:
        """Return the connection to its pool (once; a forked child's copy is dropped, not returned)."""
        pool, self.pool = self.pool, None
        if pool is None or self.pid != os.getpid():
            return
        _count(pool, -1)
        pool.release(self.connection)

    def __del__(self) -> None:  # the thread ended (its thread-local went), or the lease was evicted
        try:
            self.give_back()
        except Exception:  # interpreter shutdown, a pool already torn down
            pass


#: Per thread: ``leases``, its live leases (at most :data:`_LEASES_PER_THREAD`, newest last), and ``first``, the
#: (pool id, pid) pairs it has made one door call on without a lease.
_local = threading.local()
_LEASES_PER_THREAD = 2
#: Live leases per pool id in process ``_leased_pid`` (a lease holds its pool, so the id stays that pool's): what the
#: cap of a quarter of ``max_connections`` counts. Its own lock: a lease is given back from ``__del__``, which may run
#: anywhere.
_leased: dict[int, int] = {}
_leased_pid = os.getpid()
_lease_lock = threading.RLock()


def _count(pool: Any, delta: int, cap: int | None = None) -> bool:
    """Add ``delta`` to ``pool``'s live leases in this process, unless that would pass ``cap``; False if it would."""
    global _leased_pid
    with _lease_lock:
        if _leased_pid != os.getpid():  # a forked child: the parent's leases are not its own
            _leased.clear()
            _leased_pid = os.getpid()
        total = _leased.get(id(pool), 0) + delta
        if cap is not None and total > cap:
            return False
        if total > 0:
            _leased[id(pool)] = total
        else:
            _leased.pop(id(pool), None)
        return True


def _lease(client: Any) -> Lease | None:
    pool = getattr(client, 'connection_pool', None)
    leases = getattr(_local, 'leases', None)
    if leases:
        for found in leases:
            if found.pool is pool:
                if found.pid == os.getpid():
                    return found
                _local.leases = leases = []  # inherited across a fork: the parent's connections
                _local.first = None
                break
    if not _can_lease(client, pool):
        return None
    first = getattr(_local, 'first', None)
    key = (id(pool), os.getpid())
    if first is None or key not in first:  # this thread's first door call on the pool: redis-py's path, remembered
        if first is None or len(first) >= 64:
            _local.first = first = set()
        first.add(key)
        return None
    if not _count(pool, 1, pool.max_connections // 4):
        return None
    try:
        lease = Lease(pool)
    except BaseException:
        _count(pool, -1)
        raise
    if leases is None:
        _local.leases = leases = []
    if len(leases) >= _LEASES_PER_THREAD:  # a thread that moves between pools keeps its newest leases only
        leases.pop(0).give_back()
    leases.append(lease)
    return lease


def _can_lease(client: Any, pool: Any) -> bool:
    if pool is None or _is_pipeline(client) or getattr(client, 'connection', None) is not None:
        return False
    if isinstance(pool, BlockingConnectionPool) or getattr(pool, 'cache', None) is not None:
        return False
    if not isinstance(pool, ConnectionPool) or not isinstance(getattr(pool, 'max_connections', None), int):
        return False
    return not pool.connection_class.__module__.startswith('fakeredis')


def _carries_evalsha(connection: Any) -> bool:
    """Do ``connection``'s pipelines carry EVALSHA (as :func:`_sha_pipeline` finds: a redis-py ``Pipeline`` on a
    real server, not a cluster's)?"""
    if is_cluster(connection) or _is_pipeline(connection):
        return False
    pool = getattr(connection, 'connection_pool', None)
    connection_class = getattr(pool, 'connection_class', None)
    if connection_class is None or connection_class.__module__.startswith('fakeredis'):
        return False
    pipeline = getattr(connection, 'pipeline', None)
    if not callable(pipeline):
        return False
    with pipeline(transaction=False) as pipe:
        kind = type(pipe)
        return (callable(getattr(kind, '_execute_transaction', None))
                and callable(getattr(kind, '_execute_pipeline', None))
                and callable(getattr(kind, 'parse_response', None))
                and hasattr(pipe, '__dict__'))


def _is_pipeline(client: Any) -> bool:
    return hasattr(client, 'command_stack') and hasattr(client, 'execute')


def preload(connection: Any = None) -> None:
    """Read, expand and hash every script in ``lua/`` now, into this process's caches; with ``connection``, also load
    them all on its server (one round trip) and remember that for its pool.

    A forking worker calls it once before its first fork: a work horse inherits the caches, so it never reads and
    expands a script's files itself (the end-of-run script it rides on rq's pipeline, every job, was read from disk
    again in each new horse: about 0.7 ms a job), and never sends SCRIPT LOAD before its end-of-run pipeline's
    EVALSHA (the pool's loaded scripts are inherited too).

    The lean sources (:func:`lean_source`, an EVAL's on a pipeline that cannot carry EVALSHA) are made too only where
    ``connection``'s pipelines are such (a cluster's, another shape's) or it is not given: on a redis-py connection to
    one server every script runs by EVALSHA, and making them cost a worker's start about 9 ms (issue 33).
    """
    root = _lua_root()
    names = [item.name[:-len('.lua')] for item in sorted(root.iterdir(), key=lambda entry: entry.name)
             if item.name.endswith('.lua')]
    for name in names:
        script(name)
    if connection is None or not _carries_evalsha(connection):
        for name in names:
            _lean(name)
    if is_cluster(connection):
        # A cluster: SCRIPT LOAD goes to every primary (redis-py's default for it), one script a call. Its pipelines
        # carry EVAL (see eval_source), so nothing is remembered per pool.
        for name in names:
            connection.script_load(script(name).script)
        return
    pool = getattr(connection, 'connection_pool', None)
    if connection is None or pool is None or _is_pipeline(connection):
        return
    connection_class = getattr(pool, 'connection_class', None)
    if connection_class is None or connection_class.__module__.startswith('fakeredis'):
        return
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.script_load(script(name).script)
        pipe.execute()
    _pool_loaded(pool).update(script(name).sha for name in names)
