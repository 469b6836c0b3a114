"""Zero-code OpenTelemetry: ``opentelemetry-instrument`` finds our instrumentor by its entry point, so a producer run as
``opentelemetry-instrument python producer.py`` and a worker run as ``opentelemetry-instrument rq worker -w
rq_policies.PolicyWorker`` give one trace per job with no line of code (real subprocesses, the console exporter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip('opentelemetry.instrumentation')
pytest.importorskip('opentelemetry.distro')

from tests.helpers.cluster import CLUSTER_CLASS, ON_CLUSTER  # noqa: E402

BIN = Path(sys.executable).parent
PRODUCER = textwrap.dedent('''
    import os
    from redis import Redis
    from rq import Retry
    from rq_policies import Loner, PolicyQueue
    from tests.helpers import jobs
    connection = Redis.from_url(os.environ['REDIS_URL'])
    q = PolicyQueue('zerocode', connection=connection)
    admitted = q.enqueue(jobs.plain, 'a', policy=Loner())
    dropped = q.enqueue(jobs.plain, 'a', policy=Loner())  # the same identity, held: dropped, nothing to run
    plain = q.enqueue(jobs.plain, 'b')
    failing = q.enqueue(jobs.fail, 'x', retry=Retry(max=1))  # fails, is retried once, fails again
    assert admitted is not None and dropped is None and plain is not None and failing is not None
    print('jobs', admitted.id, plain.id, failing.id)
''')


def spans_of(text: str) -> list[dict]:
    """The spans the console exporter printed in ``text`` (each a JSON object, its first line ``{`` alone), whatever
    else the process printed around them."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while True:
        at = text.find('{\n', at)
        if at < 0:
            return found
        if at == 0 or text[at - 1] == '\n':
            try:
                span, end = decoder.raw_decode(text, at)
            except ValueError:
                span, end = None, at + 1
            if isinstance(span, dict) and 'context' in span and 'name' in span:
                found.append(span)
            at = end
        else:
            at += 1


def _instrumented(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / 'opentelemetry-instrument'), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def otel_env(worker_env):
    """The subprocesses' environment: the console exporter for traces, no metrics or logs exporter, this venv's
    ``rq`` and ``opentelemetry-instrument`` first on the PATH."""
    return dict(worker_env, OTEL_TRACES_EXPORTER='console', OTEL_METRICS_EXPORTER='none', OTEL_LOGS_EXPORTER='none',
                PATH=f'{BIN}{os.pathsep}{worker_env.get("PATH", "")}')


@pytest.mark.skipif(ON_CLUSTER, reason='the producer script connects with a plain client')
def test_zero_code_producer_and_worker_spans_share_one_trace(connection, redis_url, otel_env, tmp_path):
    (tmp_path / 'producer.py').write_text(PRODUCER)
    produced = _instrumented([sys.executable, 'producer.py'], dict(otel_env, OTEL_SERVICE_NAME='producer'), tmp_path)
    assert produced.returncode == 0, produced.stderr
    admitted_id, plain_id, failing_id = produced.stdout.split('jobs ', 1)[1].split()[:3]
    sent = spans_of(produced.stdout)
    assert [(s['name'], s['kind'], s['attributes']['rq_policies.decision']) for s in sent] == [
        ('send zerocode', 'SpanKind.PRODUCER', 'admitted'), ('send zerocode', 'SpanKind.PRODUCER', 'dropped'),
        ('send zerocode', 'SpanKind.PRODUCER', 'admitted'), ('send zerocode', 'SpanKind.PRODUCER', 'admitted')], \
        produced.stdout
    assert all(s['resource']['attributes']['service.name'] == 'producer' for s in sent)
    by_job = {s['attributes']['messaging.message.id']: s for s in sent if 'messaging.message.id' in s['attributes']}
    assert set(by_job) == {admitted_id, plain_id, failing_id}
    # the context rides the job: W3C traceparent in its meta, the decision span's
    from rq.job import Job

    meta = Job.fetch(admitted_id, connection=connection).meta
    trace_id, span_id = by_job[admitted_id]['context']['trace_id'][2:], by_job[admitted_id]['context']['span_id'][2:]
    assert meta['traceparent'].split('-')[1:3] == [trace_id, span_id]

    worked = _instrumented(['rq', 'worker', '-w', 'rq_policies.PolicyWorker', '--burst', '--url', redis_url,
                            *(CLUSTER_CLASS if ON_CLUSTER else []), 'zerocode'],
                           dict(otel_env, OTEL_SERVICE_NAME='worker'), tmp_path)
    assert worked.returncode == 0, worked.stderr
    runs: dict[str, list[dict]] = {}
    for span in spans_of(worked.stdout):
        if span['name'] == 'process zerocode':
            runs.setdefault(span['attributes']['messaging.message.id'], []).append(span)
    assert sorted(runs) == sorted([admitted_id, plain_id, failing_id]), worked.stdout + worked.stderr
    assert [len(runs[admitted_id]), len(runs[plain_id]), len(runs[failing_id])] == [1, 1, 2]
    for job_id, spans in runs.items():
        decision = by_job[job_id]
        for span in spans:
            assert span['kind'] == 'SpanKind.CONSUMER' and span['resource']['attributes']['service.name'] == 'worker'
            assert span['context']['trace_id'] == decision['context']['trace_id']  # one trace: producer -> consumer
            assert span['parent_id'] == decision['context']['span_id']
            assert 0 <= span['attributes']['rq.job.time_in_queue'] < 120
    assert len({runs[job_id][0]['context']['trace_id'] for job_id in runs}) == 3  # a trace per job, not one for all
    for job_id in (admitted_id, plain_id):
        (span,) = runs[job_id]
        assert span['attributes']['rq.job.status'] == 'finished' and 'rq.job.retries_left' not in span['attributes']
        assert span['status']['status_code'] == 'UNSET' and span['events'] == []
    # a failed run: ERROR, an exception event with the job's exception, and rq's retries left (1, then 0: the retry)
    assert [span['attributes']['rq.job.retries_left'] for span in runs[failing_id]] == [1, 0]
    for span in runs[failing_id]:
        assert span['attributes']['rq.job.status'] == 'failed' and span['status']['status_code'] == 'ERROR'
        (event,) = span['events']
        assert event['name'] == 'exception'
        assert event['attributes']['exception.type'] == 'RuntimeError'
        assert event['attributes']['exception.message'] == 'failing on purpose: x'
        assert 'Traceback' in event['attributes']['exception.stacktrace']


@pytest.mark.skipif(ON_CLUSTER, reason='the producer script connects with a plain client')
def test_disabled_by_name_makes_no_span(connection, otel_env, tmp_path):
    """The spans above come from our entry point (``rq_policies``): disabled by that name, the same run makes none,
    and the job carries no context."""
    (tmp_path / 'producer.py').write_text(PRODUCER)
    produced = _instrumented([sys.executable, 'producer.py'],
                             dict(otel_env, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS='rq_policies'), tmp_path)
    assert produced.returncode == 0, produced.stderr
    assert spans_of(produced.stdout) == []
    from rq.job import Job

    admitted_id = produced.stdout.split('jobs ', 1)[1].split()[0]
    assert 'traceparent' not in Job.fetch(admitted_id, connection=connection).meta


def test_the_instrumentor_is_a_base_instrumentor_over_instrument():
    """In code, ``RQPoliciesInstrumentor().instrument()`` is :func:`instrument` (the providers passed through) and
    ``uninstrument()`` switches it off; it names rq as what it instruments."""
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
    from opentelemetry.sdk.trace import TracerProvider

    import rq_policies.surfaces.otel as otel
    from rq_policies.engine import events

    cls = otel.RQPoliciesInstrumentor
    assert issubclass(cls, BaseInstrumentor) and cls is otel.RQPoliciesInstrumentor
    assert [dep.split()[0] for dep in cls().instrumentation_dependencies()] == ['rq']
    provider = TracerProvider()
    cls().instrument(tracer_provider=provider)
    try:
        assert otel.TRACER is not None and otel._PROVIDER is provider
        assert otel.observe in events.DOORS and otel.perform in events.RUNS
    finally:
        cls().uninstrument()
    assert otel.TRACER is None and otel.observe not in events.DOORS and otel.perform not in events.RUNS
