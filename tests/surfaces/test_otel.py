"""OpenTelemetry (rq_policies.surfaces.otel): one span per door decision with its attributes, the producer's context
carried on the job to a real forking PolicyWorker's span, metrics, and nothing of OpenTelemetry imported or done while
off."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip('opentelemetry.sdk')

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from redis.asyncio import Redis as AsyncRedis  # noqa: E402

import rq_policies.surfaces.otel as otel  # noqa: E402
from rq_policies import Concurrency, DuplicateJob, Loner, PolicyQueue  # noqa: E402
from rq_policies.surfaces.aio import AsyncPolicyQueue  # noqa: E402
from tests.helpers import jobs  # noqa: E402
from tests.helpers.workers import output, start_worker  # noqa: E402


@pytest.fixture
def traced():
    """The SDK with in-memory span and metric readers, switched on for the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    otel.instrument(tracer_provider=provider, meter_provider=meters)
    try:
        yield exporter, reader, provider.get_tracer('test')
    finally:
        otel.uninstrument()


def _points(reader, name):
    found = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found[tuple(sorted(point.attributes.items()))] = point.value
    return found


def test_one_span_per_decision_with_attributes(connection, traced):
    exporter, reader, tracer = traced
    q = PolicyQueue('otel', connection=connection)
    with tracer.start_as_current_span('request') as request:
        admitted = q.enqueue(jobs.record, 'a')
        dropped = [q.enqueue(jobs.record, 'a') for _ in range(3)]  # the later ones take the hint probe
        plain = q.enqueue(jobs.plain, 1)
        forced = q.force(jobs.record, 'a')
        with pytest.raises(DuplicateJob):
            q.enqueue(jobs.plain, 2, policy=Loner(on_conflict='raise'), job_id='x1')
            q.enqueue(jobs.plain, 2, policy=Loner(on_conflict='raise'))
        q.enqueue(jobs.plain, 't1', policy=Concurrency(2, key=lambda args, kwargs: args[0], scope='tenant'))
    assert admitted is not None and dropped == [None] * 3 and plain is not None and forced is not None
    spans = [s for s in exporter.get_finished_spans() if s.name != 'request']
    assert [s.attributes['rq_policies.decision'] for s in spans] == [
        'admitted', 'dropped', 'dropped', 'dropped', 'admitted', 'admitted', 'admitted', 'raised', 'admitted']
    trace_id = request.get_span_context().trace_id
    for span in spans:
        assert span.name == 'send otel' and span.kind.name == 'PRODUCER'
        assert span.context.trace_id == trace_id and span.parent.span_id == request.get_span_context().span_id
        assert span.attributes['messaging.system'] == 'rq'
        assert span.attributes['messaging.destination.name'] == 'otel'
        assert span.attributes['messaging.operation.type'] == 'send'
    first, drop = spans[0], spans[1]
    assert first.attributes['messaging.message.id'] == admitted.id
    assert first.attributes['rq_policies.policies'] == ('loner',)
    assert drop.attributes['rq_policies.policy'] == 'loner'
    assert drop.attributes['rq_policies.holder.id'] == admitted.id
    assert drop.attributes['rq_policies.identity'] == first.attributes['rq_policies.identity']
    assert 'messaging.message.id' not in drop.attributes
    assert spans[3].attributes.get('rq_policies.probe') is True  # decided by the hint probe, one span all the same
    assert spans[4].attributes['rq_policies.policies'] == () and spans[4].attributes['messaging.message.id'] == plain.id
    assert spans[5].attributes['messaging.operation.name'] == 'force'
    assert spans[7].status.status_code.name == 'ERROR' and spans[7].attributes['rq_policies.holder.id'] == 'x1'
    assert spans[8].attributes['rq_policies.scope'] == 'tenant' and spans[8].attributes['rq_policies.key'] == 't1'
    # the context on the job is the decision's span, in meta, in Redis
    from rq.job import Job

    stored = Job.fetch(admitted.id, connection=connection)
    version, carried_trace, carried_span, _ = stored.meta['traceparent'].split('-')
    assert int(carried_trace, 16) == trace_id and int(carried_span, 16) == first.context.span_id
    # metrics: admissions and drops by policy and queue
    assert _points(reader, 'rq_policies.dropped_enqueues')[(('policy', 'loner'), ('queue', 'otel'))] == 4
    assert _points(reader, 'rq_policies.admissions') == {
        (('policy', 'loner'), ('queue', 'otel')): 3, (('policy', 'none'), ('queue', 'otel')): 1,
        (('policy', 'concurrency'), ('queue', 'otel')): 1}


def test_async_door_spans(connection, redis_url, traced):
    exporter, reader, tracer = traced

    async def main():
        client = AsyncRedis.from_url(redis_url)
        q = AsyncPolicyQueue('otel', connection=client)
        with tracer.start_as_current_span('request'):
            first = await q.enqueue(jobs.record, 'b')
            second = await q.enqueue(jobs.record, 'b')
        await client.aclose()
        return first, second

    first, second = asyncio.run(main())
    spans = [s for s in exporter.get_finished_spans() if s.name != 'request']
    assert [s.attributes['rq_policies.decision'] for s in spans] == ['admitted', 'dropped']
    assert spans[1].attributes['rq_policies.holder.id'] == first.id and second is None
    from rq.job import Job

    carried = Job.fetch(first.id, connection=connection).meta['traceparent']
    assert int(carried.split('-')[2], 16) == spans[0].context.span_id


def test_off_means_nothing(connection):
    """Switched off, no span and no meta: the door is the plain one (its one None check)."""
    otel.uninstrument()
    assert otel.TRACER is None
    job = PolicyQueue('otel', connection=connection).enqueue(jobs.record, 'off')
    from rq.job import Job

    assert 'traceparent' not in Job.fetch(job.id, connection=connection).meta


def test_instrument_registers_its_observers_once_and_uninstrument_removes_them(connection):
    """Tracing watches from above: instrument() adds its door and run observers to the engine's lists (once, however
    often it is called), uninstrument() takes them out, and the doors are left with nothing to call."""
    from rq_policies.engine import events

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        for _ in range(2):
            otel.instrument(tracer_provider=provider, meter_provider=MeterProvider())
        assert events.DOORS == [otel.observe] and events.RUNS == [otel.perform]
        PolicyQueue('otel', connection=connection).enqueue(jobs.record, 'twice')
        assert [span.name for span in exporter.get_finished_spans()] == ['send otel']  # one span, not two
    finally:
        otel.uninstrument()
    assert events.DOORS == [] and events.RUNS == [] and otel.TRACER is None
    PolicyQueue('otel', connection=connection).enqueue(jobs.record, 'after')
    assert len(exporter.get_finished_spans()) == 1


def test_not_installed_imports_nothing(redis_url, worker_env):
    """With opentelemetry unimportable (a meta-path hook refuses it), every module loads and the doors work; nothing
    imported it; ``instrument()`` says which extra to install."""
    script = textwrap.dedent('''
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == 'opentelemetry' or name.startswith('opentelemetry.'):
                    raise ImportError('blocked: ' + name)
        sys.meta_path.insert(0, Block())
        import asyncio
        from redis import Redis
        from redis.asyncio import Redis as AsyncRedis
        from tests.helpers import jobs; import rq_policies, rq_policies.surfaces.aio, rq_policies.surfaces.otel
        import rq_policies.engine.worker
        url = sys.argv[1]
        assert rq_policies.PolicyQueue('noot', connection=Redis.from_url(url)).enqueue(jobs.record, 'n') is not None
        async def main():
            client = AsyncRedis.from_url(url)
            job = await rq_policies.surfaces.aio.AsyncPolicyQueue('noot', connection=client).enqueue(jobs.record, 'm')
            await client.aclose()
            return job
        assert asyncio.run(main()) is not None
        assert not [m for m in sys.modules if m.startswith('opentelemetry')]
        try:
            rq_policies.surfaces.otel.instrument()
        except ImportError as exc:
            assert "rq-policies[otel]" in str(exc), exc
            print('ok')
    ''')
    done = subprocess.run([sys.executable, '-c', script, redis_url], env=worker_env, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == 'ok', done.stderr


def test_forking_worker_job_span_is_a_child_of_the_producer(connection, redis_url, worker_env, traced, tmp_path):
    """A real forking PolicyWorker (TracedWorker: the SDK in the worker's process, exporting to a file) runs each
    job in a ``process`` span whose trace is the producer's and whose parent is the decision's span. The jobs share
    one per-key Concurrency(1) key and two workers take them, so a fetch that finds the key busy may park a job for
    a release to promote: such a job keeps its producer's context too (and the test just below checks that
    case step by step)."""
    from tests.helpers import otel_jobs

    exporter, reader, tracer = traced
    q = PolicyQueue('otelw', connection=connection)
    produced = []
    per_key = Concurrency(1, key=lambda args, kwargs: 'k', scope='otel-test')
    for tag in ('one', 'two', 'three'):
        with tracer.start_as_current_span(f'request {tag}'):
            job = q.enqueue(otel_jobs.traced_task, tag, policy=per_key)
        produced.append(job)
    decisions = {s.attributes['messaging.message.id']: s for s in exporter.get_finished_spans()
                 if s.name == 'send otelw'}
    span_file = tmp_path / 'spans.jsonl'
    env = dict(worker_env, RQ_POLICIES_SPAN_FILE=str(span_file))
    workers = [start_worker(redis_url, ['otelw'], env, worker_class='tests.helpers.otel_jobs.TracedWorker', burst=True)
               for _ in range(2)]  # two workers: one of them finds the key busy and parks a job
    try:
        for worker in workers:
            worker.wait(timeout=60)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for worker in workers:
        assert worker.returncode == 0, output(worker)
    lines = [json.loads(line) for line in span_file.read_text().splitlines()]
    processed = {line['attributes']['messaging.message.id']: line for line in lines if line['name'] == 'process otelw'}
    assert set(processed) == {job.id for job in produced}, lines
    for job in produced:
        span, decision = processed[job.id], decisions[job.id]
        assert span['trace_id'] == f'{decision.context.trace_id:032x}'
        assert span['parent_id'] == f'{decision.context.span_id:016x}'
        assert span['pid'] != os.getpid() and span['attributes']['rq.job.status'] == 'finished'
        result = job.latest_result() if hasattr(job, 'latest_result') else None
        if result is not None:
            assert result.return_value.split()[1] == span['trace_id']


def _fetch_all(connection, names=('keys',)):
    """Fetch (as a PolicyWorker's fetch script does) until nothing can be taken: full keys park their jobs."""
    from rq.queue import Queue

    from rq_policies.engine.fetch import Look, fetch_call, read_reply

    taken = []
    for i in range(50):
        queues = [Queue(name, connection=connection) for name in names]
        token = f'h:1:1:{i}'
        found = read_reply(fetch_call(queues, token, 90).run(connection), queues, token, 90)
        if found is None or isinstance(found, Look):
            break
        taken.append(found)
    return taken


def test_a_parked_then_promoted_job_keeps_its_producer_context(connection, traced):
    from rq.job import Job

    from rq_policies.engine.fetch import release_claim
    from tests.helpers import key_jobs

    exporter, reader, tracer = traced
    q = PolicyQueue('keys', connection=connection)
    carried = []
    for i in range(3):
        with tracer.start_as_current_span(f'request {i}'):
            job = q.enqueue(key_jobs.per_customer, f't{i}', 0.0, customer='a')
        carried.append(Job.fetch(job.id, connection=connection).meta['traceparent'])
    taken = _fetch_all(connection)  # Concurrency(2) per customer: the third job parks
    parked = Job.fetch(job.id, connection=connection)
    assert len(taken) == 2 and parked.get_status() == 'deferred'
    release_claim(taken[0], connection)  # its key frees: the parked job is promoted to the queue
    promoted = Job.fetch(job.id, connection=connection)
    assert promoted.get_status() == 'queued' and promoted.meta['traceparent'] == carried[2]
    decisions = [s for s in exporter.get_finished_spans() if s.name == 'send keys']
    assert int(carried[2].split('-')[2], 16) == decisions[2].context.span_id


def test_redis_gauges_bound_the_keys_to_a_top_n(connection):
    from rq_policies import QueueSlot
    from tests.helpers import key_jobs

    reader = InMemoryMetricReader()
    otel.instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader]),
                    connection=connection, top_keys=2)
    try:
        q = PolicyQueue('keys', connection=connection)
        for name, count in (('a', 5), ('b', 4), ('c', 3), ('d', 3)):
            for i in range(count):
                q.enqueue(key_jobs.per_customer, f'{name}{i}', 0.0, customer=name)
        _fetch_all(connection)  # 2 in use per customer, the rest parked: a 3+2, b 2+2, c 2+1, d 2+1
        QueueSlot.set('capped', 3, connection=connection)
        PolicyQueue('dropq', connection=connection).enqueue(jobs.record, 'z')
        PolicyQueue('dropq', connection=connection).enqueue(jobs.record, 'z')
        parked = _points(reader, 'rq_policies.keys.parked')
        in_use = _points(reader, 'rq_policies.keys.in_use')
        capacity = _points(reader, 'rq_policies.queue_slots.capacity')
        dropped = _points(reader, 'rq_policies.dropped_enqueues.cluster')
    finally:
        otel.uninstrument()
    scope = 'tests.helpers.key_jobs.per_customer'

    def row(key):
        return (('key', key), ('policy', 'concurrency'), ('scope', scope))

    assert parked == {row('a'): 3, row('b'): 2, row('(other)'): 2}, parked
    assert in_use == {row('a'): 2, row('b'): 2, row('(other)'): 4}, in_use
    assert capacity == {(('queue', 'capped'),): 3}
    assert dropped == {(('policy', 'loner'), ('queue', 'dropq')): 1}


# -- what a worker's fetch does besides taking a job: park, skip (a cap), promote, unpark -------------------------


def _fetch_spans(exporter):
    return [s for s in exporter.get_finished_spans() if s.name.split(' ')[0] in ('park', 'skip', 'promote', 'unpark')]


def _burst(connection, names, **kwargs):
    """A real forking PolicyWorker in this process, burst: its fetches run here (the work horses are forks)."""
    from rq_policies import PolicyWorker

    PolicyWorker(list(names), connection=connection, **kwargs).work(burst=True)


def test_a_workers_park_and_unpark_are_spans_with_the_key(connection, traced):
    """A real PolicyWorker over two jobs of one key under Rate(1 per second): its second fetch parks the second job
    (a ``park`` span), a later fetch gives it back when the key allows a start (an ``unpark`` span) and takes it.
    Nothing else happened: no skip, no promotion."""
    from rq_policies import Rate

    exporter, reader, tracer = traced
    q = PolicyQueue('evq', connection=connection)
    rate = Rate(1, per=1, key=lambda args, kwargs: 'k1', scope='ev-rate')
    first, second = (q.enqueue(jobs.plain, n, policy=rate) for n in (1, 2))
    exporter.clear()
    _burst(connection, ['evq'])
    assert first.get_status(refresh=True) == 'finished' and second.get_status(refresh=True) == 'finished'
    spans = _fetch_spans(exporter)
    assert [s.name for s in spans] == ['park evq', 'unpark evq'], [s.name for s in spans]
    for span in spans:
        assert span.kind.name == 'INTERNAL' and span.parent is None
        assert dict(span.attributes) == {
            'messaging.system': 'rq', 'messaging.destination.name': 'evq',
            'messaging.operation.name': span.name.split(' ')[0], 'messaging.message.id': second.id,
            'rq_policies.policy': 'key_rate', 'rq_policies.scope': 'ev-rate', 'rq_policies.key': 'k1'}
    assert spans[0].end_time <= spans[1].start_time


def test_a_workers_skip_at_a_cap_is_a_span_with_its_policy(connection, traced):
    """A queue at its QueueSlot cap (its one slot taken by another worker's fetch) is skipped by a real PolicyWorker:
    a ``skip`` span per fetch that skipped it, naming the gate; the plain queue beside it gives none."""
    from rq.queue import Queue

    from rq_policies import QueueSlot
    from rq_policies.engine.fetch import Claim, fetch_call, read_reply, release_claim

    exporter, reader, tracer = traced
    held = PolicyQueue('capq', connection=connection).enqueue(jobs.plain, 0)
    QueueSlot.set('capq', 1, connection=connection)
    queues = [Queue('capq', connection=connection)]
    other = read_reply(fetch_call(queues, 'h:9:9:1', 90).run(connection), queues, 'h:9:9:1', 90)  # another worker's
    assert isinstance(other, Claim) and other.job_id == held.id
    plain = [PolicyQueue('openq', connection=connection).enqueue(jobs.plain, n) for n in range(2)]
    exporter.clear()
    _burst(connection, ['capq', 'openq'])
    assert [job.get_status(refresh=True) for job in plain] == ['finished', 'finished']
    spans = _fetch_spans(exporter)
    assert spans and {s.name for s in spans} == {'skip capq'}, [s.name for s in spans]
    assert len(spans) == 3  # the fetches that took each plain job, and the last that found nothing
    for span in spans:
        assert dict(span.attributes) == {
            'messaging.system': 'rq', 'messaging.destination.name': 'capq', 'messaging.operation.name': 'skip',
            'rq_policies.policy': 'queue_slot'}
    release_claim(other, connection)
    later = PolicyQueue('capq', connection=connection).enqueue(jobs.plain, 3)
    exporter.clear()
    _burst(connection, ['capq', 'openq'])  # the cap is free again: nothing skipped
    assert later.get_status(refresh=True) == 'finished'
    assert _fetch_spans(exporter) == []


def test_a_workers_skip_under_a_queue_rate_names_the_time_it_waits_for(connection, traced):
    """A QueueRate's gate skips its queue until a server time: the ``skip`` span has it (``rq_policies.until``), and
    the worker takes the job once that time has come."""
    from rq.queue import Queue

    from rq_policies import QueueRate
    from rq_policies.engine.fetch import Claim, fetch_call, read_reply

    exporter, reader, tracer = traced
    q = PolicyQueue('rateq', connection=connection)
    first, second = (q.enqueue(jobs.plain, n) for n in range(2))
    QueueRate.set('rateq', 1, per=1, connection=connection)
    queues = [Queue('rateq', connection=connection)]
    taken = read_reply(fetch_call(queues, 'h:9:9:2', 90).run(connection), queues, 'h:9:9:2', 90)  # the rate's start
    assert isinstance(taken, Claim) and taken.job_id == first.id
    exporter.clear()
    _burst(connection, ['rateq'])
    assert second.get_status(refresh=True) == 'finished'
    spans = _fetch_spans(exporter)
    assert spans and {s.name for s in spans} == {'skip rateq'}, [s.name for s in spans]
    seconds, micros = connection.time()
    now = seconds + micros / 1e6  # after every skip: each named a time at most `per` (1 s) after its fetch
    for span in spans:
        assert span.attributes['rq_policies.policy'] == 'queue_rate'
        assert now - 5 < span.attributes['rq_policies.until'] <= now + 1.001


def test_a_workers_promotion_is_a_span_with_its_count_and_an_event_on_a_current_span(connection, traced):
    """Due scheduled jobs promoted by a real PolicyWorker's fetch: one ``promote`` span per queue with the count; with
    a span current around the worker (another instrumentation's, a caller's), the same as an event on it instead."""
    from datetime import datetime, timedelta, timezone

    exporter, reader, tracer = traced
    q = PolicyQueue('promq', connection=connection)
    soon = datetime.now(timezone.utc) + timedelta(seconds=1)
    scheduled = [q.enqueue_at(soon, jobs.plain, n) for n in range(3)]
    wait = (soon - datetime.now(timezone.utc)).total_seconds() + 0.2
    import time as _time

    _time.sleep(max(wait, 0))  # due by the server's clock (one host: the same clock)
    exporter.clear()
    _burst(connection, ['promq'])
    assert [job.get_status(refresh=True) for job in scheduled] == ['finished'] * 3
    spans = _fetch_spans(exporter)
    assert [s.name for s in spans] == ['promote promq']
    assert dict(spans[0].attributes) == {
        'messaging.system': 'rq', 'messaging.destination.name': 'promq', 'messaging.operation.name': 'promote',
        'messaging.batch.message_count': 3}
    # the same, with a span current around the worker: an event on it, no span of its own
    again = [q.enqueue_at(datetime.now(timezone.utc) + timedelta(seconds=1), jobs.plain, n) for n in range(2)]
    _time.sleep(1.2)
    exporter.clear()
    with tracer.start_as_current_span('poll'):
        _burst(connection, ['promq'])
    assert [job.get_status(refresh=True) for job in again] == ['finished'] * 2
    assert _fetch_spans(exporter) == []
    poll = next(s for s in exporter.get_finished_spans() if s.name == 'poll')
    assert [(e.name, dict(e.attributes)) for e in poll.events] == [('rq_policies.promote', {
        'messaging.system': 'rq', 'messaging.destination.name': 'promq', 'messaging.operation.name': 'promote',
        'messaging.batch.message_count': 2})]


def test_a_worker_with_nothing_to_tell_makes_no_fetch_span_and_off_makes_none(connection, traced):
    """Plain jobs on a plain queue: no park, skip, promotion or unpark, so no such span; switched off, the fetch
    observer is gone and a worker that parks makes none either."""
    from rq_policies import Rate
    from rq_policies.engine import events

    exporter, reader, tracer = traced
    q = PolicyQueue('quiet', connection=connection)
    done = [q.enqueue(jobs.plain, n) for n in range(3)]
    exporter.clear()
    _burst(connection, ['quiet'])
    assert [job.get_status(refresh=True) for job in done] == ['finished'] * 3
    assert _fetch_spans(exporter) == []
    assert events.FETCHES == [otel.fetched]
    otel.uninstrument()
    assert events.FETCHES == []
    rate = Rate(1, per=1, key=lambda args, kwargs: 'k2', scope='ev-off')
    parked = [q.enqueue(jobs.plain, n, policy=rate) for n in range(2)]
    _burst(connection, ['quiet'])
    assert [job.get_status(refresh=True) for job in parked] == ['finished'] * 2
    assert _fetch_spans(exporter) == []


def test_a_fetch_observer_that_raises_loses_no_job(connection, caplog):
    """An observer of the worker's fetch that raises is logged and passed over: the job that fetch took (after it
    parked another) still reaches the worker and runs, and so does the parked one."""
    from rq_policies import Rate
    from rq_policies.engine import events

    seen = []

    def boom(event, queue, detail):
        seen.append(event)
        raise RuntimeError('observer broke')

    q = PolicyQueue('boomq', connection=connection)
    rate = Rate(1, per=1, key=lambda args, kwargs: 'k3', scope='ev-boom')
    done = [q.enqueue(jobs.plain, n, policy=rate) for n in range(2)]
    events.observe(fetch=boom)
    try:
        _burst(connection, ['boomq'])
    finally:
        events.unobserve(fetch=boom)
    assert [job.get_status(refresh=True) for job in done] == ['finished'] * 2
    assert seen == ['park', 'unpark'] and 'observer broke' in caplog.text


def test_the_carried_context_is_what_the_w3c_propagator_writes(connection, traced):
    """The job's traceparent and tracestate, formatted from the span's context, are what OpenTelemetry's
    TraceContextTextMapPropagator writes for that span (a caller's trace state rides along)."""
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from rq.job import Job

    exporter, reader, tracer = traced
    propagator = TraceContextTextMapPropagator()
    incoming = propagator.extract({'traceparent': '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
                                   'tracestate': 'vendor=opaque,other=1'})
    token = context.attach(incoming)
    try:
        job = PolicyQueue('otel', connection=connection).enqueue(jobs.record, 'carried')
    finally:
        context.detach(token)
    span = exporter.get_finished_spans()[-1]
    expected: dict[str, str] = {}
    propagator.inject(expected, context=trace.set_span_in_context(trace.NonRecordingSpan(span.context)))
    stored = Job.fetch(job.id, connection=connection).meta
    assert expected['tracestate'] == 'vendor=opaque,other=1'
    assert {k: stored[k] for k in ('traceparent', 'tracestate')} == expected
    assert span.context.trace_id == 0x0af7651916cd43dd8448eb211c80319c


def test_counters_count_on_across_a_switch_off_and_on_with_the_same_meter(connection):
    """The counters are cumulative per meter provider: switched off and on again with the same providers, they go on
    from where they were (the SDK keeps an instrument's first callbacks); a new meter provider starts from zero."""
    reader = InMemoryMetricReader()
    tracers, meters = TracerProvider(), MeterProvider(metric_readers=[reader])
    q = PolicyQueue('otel_counts', connection=connection)
    key = (('policy', 'none'), ('queue', 'otel_counts'))
    try:
        otel.instrument(tracer_provider=tracers, meter_provider=meters)
        q.enqueue(jobs.plain, 1)
        assert _points(reader, 'rq_policies.admissions')[key] == 1
        otel.uninstrument()
        q.enqueue(jobs.plain, 2)  # off: not counted
        otel.instrument(tracer_provider=tracers, meter_provider=meters)
        q.enqueue(jobs.plain, 3)
        q.enqueue(jobs.plain, 4, policy=Loner())
        q.enqueue(jobs.plain, 4, policy=Loner())
        assert _points(reader, 'rq_policies.admissions')[key] == 2
        assert _points(reader, 'rq_policies.dropped_enqueues') == {(('policy', 'loner'), ('queue', 'otel_counts')): 1}
        fresh = InMemoryMetricReader()
        otel.instrument(tracer_provider=tracers, meter_provider=MeterProvider(metric_readers=[fresh]))
        q.enqueue(jobs.plain, 5)
        assert _points(fresh, 'rq_policies.admissions') == {key: 1}
    finally:
        otel.uninstrument()
