"""OpenTelemetry traces and metrics for every policy decision (``pip install 'rq-policies[otel]'``).

Off until you switch it on, and free while off. Zero-code, as OpenTelemetry's own instrumentations: the
:class:`RQPoliciesInstrumentor` is registered under the ``opentelemetry_instrumentor`` entry point (as
``rq_policies``), so ``opentelemetry-instrument rq worker -w rq_policies.PolicyWorker QUEUE`` and
``opentelemetry-instrument python app.py`` switch it on with the SDK the distro configures. In code::

    import rq_policies.surfaces.otel
    rq_policies.surfaces.otel.instrument()                      # the global tracer and meter providers
    rq_policies.surfaces.otel.instrument(connection=redis)      # plus gauges read from Redis (parked jobs per key, ...)
    rq_policies.surfaces.otel.RQPoliciesInstrumentor().instrument()   # the same, the BaseInstrumentor way

A span of kind PRODUCER named ``send <queue>`` per door decision (admitted, pending, replaced, dropped, raised), its
context carried to the worker in the job's ``meta`` (``traceparent``), a ``process <queue>`` span per job a
PolicyWorker runs, an event (or a short span) for each park, skip, promotion and unpark a PolicyWorker's fetch made,
and counters, a histogram and gauges. Every attribute and instrument, and why a span rather than
an event: docs/opentelemetry.md.

How it is built: the engine never imports this module. :func:`instrument` registers three observers
(:mod:`rq_policies.engine.events`): :func:`observe`, which the door core calls with each plan, verdict and error
(the span's attributes are the plan's and the verdict's), :func:`perform`, around each job a worker runs, and
:func:`fetched`, with what a worker's fetch did besides taking a job (its reply says).
Importing this module imports nothing of OpenTelemetry; only :func:`instrument` imports its API (an ImportError
naming the extra when it is missing), and :class:`RQPoliciesInstrumentor` is built at its first lookup (the module's
``__getattr__``), which imports ``opentelemetry-instrumentation``'s ``BaseInstrumentor``.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Collection
from datetime import datetime, timezone
from typing import Any

from rq_policies.engine import events
from rq_policies.engine.exceptions import InvalidArgument
from rq_policies.engine.keyed import KeyedPolicy
from rq_policies.engine.policy import by_name

from . import state

#: The tracer the doors' observer uses, or None (off). Set by :func:`instrument` only.
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
        raise InvalidArgument('top_keys', message=f'top_keys must be an int >= 0, got {top_keys!r}')
    api = _Api()
    from rq_policies.engine import __version__ as version

    tracer = api.trace.get_tracer('rq_policies', version, tracer_provider=tracer_provider)
    meter = api.metrics.get_meter('rq_policies', version, meter_provider=meter_provider)
    instruments = {
        'totals': _totals(meter),
        'duration': meter.create_histogram('rq_policies.decision.duration', unit='s',
                                           description='A door decision\'s round trip.'),
    }
    if connection is not None:
        instruments['gauges'] = _RedisGauges(meter, connection, top_keys)
    INSTRUMENTS.clear()
    INSTRUMENTS.update(instruments)
    _api, _PROVIDER = api, tracer_provider
    TRACER = tracer
    events.observe(door=observe, run=perform, fetch=fetched)


def uninstrument() -> None:
    """Switch it off again (the doors and workers go back to their one check)."""
    global TRACER
    events.unobserve(door=observe, run=perform, fetch=fetched)
    TRACER = None
    INSTRUMENTS.clear()
    _BASE.clear()
    _LABELS.clear()


#: What the instrumentor instruments, as OpenTelemetry's instrumentations name it (``instrumentation_dependencies``).
INSTRUMENTS_RQ: tuple[str, ...] = ('rq >= 2.12, < 4',)

_INSTRUMENTOR: Any = None  # the RQPoliciesInstrumentor class, built at its first lookup


def _instrumentor_class() -> Any:
    """Build :class:`RQPoliciesInstrumentor` (once): a ``BaseInstrumentor`` whose ``instrument()`` is
    :func:`instrument` and ``uninstrument()`` :func:`uninstrument`."""
    global _INSTRUMENTOR
    if _INSTRUMENTOR is not None:
        return _INSTRUMENTOR
    try:
        from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
    except ImportError as exc:
        raise ImportError("rq_policies' instrumentor needs opentelemetry-instrumentation: "
                          "pip install 'rq-policies[otel]'") from exc

    class RQPoliciesInstrumentor(BaseInstrumentor):  # type: ignore[misc]
        """rq-policies' OpenTelemetry instrumentor: a ``send <queue>`` span per door decision, its context carried
        on the job, a ``process <queue>`` span per job a PolicyWorker runs, and the metrics (docs/opentelemetry.md).

        ``opentelemetry-instrument`` finds it under the ``opentelemetry_instrumentor`` entry point ``rq_policies``
        (``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=rq_policies`` leaves it out). In code,
        ``RQPoliciesInstrumentor().instrument(tracer_provider=..., meter_provider=..., connection=..., top_keys=...)``
        takes :func:`instrument`'s arguments; ``uninstrument()`` switches it off.
        """

        def instrumentation_dependencies(self) -> Collection[str]:
            return INSTRUMENTS_RQ

        def _instrument(self, **kwargs: Any) -> None:
            instrument(tracer_provider=kwargs.get('tracer_provider'), meter_provider=kwargs.get('meter_provider'),
                       connection=kwargs.get('connection'), top_keys=kwargs.get('top_keys', 10))

        def _uninstrument(self, **kwargs: Any) -> None:
            uninstrument()

    RQPoliciesInstrumentor.__qualname__ = 'RQPoliciesInstrumentor'
    _INSTRUMENTOR = RQPoliciesInstrumentor
    return RQPoliciesInstrumentor


def __getattr__(name: str) -> Any:
    """``RQPoliciesInstrumentor``, built at its first lookup (importing this module imports nothing of
    OpenTelemetry)."""
    if name == 'RQPoliciesInstrumentor':
        return _instrumentor_class()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


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

        return [Observation(row['count'], {'policy': row['policy'], 'queue': row['queue']})
                for row in state.drops(self.connection)]


class _Totals:
    """The two counters of a meter, ``rq_policies.admissions`` and ``rq_policies.dropped_enqueues``, counted in this
    process and handed to the SDK at each collection (asynchronous counters: cumulative, monotonic, the same Sum an
    exporter gets from a synchronous counter). A door adds to a dict under a lock, not a measurement through the
    SDK's pipeline per decision: the larger part of what the metrics cost a door."""

    def __init__(self, meter: Any) -> None:
        self.lock = threading.Lock()
        self.admitted: dict[tuple[str, str], int] = {}  # (policy, queue) -> jobs admitted
        self.dropped: dict[tuple[str, str], int] = {}  # (policy, queue) -> enqueues dropped
        meter.create_observable_counter('rq_policies.admissions', [self._admissions], unit='{job}',
                                        description='Jobs the policies admitted through this process\'s doors.')
        meter.create_observable_counter('rq_policies.dropped_enqueues', [self._drops], unit='{enqueue}',
                                        description='Enqueues a policy dropped at this process\'s doors.')

    def add(self, counts: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
        with self.lock:
            counts[key] = counts.get(key, 0) + 1

    def _observe(self, counts: dict[tuple[str, str], int]) -> list[Any]:
        from opentelemetry.metrics import Observation

        with self.lock:
            rows = list(counts.items())
        return [Observation(count, {'policy': policy, 'queue': queue}) for (policy, queue), count in rows]

    def _admissions(self, options: Any) -> list[Any]:
        return self._observe(self.admitted)

    def _drops(self, options: Any) -> list[Any]:
        return self._observe(self.dropped)


#: Each meter's :class:`_Totals` (the meter kept beside it): an SDK meter keeps the callbacks its instruments were
#: first registered with, so switching on again with the same meter counts on in the same totals (a cumulative
#: counter never goes down), and a new meter provider starts from zero.
_TOTALS: dict[int, tuple[Any, _Totals]] = {}


def _totals(meter: Any) -> _Totals:
    found = _TOTALS.get(id(meter))
    if found is None or found[0] is not meter:
        found = _TOTALS[id(meter)] = (meter, _Totals(meter))
    return found[1]


# -- the producer's side ---------------------------------------------------------------------------------------------

_DECISIONS = {1: 'admitted', 2: 'pending', 3: 'replaced', 0: 'dropped'}

#: The attributes every ``send`` span of a (queue, operation, policy set) starts from, built once each (a door's
#: queue and policy set are long-lived; the cache is bounded by the queues and sets a process uses, and cleared by
#: :func:`uninstrument`). Keyed by the set's ``id`` with the set kept in the value, so a set's id is not reused while
#: its entry lives.
_BASE: dict[tuple[str, str, int], tuple[Any, dict[str, Any]]] = {}
#: The metrics' attribute dicts, built once each: ``(policy, queue)`` and ``(queue, decision)``.
_LABELS: dict[tuple[tuple[str, str], str, str], dict[str, str]] = {}


def observe(event: str, plan: Any, detail: Any, state: Any) -> Any:
    """The door observer :func:`instrument` registers (:mod:`rq_policies.engine.events`): a span per door decision,
    from the plan and the verdict the door core already has."""
    if plan.kind == 'probe':  # a span only for a drop, timed around the probe's round trip; a miss is no decision
        if event == 'planned':
            return time.time_ns(), time.perf_counter()
        if event == 'decided' and detail.code == 0:
            _probe_span(plan, detail, *state)
        return None
    if event == 'planned':
        span = _start(plan)
        carry(plan.write.job, span, plan.write)  # before the call is built: the context rides the one round trip
        return span, time.perf_counter()
    span, started = state
    if event == 'decided':
        _end(span, plan, detail, started)
    else:
        _end(span, plan, plan.verdict, started, detail)
    return None


def _messaging(queue: Any, operation: str, spec: Any) -> dict[str, Any]:
    """The attributes every ``send`` span of ``queue``'s ``operation`` through ``spec`` has (a new dict each call,
    copied from the one built once)."""
    key = (queue.name, operation, id(spec))
    found = _BASE.get(key)
    if found is None or found[0] is not spec:
        found = _BASE[key] = (spec, {
            'messaging.system': 'rq', 'messaging.destination.name': queue.name, 'messaging.operation.type': 'send',
            'messaging.operation.name': operation,
            'rq_policies.policies': tuple(item.name for item in spec.policies) if spec is not None else (),
        })
    return dict(found[1])


def _labels(first: str, second: str, names: tuple[str, str]) -> dict[str, str]:
    """A metric's attribute dict ``{names[0]: first, names[1]: second}``, built once (the SDK only reads it)."""
    key = (names, first, second)
    found = _LABELS.get(key)
    if found is None:
        found = _LABELS[key] = {names[0]: first, names[1]: second}
    return found


def _start(plan: Any) -> Any:
    """Start the decision's span of ``plan`` (an admission or a plain write)."""
    queue, write, spec, digest = plan.queue, plan.write, plan.spec, plan.digest
    job = write.job
    attributes = _messaging(queue, 'force' if plan.force else ('schedule' if write.mode == 'S' else 'enqueue'), spec)
    attributes['rq.job.function'] = job.func_name
    if digest:
        attributes['rq_policies.identity'] = digest
    if spec is not None:
        for item in spec.policies:
            if isinstance(item, KeyedPolicy):
                scope, key = item.key_of(job, digest)
                attributes['rq_policies.scope'], attributes['rq_policies.key'] = str(scope), str(key)
    return TRACER.start_span(f'send {queue.name}', kind=_api.producer, attributes=attributes)


def _probe_span(plan: Any, verdict: Any, started_ns: int, started: float) -> None:
    """A drop the hint probe decided: one span, timed around the probe's round trip."""
    queue = plan.queue
    attributes = _messaging(queue, 'enqueue', plan.spec)
    attributes['rq_policies.identity'] = plan.digest
    attributes['rq_policies.decision'] = 'dropped'
    attributes['rq_policies.policy'] = verdict.policy
    attributes['rq_policies.probe'] = True
    if verdict.job_id:
        attributes['rq_policies.holder.id'] = verdict.job_id
    span = TRACER.start_span(f'send {queue.name}', kind=_api.producer, attributes=attributes, start_time=started_ns)
    _count(queue, verdict, 'dropped', started)
    span.end()


def carry(job: Any, span: Any, write: Any = None) -> None:
    """Write ``span``'s context into ``job.meta`` (and, given the job's prepared ``write``, into the hash fields it
    is about to write): W3C Trace Context, as OpenTelemetry's ``TraceContextTextMapPropagator`` writes it, formatted
    from the span's context directly (no context object built to carry it)."""
    context = span.get_span_context()
    if not context.is_valid:
        return
    carrier = {TRACEPARENT: f'00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}'}
    if context.trace_state:
        carrier[TRACESTATE] = context.trace_state.to_header()
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


def _end(span: Any, plan: Any, verdict: Any, started: float, exc: BaseException | None = None) -> None:
    """End the decision's span: the decision, its policy, the holder (a drop) or the job written, and the metrics;
    ``exc``: the door raised it (a refused option, a Redis error, a policy's raise). A span the sampler left
    unrecorded gets no attribute (it would drop them); the metrics count every decision."""
    if exc is not None:
        decision = 'raised'
        span.record_exception(exc)
        span.set_status(_api.error)
    else:
        decision = _DECISIONS.get(verdict.code, 'admitted') if verdict is not None else 'admitted'
    if span.is_recording():
        span.set_attribute('rq_policies.decision', decision)
        if verdict is not None and verdict.policy:
            span.set_attribute('rq_policies.policy', verdict.policy)
        if verdict is not None and verdict.code == 0:
            if verdict.job_id:
                span.set_attribute('rq_policies.holder.id', verdict.job_id)
        elif decision == 'replaced':
            span.set_attribute('messaging.message.id', verdict.job_id)
        elif decision != 'raised':
            span.set_attribute('messaging.message.id', plan.write.job.id)
    _count(plan.queue, verdict, decision, started, plan.spec)
    span.end()


_QUEUE_DECISION = ('queue', 'decision')


def _count(queue: Any, verdict: Any, decision: str, started: float, spec: Any = None) -> None:
    instruments, name = INSTRUMENTS, queue.name
    totals = instruments['totals']
    if verdict is not None and verdict.code == 0:  # dropped (or raised by the dropping policy)
        totals.add(totals.dropped, (verdict.policy, name))
    elif decision in ('admitted', 'pending'):  # a job written: admitted by each of its policies ('none': no policy)
        policies = spec.policies if spec is not None else ()
        for item in policies:
            totals.add(totals.admitted, (item.name, name))
        if not policies:
            totals.add(totals.admitted, ('none', name))
    instruments['duration'].record(time.perf_counter() - started, _labels(name, decision, _QUEUE_DECISION))


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


def _time_in_queue(job: Any) -> float | None:
    """Seconds from the job's ``enqueued_at`` to now (its run's start), or None when rq recorded none."""
    enqueued = getattr(job, 'enqueued_at', None)
    if enqueued is None:
        return None
    if enqueued.tzinfo is None:  # rq 2.12 stores naive UTC
        enqueued = enqueued.replace(tzinfo=timezone.utc)
    return max(0.0, (datetime.now(timezone.utc) - enqueued).total_seconds())


def _catch(run: Any, job: Any) -> tuple[list[Any], Any]:
    """A list that the worker's exception handlers fill with ``job``'s exception, and the function that takes the
    handler out again (a no-op when ``run`` is not a worker's bound ``perform_job``).

    rq catches a job's exception inside ``perform_job`` and hands it to the worker's exception handlers (after
    rq-policies' own outcome: a back-off or a lost start is no failure and reaches none); this handler, put first,
    records it and lets the others run."""
    handlers = getattr(getattr(run, '__self__', None), '_exc_handlers', None)
    if not isinstance(handlers, list):
        return [], lambda: None
    seen: list[Any] = []

    def catch(failed: Any, *exc_info: Any) -> bool:
        if getattr(failed, 'id', None) == job.id and len(exc_info) > 1 and exc_info[1] is not None:
            seen.append(exc_info[1])
        return True  # fall through to the next handler

    def remove() -> None:
        if catch in handlers:
            handlers.remove(catch)

    handlers.insert(0, catch)
    return seen, remove


def perform(run: Any, job: Any, queue: Any, *args: Any) -> Any:
    """The run observer :func:`instrument` registers: ``run(job, queue, *args)`` (rq's ``perform_job``, in the work
    horse) inside the job's ``process`` span, a child of the producer's span carried on the job; then the provider
    flushed (a horse ends with ``os._exit``)."""
    attributes = {
        'messaging.system': 'rq', 'messaging.destination.name': queue.name, 'messaging.operation.type': 'process',
        'messaging.operation.name': 'perform', 'messaging.message.id': job.id, 'rq.job.function': job.func_name,
    }
    for name in ('retries_left', 'number_of_retries'):  # rq's own counts, when the job has them
        value = getattr(job, name, None)
        if isinstance(value, int):
            attributes[f'rq.job.{name}'] = value
    waited = _time_in_queue(job)
    if waited is not None:
        attributes['rq.job.time_in_queue'] = waited
    span = TRACER.start_span(f'process {queue.name}', context=context_of(job), kind=_api.consumer,
                             attributes=attributes)
    token = _api.context.attach(_api.trace.set_span_in_context(span))
    seen, uncatch = _catch(run, job)
    try:
        ok = run(job, queue, *args)
        span.set_attribute('rq.job.status', 'finished' if ok else 'failed')
        if not ok:
            if seen:  # with its own traceback (an older SDK formats the exception being handled: none by now)
                exc = seen[-1]
                stack = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                span.record_exception(exc, attributes={'exception.stacktrace': stack})
            span.set_status(_api.error)
        return ok
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(_api.error)
        raise
    finally:
        uncatch()
        _api.context.detach(token)
        span.end()
        flush = getattr(_PROVIDER or _api.trace.get_tracer_provider(), 'force_flush', None)
        if flush is not None:
            flush()


def fetched(event: str, queue: str, detail: dict[str, Any]) -> None:
    """The fetch observer :func:`instrument` registers (:mod:`rq_policies.engine.events`): what a PolicyWorker's
    fetch did besides taking a job (``park``, ``skip``, ``promote``, ``unpark``), as an event named
    ``rq_policies.<event>`` on the current span when one is recording (a span the worker's caller or another
    instrumentation opened around the fetch), else as a short INTERNAL span named ``<event> <queue>``."""
    attributes: dict[str, Any] = {
        'messaging.system': 'rq', 'messaging.destination.name': queue, 'messaging.operation.name': event,
    }
    if 'job_id' in detail:
        attributes['messaging.message.id'] = detail['job_id']
    if detail.get('policy'):
        attributes['rq_policies.policy'] = detail['policy']
    if detail.get('scope'):
        attributes['rq_policies.scope'], attributes['rq_policies.key'] = detail['scope'], detail.get('key', '')
    if detail.get('until') is not None:
        attributes['rq_policies.until'] = detail['until']
    if 'count' in detail:
        attributes['messaging.batch.message_count'] = detail['count']
    current = _api.trace.get_current_span()
    if current.is_recording():
        current.add_event(f'rq_policies.{event}', attributes)
        return
    TRACER.start_span(f'{event} {queue}', attributes=attributes).end()
