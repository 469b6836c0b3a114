"""Policy value objects and the ``@policy`` declaration.

A policy says what an enqueue is admitted under; it holds no state (state lives in Redis, keyed by the job's identity,
see :mod:`rq_policies.engine.identity`). Policies are validated when they are built, so a bad argument fails at import
time, where the decorator runs, and never after something was written.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .exceptions import PolicyConfigurationError
from .identity import UniqueContext
from .views import Section, Shown, text_only

if TYPE_CHECKING:
    from redis import Redis

    from .views import Explanation, Metric, Panel, Row, View

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
        raise ValueError(f'{name} must be a positive integer, got {value!r}')
    if maximum is not None and value > maximum:
        raise ValueError(f'{name} must be at most {maximum}, got {value!r}')
    return value


def whole_seconds(name: str, value: Any) -> int:
    """``value`` as a whole number of seconds from 1 to :data:`MAX_SECONDS`, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a whole number of seconds >= 1 (an int), got {value!r}')
    return positive_int(name, value, MAX_SECONDS)


#: The two kinds of policy. An *admission* policy decides at enqueue, in the admission script, whether (and how) a
#: job is written; a *fetch* policy decides at fetch, in the fetch script, whether a worker may take a job now.
ADMISSION = 'admission'
FETCH = 'fetch'

_REGISTRY: dict[str, type[Policy]] = {}


class Policy:
    """Base class of every policy. Subclasses are small immutable value objects (or, for a policy whose settings
    live in Redis, such as QueueSlot, a namespace of classmethods) that register themselves by :attr:`name`.

    The glue (queue, worker, state, metrics, cli) never names a policy: it iterates :func:`registered` and calls the
    hooks below, each of which a policy overrides where it has something to say. A new policy is its own module (the
    class and its hooks), its own Lua part (``lua/policies/<name>.lua``) and its own test file; registering is
    defining the class.
    """

    #: The one name of the policy: drop counters, metrics labels, ``info``, logs and the Lua part's file name.
    name: ClassVar[str] = 'policy'
    #: :data:`ADMISSION` or :data:`FETCH`; a class without a kind (a base class) is not registered.
    kind: ClassVar[str] = ''
    #: The order in which admission checks run (lower first): a throttle window is tested before a loner marker, so
    #: a drop names the window's owner whenever the window is held.
    rank: ClassVar[int] = 100
    #: Does the policy take part in the admission script (``lua/admit.lua``: its part's ``check``, ``commit``,
    #: ``force``, ``written``) when declared on a function? Every admission policy does; a fetch policy that also
    #: decides where its jobs wait (Fair) says so here and provides the admission hooks (``admit_part``,
    #: ``job_fields``, ``validate``, ``on_drop``, ``on_admit``, ...).
    admits: ClassVar[bool] = False
    #: Keyword options of ``enqueue``/``enqueue_at``/``enqueue_in`` the policy consumes when declared (Fair's
    #: ``priority``): the door takes them out of the call before rq parses it (the function never gets them), and
    #: :func:`rq_policies.engine.queue.door_options` hands them to the policy's :meth:`call_fields`.
    call_options: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
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

    # -- hooks the glue calls through the registry (each a no-op here) --------------------------------------------

    def conflicts(self, others: tuple[Policy, ...]) -> str | None:
        """Why this policy cannot be declared together with ``others`` (the whole declared tuple), or None."""
        return None

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[Metric]:
        """This policy's Prometheus metric families, read from Redis at scrape time (``now``: the server clock), as
        :class:`rq_policies.engine.views.Metric` descriptions; :mod:`rq_policies.surfaces.metrics` renders them."""
        return []

    @classmethod
    def commands(cls) -> tuple[View, ...]:
        """The subcommands this policy adds to ``rq-policies``, as :mod:`rq_policies.engine.views` descriptions
        (:class:`~rq_policies.engine.views.Setting`, :class:`~rq_policies.engine.views.Command`,
        :class:`~rq_policies.engine.views.Group`); :mod:`rq_policies.surfaces.cli` renders them."""
        return ()

    @classmethod
    def identity_families(cls) -> tuple[Any, ...]:
        """The per-identity key families this policy writes (:class:`rq_policies.engine.keys.Family`), for info and
        reset."""
        return ()

    @classmethod
    def on_job_exception(cls, job: Any, queue: Any, exc: BaseException, pipeline: Any) -> bool:
        """A job raised ``exc`` in a PolicyWorker: when it is this policy's (Snooze, BackOff), queue onto
        ``pipeline`` what becomes of the job instead of rq's failure path, and return True.

        The worker then skips the job's failure callback, rq's exception handlers and its failure and retry handling,
        removes the job from its started registry, and sends the pipeline; the job's holds are released as on every
        other path. Raising instead (a :class:`~rq_policies.engine.exceptions.PolicyError` chained from ``exc``) fails
        the job with that error through rq's own failure path.
        """
        return False

    def call_field_names(self) -> tuple[str, ...]:
        """The names of the fields :meth:`call_fields` writes: an in-place rewrite of a waiting job (Loner's
        ``'replace'``, Debounce, a trailing Throttle) replaces them along with the payload."""
        return ()

    def call_fields(self, job: Any, queue: str, digest: str) -> list[Any]:
        """Fields this policy stores on the job hash that depend on the call itself (its args and kwargs: a per-key
        policy's key), field, value, ...; raising here (a bad key) refuses the enqueue before anything is written."""
        return []

    @classmethod
    def cluster_info(cls, connection: Redis, now: float, limit: int | None) -> Section | None:
        """This policy's state that belongs to no queue (a per-key limit's keys), for ``rq-policies info``: a
        :class:`rq_policies.engine.views.Section` whose fields are ``info --json``'s ``policies.<name>`` and whose rows
        are its text; ``limit`` bounds the entries listed (None: all). None: nothing to show.

        A policy written before sections (one that defines ``cluster_state``, returning the dict, and
        ``describe_cluster``, its lines) is shown as it was, through :class:`LegacyCluster`."""
        if _overrides(cls, 'cluster_state', Policy):
            found = cls.cluster_state(connection, now, limit)
            return LegacyCluster(found, cls) if found else None
        return None

    @classmethod
    def cluster_state(cls, connection: Any, now: float, limit: int | None) -> dict[str, Any]:
        """:meth:`cluster_info` as the plain data ``info --json`` shows (``{}``: nothing), for readers that want
        the data alone (the OpenTelemetry gauges). A policy defines :meth:`cluster_info`, not this."""
        found = cls.cluster_info(connection, now, limit)
        return found.as_json() if found is not None else {}

    @classmethod
    def explain(cls, connection: Redis, job: dict[str, str], now: float) -> list[Explanation]:
        """This policy's part of ``rq-policies explain`` for one job (:func:`rq_policies.surfaces.explainer.explain`).

        ``job`` is the job hash without its payload (str -> str, the policies' own ``policies_*`` fields included,
        plus ``id`` and ``now``, the server clock). Answer from Redis alone, building keys from what the job hash
        stores (never SCAN): a list of ``{'policy': name, 'verdict': what it says now, 'change': what would change
        it, ...details}``, empty when this policy has nothing to say about the job.
        """
        return []

    @classmethod
    def panels(cls, connection: Redis, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """This policy's panels on the dashboard (:mod:`rq_policies.surfaces.dashboard`), read from Redis in a bounded
        number of commands (SCAN with COUNT and a budget, never KEYS): the page must answer fast on a server with
        100,000 identities, so list at most ``limit`` rows per panel and say in ``note`` when there are more.

        Args:
            connection: the Redis connection.
            now: the server's clock (epoch seconds), the clock every expiry is measured by.
            limit: the most rows a panel lists.
            search: only rows about this text (a queue name, a key, an identity digest or a job id); None for all.

        Returns:
            A list of :class:`rq_policies.engine.views.Panel` (title, columns, rows, note): a cell is a str, int, float
            or None, or a :class:`rq_policies.engine.views.Cell` (a link to a job, a live time, a warning, ...). The
            page escapes every cell.
        """
        return []

    @classmethod
    def explain_gone(cls, connection: Redis, job_id: str, records: dict[str, Any], now: float) -> list[Explanation]:
        """This policy's part of ``explain`` for a job id Redis has no job hash for (a superseded pending job, a
        dropped enqueue), from what the admission left about that id.

        ``records``: ``superseded`` (the id's tombstone, ``{'policy': who superseded it, 'by': the job that did}``),
        ``dropped`` (the drop record of an enqueue given ``job_id=``: ``{'policy', 'holder', 'n', 'at', 'queue'}``),
        each None when absent, and ``job_prefix``. Answer as :meth:`explain` does (``queue`` may name the job's
        queue); empty when the records are not this policy's.
        """
        return []


def job_status(connection: Any, job_prefix: str, job_id: str) -> tuple[str, str]:
    """``(status, origin)`` of job ``job_id`` ('' for what its hash lacks, both for no hash): for ``explain`` hooks
    naming another job (a holder, a replacement)."""
    status, origin = connection.hmget(job_prefix + job_id, 'status', 'origin')
    return (status.decode() if isinstance(status, bytes) else status or '',
            origin.decode() if isinstance(origin, bytes) else origin or '')


def replaced_in_place(job: Any, verdict: Any) -> None:
    """The admission rewrote pending job ``verdict.job_id`` in place with ``job``'s payload (Debounce, a trailing
    Throttle): make ``job`` that job, the handle the caller gets (its id, scheduled, not enqueued; the payload is
    already ``job``'s own)."""
    from rq.job import JobStatus

    from . import compat

    job.id = verdict.job_id
    compat.set_local_status(job, JobStatus.SCHEDULED)
    job.enqueued_at = None


def superseded_entry(policy: str, connection: Any, records: dict[str, Any], pending: str,
                     change: str) -> list[Explanation]:
    """The ``explain_gone`` entry of a pending job that a later enqueue of ``policy`` replaced (its tombstone in
    ``records['superseded']``), or [] when no tombstone of ``policy`` names one. ``pending`` says what the job was (a
    debounced, a trailing job) and when its replacement runs; ``change`` is the advice, ``{by}`` the job that runs.

    The chain of replacements is followed to the job that will run (``runs_as``, with ``chain`` from the first
    replacement): ids superseded one by another before pending jobs were rewritten in place each name the next. An
    id whose enqueue was merged into the pending job in place (its tombstone says ``merged``: that call's job was
    never written) names the pending job its payload went into."""
    from rq_policies.surfaces.explainer import follow

    from .views import Explanation

    superseded = records['superseded']
    if not superseded or superseded['policy'] != policy:
        return []
    by = superseded['by']
    chain, status, queue = follow(connection, records['job_prefix'], by)
    final = chain[-1]
    via = f' (via {", ".join(chain[:-1])}, each replaced in turn)' if len(chain) > 1 else ''
    if superseded.get('merged'):
        verdict = (f'merged into pending job {final} ({status or "gone"} now){via}: this enqueue\'s payload was '
                   f'written into that job in place (its own id was never a job)')
    else:
        verdict = f'superseded by job {by} ({status or "gone"} now): {pending}, which was deleted'
        if final != by:
            verdict = (f'superseded by job {by}, itself replaced: the job that runs is {final} '
                       f'({status or "gone"} now){via}: {pending}, which was deleted')
    return [Explanation(policy, verdict, change.format(by=final), {
        'superseded_by': by, 'runs_as': final, 'chain': chain, 'queue': queue, 'merged': bool(superseded.get('merged')),
    })]


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


def pending_lines(family: Any, block: dict[str, Any], detail: Callable[[dict[str, Any]], str],
                  digests: bool = False, width: int = 40) -> list[Row]:
    """``info``'s lines for a family of pending jobs (a trailing Throttle's, a Debounce's): a count, then one line per
    identity (its job's description, :func:`rq_policies.engine.readable.identity`) with ``detail(row)`` and when it runs
    (the key expires at the job's run time)."""
    from .readable import identity, in_seconds
    from .views import Row

    items = []
    for row in block['entries']:
        runs = f'  runs {in_seconds(row["expires_in"])}' if row['expires_in'] is not None else ''
        extra = detail(row)
        items.append(f'{identity(row, width, digests)}{"  " + extra if extra else ""}{runs}')
    return [Row(family.name, f'{block["count"]} pending', tuple(items))]


class AdmissionPolicy(Policy):
    """A policy decided at enqueue, in the admission script (``lua/admit.lua``, see
    :mod:`rq_policies.engine.admission`): it meets :class:`rq_policies.engine.protocols.AdmissionSide`, whose methods
    are given no-op defaults here.

    Its Lua part (``lua/policies/<name>.lua``) defines ``check``, ``commit`` and ``force``; its Python side says which
    keys and arguments that part gets (:meth:`admit_part`), and what a verdict means for the caller.
    """

    kind: ClassVar[str] = ADMISSION
    #: The job is written as a scheduled one even without a time (the policy's part sets the time).
    schedules: ClassVar[bool] = False
    #: ``(field, value)``: :meth:`ended` has something to free only for a job whose hash, as the fetch that took it
    #: read it, holds ``field`` set to ``value``; the worker's end-of-run pipeline leaves the policy out for any other
    #: job (``admission.ending``). None (the default): :meth:`ended` runs at the end of every job's run. A replayed
    #: fetch, which reads no hash, runs every policy's.
    ended_when: ClassVar[tuple[str, str] | None] = None

    @property
    def probes(self) -> bool:
        """Can an expected drop be decided by the checks alone, before rq builds the job (the hinted fast path)?"""
        return True

    def admit_part(self, call: Any, queue: Any, digest: str) -> dict[str, Any]:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.admit_part` (documented there)."""
        return {}

    def job_fields(self, queue: str, digest: str) -> list[str]:
        """See :meth:`rq_policies.engine.protocols.Declared.job_fields` (documented there)."""
        return []

    def narrow_part(self, queue: Any, digest: str) -> tuple[str, list[str]] | None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.narrow_part` (documented there)."""
        return None

    def leased_keys(self, queue: str, digest: str) -> list[str]:
        """Keys this policy writes with the job hash's lifetime (a deferred job's lease is dropped from them too)."""
        return []

    @classmethod
    def release(cls, connection: Any, job_prefix: str, job_ids: list[str]) -> None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.release` (documented there)."""

    @classmethod
    def ended(cls, pipeline: Any, job_prefix: str, job_id: str) -> None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.ended` (documented there)."""

    def validate(self, job: Any, mode: str, force: bool) -> None:
        """See :meth:`rq_policies.engine.protocols.Declared.validate` (documented there)."""

    def hint_seconds(self, verdict: Any) -> float:
        """See :meth:`rq_policies.engine.protocols.Declared.hint_seconds` (documented there)."""
        return 0.0

    def on_drop(self, func_name: str, queue: str, verdict: Any) -> None:
        """See :meth:`rq_policies.engine.protocols.AdmissionSide.on_drop` (documented there)."""
        if logger.isEnabledFor(logging.INFO):
            logger.info('rq-policies: dropped %s on queue %r (%s): identity held by job %s', func_name, queue,
                        self.name, verdict.job_id)

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        """See :meth:`rq_policies.engine.protocols.Declared.on_admit` (documented there)."""

    @classmethod
    def describe(cls, family: Any, block: dict[str, Any], digests: bool = False,
                 width: int = 40) -> list[Row | str]:
        """The rows ``rq-policies info`` prints for one of this policy's key families on one queue (``block`` is
        what ``info --json`` shows for it: ``count`` and the listed ``entries``); an identity is shown as its job's
        description (:func:`rq_policies.engine.readable.identity`), with the whole digest when ``digests``."""
        from .readable import identity
        from .views import Row

        return [Row(family.name, f'{block["count"]} key(s)',
                    tuple(identity(row, width, digests) for row in block['entries']))]

    @classmethod
    def reset_part(cls, call: Any, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        """Add the keys ``lua/reset.lua`` clears for one identity (``declared``: this policy as declared, if it is)."""
        return {}


class FetchPolicy(Policy):
    """A policy decided at fetch, in the fetch script (QueueSlot).

    Its Lua part (``lua/policies/<name>.lua``) defines ``gate`` and ``take`` (see ``lua/fetch.lua``); the class meets
    :class:`rq_policies.engine.protocols.FetchSide`, the Python side of the same fetch
    (:func:`rq_policies.engine.fetch.fetch_call`).
    """

    kind: ClassVar[str] = FETCH
    #: Declared on the job's function (``@policy(...)``, its setting stored on each job hash) rather than configured
    #: per queue in Redis: the contract suite tests such a policy through its examples (its test folder's
    #: ``examples.py``), not ``configure()``.
    per_job: ClassVar[bool] = False
    #: The keys of the fetch call (names :meth:`fetch_keys` gave ``call.key``, or ``call.key_list`` for one key per
    #: queue) whose absence means that the policy's gate passes every queue, its take does nothing, none of its keys
    #: has parked jobs and its ``source`` has nothing to hand out: while none of the fetch policies' state keys
    #: exists, a fetch skips every gate, take, source and due key (one EXISTS decides; ``lua/fetch.lua``'s ``state``
    #: phase). None (the default): the policy's hooks run on every fetch.
    fetch_state: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        """See :meth:`rq_policies.engine.protocols.FetchSide.fetch_keys` (documented there)."""

    @classmethod
    def fetch_hold(cls, queue_name: str, token: str, ttl: int) -> Any:
        """See :meth:`rq_policies.engine.protocols.FetchSide.fetch_hold` (documented there)."""
        raise NotImplementedError(f'{cls.__name__}: its Lua take() reported a hold, so it must say which one')

    @classmethod
    def release_hold(cls, connection: Any, hold: Any, wake: str) -> bool:
        """See :meth:`rq_policies.engine.protocols.FetchSide.release_hold` (documented there)."""
        raise NotImplementedError(f'{cls.__name__}: its Lua take() named a ledger, so it must release the hold')

    # -- what state, metrics and the CLI show of it (rq_policies.surfaces.state, .metrics, .cli iterate the registry)
    # -------

    @classmethod
    def configured_queues(cls, connection: Any) -> set[str]:
        """Queues this policy has a setting for (a cap): they count as known and are listed by ``info``."""
        return set()

    @classmethod
    def queue_info(cls, connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, Section]:
        """Per queue name, this policy's part of that queue in ``rq-policies info``: a
        :class:`rq_policies.engine.views.Section` whose fields join the queue's ``info --json`` entry and whose
        ``headline`` and ``rows`` are its text (``limit`` bounds the entries listed, None: all). A name left out: the
        policy shows nothing for that queue.

        A policy written before sections (one that defines ``queue_state``, returning the dicts, with ``summary``
        and ``describe_queue`` reading them) is shown as it was, through :class:`LegacyQueue`."""
        if _overrides(cls, 'queue_state', FetchPolicy):
            return {name: LegacyQueue(fields, cls) for name, fields in cls.queue_state(connection, names, now,
                                                                                        limit).items()}
        return {}

    @classmethod
    def queue_state(cls, connection: Any, names: list[str], now: float, limit: int | None) -> dict[str, dict]:
        """:meth:`queue_info` as the plain data ``info --json`` shows (per queue name, the fields this policy adds
        to that queue's entry), for readers that want the data alone (the dashboard, metrics). A policy defines
        :meth:`queue_info`, not this."""
        return {name: found.as_json() for name, found in cls.queue_info(connection, names, now, limit).items()}

    # -- the contract suite (tests/contract): settings, as a policy whose settings live in Redis takes them -------

    @classmethod
    def configure(cls, connection: Any, queue: str, **settings: Any) -> None:
        """Give ``queue`` this policy's setting (QueueSlot: ``capacity=``); bad settings raise naming the argument
        and write nothing."""
        raise NotImplementedError(f'{cls.__name__}: configure() is how the contract suite sets it up')

    @classmethod
    def unconfigure(cls, connection: Any, queue: str) -> None:
        """Remove the setting :meth:`configure` gave ``queue``."""
        raise NotImplementedError(f'{cls.__name__}: unconfigure() is how the contract suite clears it')

    @classmethod
    def setting_examples(cls) -> tuple[dict[str, Any], ...]:
        """Settings for :meth:`configure` under each of which one start is allowed now and the next is refused
        (the contract suite runs each one)."""
        return ()



def _overrides(cls: type, name: str, base: type) -> bool:
    """Does ``cls`` define hook ``name`` itself, below ``base`` (a policy written before sections)?"""
    return getattr(cls, name).__func__ is not getattr(base, name).__func__


@dataclass(frozen=True)
class LegacyQueue(Section):
    """A queue section of a policy that still defines the hooks of before (``queue_state``'s dict, ``summary`` and
    ``describe_queue`` reading it): its ``--json`` fields are the dict, its words the old hooks' (they get the dict
    with ``server_time`` added, as before)."""

    fields: dict[str, Any]
    policy: type[Policy] = text_only()

    def as_json(self) -> dict[str, object]:
        return dict(self.fields)

    def headline(self) -> str:
        summary = getattr(self.policy, 'summary', None)
        return summary(self.fields) if summary else ''

    def rows(self, shown: Shown) -> list[Row | str]:
        describe = getattr(self.policy, 'describe_queue', None)
        return list(describe({**self.fields, 'server_time': shown.now})) if describe else []


@dataclass(frozen=True)
class LegacyCluster(Section):
    """A cluster section of a policy that still defines ``cluster_state`` (its dict) and ``describe_cluster`` (its
    lines from the dict)."""

    fields: dict[str, Any]
    policy: type[Policy] = text_only()

    def as_json(self) -> dict[str, object]:
        return dict(self.fields)

    def rows(self, shown: Shown) -> list[Row | str]:
        describe = getattr(self.policy, 'describe_cluster', None)
        return list(describe(self.fields)) if describe else []


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
                raise TypeError(f'policy: expected a Policy (Loner(), Throttle(60), ...), got {item!r}')
            if type(item) in seen:
                raise PolicyConfigurationError(f'policy: {type(item).__name__} is given twice in {self.policies!r}')
            seen.add(type(item))
        check_combination(self.policies)
        if self.unique_context is not None and not callable(self.unique_context):
            raise TypeError(f'unique_context: expected a callable (args, kwargs) -> value, got {self.unique_context!r}')
        if self.on_drop is not None and not callable(self.on_drop):
            raise TypeError(f'on_drop: expected a callable (call, holder_id) -> None, got {self.on_drop!r}')

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
    """Refuse combinations that mean nothing, with the reason each policy's :meth:`Policy.conflicts` gives."""
    for item in policies:
        message = item.conflicts(policies)
        if message:
            raise PolicyConfigurationError(f'policy: {message}')


#: make_set's sets of one policy, by the policy's id (bounded: a caller building a new policy per call only refills it).
_SINGLE_SETS: dict[int, tuple[Policy, PolicySet]] = {}
_SINGLE_SETS_MAX = 1024
#: The set made for a policy, by its value (:func:`make_set`): an equal policy made later gets the same set.
_EQUAL_SETS: dict[Policy, PolicySet] = {}


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
    raise TypeError(f'policy: expected a Policy, a list of policies or None, got {value!r}')


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
        raise TypeError('policy: give at least one policy, for example @policy(Loner())')
    spec = PolicySet(tuple(policies), unique_context, on_drop)

    def decorate(func: F) -> F:
        if not callable(func):
            raise TypeError(f'policy: can only decorate a callable, got {func!r}')
        setattr(func, ATTRIBUTE, spec)
        return func

    return decorate


def declared(func: Any) -> PolicySet | None:
    """The PolicySet declared on a function with ``@policy``, or None."""
    spec = getattr(func, ATTRIBUTE, None)
    return spec if isinstance(spec, PolicySet) else None
