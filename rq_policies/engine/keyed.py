"""The per-key policies' rules base (Concurrency, Rate; Fair uses its key handling): declared on the function, the
key computed at enqueue and stored on the job hash, checked at fetch, a refused job parked on its key.

The design (keys on the job, parking, the due index, unparking) is docs/architecture.md's "Per-job fetch policies";
their views share :class:`rq_policies.engine.views.KeyedViews`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import msgpack
from rq.job import Job
from rq.queue import Queue
from rq.registry import DeferredJobRegistry
from rq.worker import Worker

from . import compat, keys, reading
from .admin import clear_setting, refusing, unknown_scope
from .exceptions import BackOff, InvalidArgument, InvalidSetting, PolicyError
from .identity import func_path
from .ops import Call, need_connection, pack, text
from .policy import FETCH, FetchPolicy, declare_scope, registered, scope_declared

#: A key function: ``(args, kwargs) -> str | int``, as ``unique_context`` gets them.
KeyFunction = Callable[[tuple, dict], Any]

#: The longest key value accepted (characters): it is part of Redis key names.
MAX_KEY_LENGTH = 1000


def keyed_args(job_prefix: str = Job.redis_job_namespace_prefix) -> dict[str, str]:
    """The key prefixes the per-key Lua parts build their keys from (``ctx.kp``), the key id (``<scope>:<key>``)
    appended; and the ones a parked job's part reads liveness under (``worker``: rq's worker keys, ``alive``: a
    horse's liveness key; lua/policies/loner_next.lua asks whether the job it waits behind still runs)."""
    return {
        'job': job_prefix, 'queue': Queue.redis_queue_namespace_prefix,
        'deferred': DeferredJobRegistry.key_template.format(''), 'wake': keys.wake(''),
        'holds': keys.KEY_HOLDS_PREFIX, 'parked': keys.KEY_PARKED_PREFIX, 'limits': keys.KEY_LIMITS,
        'rates': keys.KEY_RATES, 'rules': keys.KEY_RULES,
        'block': keys.KEY_BLOCK_PREFIX, 'tat': keys.KEY_TAT_PREFIX, 'due': keys.KEY_DUE,
        'units': keys.KEY_UNITS_PREFIX,
        'worker': Worker.redis_worker_namespace_prefix, 'alive': keys.ALIVE_PREFIX,
    }


#: The most prefixes one rule holds: the deciding script compares the key with each.
MAX_RULE_TIERS = 64


class Tiers:
    """A per-key limit stated as a rule over the key: the longest of ``tiers``' prefixes a key starts with gives its
    limit, ``default`` the limit of every other key. Stored once per scope in Redis (``Concurrency.set_rule``,
    ``Rate.set_rule``), never carried by a job, and read by the script that decides, so every producer and worker
    resolves a key the same way whatever its code declares.

    Example::

        Concurrency.set_rule('billing', Tiers({'premium:': 10, 'free:': 1}, default=2))
        # key 'premium:acme' -> 10 at once, 'free:bob' -> 1, 'trial:x' -> 2

    Args:
        tiers: key prefix (a non-empty str) -> the policy's setting for the keys it starts (Concurrency: a limit;
            Rate: ``(limit, per)``, ``(limit, per, burst)``, a list of such windows, or a KeyRate); at most
            :data:`MAX_RULE_TIERS`. A key matching several takes the longest prefix's.
        default: the setting of a key no prefix matches (required: a rule states every key's limit, so no key of
            the scope falls back to what its jobs declare).

    The settings are checked by the policy the rule is set on (``InvalidSetting`` naming ``tiers[...]`` or
    ``default`` and the value).
    """

    __slots__ = ('tiers', 'default')

    def __init__(self, tiers: Mapping[str, Any] | None = None, *, default: Any) -> None:
        tiers = {} if tiers is None else tiers
        if not isinstance(tiers, Mapping):
            raise InvalidArgument('tiers', message=f'tiers must be a mapping of key prefix -> setting, got {tiers!r}')
        if len(tiers) > MAX_RULE_TIERS:
            raise InvalidArgument('tiers', message=f'tiers must hold at most {MAX_RULE_TIERS} prefixes, got '
                                                   f'{len(tiers)}')
        for prefix in tiers:
            if not isinstance(prefix, str) or not prefix:
                raise InvalidArgument('tiers', message=f'each prefix of tiers must be a non-empty str, got {prefix!r}')
            key_text(prefix, 'tiers prefix')
        if default is None:
            raise InvalidArgument('default', message='default must be given (the setting of a key no prefix '
                                                     'matches), got None')
        self.tiers: dict[str, Any] = dict(tiers)
        self.default = default

    def resolve(self, key: str) -> tuple[Any, str]:
        """The setting this rule gives ``key`` and the prefix that gave it (``''``: the default), as
        ``lua/lib/key_rule.lua`` finds them."""
        best, tier = self.default, ''
        for prefix, value in self.tiers.items():
            if len(prefix) > len(tier) and key.startswith(prefix):
                best, tier = value, prefix
        return best, tier

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tiers) and (self.tiers, self.default) == (other.tiers, other.default)

    def __hash__(self) -> int:
        return hash(repr(self))  # settings may be lists (a Rate's windows), which do not hash

    def __repr__(self) -> str:
        return f'Tiers({self.tiers!r}, default={self.default!r})'


def rule_source(tier: str) -> str:
    """The words naming the part of a scope's rule that gave a key its setting (``tier``: the prefix, '' the
    default): ``"rule tier 'premium:'"`` or ``'rule default'``."""
    return f'rule tier {tier!r}' if tier else 'rule default'


def _source(value: Any, args: tuple, kwargs: dict) -> str:
    """``', args[0]'``: the argument a key function returned as is (the usual ``lambda a, k: a[0]``), if any."""
    for i, arg in enumerate(args):
        if arg is value:
            return f', args[{i}]'
    for name, arg in kwargs.items():
        if arg is value:
            return f', kwargs[{name!r}]'
    return ''


def check_scope(scope: Any) -> str:
    """``scope`` as given, or an InvalidArgument naming it: a non-empty str without a colon (it ends at the first
    one)."""
    if not isinstance(scope, str) or not scope or ':' in scope or len(scope) > MAX_KEY_LENGTH:
        raise InvalidArgument(
            'scope', message=f'scope must be a non-empty str without ":" (at most {MAX_KEY_LENGTH} characters), '
                             f'got {scope!r}')
    if not scope.isascii():
        try:
            scope.encode('utf-8')
        except UnicodeEncodeError:
            raise InvalidArgument('scope', f'{scope!r} contains a lone surrogate, which UTF-8 cannot encode, and '
                                  'Redis stores keys as UTF-8') from None
    return scope


def key_text(value: Any, where: str = 'key', function: str | None = None) -> str:
    """A key value as the text it is stored as: a str, or an int (``12`` and ``'12'`` are one key); else
    :class:`~rq_policies.engine.exceptions.InvalidArgument` naming the value (``where``, and the job's ``function``
    when there is one), as for text Redis cannot store (a lone surrogate) and a too long key."""
    named = f'{where} in a call of {function}' if function else where
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidArgument(named, message=f'{named} must be a str or an int, got {value!r} ({type(value).__name__})')
    if isinstance(value, int) and value.bit_length() > 4 * MAX_KEY_LENGTH:  # str() would refuse past its digit limit
        raise InvalidArgument(
            named, message=f'{named} must be at most {MAX_KEY_LENGTH} characters, got an int of {value.bit_length()} '
                           'bits')
    out = str(value)
    if len(out) > MAX_KEY_LENGTH:
        raise InvalidArgument(
            named, message=f'{named} must be at most {MAX_KEY_LENGTH} characters, got one of {len(out)}')
    if not out.isascii():  # O(1): CPython flags ASCII strings
        try:
            out.encode('utf-8')
        except UnicodeEncodeError as exc:
            raise InvalidArgument(where, f'{out!r} contains a lone surrogate ({out[exc.start]!r} at index '
                                  f'{exc.start}), which UTF-8 cannot encode, and Redis stores keys as UTF-8',
                                  function) from None
    return out


def cost(value: Any, limit: int, where: str = 'cost', never: str = 'could never start') -> int:
    """A job's cost: an int from 1 to the policy's ``limit``, else an InvalidArgument naming ``where`` and the value
    (``never`` says what a larger cost would mean)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(where, message=f'{where} must be a positive integer, got {value!r}')
    if value > limit:
        raise InvalidArgument(
            where, message=f'{where} must be at most the limit ({limit}), got {value!r}: such a job {never}')
    return value


class KeyedPolicy(FetchPolicy):
    """The rules the per-key policies share (Concurrency, Rate): declared on the function, the key computed at
    enqueue and stored on the job hash (its only admission-side work, :meth:`job_fields`), checked at fetch, a
    refused job parked on its key."""

    per_job: ClassVar[bool] = True
    #: A per-key policy has no gate: its fetch work is the job's own field (read with the popped job) and the keys
    #: with parked jobs, which are all in the due index.
    fetch_state: ClassVar[tuple[str, ...] | None] = ('keydue',)
    #: The job hash field carrying the policy's setting and key: ``'<setting> <scope>:<key>'``.
    field: ClassVar[str] = ''
    #: How many space-separated words the setting has (before ``<scope>:<key>``).
    setting_words: ClassVar[int] = 1
    #: Does the policy take a hold per running job (a key's ledger, ``rq:policies:keyholds:<scope>:<key>``)?
    holds: ClassVar[bool] = False
    #: The hash of the keys' run-time settings (key id -> setting), which win over the ones their jobs declare.
    key_settings: ClassVar[str] = ''
    #: The settings its repr names after the limit (``Rate(10, per=1, burst=5)``).
    repr_settings: ClassVar[tuple[str, ...]] = ()
    limit: int
    cost: int | KeyFunction

    def __init__(self, key: KeyFunction | None, scope: str | None) -> None:
        if key is not None and not callable(key):
            raise InvalidArgument('key', message=f'key must be a callable (args, kwargs) -> str | int, got {key!r}')
        self.key = key
        self.scope = None if scope is None else check_scope(scope)
        if self.scope is not None:
            declare_scope(self.name, self.scope)

    # -- the enqueue ----------------------------------------------------------------------------------------------

    def key_of(self, job: Any, digest: str) -> tuple[str, str]:
        """``(scope, key)`` of one job: its key function's value (the identity digest without one)."""
        scope = self.scope or func_path(job)
        if ':' in scope:  # a function path never has one; refuse rather than build an ambiguous key
            raise InvalidArgument('scope', message=f'scope must not contain ":", got {scope!r}')
        if self.scope is None:
            declare_scope(self.name, scope)
        if self.key is None:
            return scope, digest
        args, kwargs = tuple(job.args), dict(job.kwargs)
        try:
            value = self.key(args, kwargs)
        except Exception as exc:
            raise InvalidArgument('key', message=f'{self!r}: the key function failed on this call: {exc!r}') from exc
        where = f'{self!r} key (the value the key function returned{_source(value, args, kwargs)})'
        return scope, key_text(value, where, func_path(job))

    def setting(self) -> str:
        """The policy's own part of the job field, before ``<scope>:<key>``."""
        raise NotImplementedError

    @property
    def cost_limit(self) -> int:
        """The largest cost one job may have: ``limit`` (Rate with several windows: the smallest window's)."""
        return self.limit

    def job_cost(self, job: Any) -> int:
        """How many units of its key's limit ``job`` uses: the policy's ``cost`` (an int, or ``(args, kwargs) ->
        int`` called on the job's arguments), checked against :attr:`cost_limit` as :func:`cost` does."""
        found = self.cost
        if not callable(found):
            return found
        try:
            found = found(tuple(job.args), dict(job.kwargs))
        except Exception as exc:
            raise InvalidArgument('cost', message=f'{self!r}: the cost function failed on this call: {exc!r}') from exc
        return cost(found, self.cost_limit, f'{self!r} cost (the value the cost function returned)')

    def job_fields(self, job: Any, queue: str, digest: str) -> list[str]:
        scope, key = self.key_of(job, digest)
        units = self.job_cost(job)
        setting = self.setting() if units == 1 else f'{self.setting()}*{units}'  # a costed job: '<setting>*<cost>'
        return [self.field, f'{setting} {keys.key_id(scope, key)}']

    def repr_words(self) -> list[str]:
        """Its settings as its repr shows them, before ``key=`` (``['10', 'per=1', 'burst=5']``)."""
        return [str(self.limit), *(f'{name}={getattr(self, name)}' for name in self.repr_settings)]

    def __repr__(self) -> str:
        words = self.repr_words()
        if self.key is not None:
            words.append(f'key={getattr(self.key, "__name__", self.key)}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        if self.cost != 1:
            words.append(f'cost={getattr(self.cost, "__name__", self.cost)}')
        return f'{type(self).__name__}({", ".join(words)})'

    # -- the fetch, and a job raising BackOff(key=True) ------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key('keydue', keys.KEY_DUE)
        call.arg('keyed', keyed_args(call.args.get('job_prefix', Job.redis_job_namespace_prefix)))

    @classmethod
    def on_job_exception(cls, job: Any, queue: Any, exc: BaseException, pipeline: Any) -> bool:
        if not isinstance(exc, BackOff) or not getattr(exc, 'key', False):
            return False
        classes = keyed_classes()
        key_ids = job_key_ids(classes, job.connection.hmget(job.key, [p.field for p in classes]))
        if not key_ids:
            raise PolicyError(f'job {job.id} raised BackOff(key=True) but has no per-key policy: declare '
                              'Concurrency or Rate with a key, or raise BackOff() to block its queue') from exc
        job.meta['policies_backoffs'] = int(job.meta.get('policies_backoffs', 0)) + 1
        call = Call('key_backoff', seconds=exc.seconds)
        call.key_list('blocks', [keys.KEY_BLOCK_PREFIX(key_id) for key_id in key_ids])
        call.run(pipeline)
        compat.enqueue_now(queue, job, pipeline=pipeline, at_front=True)  # saves the job, meta included
        return True

    # -- run-time settings and state shared by both (the admin API: rq_policies.engine.admin) ----------------------

    @classmethod
    def read_setting(cls, scope: str, key: Any, connection: Any = None) -> Any:
        """One key's run-time setting as stored (None: none), the scope, the key and the connection checked first
        (:class:`~rq_policies.engine.exceptions.InvalidSetting` naming a bad one)."""
        with refusing():
            key_id = keys.key_id(check_scope(scope), key_text(key))
            conn = need_connection(connection)
        return conn.hget(cls.key_settings, key_id)

    @classmethod
    def scope_in_use(cls, connection: Any, scope: str) -> bool:
        """Does Redis hold state of ``scope`` for this policy: a run-time setting of one of its keys, a key with
        parked jobs, a running hold (Concurrency) or an arrival time (Rate)? A SCAN of the keyspace when none."""
        pattern = reading.glob_escape(scope) + ':*'
        if connection.hexists(keys.KEY_RULES, cls.rule_field(scope)):
            return True
        if reading.any_field(connection, cls.key_settings, pattern):
            return True
        if reading.any_member(connection, keys.KEY_DUE, reading.glob_escape(f'{cls.name}:{scope}:') + '*'):
            return True
        return reading.any_key(connection, (keys.KEY_HOLDS_PREFIX if cls.holds else keys.KEY_TAT_PREFIX) + pattern)

    @classmethod
    def require_known_scope(cls, connection: Any, scope: str, hint: str) -> None:
        """Refuse (:class:`InvalidSetting` naming ``scope``, with ``hint``) a scope this policy is not known to use:
        not declared in this process, not the path of a function declaring it, no state of it in Redis."""
        if not scope_declared(cls.name, scope) and not cls.scope_in_use(connection, scope):
            raise InvalidSetting('scope', message=unknown_scope(cls.__name__, scope, hint))

    @classmethod
    def write_setting(cls, scope: str, key: Any, value: str, connection: Any = None, force: bool = True) -> Any:
        """Store ``value`` as one key's run-time setting ('' removes it) with ``lua/key_setting.lua``, which looks at
        the key's parked jobs again at once; the scope, the key and the connection checked first. The script's
        answer (1: a setting was there); a removal keeps it (lua/lib/answer.lua), so a replay after a lost reply
        answers what the first run did. Without ``force``, a setting of a scope this policy is not known to use
        (:meth:`require_known_scope`) is refused."""
        with refusing():
            key_id = keys.key_id(check_scope(scope), key_text(key))
            conn = need_connection(connection)
        if value and not force:
            cls.require_known_scope(conn, scope, 'pass force=True to set it anyway')
        call = Call('key_setting', key_id=key_id, policy=cls.name, value=value,
                    job_prefix=Job.redis_job_namespace_prefix, wake=keys.wake(''))
        call.key('limits', cls.key_settings)
        call.key('parked', keys.KEY_PARKED_PREFIX(cls.name, key_id))
        call.key('keydue', keys.KEY_DUE)
        return (call if value else call.answered()).run(conn)

    # -- a scope's stated rule (Tiers): stored once in Redis, read by the deciding script ---------------------------

    @classmethod
    def rule_setting(cls, value: Any, where: str) -> str:
        """One setting of a rule (a tier's or the default) as the policy stores a run-time setting, or an
        InvalidArgument naming ``where`` and the value."""
        raise NotImplementedError

    @classmethod
    def rule_value(cls, stored: str) -> Any:
        """A stored setting of a rule as :meth:`get_rule` gives it back."""
        raise NotImplementedError

    @classmethod
    def rule_field(cls, scope: str) -> str:
        """The field of ``rq:policies:keyrules`` holding this policy's rule of ``scope``."""
        return f'{cls.name}:{scope}'

    @classmethod
    def set_rule(cls, scope: str, rule: Tiers, connection: Any = None, force: bool = False) -> Tiers:
        """State the limit of every key of ``scope`` as a rule (:class:`Tiers`), stored once in Redis and read by
        the script that decides each start: it wins over the setting every job of the scope declares, whatever the
        producer's code, so two producers cannot make a key's limit drift; a per-key run-time setting (``set``) still
        wins over it. Replaces the scope's rule; writing the same rule twice is harmless. A key's parked jobs see a
        raised rule when the key next comes due (a release, a hold's expiry, its rate's next start; ``set`` wakes
        them at once): a rule covers keys listed nowhere, so setting one touches no key's state. A scope this
        policy is not known to use is refused as a typo; ``force=True`` sets it anyway. Returns the rule as stored."""
        with refusing():
            scope = check_scope(scope)
            if not isinstance(rule, Tiers):
                raise InvalidArgument('rule', message=f'rule must be a Tiers(...), got {rule!r}')
            stored = [cls.rule_setting(rule.default, 'default')]
            for prefix, value in rule.tiers.items():
                stored += [prefix, cls.rule_setting(value, f'tiers[{prefix!r}]')]
            conn = need_connection(connection)
        if not force:
            cls.require_known_scope(conn, scope, 'pass force=True to set it anyway')
        conn.hset(keys.KEY_RULES, cls.rule_field(scope), pack(stored))
        return cls.decode_rule(pack(stored))

    @classmethod
    def decode_rule(cls, raw: Any) -> Tiers | None:
        """A rule as stored in ``rq:policies:keyrules`` (None: none, or not one)."""
        if raw is None:
            return None
        try:
            items = msgpack.unpackb(raw, raw=False)
            tiers = {items[i]: cls.rule_value(items[i + 1]) for i in range(1, len(items) - 1, 2)}
            return Tiers(tiers, default=cls.rule_value(items[0]))
        except (ValueError, TypeError, IndexError, msgpack.UnpackException):
            return None

    @classmethod
    def get_rule(cls, scope: str, connection: Any = None) -> Tiers | None:
        """The rule of ``scope`` (:meth:`set_rule`), or None (each job's declared setting applies)."""
        with refusing():
            scope = check_scope(scope)
            conn = need_connection(connection)
        return cls.decode_rule(conn.hget(keys.KEY_RULES, cls.rule_field(scope)))

    @classmethod
    def clear_rule(cls, scope: str, connection: Any = None) -> bool:
        """Remove the rule of ``scope``: each job's declared setting applies again (per-key ``set`` ones stay).
        True when there was one; a replay after a lost reply answers the same (``lua/clear_setting.lua``)."""
        with refusing():
            scope = check_scope(scope)
            conn = need_connection(connection)
        return clear_setting(conn, keys.KEY_RULES, cls.rule_field(scope))

    @classmethod
    def clear(cls, scope: str, key: Any, connection: Any = None) -> bool:
        """Remove the run-time setting of one key (``set``): its jobs' declared one applies again. Returns True
        when it had one."""
        return cls.write_setting(scope, key, '', connection) == 1

    @classmethod
    def parked(cls, scope: str, key: Any, connection: Any = None) -> list[str]:
        """The ids of one key's jobs parked by this policy, oldest first (the order they go back in)."""
        key_id = keys.key_id(check_scope(scope), key_text(key))
        return [text(j) for j in need_connection(connection).lrange(keys.KEY_PARKED_PREFIX(cls.name, key_id),
                                                                      0, -1)]

    @classmethod
    def backoff(cls, scope: str, key: Any, seconds: float, connection: Any = None) -> float:
        """Block one key of ``scope`` for ``seconds`` (server clock), as a job raising ``BackOff(seconds, key=True)``
        does; a block that already ends later is kept. Returns the server time the block ends."""
        delay = BackOff(seconds, key=True).seconds
        call = Call('key_backoff', seconds=delay)
        call.key_list('blocks', [keys.KEY_BLOCK_PREFIX(keys.key_id(check_scope(scope), key_text(key)))])
        call.run(need_connection(connection))
        return float(cls.blocked_until(scope, key, connection) or 0.0)

    @classmethod
    def blocked_until(cls, scope: str, key: Any, connection: Any) -> float | None:
        """The server time until which ``key`` of ``scope`` is backed off, or None."""
        raw = need_connection(connection).get(keys.KEY_BLOCK_PREFIX(keys.key_id(check_scope(scope), key_text(key))))
        return float(raw) if raw is not None else None


def keyed_classes() -> list[type[KeyedPolicy]]:
    """The registered per-key policies, in the registry's order."""
    return [cls for cls in registered(FETCH) if issubclass(cls, KeyedPolicy)]


def job_key_ids(classes: list[type[KeyedPolicy]], values: list[Any]) -> list[str]:
    """The distinct key ids (``<scope>:<key>``) of a job's per-key fields (``values``: each class's field as read,
    or None)."""
    out: list[str] = []
    for cls, raw in zip(classes, values):
        if raw is None:
            continue
        key_id = text(raw).split(' ', cls.setting_words)[-1]
        if key_id not in out:
            out.append(key_id)
    return out
