"""What OpenTelemetry on costs an enqueue's client: process CPU per ``PolicyQueue.enqueue``, on against off.

    python bench/otel.py [--rounds 9] [--calls 2000] [--smoke] [--profile] [--against FILE]

Issue 34's target: with OpenTelemetry on, an enqueue's client CPU at most 1.25x off. Three cases through one
``PolicyQueue`` on one fresh server (``REDIS_URL``, else a throwaway one): a plain job (no policy), a Loner admitted
(new arguments each call) and a Loner dropped (the same arguments each call: the hint probe's drop). Each round runs
every case with OpenTelemetry off and on, the order alternating from round to round (``instrument()`` and
``uninstrument()`` between), and prints each side's client CPU per call and the ratio on/off of that round; then the
medians and min-max over the rounds.

The clock is ``time.process_time`` over the round's ``--calls`` calls: the whole process's CPU, every thread's, so the
BatchSpanProcessor's export thread counts as well as the caller's. "On" is what a deployment pays: an SDK
``TracerProvider`` (default sampler: every span recorded) with a ``BatchSpanProcessor`` over an exporter that
discards what it is given (no network), and an SDK ``MeterProvider`` with one ``InMemoryMetricReader`` (the counters
and the histogram aggregate as under a periodic exporter; nothing collects them). The server's CPU is not counted.

``--against FILE``: a third side, 'on' through another revision of ``rq_policies/surfaces/otel.py`` (``git show
main:rq_policies/surfaces/otel.py > /tmp/otel_main.py``), loaded beside this one: a before-and-after in one run,
printed as its own ratio to off.

Beside them, each round measures the floor: what the SDK alone costs per decision at the least, a span with the
case's attributes (the same names and kinds of values as the ``send`` span: 8 for a plain job, 9 admitted, 10 for
the probe's drop) started and ended through the same tracer provider, and one histogram record through the same meter
provider, with no enqueue around it. ``(off + floor) / off`` is the lowest on/off any tracing that records the
decision's span can reach on this machine.

``--profile`` runs cProfile over the 'on' side of one extra round of each case and prints the top functions by their
own time. ``--smoke`` runs a few calls, one round (CI: the bench still works; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import work  # noqa: E402
from common import add_smoke, connect, run_main, server_url, smoke_defaults  # noqa: E402

from rq_policies import Loner, PolicyQueue  # noqa: E402

#: Issue 34's target: client CPU per enqueue, on / off.
TARGET = 1.25


def providers() -> tuple:
    """An SDK tracer provider (BatchSpanProcessor, a discarding exporter) and meter provider (an in-memory reader)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        """Takes every batch and drops it: the export's own cost is the collector's network, not ours."""

        def export(self, spans):  # noqa: ANN001, ANN201
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    return tracer_provider, MeterProvider(metric_readers=[InMemoryMetricReader()])


def cases(url: str) -> dict:
    """Each case: a function of the call's number that enqueues once."""
    q = PolicyQueue('bench_otel', connection=connect(url))
    loner = Loner()
    q.enqueue(work, 'held', policy=loner)  # the identity every "dropped" call collides with
    return {
        'plain (no policy)': lambda i: q.enqueue(work, i),
        'Loner admitted': lambda i: q.enqueue(work, i, policy=loner),
        'Loner dropped': lambda i: q.enqueue(work, 'held', policy=loner),
    }


def load_against(path: str):  # noqa: ANN201
    """Another revision's ``rq_policies/surfaces/otel.py``, loaded as ``rq_policies.surfaces.otel_against``."""
    name = 'rq_policies.surfaces.otel_against'
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: Each case's span attributes, as the send span has them: (at its start, at its end).
_FLOOR_ATTRIBUTES = {
    'plain (no policy)': ({'messaging.operation.name': 'enqueue', 'rq_policies.policies': ()},
                          {'rq_policies.decision': 'admitted', 'messaging.message.id': '6f1c0d2e-' + '0' * 27}),
    'Loner admitted': ({'messaging.operation.name': 'enqueue', 'rq_policies.policies': ('loner',),
                        'rq_policies.identity': 'f' * 32},
                       {'rq_policies.decision': 'admitted', 'rq_policies.policy': 'loner',
                        'messaging.message.id': '6f1c0d2e-' + '0' * 27}),
    'Loner dropped': ({'messaging.operation.name': 'enqueue', 'rq_policies.policies': ('loner',),
                       'rq_policies.identity': 'f' * 32, 'rq_policies.decision': 'dropped',
                       'rq_policies.policy': 'loner', 'rq_policies.probe': True,
                       'rq_policies.holder.id': '6f1c0d2e-' + '0' * 27}, {}),
}


def floor(tracer_provider, meter_provider, name: str):  # noqa: ANN001, ANN201
    """A function of the call's number doing what the SDK must do per decision of case ``name`` at the least."""
    from opentelemetry.trace import SpanKind

    tracer = tracer_provider.get_tracer('bench_otel_floor')
    histogram = meter_provider.get_meter('bench_otel_floor').create_histogram('bench_otel_floor.duration', unit='s')
    start, end = _FLOOR_ATTRIBUTES[name]
    start = {'messaging.system': 'rq', 'messaging.destination.name': 'bench_otel', 'messaging.operation.type': 'send',
             'rq.job.function': 'bench_jobs.work', **start}
    labels = {'queue': 'bench_otel', 'decision': 'admitted'}

    def decision(i: int) -> None:
        span = tracer.start_span('send bench_otel', kind=SpanKind.PRODUCER, attributes=start)
        for key, value in end.items():
            span.set_attribute(key, value)
        span.end()
        histogram.record(0.0001, labels)

    return decision


def cpu_per_call(call, calls: int, start: int) -> float:  # noqa: ANN001
    """Process CPU seconds per call over ``calls`` calls of ``call`` (numbered from ``start``)."""
    used = time.process_time()
    for i in range(start, start + calls):
        call(i)
    return (time.process_time() - used) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--rounds', type=int, default=9)
    parser.add_argument('--calls', type=int, default=2000, help='calls per case per side per round')
    parser.add_argument('--profile', action='store_true', help="cProfile the 'on' side of one extra round")
    parser.add_argument('--against', metavar='FILE', help="a third side: 'on' through this otel.py (another revision)")
    add_smoke(parser)
    opts = parser.parse_args()
    smoke_defaults(opts, rounds=1, calls=30)

    import rq_policies.surfaces.otel as otel

    tracer_provider, meter_provider = providers()
    other = load_against(opts.against) if opts.against else None

    def switch(module):  # noqa: ANN001, ANN202
        def on() -> None:
            for each in (otel, other):
                if each is not None:
                    each.uninstrument()
            if module is not None:
                module.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        return on

    on_off = {'off': switch(None), 'on': switch(otel)}
    if other is not None:
        on_off['against'] = switch(other)
    with server_url() as url:
        variants = cases(url)
        for call in variants.values():  # warm: the hint, the scripts loaded, the imports
            for i in range(20):
                call(-i - 1)
        cpu: dict[tuple[str, str], list[float]] = {(name, side): [] for name in variants
                                                   for side in [*on_off, 'floor']}
        floors = {name: floor(tracer_provider, meter_provider, name) for name in variants}
        counter = 0
        print(f'client process CPU per enqueue (time.process_time, all threads), {opts.calls} calls a case a side, '
              f'{opts.rounds} rounds interleaved')
        extra = f' {"against us":>10} {"against/off":>11}' if other is not None else ''
        print(f'{"round":>5}  {"case":20} {"off us":>8} {"on us":>8} {"on/off":>7} {"floor us":>8} '
              f'{"(off+floor)/off":>15}{extra}')
        for r in range(opts.rounds):
            sides = list(on_off.items())
            sides = sides[r % len(sides):] + sides[:r % len(sides)]  # rotate which side goes first
            if r % 2:
                sides.reverse()
            for side, turn in sides:
                turn()
                for name, call in variants.items():
                    cpu[(name, side)].append(cpu_per_call(call, opts.calls, counter))
                    counter += opts.calls
            for name in variants:
                cpu[(name, 'floor')].append(cpu_per_call(floors[name], opts.calls, 0))
            for name in variants:
                off, on, least = cpu[(name, 'off')][-1], cpu[(name, 'on')][-1], cpu[(name, 'floor')][-1]
                extra = ''
                if other is not None:
                    against = cpu[(name, 'against')][-1]
                    extra = f' {against * 1e6:10.1f} {against / off:11.3f}'
                print(f'{r + 1:5}  {name:20} {off * 1e6:8.1f} {on * 1e6:8.1f} {on / off:7.3f} {least * 1e6:8.1f} '
                      f'{(off + least) / off:15.3f}{extra}')
        switch(None)()
        tracer_provider.shutdown()

        print(f'\n{"case":20} {"off us (min-max)":>22} {"on us (min-max)":>22} {"on/off (min-max)":>22}  target')
        for name in variants:
            off, on = cpu[(name, 'off')], cpu[(name, 'on')]
            ratios = [b / a for a, b in zip(off, on)]
            med = statistics.median(ratios)
            mark = f'<= {TARGET}  ' + ('ok' if med <= TARGET else 'MISSED')
            print(f'{name:20} {_spread(off, 1e6):>22} {_spread(on, 1e6):>22} {_spread(ratios, 1, 3):>22}  {mark}')
        print(f'\n{"case":20} {"floor us (min-max)":>22} {"(off+floor)/off":>22}')
        for name in variants:
            off, least = cpu[(name, 'off')], cpu[(name, 'floor')]
            print(f'{name:20} {_spread(least, 1e6):>22} {_spread([(a + b) / a for a, b in zip(off, least)], 1, 3):>22}')
        if other is not None:
            print(f'\n{"case":20} {"against us (min-max)":>22} {"against/off (min-max)":>22} '
                  f'{"on/against (min-max)":>22}')
            for name in variants:
                off, on, against = cpu[(name, 'off')], cpu[(name, 'on')], cpu[(name, 'against')]
                print(f'{name:20} {_spread(against, 1e6):>22} '
                      f'{_spread([b / a for a, b in zip(off, against)], 1, 3):>22} '
                      f'{_spread([b / a for a, b in zip(against, on)], 1, 3):>22}')
        if opts.smoke:
            print('(smoke: the figures mean nothing)')

        if opts.profile:
            tracer_provider, meter_provider = providers()
            otel.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
            for name, call in variants.items():
                profile = cProfile.Profile()
                profile.enable()
                for i in range(counter, counter + opts.calls):
                    call(i)
                profile.disable()
                counter += opts.calls
                print(f"\n--- cProfile, 'on', {name}, {opts.calls} calls: top by own time")
                pstats.Stats(profile).sort_stats('tottime').print_stats(25)
            otel.uninstrument()
            tracer_provider.shutdown()


def _spread(values: list[float], scale: float, digits: int = 1) -> str:
    return (f'{statistics.median(values) * scale:.{digits}f} '
            f'({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})')


if __name__ == '__main__':
    run_main(main)
