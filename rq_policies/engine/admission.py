"""The admission framework: one script call (``lua/admit.lua``) admits a job through every policy it is declared
under, whichever they are.

A door (``PolicyQueue.enqueue`` and the rest) builds the job as rq would and hands it here with its PolicySet. This
module asks each declared admission policy for its part of the call (its keys, by name, and its arguments, one value
each, see :class:`rq_policies.engine.policy.AdmissionPolicy`), runs the script, and reads the one small verdict that
comes back: admitted, or dropped by a named policy with the id of the job that holds the identity. It names no policy:
what a verdict means for the caller's log line or job status is the policy's own ``on_drop``/``on_admit``.

The commonest calls (a job without a policy, or with one policy that has a narrow part, pushed or scheduled, not
forced, and that policy's probe) go to a narrow twin instead, ``lua/admit_narrow.lua`` (:func:`narrow_call`): the
same decision, writes and verdict in flat arguments, without admit.lua's fixed cost (its msgpack decode, its parts'
loaders: about a third of the commonest admission's server time). Which policies it serves is each policy's to say
(:meth:`rq_policies.engine.policy.AdmissionPolicy.narrow_part`; the script's header names them).

admit.lua answers two more questions: ``probe`` (the fast path for an enqueue expected to be dropped: the
checks only, before rq builds the job, see :mod:`rq_policies.engine.hints`) and ``force`` (enqueue whatever the policies
say). ``reset`` clears one identity's state of every registered admission policy through ``lua/reset.lua``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from rq.registry import ScheduledJobRegistry

from rq_policies.surfaces import otel

from . import identity, keys
from .exceptions import PolicyConfigurationError
from .hints import DropRates, Hints, call_identity, hint_key, plain, spec_token
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
    """

    job: Job
    mode: str
    score: int
    dest: str
    ttl: int
    fields: list[Any]
    created: Any = None


class Verdict(NamedTuple):
    """What the admission script decided: the one typed answer a door reads back (a named tuple: built on every
    enqueue, it costs a third of a frozen dataclass).

    The script answers with named fields (``lua/admit.lua``'s header), which :meth:`read`, the one place that
    decodes them, turns into this.

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
        if b'code' in named:
            get = named.get
            code, policy, job_id = named[b'code'], get(b'policy', b''), get(b'job', b'')
            number, now, superseded, flat = get(b'n', 0), get(b'now', 0), get(b'superseded', b''), get(b'dropped')
        else:
            get = named.get
            code, policy, job_id = named['code'], get('policy', ''), get('job', '')
            number, now, superseded, flat = get('n', 0), get('now', 0), get('superseded', ''), get('dropped')
        dropped = tuple((text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat) - 1, 2)) if flat else ()
        # float() reads the reply's bytes as they are; text() only where a str is kept.
        return cls(int(code), text(policy), text(job_id), float(number), float(now), text(superseded), dropped,
                   digest)


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
        payload = [name for item in spec.policies for name in item.payload_fields]
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
    call.arg('p', {item.name: item.admit_part(call, queue, digest) for item in spec.admission})
    return call


def admit_call(queue: Queue, spec: PolicySet, digest: str, write: JobWrite, force: bool = False,
               narrow: bool = True) -> Call | FlatCall:
    """The call that writes ``write.job`` through ``spec`` (see :func:`admit`, which runs it): the narrow script's
    when it serves the call (:func:`narrow_call`; ``narrow=False``: never), else ``lua/admit.lua``'s."""
    if narrow and not force:
        narrow = narrow_call(queue, spec, digest, write)
        if narrow is not None:
            return narrow
    call = _policy_call(queue, spec, digest, force=force, **_write_args(queue, write))
    _write_keys(call, queue, write)
    if chose_id(write.job):
        _record_drops(call, write.job.id)
    return call


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
        call.arg('record_ttl', keys.PUSHED_SECONDS)


#: The attribute :func:`mark_chosen_id` sets on a Job object (never saved: rq writes only its own fields).
_CHOSEN_ID = '_policies_chosen_id'


def mark_chosen_id(job: Job) -> None:
    """The caller chose ``job``'s id (``job_id=``): a policy's drop of it leaves a record ``explain`` reads."""
    setattr(job, _CHOSEN_ID, True)


def chose_id(job: Job) -> bool:
    """Was ``job``'s id chosen by the caller (:func:`mark_chosen_id`), not drawn by rq?"""
    return getattr(job, _CHOSEN_ID, False)


def _record_drops(call: Call, job_id: str) -> None:
    """Have a drop of ``job_id`` leave its record (``keys.dropped``). Only for an id the caller chose: nobody can ask
    about an id rq drew for a job that was never written, so the common path writes nothing more."""
    call.key('dropped', keys.dropped(job_id))
    call.arg('dropped_ttl', keys.DROPPED_SECONDS)


def _created_at(fields: list[Any]) -> Any:
    """The job's ``created_at`` as it is written to the hash: what makes a replay of this very call recognisable."""
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == 'created_at':
            return fields[i + 1]
    return None


def admit(queue: Queue, spec: PolicySet, digest: str, write: JobWrite, force: bool = False,
          hint: tuple | None = None) -> Verdict:
    """Run one job's admission (or, with ``force``, write it whatever its policies say): the door's one pass down.

    Each declared policy validates the job, gives its part of the one script call and is told the outcome
    (``on_drop``/``on_admit``); the door reads back the one typed :class:`Verdict` (``verdict.written``,
    ``verdict.replaced``) and nothing else.
    """
    if otel.TRACER is not None:  # the traced twin of this function (rq_policies.surfaces.otel), only once it is enabled
        return otel.admit(queue, spec, digest, write, force, hint)
    call = checked_call(queue, spec, digest, write, force)
    return settle(queue, spec, write, Verdict.read(call.run_door(queue.connection), digest), hint)


def checked_call(queue: Queue, spec: PolicySet, digest: str, write: JobWrite, force: bool = False,
                 narrow: bool = True) -> Call | FlatCall:
    """:func:`admit_call` after each policy validated the job (a bad option raises before anything is sent): the
    call every admission door runs, synchronous (:func:`admit`) or not (:mod:`rq_policies.surfaces.aio`)."""
    for item in spec.policies:
        item.validate(write.job, write.mode, force)
    if force and write.mode == 'S':
        raise PolicyConfigurationError('force() enqueues now; it cannot be scheduled')
    return admit_call(queue, spec, digest, write, force, narrow)


def settle(queue: Queue, spec: PolicySet, write: JobWrite, verdict: Verdict, hint: tuple | None = None) -> Verdict:
    """Act on the verdict of :func:`checked_call`'s reply, as every admission door does: each policy's ``on_drop``
    (its log line, or its raise) or ``on_admit``, and the hints. Returns ``verdict``."""
    job, digest = write.job, verdict.digest
    if verdict.code == 0:
        _remember(hint, spec, digest, verdict)
        if spec.on_drop is not None:
            spec.dropped(DroppedCall(job.func_name, tuple(job.args), dict(job.kwargs), queue.name, verdict.policy),
                         verdict.job_id)
        next(item for item in spec.policies if item.name == verdict.policy).on_drop(job.func_name, queue.name, verdict)
        return verdict
    _remember(hint, spec, digest, verdict)
    for item in spec.policies:
        item.on_admit(job, queue.name, verdict)
    for kind, dropped in verdict.dropped:
        logger.info('rq-policies: forced %s on queue %r as job %s; dropped pending %s job %s', job.func_name,
                    queue.name, job.id, kind, dropped)
    return verdict


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
    if chose_id(job):  # as _record_drops, and plain_call's tombstone
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


def plain_call(queue: Queue, write: JobWrite, narrow: bool = True) -> Call | FlatCall:
    """The call that writes a job without a policy: no check, no identity, the job written as rq's own enqueue
    writes it, once (a resend of the call finds its ``created`` and writes nothing): ``lua/admit_narrow.lua``'s for
    a job pushed or scheduled (:func:`narrow_call`), else ``lua/admit.lua``'s.

    A job rq deletes soon after it runs (``result_ttl`` under ``keys.PUSHED_SECONDS``) also keeps that value in
    ``keys.pushed(id)`` for as long: a resend that arrives after the job ran and was deleted writes nothing either.
    An id the caller chose drops the tombstone a superseded pending job of that id left (the fetch would drop it).
    """
    found = narrow_call(queue, None, '', write) if narrow else None
    if found is not None:
        return found
    job = write.job
    call = Call('admit', order=_NO_ORDER, p=_NO_PARTS, **_write_args(queue, write))
    _write_keys(call, queue, write)
    if chose_id(job):
        call.key('dropped', keys.dropped(job.id))
        call.arg('tombstone', keys.SUPERSEDED_PREFIX)
    return call


#: The empty policy order and parts of a plain call (:func:`plain_call`), shared: msgpack packs them as they are.
_NO_ORDER: list[str] = []
_NO_PARTS: dict[str, Any] = {}


def write_plain(queue: Queue, write: JobWrite) -> None:
    """Write a job without a policy in one script call (:func:`plain_call`), safe to send twice."""
    if otel.TRACER is not None:  # traced (rq_policies.surfaces.otel), only once it is enabled
        return otel.write_plain(queue, write)
    plain_call(queue, write).run_door(queue.connection)


def claim(queue: Queue, spec: PolicySet, digest: str, job: Job) -> Verdict:
    """Take the policies' state for ``job`` without writing the job (mode N: a throttle's ``admit``)."""
    call = _policy_call(queue, spec, digest, jid=job.id, mode='N', score=0, ttl=-1, queue_key=queue.key)
    return Verdict.read(call.run(queue.connection))


# -- the fast path for an enqueue that is expected to be dropped ---------------------------------------------------

#: What this process last saw of identities held, and how often its cold enqueues were dropped
#: (rq_policies.engine.hints).
_hints = Hints()
_rates = DropRates()


class Seen(NamedTuple):
    """What :func:`quick_drop` hands the full path of an enqueue it did not drop, for :func:`admit` to remember.

    Attributes:
        key: the call's hint key (:func:`rq_policies.engine.hints.hint_key`), or None.
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


def quick_drop(queue: Queue, spec: PolicySet | None, f: Any, args: tuple, kwargs: dict) -> tuple[bool, Any]:
    """Drop an expected duplicate before rq builds its job (see :mod:`rq_policies.engine.hints` for what makes one
    expected).

    Building and serializing a job costs more than the decision. An enqueue expected to be dropped (this process just
    saw its identity held, or most recent enqueues of its function on this queue were dropped) first runs the
    admission script as a probe: the checks only, which drop the extra as one complete atomic decision when the
    identity is still held. Anything else (nothing expected, the identity free after all, a replayed job id, options
    the full path must refuse) returns False and the enqueue takes the full path, which checks again and writes in
    one script. An expectation only chooses which call runs first; it never decides.

    Returns:
        (dropped, seen): dropped is True when the enqueue was dropped (and logged and counted); ``seen`` is for the
        full path to remember what it saw (:class:`Seen`).
    """
    if spec is None or not queue.is_async or not _probes(spec):
        return False, None
    token = spec_token(spec)
    key = hint_key(queue.name, token, f, args, kwargs)
    seen = _hints.get(key, spec)
    if seen is None:
        rate = (queue.name, token, f) if key is not None else None
        if not _rates.likely(rate):
            return False, Seen(key, rate)
        found = call_identity(queue, spec, f, args, kwargs)
        if found is None:
            return False, Seen(key, rate)
        func_name, digest, job_id = found
        call = probe_call(queue, spec, digest, job_id).packed()
        verdict = probe(queue, spec, digest, job_id, call)
        if verdict.code != 0:
            return False, Seen(key, rate)
        _remember(Seen(key, rate), spec, digest, verdict, call)
        _dropped(spec, func_name, queue, verdict, args, kwargs, f)
        return True, None
    call = seen.probe
    if (call is not None and plain(key) and call.args['queue_key'] == queue.key
            and call.args['job_prefix'] == queue.job_class.redis_job_namespace_prefix):
        # An equal key of plain arguments is the same identity (and the same queue and job keys): the packed probe
        # is this call's own.
        func_name, digest, job_id = identity.function_name(f), seen.digest, ''
    else:
        found = call_identity(queue, spec, f, args, kwargs)
        if found is None or found[1] != seen.digest:
            return False, None
        func_name, digest, job_id = found
        call = probe_call(queue, spec, digest, job_id).packed()
    verdict = probe(queue, spec, digest, job_id, call)
    if verdict.code != 0:
        _hints.forget(key)
        return False, Seen(key)
    _remember(Seen(key), spec, digest, verdict, call)
    _dropped(spec, func_name, queue, verdict, args, kwargs, f)
    return True, None


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
    """The probe's call for one identity (see :func:`probe`): the narrow script's for a set it serves
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


def probe(queue: Queue, spec: PolicySet, digest: str, job_id: str = '', call: Any = None) -> Verdict:
    """Run only the checks of ``spec`` for one identity: code 0 (dropped, counted) or -1 (nothing to drop; a replay
    of ``job_id`` is also -1, for the full path to answer). Writes nothing but a drop's counter.

    ``call``: the probe's call already built (:func:`probe_call`, packed or not), as an identity hint keeps it.
    """
    if call is None:
        call = probe_call(queue, spec, digest, job_id)
    if otel.TRACER is not None:  # traced (rq_policies.surfaces.otel), only once it is enabled
        return otel.probe(queue, spec, digest, call)
    return Verdict.read(call.run_door(queue.connection), digest)


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
    return call


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
            cls.release(pipeline, job_prefix, [job_id], ended=True)


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
