"""Jobs and a worker class for tests/surfaces/test_otel.py: ``TracedWorker`` switches OpenTelemetry on in the worker's
process (the SDK with an exporter that appends each ended span to the JSON-lines file named by
``RQ_POLICIES_SPAN_FILE``)."""

from __future__ import annotations

import json
import os
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import rq_policies.surfaces.otel
from rq_policies import PolicyWorker


class FileExporter(SpanExporter):
    """Each span as one JSON line: name, trace id, span id, parent span id, attributes (opened per export: a work
    horse is a fork, and each appends its own lines)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Any) -> SpanExportResult:
        with open(self.path, 'a') as out:
            for span in spans:
                out.write(json.dumps({
                    'name': span.name, 'trace_id': f'{span.context.trace_id:032x}',
                    'span_id': f'{span.context.span_id:016x}',
                    'parent_id': f'{span.parent.span_id:016x}' if span.parent else None,
                    'attributes': {k: v if isinstance(v, (str, int, float, bool)) else list(v)
                                   for k, v in span.attributes.items()},
                    'pid': os.getpid(),
                }) + '\n')
        return SpanExportResult.SUCCESS


class TracedWorker(PolicyWorker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ['RQ_POLICIES_SPAN_FILE'])))
        rq_policies.surfaces.otel.instrument(tracer_provider=provider)
        super().__init__(*args, **kwargs)


def traced_task(tag):
    """A job that reports the trace it runs in (its own span is the worker's ``process`` span)."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return f'{tag} {context.trace_id:032x}'
