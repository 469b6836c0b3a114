"""The admission framework and the door core: one script call admits a job through every policy it is declared
under, planned and read by pure functions that every door drives (docs/architecture.md, "One door core")::

    plan = admission.plan(queue, spec, digest, write)          # which script, its KEYS and ARGV; nothing sent
    reply = <the driver sends plan.call>                       # PolicyQueue's, or AsyncPolicyQueue's await
    job = admission.settle(plan, admission.read(plan, reply))   # the Verdict, then each policy's on_drop / on_admit

The commonest calls go to ``lua/admit_narrow.lua`` (:func:`narrow_call`), the rest to ``lua/admit.lua``; an enqueue
expected to be dropped sends a probe first (:func:`probe_plan`). Door observers (:mod:`rq_policies.engine.events`)
are told of each plan, verdict and error here, so no driver repeats them. It names no policy: each gives its part of
the call (:class:`rq_policies.engine.policy.AdmissionPolicy`) and says what a verdict means (``on_drop``,
``on_admit``). ``reset``, ``release`` and ``ended`` clear or free an identity's state through every registered
admission policy.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from rq.registry import ScheduledJobRegistry

from . import identity, keys
from .events import DOORS
from .exceptions import PolicyConfigurationError
from .ops import Call, FlatCall, text
from .policy import ADMISSION, DroppedCall, PolicySet, registered

if TYPE_CHECKING:
    from rq.job import Job
    from rq.queue import Queue

logger = logging.getLogger('rq_policies')


@dataclass
class JobWrite:
    """How the admission script writes one job, as rq's own enqueue would.

    Attributes:
        job: the job, prepared by the queue (origin, status, timeout set).
        mode: R | L (push to tail / head), S (scheduled), D (hash only: deferred), N (write no job).
        score: epoch seconds the job is scheduled for (mode S), else 0.
        dest: the queue list, the scheduled registry, or the queue key (unused) for modes D and N.
        ttl: seconds the job hash lives, -1 for no expiry.
        fields: the job hash as a flat field/value list (each policy's extra fields included).
        created: the job's ``created_at`` as ``fields`` write it (what makes a replay of this very call
            recognisable); None to find it in ``fields``.
        replicas: ``(replicas, timeout_ms)``: the door waits for that many replicas to have the job before it
            returns (the queue's or the call's ``wait_replicas=``; the synchronous driver sends ``WAIT`` with the
            plan's call, :func:`run_replicated`); None: it does not wait.
        acknowledged: how many replicas had the admission when the door's ``WAIT`` answered (-1: no ``WAIT`` sent).
    """

    job: Job
    mode: str
    score: int
    dest: str
    ttl: int
    fields: list[Any]
    created: Any = None
    replicas: tuple[int, int] | None = None
    acknowledged: int = -1


class Verdict(NamedTuple):
    """What the admission script decided (a named tuple: built on every enqueue, it costs a third of a frozen
    dataclass), from its named fields (``lua/admit.lua``'s header) by :meth:`read`, the one place that decodes them.

    Attributes:
        code: 1 admitted, 2 admitted as a pending job (a trailing job), 3 the waiting holder's payload replaced in
            place (job_id names it), 0 dropped, -1 a probe that found no drop.
        policy: the policy that dropped the job (or answered a replay), '' otherwise.
        job_id: ours when admitted; the holder of the identity when dropped.
        number: the deciding policy's number (a throttle window's end, a pending job's run time), epoch seconds.
        server_now: the server's clock when the script ran; 0 when no policy of the call reads the clock (a part
            with ``clock = false``), which then skips the TIME call.
        superseded: the pending job this one replaced and deleted, or ''.
        dropped: (kind, job id) of the pending jobs a force dropped.
        digest: the identity the verdict is about (set by the caller, not the script).
    """

    code: int
    policy: str
    job_id: str
    number: float
    server_now: float
    superseded: str
    dropped: tuple[tuple[str, str], ...] = ()
    digest: str = ''

    @property
    def written(self) -> bool:
        """Was the call's job written, or its payload taken by the waiting job in place (codes 1, 2, 3)?"""
        return self.code > 0

    @property
    def replaced(self) -> str:
        """The waiting job whose payload this call's job replaced in place (code 3), which is then the job; or ''."""
        return self.job_id if self.code == 3 else ''

    @classmethod
    def read(cls, reply: list[Any], digest: str = '') -> Verdict:
        """The verdict in ``lua/admit.lua``'s reply: named fields, a flat name/value list (bytes or, on a client
        that decodes responses, str); a field left out has its default."""
        named = dict(zip(reply[::2], reply[1::2]))
        if b'code' not in named:  # a client that decodes replies
            named = {name.encode(): value for name, value in named.items()}
        get = named.get
        code, policy, job_id = named[b'code'], get(b'policy', b''), get(b'job', b'')
        number, now, superseded, flat = get(b'n', 0), get(b'now', 0), get(b'superseded', b''), get(b'dropped')
        dropped = tuple((text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat) - 1, 2)) if flat else ()
        # float() reads the reply's bytes as they are; text() only where a str is kept.
        return cls(int(code), text(policy), text(job_id), float(number), float(now), text(superseded), dropped,
                   digest)


#: A plan's kinds: a job written through its policies (the reply is a verdict), a job written without a policy (the
#: reply says nothing the door needs), the checks alone before the job is built (a verdict: dropped, or -1).
ADMIT, PLAIN, PROBE = 'admit', 'plain', 'probe'


class Plan:
    """One door's round trip (:func:`plan`, :func:`probe_plan`): the call a driver sends (``call.script``,
    ``call.keys``, ``call.argv()``; a ``Call``, ``FlatCall`` or a probe's ``Packed``), and what the core needs to read
    and act on its reply. One per door call (slots: the hottest path). What a driver sends with the call beside it
    rides the plan too: the durable admission's ``WAIT`` (``write.replicas``, its answer in ``write.acknowledged``).

    Attributes:
        kind: :data:`ADMIT`, :data:`PLAIN` or :data:`PROBE`.
        queue, spec, digest, write, force: what it was planned from (``spec`` None and ``digest`` '' for a job
            without a policy; ``write`` None for a probe).
        hint: what the hint fast path saw (:class:`Seen`), for the verdict to feed; or None.
        verdict: what :func:`read` read (None before, and for a plain write).
        observed: ``(observer, state)`` of each door observer told of it, or None.
        caller: a probe's ``(function name, function, args, kwargs)``, for the set's ``on_drop`` hook.
    """

    __slots__ = ('kind', 'call', 'queue', 'spec', 'digest', 'write', 'force', 'hint', 'verdict', 'observed', 'caller')

    def __init__(self, kind: str, queue: Queue, spec: PolicySet | None, digest: str, write: JobWrite | None,
                 force: bool = False, hint: Seen | None = None) -> None:
        # One assignment a statement: a tuple assigned at once costs three times as much.
        self.kind = kind
        self.queue = queue
        self.spec = spec
        self.digest = digest
        self.write = write
        self.force = force
        self.hint = hint
        self.call: Any = None
        self.verdict: Verdict | None = None
        self.observed: list[tuple[Any, Any]] | None = None
        self.caller: tuple | None = None


def plan(queue: Queue, spec: PolicySet | None, digest: str, write: JobWrite, force: bool = False,
         hint: Seen | None = None) -> Plan:
    """Plan the one round trip that writes ``write.job`` (pure: nothing sent) through ``spec``, each of whose
    policies validates the job first (a bad option raises here), or, ``spec`` None, without a policy; the call is
    :func:`admit_call`'s. ``force``: whatever the policies say. ``hint``: what the hint fast path saw. Observers are
    told before the call is built, so what they add to the job (a trace context in its meta) rides it."""
    made = Plan(ADMIT if spec is not None else PLAIN, queue, spec, digest, write, force, hint)
    if DOORS:
        _observe(made)
    try:
        if spec is not None:
            for item in spec.policies:
                item.validate(write.job, write.mode, force)
            if force and write.mode == 'S':
                raise PolicyConfigurationError('force() enqueues now; it cannot be scheduled')
        made.call = admit_call(queue, spec, digest, write, force)
    except BaseException as exc:
        failed(made, exc)
        raise
    return made


def read(plan: Plan, reply: Any) -> Verdict | None:
    """The verdict in the reply to ``plan``'s call (pure; kept as ``plan.verdict``); None for a plain write, whose
    reply says nothing the door needs."""
    if plan.kind is PLAIN:
        return None
    verdict = plan.verdict = Verdict.read(reply, plan.digest)
    return verdict


def settle(plan: Plan, verdict: Verdict | None) -> Job | None:
    """What follows the verdict of an admission or a plain write (no I/O of its own): each policy's ``on_drop`` (its
    log line, or its raise) or ``on_admit``, the set's ``on_drop`` hook, the hints, and the observers.

    Returns:
        The Job the door returns (when its payload went into the waiting holder in place, the policy's ``on_admit``
        made it that job), or None when a policy dropped it. A deferred job admitted is then handed to rq's
        dependency handling by the door (:func:`hands_over`).
    """
    job = plan.write.job
    try:
        if verdict is not None and not _follow(plan, job, verdict):
            job = None
    except BaseException as exc:
        failed(plan, exc)
        raise
    if plan.observed is not None:
        _decided(plan, verdict)
    return job


def hands_over(plan: Plan) -> bool:
    """Is ``plan`` a deferred job (``depends_on=``) that its admission wrote, which rq's dependency handling must now
    take (the synchronous door's hand-over)?"""
    verdict = plan.verdict
    return plan.write.mode == 'D' and verdict is not None and verdict.written and not verdict.replaced


def failed(plan: Plan, exc: BaseException) -> None:
    """The door of ``plan`` raised ``exc`` (planning it, sending it, or acting on its verdict): the observers hear of
    it. Every driver calls it for an error of its send."""
    for observer, state in plan.observed or ():
        observer('failed', plan, exc, state)


def _observe(plan: Plan) -> None:
    plan.observed = [(observer, observer('planned', plan, None, None)) for observer in DOORS]


def _decided(plan: Plan, verdict: Verdict | None) -> None:
    for observer, state in plan.observed or ():
        observer('decided', plan, verdict, state)


def _follow(plan: Plan, job: Job, verdict: Verdict) -> bool:
    """Each policy told of the verdict, the hints fed; was the job written (or its payload taken in place)?"""
    queue, spec = plan.queue, plan.spec
    _remember(plan.hint, spec, verdict.digest, verdict)
    if verdict.code == 0:
        if spec.on_drop is not None:
            spec.dropped(DroppedCall(job.func_name, tuple(job.args), dict(job.kwargs), queue.name, verdict.policy),
                         verdict.job_id)
        next(item for item in spec.policies if item.name == verdict.policy).on_drop(job.func_name, queue.name, verdict)
        return False
    for item in spec.policies:
        item.on_admit(job, queue.name, verdict)
    for kind, dropped in verdict.dropped:
        logger.info('rq-policies: forced %s on queue %r as job %s; dropped pending %s job %s', job.func_name,
                    queue.name, job.id, kind, dropped)
    return True


#: Queues whose constant admission arguments one PolicySet keeps (a set used on more queues rebuilds them).
_MEMO_QUEUES = 256


def _constants(queue: Queue, spec: PolicySet) -> dict[str, Any]:
    """The admit call's arguments that depend only on the set and the queue, built once per (set, queue)."""
    prefix = queue.job_class.redis_job_namespace_prefix
    memo = spec.memo
    found = memo.get((queue.name, prefix))
    if found is None:
        ordered = spec.admission
        found = {
            'order': [item.name for item in ordered],
            'drops': {item.name: keys.drop_field(item.name, queue.name) for item in ordered},
            'job_prefix': prefix, 'tombstone': keys.SUPERSEDED_PREFIX, 'tombstone_ttl': keys.SUPERSEDED_SECONDS,
        }
        payload = [name for item in spec.policies for name in item.call_field_names()]
        if payload:  # what an in-place rewrite of a waiting job replaces besides data, description and meta
            found['payload'] = payload
        if len(memo) >= _MEMO_QUEUES:
            memo.clear()
        memo[(queue.name, prefix)] = found
    return found


def _policy_call(queue: Queue, spec: PolicySet, digest: str, **args: Any) -> Call:
    """The admit call with every declared admission policy's part: keys by name, arguments under ``p``."""
    call = Call('admit', **args, **_constants(queue, spec))
    call.key('drops', keys.DROPS)
    call.key('drops_minute', keys.DROPS_MINUTE_PREFIX)
    call.args['p'] = {item.name: item.admit_part(call, queue, digest) for item in spec.admission}
    return call


def admit_call(queue: Queue, spec: PolicySet | None, digest: str, write: JobWrite,
               force: bool = False) -> Call | FlatCall:
    """The call that writes ``write.job`` through ``spec`` (validated: :func:`plan`), or without a policy (``spec``
    None: no check, no identity), once: a resend finds its ``created`` in the job's hash, or in the replay record of a
    job rq deletes soon after it runs, and writes nothing. The narrow script's when it serves the call
    (:func:`narrow_call`), else ``lua/admit.lua``'s."""
    if not force:
        narrow = narrow_call(queue, spec, digest, write)
        if narrow is not None:
            return narrow
    if spec is None:
        call = Call('admit', order=_NO_ORDER, p=_NO_PARTS, **_write_args(queue, write))
    else:
        call = _policy_call(queue, spec, digest, force=force, **_write_args(queue, write))
    _write_keys(call, queue, write)
    if chose_id(write.job):
        _record_drops(call, write.job.id)
    return call


def plain_call(queue: Queue, write: JobWrite) -> Call | FlatCall:
    """:func:`admit_call` of a job without a policy (the plain write)."""
    return admit_call(queue, None, '', write)


#: The empty policy order and parts of a plain call, shared: msgpack packs them as they are.
_NO_ORDER: list[str] = []
_NO_PARTS: dict[str, Any] = {}


def _write_args(queue: Queue, write: JobWrite) -> dict[str, Any]:
    """The arguments of an admit call that say how ``write.job`` is written (with a policy or without)."""
    return {'jid': write.job.id, 'mode': write.mode, 'score': write.score, 'ttl': write.ttl, 'queue_key': queue.key,
            'wake': keys.wake(queue.name), 'fields': write.fields,
            'created': write.created if write.created is not None else _created_at(write.fields)}


def _write_keys(call: Call, queue: Queue, write: JobWrite) -> None:
    """The keys of an admit call that writes ``write.job``: its hash, where it goes, rq's queues set, and the replay
    record of a job rq deletes soon after it runs (:func:`_keep_replay_record`)."""
    call.key('job', write.job.key)
    call.key('dest', write.dest)
    call.key('queues', queue.redis_queues_keys)
    _keep_replay_record(call, write.job)


def _keep_replay_record(call: Call, job: Job) -> None:
    """A job rq deletes soon after it runs (``result_ttl`` under ``keys.PUSHED_SECONDS``) keeps its ``created`` in
    ``keys.pushed(id)`` for as long, so that a resend of its write that arrives after it ran and rq deleted its hash
    is still known as a replay (the hash that tells a replay is gone; a policy's identity may be free again)."""
    result_ttl = job.result_ttl
    if result_ttl is not None and 0 <= result_ttl < keys.PUSHED_SECONDS:
        call.key('record', keys.pushed(job.id))
        call.args['record_ttl'] = keys.PUSHED_SECONDS


#: The attribute :func:`mark_chosen_id` sets on a Job object (never saved: rq writes only its own fields).
_CHOSEN_ID = '_policies_chosen_id'


def mark_chosen_id(job: Job) -> None:
    """The caller chose ``job``'s id (``job_id=``): a policy's drop of it leaves a record ``explain`` reads."""
    setattr(job, _CHOSEN_ID, True)


def chose_id(job: Job) -> bool:
    """Was ``job``'s id chosen by the caller (:func:`mark_chosen_id`), not drawn by rq?"""
    return getattr(job, _CHOSEN_ID, False)


def _record_drops(call: Call, job_id: str) -> None:
    """Have a drop of ``job_id`` leave its record (``keys.dropped``), and its admission clear the tombstone a
    superseded pending job of that id left (the fetch would drop it). Only for an id the caller chose: nobody can ask
    about an id rq drew for a job that was never written, so the common path writes nothing more."""
    call.key('dropped', keys.dropped(job_id))
    call.args['dropped_ttl'] = keys.DROPPED_SECONDS
    call.args['tombstone'] = keys.SUPERSEDED_PREFIX


def _created_at(fields: list[Any]) -> Any:
    """The job's ``created_at`` as it is written to the hash: what makes a replay of this very call recognisable."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == 'created_at':
            return fields[i + 1]
    return None


#: The write modes ``lua/admit_narrow.lua`` serves: pushed to the queue's tail or head, or scheduled.
_NARROW_MODES = frozenset('RLS')


def narrow_call(queue: Queue, spec: PolicySet | None, digest: str, write: JobWrite) -> FlatCall | None:
    """The ``lua/admit_narrow.lua`` call that writes ``write.job`` without a policy (``spec`` None) or through a set
    of one admission policy that has a narrow part (:meth:`rq_policies.engine.policy.AdmissionPolicy.narrow_part`),
    pushed or scheduled (modes R, L, S); None when that script does not serve the call, which
    then goes to ``lua/admit.lua``. The same decision, writes and verdict as admit.lua's, in flat arguments (the
    script's header has the layout): no msgpack map for the server to decode, no parts to load.

    Not for a forced call (:func:`admit_call` sends those to admit.lua)."""
    mode = write.mode
    if mode not in _NARROW_MODES:
        return None
    job = write.job
    job_id = job.id
    created = write.created if write.created is not None else _created_at(write.fields)
    call_keys = [job.key, write.dest, queue.redis_queues_keys]
    if spec is None:
        options: list[Any] = []
    else:
        part = _narrow_part(queue, spec, digest)
        if part is None:
            return None
        marker, options = part
        call_keys += [marker, keys.DROPS, keys.DROPS_MINUTE_PREFIX]
    result_ttl = job.result_ttl
    if result_ttl is not None and 0 <= result_ttl < keys.PUSHED_SECONDS:  # as _keep_replay_record
        call_keys.append(keys.pushed(job_id))
        options = [*options, 'record', keys.PUSHED_SECONDS]
    if chose_id(job):  # as _record_drops
        call_keys.append(keys.dropped(job_id))
        options = [*options, 'dropped', keys.DROPPED_SECONDS, 'tombstone', keys.SUPERSEDED_PREFIX]
    args = [job_id, created if created is not None else '', mode, write.score, write.ttl, queue.key,
            keys.wake(queue.name), 9 + len(options), *options, *write.fields]
    return FlatCall('admit_narrow', call_keys, args)


def _narrow_part(queue: Queue, spec: PolicySet, digest: str) -> tuple[str, list[Any]] | None:
    """The narrow part (marker key, options) of a set of one admission policy that has one, else None."""
    ordered = spec.admission
    if len(ordered) != 1 or len(spec.policies) != 1:
        return None
    item = ordered[0]
    if item.kind != ADMISSION:  # a fetch policy that admits: admit.lua
        return None
    return item.narrow_part(queue, digest)


def claim(queue: Queue, spec: PolicySet, digest: str, job: Job) -> Verdict:
    """Take the policies' state for ``job`` without writing the job (mode N: a throttle's ``admit``)."""
    call = _policy_call(queue, spec, digest, jid=job.id, mode='N', score=0, ttl=-1, queue_key=queue.key)
    return Verdict.read(call.run(queue.connection))


# -- the fast path for an enqueue expected to be dropped: the probe, and what this process saw -------------------
#
# An enqueue expected to be dropped first sends a probe (the checks only, before rq builds its job), which drops the
# extra as one complete atomic decision while the identity is held; otherwise the full path checks again and writes.
# Expected means an identity hint (:class:`Hints`: this process just saw this very call's identity held; the hint
# keeps the probe's call packed) or a cold call of a (queue, function, policy set) whose enqueues without a hint were
# mostly dropped (:class:`DropRates`). An expectation only chooses which call runs first; a wrong one costs a round
# trip. Why these two, and their figures: docs/benchmarks.md ("Probes: fast drops").

#: Argument types whose equal values (of the same exact type) always have the same canonical encoding, so a hint key
#: holding only these needs no digest to confirm it (a float does not qualify: ``0.0 == -0.0``).
_PLAIN_TYPES = frozenset((str, int, bool, type(None), bytes))


class Hint(NamedTuple):
    """What one identity hint remembers."""

    digest: str
    until: float  # time.monotonic() after which the hint is ignored
    spec: Any  # the PolicySet the hint was seen under
    probe: Any  # the probe's call, built and packed (rq_policies.engine.ops.Packed), or None


class Hints:
    """A bounded map of hint key -> :class:`Hint`."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._items: dict[tuple, Hint] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple | None, spec: Any = None) -> Hint | None:
        """The hint remembered for ``key`` while it is fresh (and, given ``spec``, seen under an equal set), else
        None."""
        if key is None:
            return None
        found = self._items.get(key)
        if found is None or found.until <= time.monotonic():
            return None
        if spec is not None and found.spec is not spec and not (
                found.spec.policies == spec.policies and found.spec.unique_context is spec.unique_context):
            return None
        return found

    def remember(self, key: tuple | None, digest: str, seconds: float, spec: Any = None, probe: Any = None) -> None:
        if key is None or seconds <= 0:
            return
        with self._lock:
            if len(self._items) >= self._size:
                now = time.monotonic()
                for stale in [k for k, item in self._items.items() if item.until <= now]:
                    del self._items[stale]
                if len(self._items) >= self._size:
                    self._items.clear()
            self._items[key] = Hint(digest, time.monotonic() + seconds, spec, probe)

    def forget(self, key: tuple | None) -> None:
        if key is not None:
            self._items.pop(key, None)


class DropRates:
    """Per (queue, function, policy set): the weighted rate at which enqueues without an identity hint were dropped.

    Bounded (a process enqueuing under many queues or functions only refills it); updates are not locked, because a
    lost update of a rate that only chooses which script runs first changes nothing a caller sees.
    """

    #: How far one drop moves the rate towards 1, and one admission towards 0 (an exponentially weighted average
    #: with a weight per outcome): from 0, a run of 16 drops passes the threshold (1 - 0.9 ** 16 > 0.8), and from
    #: any rate one admission brings it under (0.5 * 1.0 < 0.8).
    RISE = 0.1
    FALL = 0.5
    #: The rate above which a cold enqueue probes first. With RISE and FALL as they are, a stream whose average share
    #: of drops is q settles at q * RISE / (q * RISE + (1 - q) * FALL): above the threshold only for q above 0.95.
    THRESHOLD = 0.8

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._rates: dict[tuple, float] = {}

    def likely(self, key: tuple | None) -> bool:
        """Is a drop the likely outcome of the next enqueue without a hint under ``key``?"""
        return key is not None and self._rates.get(key, 0.0) > self.THRESHOLD

    def record(self, key: tuple | None, dropped: bool) -> None:
        """One enqueue without a hint under ``key`` was dropped (or admitted)."""
        if key is None:
            return
        rate = self._rates.get(key)
        if rate is None:
            if len(self._rates) >= self._size:
                self._rates.clear()
            rate = 0.0
        self._rates[key] = rate + (1.0 - rate) * self.RISE if dropped else rate * (1.0 - self.FALL)


def spec_token(spec: Any) -> int:
    """A small hashable stand-in for a PolicySet in hint keys, computed once per set (a hit is confirmed against the
    set itself, :meth:`Hints.get`)."""
    memo = spec.memo
    token = memo.get('hint token')
    if token is None:
        token = memo['hint token'] = hash(spec.policies)
    return token


def hint_key(queue: str, token: Any, f: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The hint key of a call, or None when its arguments are not hashable (such calls take the full path).

    The key ends with ``True`` when every argument is of a :data:`_PLAIN_TYPES` type, so that an equal key means an
    equal identity without computing it; the types of the top-level arguments are part of the key either way.
    """
    try:
        if kwargs:
            items = tuple(sorted(kwargs.items()))
            types = (*map(type, args), *(type(value) for _, value in items))
        else:
            items = ()
            types = tuple(map(type, args))
        key = (queue, token, f, args, items, types, _PLAIN_TYPES.issuperset(types))
        hash(key)
    except TypeError:
        return None
    return key


def plain(key: tuple) -> bool:
    """Does an equal hint key mean the same identity (every argument of a :data:`_PLAIN_TYPES` type)?"""
    return key[-1]


def call_identity(queue: Any, spec: Any, f: Any, args: tuple, kwargs: dict) -> tuple[str, str, str] | None:
    """``(func_name, digest, explicit job id or '')`` of an enqueue call, computed without building its job.

    None when only the full path can tell: bound methods and callable objects (rq names them in ways only building
    the job reproduces), and calls carrying options the full path must refuse with an error (pipeline=, unique=,
    rate_limit=), which must never become a silent drop here.
    """
    if not (isinstance(f, str) or inspect.isfunction(f)):
        return None
    if kwargs:  # rq's options travel in kwargs: let rq tell them from the function's own
        parsed = queue.parse_args(f, *args, **dict(kwargs))
        if parsed.pipeline is not None or parsed.unique or getattr(parsed, 'rate_limit', None) is not None:
            return None
        fargs, fkwargs, job_id = tuple(parsed.args or ()), dict(parsed.kwargs or {}), parsed.job_id
    else:
        fargs, fkwargs, job_id = args, {}, None
    func_name = identity.function_name(f)
    digest = identity.digest(func_name, queue.name, fargs, fkwargs, spec.unique_context, spec.policies)
    return func_name, digest, job_id or ''


#: What this process last saw of identities held, and how often its cold enqueues were dropped.
_hints = Hints()
_rates = DropRates()


class Seen(NamedTuple):
    """What :func:`probe_plan` hands the full path of an enqueue it did not drop, for :func:`settle` to remember.

    Attributes:
        key: the call's hint key (:func:`hint_key`), or None.
        rate: the call's drop-rate key when it had no identity hint (its outcome feeds the predictor), or None.
    """

    key: tuple | None
    rate: tuple | None = None


def _remember(hint: Seen | None, spec: PolicySet, digest: str, verdict: Verdict, probe_call: Any = None) -> None:
    if hint is None:
        return
    if hint.rate is not None:
        _rates.record(hint.rate, verdict.code == 0)
    seconds = 0.0
    for item in spec.policies:  # a loop, not max() over a generator: this runs on every enqueue
        found = item.hint_seconds(verdict)
        if found > seconds:
            seconds = found
    if seconds > 0:
        _hints.remember(hint.key, digest, seconds, spec, probe_call)


def _probes(spec: PolicySet) -> bool:
    """Can every policy of ``spec`` decide an expected drop by its checks alone (computed once per set)?"""
    memo = spec.memo
    found = memo.get('probes')
    if found is None:
        found = memo['probes'] = all(item.probes for item in spec.policies)
    return found


def probe_plan(queue: Queue, spec: PolicySet | None, f: Any, args: tuple,
               kwargs: dict) -> tuple[Plan | None, Seen | None]:
    """The probe to send first for an enqueue expected to be dropped (an identity hint, or a likely drop: see this
    section's opening), before rq builds its job, or None; and what the full path is to remember of the call (for a
    probe: its ``hint``, should it find nothing to drop). Pure: it reads this process's hints.

    Building and serializing a job costs more than the decision. A probe runs the checks only, and drops the extra as
    one complete atomic decision when the identity is still held (:func:`probed`); anything else (the identity free
    after all, a replayed job id) leaves the enqueue to the full path, which checks again and writes in one script.
    No probe is planned where the full path must refuse something with an error (options it refuses): an expectation
    only chooses which call runs first; it never decides.
    """
    if spec is None or not queue.is_async or not _probes(spec):
        return None, None
    token = spec_token(spec)
    key = hint_key(queue.name, token, f, args, kwargs)
    seen = _hints.get(key, spec)
    call = None
    if seen is None:
        rate = (queue.name, token, f) if key is not None else None
        hint = Seen(key, rate)
        if not _rates.likely(rate):
            return None, hint
        found = call_identity(queue, spec, f, args, kwargs)
        if found is None:
            return None, hint
        func_name, digest, job_id = found
    else:
        hint = Seen(key)
        call = seen.probe
        if (call is not None and plain(key) and call.args['queue_key'] == queue.key
                and call.args['job_prefix'] == queue.job_class.redis_job_namespace_prefix):
            # An equal key of plain arguments is the same identity (and the same queue and job keys): the packed
            # probe is this call's own.
            func_name, digest, job_id = identity.function_name(f), seen.digest, ''
        else:
            found = call_identity(queue, spec, f, args, kwargs)
            if found is None or found[1] != seen.digest:
                return None, None
            func_name, digest, job_id = found
            call = None
    made = Plan(PROBE, queue, spec, digest, None, hint=hint)
    made.call = call if call is not None else probe_call(queue, spec, digest, job_id).packed()
    made.caller = (func_name, f, args, kwargs)
    if DOORS:
        _observe(made)
    return made, hint


def probed(plan: Plan, verdict: Verdict) -> bool:
    """What follows a probe's verdict: True when it dropped the enqueue (the script counted it; the hint is
    remembered, the set's ``on_drop`` hook and the dropping policy's ``on_drop`` told, its log line or its raise);
    False when the full path decides (an identity hint that proved wrong is forgotten; the full path remembers
    ``plan.hint``). Writes nothing: a probe that finds nothing to drop makes no decision."""
    if plan.observed is not None:
        _decided(plan, verdict)
    seen = plan.hint
    if verdict.code != 0:
        if seen.rate is None:  # an identity hint (a cold probe has a rate): it proved wrong
            _hints.forget(seen.key)
        return False
    _remember(seen, plan.spec, plan.digest, verdict, plan.call)
    func_name, f, args, kwargs = plan.caller
    _dropped(plan.spec, func_name, plan.queue, verdict, args, kwargs, f)
    return True


def _dropped(spec: PolicySet, func_name: str, queue: Queue, verdict: Verdict, args: tuple, kwargs: dict,
             f: Any = None) -> None:
    """The set's ``on_drop`` hook (told the function's own arguments, rq's options taken out), then the dropping
    policy's own ``on_drop`` (its log line, or its raise)."""
    if spec.on_drop is not None:
        if kwargs:  # rq's options travel in kwargs: let rq tell them from the function's own
            parsed = queue.parse_args(f if f is not None else func_name, *args, **dict(kwargs))
            fargs, fkwargs = tuple(parsed.args or ()), dict(parsed.kwargs or {})
        else:
            fargs, fkwargs = tuple(args), {}
        spec.dropped(DroppedCall(func_name, fargs, fkwargs, queue.name, verdict.policy), verdict.job_id)
    for item in spec.policies:
        if item.name == verdict.policy:
            item.on_drop(func_name, queue.name, verdict)
            return


def probe_call(queue: Queue, spec: PolicySet, digest: str, job_id: str = '') -> Call | FlatCall:
    """The probe's call for one identity (:func:`probe_plan`): the narrow script's for a set it serves
    (:func:`narrow_call`), else ``lua/admit.lua``'s."""
    part = _narrow_part(queue, spec, digest)
    if part is not None:
        marker, options = part
        prefix = queue.job_class.redis_job_namespace_prefix
        call_keys = [prefix + job_id, queue.key, queue.redis_queues_keys, marker, keys.DROPS, keys.DROPS_MINUTE_PREFIX]
        options = [*options, 'probe', '1']
        if job_id:  # the caller's own job_id= (a probe knows no other): a drop leaves its record
            call_keys.append(keys.dropped(job_id))
            options += ['dropped', keys.DROPPED_SECONDS]
        args = [job_id, '', 'N', 0, -1, queue.key, keys.wake(queue.name), 9 + len(options), *options]
        return FlatCall('admit_narrow', call_keys, args, {'queue_key': queue.key, 'job_prefix': prefix})
    call = _policy_call(queue, spec, digest, jid=job_id, mode='N', score=0, ttl=-1, queue_key=queue.key, probe=True)
    if job_id:  # the caller's own job_id= (a probe knows no other)
        _record_drops(call, job_id)
    return call


# -- reset -----------------------------------------------------------------------------------------------------------


def reset(queue: Queue, spec: PolicySet | None, digest: str, scanned: list[str] | None = None) -> int:
    """Clear one identity's state of every registered admission policy on ``queue``; how many keys went.

    A policy that is declared passes its settings (a throttle's window width); one that is not still clears what it
    can find from the identity alone. ``scanned`` are keys the caller found by SCAN for state whose name needs a
    setting it does not know (``rq-policies reset`` of a function it cannot import).
    """
    return int(reset_call(queue, spec, digest, scanned).run(queue.connection))


def reset_call(queue: Queue, spec: PolicySet | None, digest: str, scanned: list[str] | None = None) -> Call:
    """The ``lua/reset.lua`` call of :func:`reset` (run by the synchronous and the asyncio doors alike)."""
    declared = {item.name: item for item in (spec.policies if spec else ())}
    call = Call('reset', job_prefix=queue.job_class.redis_job_namespace_prefix, tombstone=keys.SUPERSEDED_PREFIX,
                tombstone_ttl=keys.SUPERSEDED_SECONDS)
    call.key('registry', ScheduledJobRegistry(queue=queue).key)
    parts: dict[str, Any] = {}
    for cls in registered(ADMISSION):
        parts[cls.name] = cls.reset_part(call, queue.name, digest, declared.get(cls.name))
    call.key_list('scanned', list(scanned or ()))
    call.arg('order', list(parts))
    call.arg('p', parts)
    return call.answered()  # a replay answers the first run's count, not the 0 a second run would remove


def release(connection: Any, job_prefix: str, job_ids: list[str]) -> None:
    """These jobs stopped waiting (deleted, cancelled, removed from their queue): every admission policy frees what
    they hold. ``connection`` may be a pipeline, which the releases then ride."""
    if not job_ids:
        return
    for cls in registered(ADMISSION):
        cls.release(connection, job_prefix, job_ids)


def ended(pipeline: Any, job_prefix: str, job_id: str, ending: tuple[str, ...] | None = None) -> None:
    """A job ended for good (finished, failed with no retry left, stopped): every admission policy frees what it held
    while it ran, on ``pipeline``, the one that records the ending (the worker's ``cleanup_execution``).

    ``ending``: the policies that may have something to free for this job (:func:`ending`, from the hash its fetch
    read); None (unknown): every one."""
    for cls in registered(ADMISSION):
        if ending is None or cls.name in ending:
            cls.ended(pipeline, job_prefix, job_id)


def ending(raw: Any) -> tuple[str, ...]:
    """The admission policies whose ``ended`` may have something to free for the job whose hash (as its fetch read
    it: field -> value, bytes, or str from a client that decodes replies) is ``raw``: those without ``ended_when``,
    and those whose ``(field, value)`` the hash holds. The only ones its end-of-run pipeline runs: a job under none
    ends with no script of ours in that pipeline."""
    found = []
    for cls in registered(ADMISSION):
        when = cls.ended_when
        if when is not None:
            field, value = when
            held = raw.get(field.encode(), raw.get(field))
            if held != value.encode() and held != value:
                continue
        found.append(cls.name)
    return tuple(found)


# -- durable admission: WAIT in the door's own round trip -----------------------------------------------------------

def run_replicated(name: str, connection: Any, call_keys: list[str], args: list[Any], replicas: int,
                   timeout_ms: int) -> tuple[Any, int]:
    """Run script ``name`` (a door's admission) and wait for ``replicas`` replicas to have it, in one round trip on
    one connection: ``EVALSHA``, then ``SET`` of :data:`rq_policies.engine.keys.REPLICATED` and ``WAIT replicas
    timeout_ms``, pipelined (not a transaction). Returns the script's reply and how many replicas acknowledged
    (``WAIT``'s answer, fewer than asked after the timeout).

    The ``SET`` makes the count right whatever the script wrote: ``WAIT`` counts the replicas that have the
    connection's last write, and a script that wrote nothing this time (a lost reply resent: it recognises its own
    write and answers as before) would leave that to an older write or none; the replication stream is in order, so a
    replica that has the ``SET`` has the admission before it, made on any connection. A ``NOSCRIPT`` (the server's
    script cache emptied: a restart, a failover) sends the three again with ``EVAL`` and the source: the script did
    not run. On a Redis Cluster the three go to the primary serving the prefix's slot through its node's own client
    (redis-py's cluster pipeline refuses ``WAIT``, a keyless command), with
    :data:`rq_policies.engine.keys.SLOT_GUARD` in KEYS as every script there: a redirection or ``TRYAGAIN`` (the slot
    moving) is sent again after the slot map is read anew, as the adopted client does
    (:data:`rq_policies.engine.compat.SLOT_WAIT_SECONDS`), and a connection error (the primary gone) as the client's own
    ``retry`` says, after reading the slot map anew. Every admission script is safe to run twice.
    """
    from redis.cluster import RedisCluster

    from . import compat

    if not isinstance(connection, RedisCluster):
        if keys.is_cluster(connection):
            raise TypeError(f'run_replicated takes a synchronous client, got {type(connection).__name__}')
        return _replicated(connection, name, call_keys, args, replicas, timeout_ms)
    guarded = [*call_keys, keys.SLOT_GUARD]

    def attempt() -> tuple[Any, int]:
        node = connection.get_redis_connection(connection.get_node_from_key(keys.PREFIX))
        return _replicated(node, name, guarded, args, replicas, timeout_ms)

    def read_slots_anew(_error: BaseException) -> None:
        try:
            connection.nodes_manager.initialize()
        except Exception:  # no node answers yet (a failover in progress): the next attempt reads it again
            pass

    wait = None
    while True:
        try:
            return connection.retry.call_with_retry(attempt, read_slots_anew)
        except Exception as exc:
            if not compat.slot_moving(exc):
                raise
            wait = wait or compat.SlotWait(float(getattr(connection, 'slot_wait_seconds', compat.SLOT_WAIT_SECONDS)))
            pause = wait.pause(exc)  # SlotMigrating past the bound
            read_slots_anew(exc)
            time.sleep(pause)


def _replicated(client: Any, name: str, call_keys: list[str], args: list[Any], replicas: int,
                timeout_ms: int) -> tuple[Any, int]:
    from redis.exceptions import NoScriptError

    from . import scripts

    found = scripts.script(name)
    for command, first in (('EVALSHA', found.sha), ('EVAL', found.script)):
        with client.pipeline(transaction=False) as pipe:
            pipe.execute_command(command, first, len(call_keys), *call_keys, *args)
            pipe.set(keys.REPLICATED, '1', px=60_000)
            pipe.execute_command('WAIT', replicas, timeout_ms)
            replies = pipe.execute(raise_on_error=False)
        if not isinstance(replies[0], NoScriptError):
            break  # NOSCRIPT: the script did not run; with its source now
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies[0], int(replies[2])


def replicated(connection: Any, replicas: int, timeout_ms: int) -> int:
    """Write :data:`rq_policies.engine.keys.REPLICATED` and ``WAIT replicas timeout_ms`` in one pipeline, on one
    connection to the primary (on a cluster the prefix slot's primary, through its node's own client: a cluster
    pipeline takes no ``WAIT``); how many replicas acknowledged. The replication stream is in order, so a replica
    that has that write has every write before it, from any connection (what
    :func:`rq_policies.surfaces.replicas.wait_for_replicas` and a door on rq's own pipeline wait for)."""
    from redis.cluster import RedisCluster

    client = connection
    if isinstance(connection, RedisCluster):
        client = connection.get_redis_connection(connection.get_node_from_key(keys.PREFIX))
    elif keys.is_cluster(connection):
        raise TypeError(f'wait_for_replicas takes a synchronous client, got {type(connection).__name__}')
    with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.REPLICATED, '1', px=60_000)
        pipe.execute_command('WAIT', replicas, timeout_ms)
        _, acknowledged = pipe.execute()
    return int(acknowledged)
