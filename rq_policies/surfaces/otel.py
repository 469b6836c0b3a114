"""OpenTelemetry traces and metrics for every policy decision (``pip install 'rq-policies[otel]'``).

Off until you switch it on, and free while off::

    import rq_policies.surfaces.otel
    rq_policies.surfaces.otel.instrument()                      # the global tracer and meter providers
    rq_policies.surfaces.otel.instrument(connection=redis)      # plus gauges read from Redis (parked jobs per key, ...)

Importing this module imports nothing of OpenTelemetry: the doors test one module global, ``TRACER is None``, and
only :func:`instrument` imports the ``opentelemetry`` API (an ImportError naming the extra when it is missing).

**A span per decision, not an event on the caller's span.** Each door decision (a job written by its policies, or
without a policy; dropped; a pending job's payload replaced; raised) is a span of kind PRODUCER named ``send
<queue>``, a child of the caller's current span when there is one. A span rather than a span event because: the
messaging semantic conventions model an enqueue as a producer span, and that span's context is what the job carries
to its worker (its ``process`` span is the span's child), so the trace runs request -> enqueue -> job even when the
caller has no span of its own (a cron script, a shell); a span also measures the round trip (the answer to "why was
the request slow"), and sampling applies to it as to any span. What it costs when on is in ``bench/aio.py``.

Attributes (messaging semantic conventions where they fit):

==================================  ==============================================================================
``messaging.system``                ``rq``
``messaging.destination.name``      the queue
``messaging.operation.type``        ``send``
``messaging.operation.name``        ``enqueue``, ``schedule`` (a scheduled or debounced write) or ``force``
``messaging.message.id``            the job's id, when one was written (or, ``replaced``, the holder it went to)
``rq.job.function``                 the job's function path
``rq_policies.decision``            ``admitted``, ``pending`` (a trailing job), ``replaced``, ``dropped``, ``raised``
``rq_policies.policies``            the policies the job was admitted under, in check order ([] for a plain job)
``rq_policies.engine.policy``              the policy that decided a drop (or replaced), else absent
``rq_policies.holder.id``           on a drop: the id of the job that holds the identity
``rq_policies.engine.identity``            the identity's digest (a policy with an identity)
``rq_policies.scope``, ``.key``     a per-key policy's (Concurrency, Rate) scope and key
==================================  ==============================================================================

A raise (a Loner's ``on_conflict='raise'``, a refused option, a Redis error) records the exception and sets the
span's status to ERROR. A drop decided by the hint probe (the synchronous door's fast path) is a span as well, timed
around the probe's round trip.

**Context on the job.** The span's context is written into the job's ``meta`` as W3C ``traceparent`` (and
``tracestate`` when set) before the admission script writes the hash, so it rides the one round trip and stays on
the job wherever it goes: scheduled, parked by a per-key policy and promoted, retried. With :func:`instrument` called
in the worker's process too, ``PolicyWorker`` runs each job inside a ``process <queue>`` span (kind CONSUMER) that is a
child of the producer's span and carries ``messaging.message.id`` and the outcome. rq's forked work horse exits with
``os._exit``, so the horse flushes the tracer provider after the job (``force_flush``).

**Metrics** (the OTel metrics API; names mirror :mod:`rq_policies.surfaces.metrics`):

========================================  ==============  ========================================================
``rq_policies.admissions``                counter         ``policy``, ``queue``: jobs admitted by this process
``rq_policies.dropped_enqueues``          counter         ``policy``, ``queue``: enqueues this process's doors dropped
``rq_policies.decision.duration``         histogram (s)   ``queue``, ``decision``: a door's round trip
``rq_policies.keys.parked``               gauge           ``policy``, ``scope``, ``key``: parked jobs of the
                                                          ``top_keys`` busiest keys, the rest as ``key='(other)'``
``rq_policies.keys.in_use``               gauge           the same labels: holds in use (Concurrency)
``rq_policies.dropped_enqueues.cluster``  gauge           ``policy``, ``queue``: the cluster-wide count in Redis
``rq_policies.queue_slots.in_use``        gauge           ``queue``: live QueueSlot holds (jobs running under a cap)
``rq_policies.queue_slots.capacity``      gauge           ``queue``: the cap of a capped queue
========================================  ==============  ========================================================

The counters are per process (each producer exports its own, as OTel's SDKs expect); the gauges read Redis when the
SDK collects and exist only with ``instrument(connection=...)``.
"""

from __future__ import annotations

import time
from typing import Any

from rq_policies.engine.keyed import KeyedPolicy

#: The tracer the doors use, or None (off: the doors' one check). Set by :func:`instrument` only.
TRACER: Any = None
#: The instruments, set with :data:`TRACER` (a dict of name -> instrument).
INSTRUMENTS: dict[str, Any] = {}

#: The job ``meta`` keys that carry the producer's trace context (W3C Trace Context).
TRACEPARENT = 'traceparent'
TRACESTATE = 'tracestate'

_api: Any = None  # the opentelemetry modules this module uses, imported by instrument()
_PROVIDER: Any = None  # the tracer provider instrument() was given (the global one when None)


class _Api:
    def __init__(self) -> None:
        try:
            from opentelemetry import context, metrics, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise ImportError("rq_policies.otel needs OpenTelemetry: pip install 'rq-policies[otel]'") from exc
        self.trace, self.metrics, self.context = trace, metrics, context
        self.propagator = TraceContextTextMapPropagator()
        self.producer, self.consumer = trace.SpanKind.PRODUCER, trace.SpanKind.CONSUMER
        self.error = trace.Status(trace.StatusCode.ERROR)


def instrument(tracer_provider: Any = None, meter_provider: Any = None, connection: Any = None,
               top_keys: int = 10) -> None:
    """Switch tracing and metrics on for every door and PolicyWorker of this process.

    Args:
        tracer_provider: the tracer provider to use (the global one when None).
        meter_provider: the meter provider to use (the global one when None).
        connection: a synchronous ``redis.Redis``: adds the gauges read from Redis at each collection.
        top_keys: per scope, how many of the busiest keys get a ``key`` label of their own (the cardinality bound);
            the others are summed under ``key='(other)'``.
    """
    global TRACER, _api, _PROVIDER
    if isinstance(top_keys, bool) or not isinstance(top_keys, int) or top_keys < 0:
        raise ValueError(f'top_keys must be an int >= 0, got {top_keys!r}')
    api = _Api()
    from rq_policies import __version__ as version

    tracer = api.trace.get_tracer('rq_policies', version, tracer_provider=tracer_provider)
    meter = api.metrics.get_meter('rq_policies', version, meter_provider=meter_provider)
    instruments = {
        'admissions': meter.create_counter('rq_policies.admissions', unit='{job}',
                                           description='Jobs the policies admitted through this process\'s doors.'),
        'drops': meter.create_counter('rq_policies.dropped_enqueues', unit='{enqueue}',
                                      description='Enqueues a policy dropped at this process\'s doors.'),
        'duration': meter.create_histogram('rq_policies.decision.duration', unit='s',
                                           description='A door decision\'s round trip.'),
    }
    if connection is not None:
        instruments['gauges'] = _RedisGauges(meter, connection, top_keys)
    INSTRUMENTS.clear()
    INSTRUMENTS.update(instruments)
    _api, _PROVIDER = api, tracer_provider
    TRACER = tracer


def uninstrument() -> None:
    """Switch it off again (the doors go back to their one ``None`` check)."""
    global TRACER
    TRACER = None
    INSTRUMENTS.clear()


class _RedisGauges:
    """The gauges read from Redis at each collection (the state :mod:`rq_policies.surfaces.metrics` exports)."""

    def __init__(self, meter: Any, connection: Any, top_keys: int) -> None:
        self.connection, self.top = connection, top_keys
        self._rows: list[tuple] | None = None
        meter.create_observable_gauge('rq_policies.keys.parked', [self._parked], unit='{job}',
                                      description='Parked jobs per key of the per-key policies (top keys).')
        meter.create_observable_gauge('rq_policies.keys.in_use', [self._in_use], unit='{job}',
                                      description='Holds in use per key of the per-key policies (top keys).')
        meter.create_observable_gauge('rq_policies.dropped_enqueues.cluster', [self._drops], unit='{enqueue}',
                                      description='Enqueues dropped, counted in Redis by every producer.')
        meter.create_observable_gauge('rq_policies.queue_slots.in_use', [self._slots], unit='{job}',
                                      description='Live QueueSlot holds of a queue (jobs running under its cap).')
        meter.create_observable_gauge('rq_policies.queue_slots.capacity', [self._capacity], unit='{job}',
                                      description='Cluster-wide QueueSlot cap of a queue.')

    def key_rows(self) -> list[tuple[str, str, str, int, int]]:
        """(policy, scope, key, parked, in_use), the busiest ``top_keys`` keys per scope and an ``(other)`` row."""
        from . import state

        now = state.server_now(self.connection)
        rows = []
        for name, section in state.policies_state(self.connection, now, None).items():
            found = section.as_json()
            for scope, entry in found.get('scopes', {}).items():
                busiest = entry.get('busiest') or []
                for row in busiest[:self.top]:
                    rows.append((name, scope, row['key'], int(row.get('parked', 0)), int(row.get('in_use', 0))))
                rest = busiest[self.top:]
                if rest:
                    rows.append((name, scope, '(other)', sum(int(r.get('parked', 0)) for r in rest),
                                 sum(int(r.get('in_use', 0)) for r in rest)))
        return rows

    def _observe(self, column: int) -> list[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(row[column], {'policy': row[0], 'scope': row[1], 'key': row[2]})
                for row in self.key_rows()]

    def _parked(self, options: Any) -> list[Any]:
        return self._observe(3)

    def _in_use(self, options: Any) -> list[Any]:
        return self._observe(4)

    def _slot_rows(self) -> list[dict[str, Any]]:
        from rq_policies.engine.policy import by_name

        from . import state

        now = state.server_now(self.connection)
        return by_name('queue_slot').gauges(self.connection, state.queue_names(self.connection), now)

    def _slots(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(row['in_use'], {'queue': row['queue']}) for row in self._slot_rows()]

    def _capacity(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(row['capacity'], {'queue': row['queue']}) for row in self._slot_rows()
                if row['capacity'] is not None]

    def _drops(self, options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        from . import state

        return [Observation(row['count'], {'policy': row['policy'], 'queue': row['queue']})
                for row in state.drops(self.connection)]


# -- the producer's side ---------------------------------------------------------------------------------------------

_DECISIONS = {1: 'admitted', 2: 'pending', 3: 'replaced', 0: 'dropped'}


def _start(queue: Any, write: Any, spec: Any, force: bool, digest: str = '') -> Any:
    """Start the decision's span and write its context into the job's meta (in ``write.fields``)."""
    job = write.job
    operation = 'force' if force else ('schedule' if write.mode == 'S' else 'enqueue')
    attributes = {
        'messaging.system': 'rq', 'messaging.destination.name': queue.name, 'messaging.operation.type': 'send',
        'messaging.operation.name': operation, 'rq.job.function': job.func_name,
        'rq_policies.policies': [item.name for item in spec.policies] if spec is not None else [],
    }
    if digest:
        attributes['rq_policies.identity'] = digest
    if spec is not None:
        for item in spec.policies:
            if isinstance(item, KeyedPolicy):
                scope, key = item.key_of(job, digest)
                attributes['rq_policies.scope'], attributes['rq_policies.key'] = str(scope), str(key)
    span = TRACER.start_span(f'send {queue.name}', kind=_api.producer, attributes=attributes)
    carry(job, span, write)
    return span


def carry(job: Any, span: Any, write: Any = None) -> None:
    """Write ``span``'s context into ``job.meta`` (and, given the job's prepared ``write``, into the hash fields it
    is about to write)."""
    carrier: dict[str, str] = {}
    _api.propagator.inject(carrier, context=_api.trace.set_span_in_context(span))
    if not carrier:
        return
    job.meta = dict(job.meta or {})
    job.meta.update(carrier)
    if write is None:
        return
    fields = write.fields
    packed = job.serializer.dumps(job.meta)
    for i in range(0, len(fields) - 1, 2):
        if fields[i] == 'meta':
            fields[i + 1] = packed
            return
    fields += ['meta', packed]


def _finish(span: Any, queue: Any, write: Any, verdict: Any, started: float, spec: Any) -> None:
    decision = _DECISIONS.get(verdict.code, 'admitted') if verdict is not None else 'admitted'
    span.set_attribute('rq_policies.decision', decision)
    if verdict is not None and verdict.policy:
        span.set_attribute('rq_policies.policy', verdict.policy)
    if decision == 'dropped':
        if verdict.job_id:
            span.set_attribute('rq_policies.holder.id', verdict.job_id)
    elif decision == 'replaced':
        span.set_attribute('messaging.message.id', verdict.job_id)
    else:
        span.set_attribute('messaging.message.id', write.job.id)
    _count(queue, verdict, decision, started, spec)
    span.end()


def _count(queue: Any, verdict: Any, decision: str, started: float, spec: Any = None) -> None:
    instruments = INSTRUMENTS
    if decision == 'dropped':
        instruments['drops'].add(1, {'policy': verdict.policy, 'queue': queue.name})
    elif decision != 'replaced':  # a job written: admitted by each of its policies ('none' for a plain job)
        for item in spec.policies if spec is not None else ():
            instruments['admissions'].add(1, {'policy': item.name, 'queue': queue.name})
        if spec is None or not spec.policies:
            instruments['admissions'].add(1, {'policy': 'none', 'queue': queue.name})
    instruments['duration'].record(time.perf_counter() - started, {'queue': queue.name, 'decision': decision})


def _raised(span: Any, queue: Any, exc: BaseException, verdict: Any, started: float) -> None:
    span.set_attribute('rq_policies.decision', 'raised')
    if verdict is not None:
        if verdict.policy:
            span.set_attribute('rq_policies.policy', verdict.policy)
        if verdict.code == 0 and verdict.job_id:
            span.set_attribute('rq_policies.holder.id', verdict.job_id)
    span.record_exception(exc)
    span.set_status(_api.error)
    if verdict is not None and verdict.code == 0:
        INSTRUMENTS['drops'].add(1, {'queue': queue.name, 'policy': verdict.policy})
    INSTRUMENTS['duration'].record(time.perf_counter() - started, {'queue': queue.name, 'decision': 'raised'})
    span.end()


def admit(queue: Any, spec: Any, digest: str, write: Any, force: bool, hint: Any) -> Any:
    """:func:`rq_policies.engine.admission.admit`, traced."""
    from rq_policies.engine.admission import Verdict, checked_call, settle

    started = time.perf_counter()
    span = _start(queue, write, spec, force, digest)
    verdict = None
    try:
        call = checked_call(queue, spec, digest, write, force)
        verdict = Verdict.read(call.run_door(queue.connection), digest)
        settle(queue, spec, write, verdict, hint)
    except BaseException as exc:
        _raised(span, queue, exc, verdict, started)
        raise
    _finish(span, queue, write, verdict, started, spec)
    return verdict


def write_plain(queue: Any, write: Any) -> None:
    """:func:`rq_policies.engine.admission.write_plain`, traced."""
    from rq_policies.engine.admission import plain_call

    started = time.perf_counter()
    span = _start(queue, write, None, False)
    try:
        plain_call(queue, write).run_door(queue.connection)
    except BaseException as exc:
        _raised(span, queue, exc, None, started)
        raise
    _finish(span, queue, write, None, started, None)


def probe(queue: Any, spec: Any, digest: str, call: Any, func_name: str = '') -> Any:
    """:func:`rq_policies.engine.admission.probe`, traced: a drop is a span (timed around the probe), a miss none (the
    full path that follows is the decision)."""
    from rq_policies.engine.admission import Verdict

    started_ns, started = time.time_ns(), time.perf_counter()
    verdict = Verdict.read(call.run_door(queue.connection), digest)
    if verdict.code == 0:
        attributes = {
            'messaging.system': 'rq', 'messaging.destination.name': queue.name,
            'messaging.operation.type': 'send', 'messaging.operation.name': 'enqueue',
            'rq_policies.policies': [item.name for item in spec.policies], 'rq_policies.identity': digest,
            'rq_policies.decision': 'dropped', 'rq_policies.policy': verdict.policy, 'rq_policies.probe': True,
        }
        if verdict.job_id:
            attributes['rq_policies.holder.id'] = verdict.job_id
        span = TRACER.start_span(f'send {queue.name}', kind=_api.producer, attributes=attributes,
                                 start_time=started_ns)
        _count(queue, verdict, 'dropped', started)
        span.end()
    return verdict


async def send_async(queue: Any, plan: Any, client: Any) -> Any:
    """An asyncio door's round trip (``rq_policies.surfaces.aio``), traced. The job's context is written before the
    send."""
    from rq_policies.engine.admission import Verdict, settle

    from .aio import run_call

    started = time.perf_counter()
    write = plan.write
    span = _start(queue, write, plan.spec, bool(plan.call.args.get('force')), plan.digest)
    verdict = None
    try:
        reply = await run_call(plan.call, client)
        if plan.kind == 'plain':
            written = True
        else:
            verdict = Verdict.read(reply, plan.digest)
            written = settle(queue, plan.spec, write, verdict).written
    except BaseException as exc:
        _raised(span, queue, exc, verdict, started)
        raise
    _finish(span, queue, write, verdict, started, plan.spec)
    return write.job if written else None


# -- the worker's side -----------------------------------------------------------------------------------------------


def context_of(job: Any) -> Any:
    """The producer's context carried in ``job.meta`` (None when it carries none)."""
    meta = job.meta or {}
    if TRACEPARENT not in meta:
        return None
    carrier = {TRACEPARENT: str(meta[TRACEPARENT])}
    if TRACESTATE in meta:
        carrier[TRACESTATE] = str(meta[TRACESTATE])
    return _api.propagator.extract(carrier)


def perform(job: Any, queue: Any, run: Any, *args: Any) -> Any:
    """Run ``run(job, queue, *args)`` (rq's ``perform_job``, in the work horse) inside the job's ``process`` span, a
    child of the producer's span carried on the job; then flush the provider (a horse ends with ``os._exit``)."""
    attributes = {
        'messaging.system': 'rq', 'messaging.destination.name': queue.name, 'messaging.operation.type': 'process',
        'messaging.operation.name': 'perform', 'messaging.message.id': job.id, 'rq.job.function': job.func_name,
    }
    span = TRACER.start_span(f'process {queue.name}', context=context_of(job), kind=_api.consumer,
                             attributes=attributes)
    token = _api.context.attach(_api.trace.set_span_in_context(span))
    try:
        ok = run(job, queue, *args)
        span.set_attribute('rq.job.status', 'finished' if ok else 'failed')
        if not ok:
            span.set_status(_api.error)
        return ok
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(_api.error)
        raise
    finally:
        _api.context.detach(token)
        span.end()
        flush = getattr(_PROVIDER or _api.trace.get_tracer_provider(), 'force_flush', None)
        if flush is not None:
            flush()
