"""The one place that builds a script's KEYS and ARGV: by name, never by position with blanks.

Every script takes the keys it touches in KEYS (so a Redis ACL or a proxy sees them) and everything else in one
structured argument, ``ARGV[1]``: a msgpack map decoded once per script by ``lua/lib/codec.lua``. A key is passed
by name as well: the map carries ``k = {name = index into KEYS}``, and a list of keys ``kl = {name = {first, n}}``,
so a script reads ``KEYS[a.k.marker]`` and nobody counts positions.

Strings travel as msgpack's raw type (``use_bin_type=False``): Lua strings are bytes, so pickled job data arrives
byte for byte, and the cmsgpack of Redis 7 and Valkey (which predates the bin type) decodes it.

Example::

    call = Call('admit')
    call.key('job', job.key)
    call.arg('jid', job.id)
    admitted = call.run(connection)
"""

from __future__ import annotations

from typing import Any

import msgpack

from . import scripts
from .exceptions import InvalidArgument

_packb = msgpack.Packer(use_bin_type=False, autoreset=True).pack


def text(value: Any) -> str:
    """A reply element (or a key redis-py returned) as str: redis-py returns bytes unless the client decodes."""
    return value.decode() if isinstance(value, bytes) else str(value)


def need_connection(connection: Any) -> Any:
    """``connection``, or an InvalidArgument saying one is required (the policies' classmethods take ``connection=``).

    A redis-py ``RedisCluster`` is checked (a hash-tagged prefix, :func:`keys.check_connection`) and adopted
    (:func:`compat.adopt_cluster`: its pipelines send EVALSHA, which the policies' scripts need, and are transactions
    by default, as rq expects), as ``PolicyQueue`` and the workers do."""
    if connection is None:
        raise InvalidArgument('connection', message='connection is required: pass connection=Redis(...)')
    from . import compat, keys

    keys.check_connection(connection)
    return compat.adopt_cluster(connection)


def server_now(connection: Any) -> float:
    """The server's clock (epoch seconds, with microseconds): the clock every expiry and rate is measured by."""
    seconds, micros = connection.time()
    return seconds + micros / 1e6


def time_in(pipeline: Any) -> None:
    """Queue a read of the server's clock on ``pipeline``; its reply (with ``execute()``) is ``(seconds,
    microseconds)``.

    ``TIME`` on a single server's pipeline. A Redis Cluster's pipeline takes no keyless command (redis-py's refuses
    TIME by name in a transaction, and outside one sends it to any node), so there the clock is read by
    ``lua/server_time.lua``, sent as ``EVAL_RO`` with a key of the prefix's slot: it goes where the pipeline's
    other reads go (the slot's primary, or its replica for a client that balances reads over replicas).
    """
    from . import keys

    if keys.is_cluster(pipeline):
        pipeline.execute_command('EVAL_RO', scripts.lean_source('server_time'), 1, keys.PREFIX)
    else:
        pipeline.time()


def on_next_execute(pipeline: Any, read: Any) -> None:
    """Hand the replies of ``pipeline``'s next ``execute()`` to ``read`` (after they come back; its own errors are
    the caller's to handle), once.

    The reader is taken off before the call runs: a pipeline that rq resets and executes again (a retry after a
    WatchError, a connection error, or a second batch on the same object) runs without it, so a reader never reads
    a later batch's replies by an index that belonged to an earlier one. Readers stack: each one restores what it
    wrapped.
    """
    execute = pipeline.execute

    def execute_and_read(*args: Any, **kwargs: Any) -> Any:
        pipeline.execute = execute
        replies = execute(*args, **kwargs)
        read(replies)
        return replies

    pipeline.execute = execute_and_read


def pack(value: Any) -> bytes:
    """``value`` (dicts, lists, str, bytes, int, float, bool, None) as the msgpack a script decodes."""
    return _packb(value)


class Call:
    """The KEYS and ARGV of one script call, built by name.

    Attributes:
        script: the script's name (``lua/<script>.lua``).
        keys: KEYS in the order they were added.
        args: the structured argument (what ``ARGV[1]`` decodes to), including ``k`` and ``kl``.
    """

    __slots__ = ('script', 'keys', 'args', '_k')

    def __init__(self, script: str, **args: Any) -> None:
        self.script = script
        self.keys: list[str] = []
        self._k: dict[str, int] = {}
        self.args: dict[str, Any] = {'k': self._k, **args}

    def key(self, name: str, value: str) -> Call:
        """Pass key ``value`` as ``KEYS[a.k[name]]``. Two parts may share a key (the scheduled registry) by passing
        the same name and value; the same name with another value is an error (it would hide the first)."""
        if name in self._k:
            if self.keys[self._k[name] - 1] == value:
                return self
            raise ValueError(f'key {name!r} is already part of this {self.script} call, as another key')
        self.keys.append(value)
        self._k[name] = len(self.keys)
        return self

    def set_key(self, name: str, value: str) -> Call:
        """Point the key already passed as ``name`` at ``value`` (a call reused with a new per-call key)."""
        self.keys[self._k[name] - 1] = value
        return self

    def key_list(self, name: str, values: list[str]) -> Call:
        """Pass ``values`` as consecutive KEYS; the script finds them as ``a.kl[name] = {first index, count}``."""
        lists = self.args.setdefault('kl', {})
        if name in lists:
            raise ValueError(f'key list {name!r} is already part of this {self.script} call')
        lists[name] = [len(self.keys) + 1, len(values)]
        self.keys.extend(values)
        return self

    def arg(self, name: str, value: Any) -> Call:
        """Set ``a[name] = value`` in the structured argument."""
        self.args[name] = value
        return self

    def job_field(self, name: str) -> Any:
        """The value of the job hash field ``name`` this admission writes (``a.fields``, the policies' fields last,
        so the last one of that name), or None: a probe builds no job (a per-job policy's ``admit_part`` reads its
        own field so: Fair, Batch)."""
        fields = self.args.get('fields') or ()
        for i in range(len(fields) - 2, -1, -2):
            if fields[i] == name:
                return fields[i + 1]
        return None

    def answered(self) -> Call:
        """Keep this call's answer under a request id of its own (``KEYS[a.k.answer]``, lua/lib/answer.lua), so that
        a replay of the call (redis-py resending it after a lost reply) answers what its first run did."""
        from . import keys

        self.key('answer', keys.answer())
        return self.arg('answer_ttl', keys.ANSWER_TTL)

    def argv(self) -> list[bytes]:
        """ARGV as sent: the one packed argument."""
        return [pack(self.args)]

    def run(self, client: Any) -> Any:
        """Run the script on ``client``: a connection, or a pipeline (its own, or someone else's: rq's end-of-run
        transaction, its enqueue pipeline), whose ``execute()`` then brings the reply.

        On a pipeline it goes out as EVALSHA: redis-py's ``Script`` in a pipeline would send SCRIPT EXISTS before every
        such pipeline (a round trip per job on rq's end-of-run pipeline), and an EVAL would carry the whole source,
        which the server hashes every call. The script is loaded once per connection pool, and a NOSCRIPT (a flush or
        restart since) is recovered inside ``execute()`` by sending that script alone with its source
        (``scripts.run``), so rq never sees the error.
        """
        return scripts.run(self.script, client, self.keys, self.argv())

    def run_door(self, client: Any) -> Any:
        """Run the script as an enqueue door does: on this thread's leased connection (``scripts.Lease``)."""
        return scripts.run_leased(self.script, client, self.keys, self.argv())

    def packed(self) -> Packed:
        """This call, its argument packed once, to be sent as it is any number of times (a hint's probe)."""
        return Packed(self.script, list(self.keys), self.args, self.argv())

    #: The name :meth:`run` had on a pipeline someone else owns (one method: a call on a pipeline is run as on a
    #: connection). Kept for other code that calls it.
    ride = run


class FlatCall:
    """A script call whose ARGV is a flat list of strings, not one msgpack map: the narrow admission
    (``lua/admit_narrow.lua``), where the decode of a map was a third of the script's time. The script documents its
    positions; the door that builds the call keeps the layout in one function
    (:func:`rq_policies.engine.admission.narrow_call`).

    Attributes:
        script: the script's name (``lua/<script>.lua``).
        keys: KEYS as sent.
        args: ARGV as sent.
        view: what the builder says some of ``args`` are, by name (for reading only: :meth:`packed` hands it on as
            :attr:`Packed.args`).
    """

    __slots__ = ('script', 'keys', 'args', 'view')

    def __init__(self, script: str, keys: list[str], args: list[Any], view: dict[str, Any] | None = None) -> None:
        self.script, self.keys, self.args, self.view = script, keys, args, view or {}

    def argv(self) -> list[Any]:
        """ARGV as sent."""
        return self.args

    def run(self, client: Any) -> Any:
        """Run the script on ``client`` (a connection or a pipeline), as :meth:`Call.run`."""
        return scripts.run(self.script, client, self.keys, self.args)

    def run_door(self, client: Any) -> Any:
        """Run the script as an enqueue door does (:meth:`Call.run_door`)."""
        return scripts.run_leased(self.script, client, self.keys, self.args)

    def packed(self) -> Packed:
        """This call, to be sent as it is any number of times (:meth:`Call.packed`)."""
        return Packed(self.script, list(self.keys), self.view, list(self.args))


class Packed:
    """A :class:`Call` built and packed once (:meth:`Call.packed`): running it again sends the same bytes.

    Attributes:
        script, keys, args: those of the call (``args`` for reading only: changing it changes nothing sent).
        argv: ARGV as sent.
        wire: a one-item list, the EVALSHA as packed for the pool it was last sent to (``scripts.run_leased``).
    """

    __slots__ = ('script', 'keys', 'args', 'argv', 'wire')

    def __init__(self, script: str, keys: list[str], args: dict[str, Any], argv: list[bytes]) -> None:
        self.script, self.keys, self.args, self.argv = script, keys, args, argv
        self.wire: list = [None]

    def run_door(self, client: Any) -> Any:
        """Run the script as :meth:`Call.run_door` does (a packed call is a hint's probe, always a door's), sending
        the command as it was packed the first time."""
        return scripts.run_leased(self.script, client, self.keys, self.argv, self.wire)
