"""Policy value objects, their registry and the ``@policy`` declaration.

A policy says what an enqueue is admitted under; it holds no state (state lives in Redis, keyed by the job's identity,
see :mod:`rq_policies.engine.identity`). Policies are validated when they are built, so a bad argument fails at import
time, where the decorator runs, and never after something was written.

What a policy implements for the engine is :mod:`rq_policies.engine.protocols` (each hook documented there once); the
base classes here give every hook its default, so a policy overrides only what it decides. What a policy *shows* is
its views (:class:`rq_policies.engine.views.PolicyViews`), apart from its rules.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .exceptions import InvalidArgument, PolicyConfigurationError
from .identity import UniqueContext

# A hook's ``verdict`` is an admission.Verdict (protocols.py says so); not imported here, even for type checking:
# admission imports this module, and the import would close a circle.
if TYPE_CHECKING:
    from redis import Redis
    from redis.client import Pipeline
    from rq.job import Job
    from rq.queue import Queue

    from .keys import Family
    from .ledger import Hold
    from .ops import Call

F = TypeVar('F', bound=Callable[..., Any])

logger = logging.getLogger('rq_policies')

#: Attribute ``@policy`` sets on the decorated function.
ATTRIBUTE = '__rq_policies__'

#: The longest duration any policy accepts (slot, wait, hold ttl): ten years. Beyond it Redis's expiry arithmetic
#: overflows, and a Lua script that fails half-way keeps the writes it already made, so it is refused up front.
MAX_SECONDS = 10 * 366 * 24 * 3600

#: The largest cap QueueSlot accepts (Lua numbers are doubles; far below where they stop being exact).
MAX_CAPACITY = 2**31 - 1


def positive_int(name: str, value: Any, maximum: int | None = None) -> int:
    """``value`` as an int >= 1 (and <= ``maximum``), or a ValueError naming ``name`` and the value.

    bool is refused although it is an int: ``Throttle(True)`` is a bug, not a one-second slot.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(name, message=f'{name} must be a positive integer, got {value!r}')
    if maximum is not None and value > maximum:
        raise InvalidArgument(name, message=f'{name} must be at most {maximum}, got {value!r}')
    return value


def whole_seconds(name: str, value: Any) -> int:
    """``value`` as a whole number of seconds from 1 to :data:`MAX_SECONDS`, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(name, message=f'{name} must be a whole number of seconds >= 1 (an int), got {value!r}')
    return positive_int(name, value, MAX_SECONDS)


#: The two kinds of policy. An *admission* policy decides at enqueue, in the admission script, whether (and how) a
#: job is written; a *fetch* policy decides at fetch, in the fetch script, whether a worker may take a job now.
ADMISSION = 'admission'
FETCH = 'fetch'

_REGISTRY: dict[str, type[Policy]] = {}

_VIEWS = 'on its views, a rq_policies.engine.views.PolicyViews subclass naming the policy (policy = ...)'
#: Hooks the engine no longer calls on a policy class (0.3), each with what replaces it: a class defining one is
#: refused when it is defined (:class:`PolicyConfigurationError`), rather than left silently unused.
RETIRED = {
    'summary': f'a views.Section returned by queue_info {_VIEWS} (its headline())',
    'describe_queue': f'a views.Section returned by queue_info {_VIEWS} (its rows())',
    'queue_state': f'queue_info {_VIEWS}, returning a views.Section per queue (its as_json() is the data)',
    'describe_cluster': f'a views.Section returned by cluster_info {_VIEWS} (its rows())',
    'cluster_state': f'cluster_info {_VIEWS}, returning a views.Section (its as_json() is the data)',
    **{name: f'define {name} {_VIEWS}' for name in (
        'explain', 'explain_gone', 'panels', 'metrics', 'commands', 'queue_info', 'cluster_info', 'describe')},
    'conflicts': 'the class attribute excludes: {other policy name: why the two cannot be combined}',
    'call_fields': 'job_fields(job, queue, digest), which returns the call\'s fields too (names in payload_fields)',
    'call_field_names': 'the class attribute payload_fields',
    'ended': 'release(connection, job_prefix, job_ids, ended=True)',
    'leased_keys': 'the attribute leased: the identity family whose key lives as long as the job hash',
    'fetch_hold': 'a take reporting flag 1 holds in the queue\'s ledger (keys.holds); else it reports its ledger',
    'configured_queues': 'the class attribute queue_settings: the hash whose fields name the queues it configures',
    **{name: 'the contract suite\'s SETTINGS in the policy\'s tests/<folder>/examples.py, and set/clear (the admin '
             'API) with PolicyViews.queue_settings for the dashboard' for name in
       ('configure', 'unconfigure', 'setting_examples')},
}


def _is_method(found: object) -> bool:
    return callable(found) or isinstance(found, (classmethod, staticmethod, property))


class Policy:
    """Base class of every policy. Subclasses are small immutable value objects (or, for a policy whose settings
    live in Redis, such as QueueSlot, a namespace of classmethods) that register themselves by :attr:`name`.

    The engine never names a policy: it iterates :func:`registered` and calls the hooks of
    :mod:`rq_policies.engine.protocols`, which a policy overrides where it has something to say. A new policy is its
    own folder (``rules.py``: the class and its hooks; ``views.py``: what it shows), its own Lua part
    (``lua/policies/<name>.lua``) and its own tests; registering is defining the class.
    """

    #: The one name of the policy: drop counters, metrics labels, ``info``, logs and the Lua part's file name.
    name: ClassVar[str] = 'policy'
    #: :data:`ADMISSION` or :data:`FETCH`; a class without a kind (a base class) is not registered.
    kind: ClassVar[str] = ''
    #: The order in which admission checks run (lower first): a throttle window is tested before a loner marker, so
    #: a drop names the window's owner whenever the window is held.
    rank: ClassVar[int] = 100
    # The data of the contract (rq_policies.engine.protocols documents each): the defaults of a policy that has none.
    admits: ClassVar[bool] = False
    call_options: ClassVar[tuple[str, ...]] = ()
    excludes: ClassVar[Mapping[str, str]] = {}
    leased: ClassVar[Family | None] = None
    payload_fields: ClassVar[tuple[str, ...]] = ()
    probes: ClassVar[bool] = True
    schedules: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for hook, instead in RETIRED.items():
            if _is_method(cls.__dict__.get(hook)):
                raise PolicyConfigurationError(f'{cls.__module__}.{cls.__qualname__} defines {hook}, which '
                                               f'rq-policies no longer calls: use {instead} (see CHANGELOG.md, 0.3)')
        if _is_method(cls.__dict__.get('identity_families')):
            raise PolicyConfigurationError(f'{cls.__module__}.{cls.__qualname__}.identity_families is a method: make '
                                           'it a class attribute, the tuple of keys.Family it returned')
        if not cls.kind or 'name' not in cls.__dict__:
            return
        known = _REGISTRY.get(cls.name)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise PolicyConfigurationError(
                f'policy name {cls.name!r} is taken by {known.__module__}.{known.__qualname__}: pick another name'
            )
        _REGISTRY[cls.name] = cls

    def __repr__(self) -> str:
        return f'{type(self).__name__}()'

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items()))))

    # -- the door's hooks of every declared policy (protocols.Declared), each a no-op here ---------------------------

    def validate(self, job: Job, mode: str, force: bool) -> None:
        """See :meth:`rq_policies.engine.protocols.Declared.validate`."""

    def job_fields(self, job: Job, queue: str, digest: str) -> list[str]:
        """See :meth:`rq_policies.engine.protocols.Declared.job_fields`."""
        return []

    def on_admit(self, job: Job, queue: str, verdict: Any) -> None:
        """See :meth:`rq_policies.engine.protocols.Declared.on_admit`."""

    def hint_seconds(self, verdict: Any) -> float:
        """See :meth:`rq_policies.engine.protocols.Declared.hint_seconds`."""
        return 0.0

    @classmethod
    def on_job_exception(cls, job: Job, queue: Queue, exc: BaseException, pipeline: Pipeline) -> bool:
        """See :meth:`rq_policies.engine.protocols.FetchSide.on_job_exception`."""
        return False


def replaced_in_place(job: Any, queue: str, verdict: Any, policy: str, pending: str) -> None:
    """The admission rewrote ``pending`` job ``verdict.job_id`` in place with ``job``'s payload (Debounce, a trailing
    Throttle), to run at ``verdict.number``: log it, and make ``job`` that job, the handle the caller gets (its id,
    scheduled, not enqueued; the payload is already ``job``'s own)."""
    from datetime import datetime, timezone

    from rq.job import JobStatus

    from . import compat

    if logger.isEnabledFor(logging.INFO):
        logger.info('rq-policies: %s on queue %r (%s): replaced the payload of %s %s in place (this call was job %s), '
                    'runs at %s', job.func_name, queue, policy, pending, verdict.job_id, job.id,
                    datetime.fromtimestamp(verdict.number, timezone.utc).isoformat())
    job.id = verdict.job_id
    compat.set_local_status(job, JobStatus.SCHEDULED)
    job.enqueued_at = None


#: Functions that import views not imported with their policies' rules (:func:`defer_views`), run once by
#: :func:`load_views`.
_VIEW_LOADERS: list[Callable[[], object]] = []
_views_lock = threading.RLock()
_views_loading: list[bool] = []  # non-empty while a thread runs the loaders


def defer_views(load: Callable[[], object]) -> None:
    """Have the first look at the policies' views (:func:`rq_policies.engine.views.shown`, ``views_of``) call
    ``load``, which imports views modules (each registers its views when it is defined).

    The built-in policies' views are imported so (``rq_policies/policies/__init__.py``), not with their rules: a
    PolicyWorker and a producer never look at them, and importing them (the engine's descriptions included) cost a
    worker's start about 8 ms (issue 33). A policy of the application's may import its views with its rules, or
    defer them too."""
    with _views_lock:
        _VIEW_LOADERS.append(load)


def load_views() -> None:
    """Run every deferred views loader (once; a thread that finds another one running them waits for it)."""
    if not _VIEW_LOADERS and not _views_loading:
        return
    with _views_lock:
        _views_loading.append(True)
        try:
            while _VIEW_LOADERS:
                _VIEW_LOADERS.pop(0)()
        finally:
            _views_loading.pop()


def registered(kind: str | None = None) -> list[type[Policy]]:
    """Every registered policy class (of one kind when ``kind`` is given), in rank order, then by name."""
    return sorted(
        (cls for cls in _REGISTRY.values() if kind is None or cls.kind == kind), key=lambda cls: (cls.rank, cls.name)
    )


def by_name(name: str) -> type[Policy]:
    """The registered policy class called ``name``; KeyError names the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f'no policy named {name!r}; registered: {sorted(_REGISTRY)}') from None


class AdmissionPolicy(Policy):
    """A policy decided at enqueue, in the admission script (``lua/admit.lua``, see
    :mod:`rq_policies.engine.admission`): it meets :class:`rq_policies.engine.protocols.AdmissionSide`, whose methods
    are given no-op defaults here.

    Its Lua part (``lua/policies/<name>.lua``) defines ``check``, ``commit`` and ``force``; its Python side says which
    keys and arguments that part gets (:meth:`admit_part`), and what a verdict means for the caller.
    """

    kind: ClassVar[str] = ADMISSION
    ended_when: ClassVar[tuple[str, str] | None] = None
    identity_families: ClassVar[tuple[Family, ...]] = ()

    def admit_part(self, call: Call, queue: Queue, digest: str) -> Mapping[str, object]:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.admit_part`."""
        return {}

    def narrow_part(self, queue: Queue, digest: str) -> tuple[str, list[str]] | None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.narrow_part`."""
        return None

    def on_drop(self, func_name: str, queue: str, verdict: Any) -> None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.on_drop`."""
        if logger.isEnabledFor(logging.INFO):
            logger.info('rq-policies: dropped %s on queue %r (%s): identity held by job %s', func_name, queue,
                        self.name, verdict.job_id)

    @classmethod
    def release(cls, connection: Redis | Pipeline, job_prefix: str, job_ids: list[str], ended: bool = False) -> None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.release`."""

    @classmethod
    def reset_part(cls, call: Call, queue: str, digest: str, declared: AdmissionPolicy | None) -> Mapping[str, object]:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.reset_part`."""
        return {}


class FetchPolicy(Policy):
    """A policy decided at fetch, in the fetch script (QueueSlot).

    Its Lua part (``lua/policies/<name>.lua``) defines ``gate`` and ``take`` (see ``lua/fetch.lua``); the class meets
    :class:`rq_policies.engine.protocols.FetchSide`, the Python side of the same fetch
    (:func:`rq_policies.engine.fetch.fetch_call`).
    """

    kind: ClassVar[str] = FETCH
    per_job: ClassVar[bool] = False
    fetch_state: ClassVar[tuple[str, ...] | None] = None
    queue_settings: ClassVar[str | None] = None

    @classmethod
    def fetch_keys(cls, call: Call, queue_names: list[str]) -> None:
        """See :meth:`rq_policies.engine.protocols.FetchSide.fetch_keys`."""

    @classmethod
    def release_hold(cls, connection: Redis | Pipeline, hold: Hold, wake: str) -> bool:
        """See :meth:`rq_policies.engine.protocols.FetchSide.release_hold`."""
        raise NotImplementedError(f'{cls.__name__}: its Lua take() named a ledger, so it must release the hold')


@dataclass(frozen=True)
class DroppedCall:
    """An enqueue a policy dropped, as the ``on_drop`` hook of ``@policy(...)`` gets it.

    Attributes:
        function: the job function's import path, as rq stores it (``tasks.sweep_cache``).
        args: the call's positional arguments (the function's, without rq's enqueue options).
        kwargs: the call's keyword arguments (likewise).
        queue: the queue name.
        policy: the name of the policy that dropped it (``'loner'``, ``'throttle'``, ...).
    """

    function: str
    args: tuple
    kwargs: dict
    queue: str
    policy: str


#: ``on_drop(call, holder_id)``: told of each enqueue a policy dropped (see :func:`policy`).
OnDrop = Callable[[DroppedCall, str], Any]


@dataclass(frozen=True)
class PolicySet:
    """The policies one enqueue is admitted under, with the identity hook they share and the drop hook."""

    policies: tuple[Policy, ...]
    unique_context: UniqueContext | None = field(default=None, compare=False)
    on_drop: OnDrop | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        seen: set[type] = set()
        for item in self.policies:
            if not isinstance(item, Policy):
                raise InvalidArgument(
                    'policy', message=f'policy: expected a Policy (Loner(), Throttle(60), ...), got {item!r}')
            if type(item) in seen:
                raise PolicyConfigurationError(f'policy: {type(item).__name__} is given twice in {self.policies!r}')
            seen.add(type(item))
        check_combination(self.policies)
        if self.unique_context is not None and not callable(self.unique_context):
            raise InvalidArgument(
                'unique_context', message=f'unique_context: expected a callable (args, kwargs) -> value, got '
                                          f'{self.unique_context!r}')
        if self.on_drop is not None and not callable(self.on_drop):
            raise InvalidArgument(
                'on_drop', message=f'on_drop: expected a callable (call, holder_id) -> None, got {self.on_drop!r}')

    def dropped(self, call: DroppedCall, holder: str) -> None:
        """Tell the ``on_drop`` hook (if any) of a drop; an exception in it is logged, never raised."""
        hook = self.on_drop
        if hook is None:
            return
        try:
            hook(call, holder)
        except Exception:
            logger.exception('rq-policies: the on_drop hook %r raised on a drop of %s on queue %r (%s, held by job '
                             '%s); the enqueue returns as dropped all the same', hook, call.function, call.queue,
                             call.policy, holder)

    @functools.cached_property
    def admission(self) -> tuple[AdmissionPolicy, ...]:
        """The policies of the set that take part in the admission script (admission policies, and a fetch policy
        that ``admits``), in the order their checks run (computed once per set)."""
        return tuple(sorted((p for p in self.policies if p.kind == ADMISSION or p.admits),
                            key=lambda p: (p.rank, p.name)))

    @functools.cached_property
    def memo(self) -> dict[Any, Any]:
        """Values the doors derive from this set alone and reuse on every enqueue under it (the admission call's
        constant arguments per queue), kept with the set so they live exactly as long as it does."""
        return {}

    def __bool__(self) -> bool:
        return bool(self.policies)


def check_combination(policies: tuple[Policy, ...]) -> None:
    """Refuse combinations that mean nothing, with the reason a policy's ``excludes`` gives for the other."""
    for item in policies:
        for other in policies:
            if other.name in item.excludes:
                raise PolicyConfigurationError(f'policy: {item.excludes[other.name]}')


#: make_set's sets of one policy, by the policy's id (bounded: a caller building a new policy per call only refills it).
_SINGLE_SETS: dict[int, tuple[Policy, PolicySet]] = {}
_SINGLE_SETS_MAX = 1024
#: The set made for a policy, by its value (:func:`make_set`): an equal policy made later gets the same set.
_EQUAL_SETS: dict[Policy, PolicySet] = {}

#: The scopes of the per-key policies (Fair, Concurrency, Rate) this process has seen declared, by policy name: a
#: ``scope=`` given to one, a decorated function's path (its default scope), a scope an enqueue used. What
#: :func:`scope_declared` answers first, before looking in Redis (a typo in an admin call's scope is refused).
DECLARED_SCOPES: dict[str, set[str]] = {}


def declare_scope(name: str, scope: str) -> None:
    """Note that a policy named ``name`` uses ``scope`` in this process."""
    found = DECLARED_SCOPES.get(name)
    if found is None:
        found = DECLARED_SCOPES[name] = set()
    if scope not in found:
        found.add(scope)


def scope_declared(name: str, scope: str) -> bool:
    """Is ``scope`` one a policy named ``name`` uses: declared in this process (:data:`DECLARED_SCOPES`), or the
    import path of a function whose declared policies include one named ``name`` with its default scope (what a
    command line, which has not imported the app, can still check)?"""
    if scope in DECLARED_SCOPES.get(name, ()):
        return True
    if '.' not in scope:
        return False
    from rq.utils import import_attribute

    try:
        target = import_attribute(scope)
    except Exception:  # not importable here: a typo, or code this process does not have (Redis may still know it)
        return False
    spec = getattr(target, ATTRIBUTE, None)
    return isinstance(spec, PolicySet) and any(
        getattr(item, 'name', None) == name and getattr(item, 'scope', '') is None for item in spec.policies)


def make_set(value: Policy | Iterable[Policy] | PolicySet | None, unique_context: UniqueContext | None = None):
    """Normalize what a caller passed as ``policy=`` into a PolicySet (or None for "no policy")."""
    if value is None:
        return None
    if isinstance(value, PolicySet):
        return value
    if isinstance(value, Policy):
        if unique_context is not None:
            return PolicySet((value,), unique_context)
        # A door's ``policy=Loner()`` is usually one long-lived object passed on every call: its set is built (and
        # its combination checked) once, not per enqueue. Keyed by identity, holding the policy so the id stays its.
        found = _SINGLE_SETS.get(id(value))
        if found is not None and found[0] is value:
            return found[1]
        # A new but equal policy (``policy=Loner()`` written in the call, a new object every enqueue) gets the set
        # an equal one made: a new set would rebuild, per enqueue, everything a set computes once (its admission
        # order, its constant call arguments, its hint token: about 14 us). Policies are values (their settings,
        # fixed in __init__, are their equality and hash); one whose settings do not hash gets a set of its own.
        try:
            made = _EQUAL_SETS.get(value)
        except TypeError:
            made = None
        if made is None:
            made = PolicySet((value,))
            try:
                if len(_EQUAL_SETS) >= _SINGLE_SETS_MAX:
                    _EQUAL_SETS.clear()
                _EQUAL_SETS[value] = made
            except TypeError:
                pass
        if len(_SINGLE_SETS) >= _SINGLE_SETS_MAX:
            _SINGLE_SETS.clear()
        _SINGLE_SETS[id(value)] = (value, made)
        return made
    if isinstance(value, (list, tuple)):
        return PolicySet(tuple(value), unique_context) if value else None
    raise InvalidArgument('policy', message=f'policy: expected a Policy, a list of policies or None, got {value!r}')


def policy(*policies: Policy, unique_context: UniqueContext | None = None,
           on_drop: OnDrop | None = None) -> Callable[[F], F]:
    """Declare the policies a job function is enqueued under.

    Example::

        @policy(Loner())
        def sweep_cache(article_id): ...

        @policy(Loner(), unique_context=lambda args, kwargs: args[0])
        def sync_account(account_id, reason): ...   # one waiting job per account, whatever the reason

        def count_drop(call, holder_id):             # call: a DroppedCall
            metrics.increment('jobs.dropped', tags={'function': call.function, 'policy': call.policy})

        @policy(Throttle(60), on_drop=count_drop)
        def poll_account(account_id): ...

    Args:
        *policies: one or more Policy objects.
        unique_context: optional ``(args, kwargs) -> value`` narrowing the identity every policy keys on.
        on_drop: optional ``(call, holder_id) -> None``, called in the producer after a policy dropped an enqueue of
            the function (the drop is already decided, counted and logged): ``call`` is a :class:`DroppedCall`
            (function path, args, kwargs, queue name, the dropping policy's name), ``holder_id`` the id of the job
            that holds the identity. For the app's own logging or metrics. It runs in the enqueueing thread, before
            the enqueue returns None (or, under ``Loner(on_conflict='raise')``, before it raises DuplicateJob), so
            keep it short. An exception in it is logged (``rq_policies`` logger, with its traceback) and not raised
            into the enqueue: a metrics hook that fails must not turn a decided drop into an error the caller would
            read as "not enqueued for another reason". Not called on an admitted enqueue, nor on a replace (a
            Loner ``'replace'``, a Debounce or a trailing Throttle rewriting the pending job: nothing was dropped).

    Returns:
        A decorator that returns the function itself (rq stores jobs by import path, so no wrapper is involved).
    """
    if not policies:
        raise InvalidArgument('policy', message='policy: give at least one policy, for example @policy(Loner())')
    spec = PolicySet(tuple(policies), unique_context, on_drop)

    def decorate(func: F) -> F:
        if not callable(func):
            raise InvalidArgument('policy', message=f'policy: can only decorate a callable, got {func!r}')
        setattr(func, ATTRIBUTE, spec)
        path = f'{getattr(func, "__module__", "")}.{getattr(func, "__qualname__", "")}'
        for item in spec.policies:
            if getattr(item, 'scope', '') is None:  # a per-key policy on its default scope: the function's path
                declare_scope(item.name, path)
        return func

    return decorate


def declared(func: Any) -> PolicySet | None:
    """The PolicySet declared on a function with ``@policy``, or None."""
    spec = getattr(func, ATTRIBUTE, None)
    return spec if isinstance(spec, PolicySet) else None
