"""Prometheus metrics for rq-policies, read from Redis when scraped (``pip install 'rq-policies[metrics]'``).

The collector holds no counters of its own: every value is read from Redis at scrape time, so any one process (the
``rq-policies exporter`` command, or a web app that already serves /metrics) exports the state of the whole cluster,
and drops count from every producer because the admission scripts count them in Redis (``rq:policies:drops``).

============================================================  =======  ================  ===========================
metric                                                        type     labels            source
============================================================  =======  ================  ===========================
``limited_capacity_worker_running_jobs``                      gauge    ``worker``        live holds in the class's
                                                                                         running ledger
``limited_capacity_worker_max_running_jobs``                  gauge    ``worker``        last reported
``limited_capacity_worker_remaining_work_count``              gauge    ``worker``        last reported
``limited_capacity_worker_queued_jobs``                       gauge    ``worker``        jobs waiting to start
``rq_policies_queue_slots_in_use``                            gauge    ``queue``         live cap holds
``rq_policies_queue_slots_capacity``                          gauge    ``queue``         the cap (capped queues)
``rq_policies_dropped_enqueues_total``                        counter  ``policy``,       ``rq:policies:drops``
                                                                       ``queue``
``rq_policies_eviction_unsafe``                               gauge    ``policy``        1 when ``maxmemory-policy``
                                                                                         may evict policy keys, 0
                                                                                         under ``noeviction``; no
                                                                                         sample when CONFIG is
                                                                                         denied
``rq_policies_redis_evicted_keys_total``                      counter                    the server's ``evicted_keys``
                                                                                         (``INFO stats``); no sample
                                                                                         when INFO is denied
``rq_policies_redis_evicted_keys_rose``                       gauge                      1 once ``evicted_keys`` rose
                                                                                         since this collector's first
                                                                                         scrape
``rq_policies_hold_lapses_total``                             counter  ``queue``         ``rq:policies:lapses``: holds
                                                                                         found lapsed under a running
                                                                                         job (and re-added)
``rq_policies_keys_with_parked_jobs``                         gauge                      per-key policies' keys with
                                                                                         parked jobs (the due index)
``rq_policies_keys_due_overdue_seconds``                      gauge                      how late the most overdue
                                                                                         key is being served
``rq_policies_redis_up``                                      gauge                      1 when Redis answered
============================================================  =======  ================  ===========================

``worker`` is the LimitedCapacityWorker's import path (``module.Class``), as GitLab labels by class name. The
collector does not import or call application code: ``max_running_jobs`` and ``remaining_work_count`` are the values
the class last reported, which it does on every ``perform_with_capacity`` and every finishing job (a
``remaining_work_count`` may be a database query, which a scrape should not repeat). A class is exported while it
reported within the last day.

Usage::

    from prometheus_client import REGISTRY
    from rq_policies.surfaces.metrics import PolicyCollector

    REGISTRY.register(PolicyCollector(redis))

On a cluster, ``PolicyCollector(cluster, read_from_replicas=True)`` (``rq-policies exporter --read-from-replicas``)
reads the replicas of the prefix's slot instead of its primary: a scrape may then be a moment stale (the replication
lag), and decides nothing (:mod:`rq_policies.surfaces.replicas`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from redis import Redis
from redis.exceptions import RedisError

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "rq_policies.metrics needs prometheus-client: pip install 'rq-policies[metrics]'"
    ) from exc

from rq_policies.engine import health, keys, views
from rq_policies.engine.exceptions import InvalidArgument

from . import replicas, state

logger = logging.getLogger('rq_policies')


class PolicyCollector(Collector):
    """A custom collector that reads rq-policies' state from Redis on every scrape.

    Args:
        connection: the Redis client to read (a ``redis.Redis``, a Sentinel's, a ``redis.cluster.RedisCluster``).
        read_from_replicas: on a cluster, read through a client of the collector's own whose reads go to the
            replicas of the prefix's slot (:mod:`rq_policies.surfaces.replicas`), built at the first scrape and closed
            by :meth:`close`; ``connection`` itself is not changed. A replica is behind its primary by the replication
            lag, so a scrape may be a moment stale; it decides nothing (doors and fetches always use the primary).
            Refused with a :class:`~rq_policies.engine.exceptions.PolicyConfigurationError` naming the option when
            ``connection`` is not a ``RedisCluster``.
    """

    def __init__(self, connection: Redis, *, read_from_replicas: bool = False) -> None:
        if connection is None:
            raise InvalidArgument(
                'connection', message='PolicyCollector: connection is required, pass a Redis connection')
        if read_from_replicas:  # refused here, not at the first scrape (nothing here reaches Redis)
            replicas.check(connection, 'PolicyCollector(read_from_replicas=True)')
            keys.check_connection(connection)
        self.connection = connection
        self.read_from_replicas = read_from_replicas
        self._reader: Any = None  # the replica reader, built at the first scrape (registering must not reach Redis)
        self._reader_lock = threading.Lock()
        self._evicted_baseline: int | None = None  # evicted_keys at the first scrape (what "rose" compares with)

    def reads(self) -> Any:
        """The client a scrape reads through: ``connection``, or with ``read_from_replicas`` the replica reader."""
        if not self.read_from_replicas:
            return self.connection
        with self._reader_lock:
            if self._reader is None:
                self._reader = replicas.replica_reader(self.connection, 'PolicyCollector(read_from_replicas=True)')
            return self._reader

    def close(self) -> None:
        """Close the replica reader this collector built (nothing else: ``connection`` is the caller's)."""
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None and replicas.owned(reader, self.connection):
            reader.close()

    def describe(self) -> list[Metric]:
        # Registering must not reach Redis (prometheus_client calls collect() when describe() is missing).
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily('rq_policies_redis_up', 'Whether Redis answered this scrape (1) or not (0).')
        try:
            families = self._families()
        except RedisError as exc:
            # A scrape during an outage reports it instead of failing the whole endpoint with a 500.
            logger.warning('rq-policies: metrics scrape could not read Redis: %s', exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> list[Metric]:
        conn = self.reads()
        now = state.server_now(conn)
        lcw = state.lcw_gauges(conn, now)
        drops = state.drops(conn)

        running = GaugeMetricFamily(
            'limited_capacity_worker_running_jobs', 'Jobs of a LimitedCapacityWorker running now.', labels=['worker']
        )
        maximum = GaugeMetricFamily(
            'limited_capacity_worker_max_running_jobs',
            'max_running_jobs() of a LimitedCapacityWorker, as last reported.', labels=['worker'],
        )
        remaining = GaugeMetricFamily(
            'limited_capacity_worker_remaining_work_count',
            'remaining_work_count() of a LimitedCapacityWorker, as last reported.', labels=['worker'],
        )
        queued = GaugeMetricFamily(
            'limited_capacity_worker_queued_jobs',
            'Jobs of a LimitedCapacityWorker enqueued and not started yet.', labels=['worker'],
        )
        for row in lcw:
            label = [row['class']]
            running.add_metric(label, row['running_jobs'])
            queued.add_metric(label, row['queued_jobs'])
            if row['max_running_jobs'] is not None:
                maximum.add_metric(label, row['max_running_jobs'])
            if row['remaining_work_count'] is not None:
                remaining.add_metric(label, row['remaining_work_count'])

        dropped = CounterMetricFamily(
            'rq_policies_dropped_enqueues', 'Enqueues a policy dropped, counted by every producer.',
            labels=['policy', 'queue'],
        )
        for row in drops:
            dropped.add_metric([row['policy'], row['queue']], row['count'])
        families = [running, maximum, remaining, queued]
        for cls in views.shown():
            families.extend(family(metric) for metric in cls.metrics(conn, now))
        eviction = GaugeMetricFamily(
            'rq_policies_eviction_unsafe',
            "1 when Redis's maxmemory-policy may evict the policies' keys (caps, ledgers, markers), 0 if noeviction.",
            labels=['policy'],
        )
        check = health.eviction_check(conn)
        if check.unsafe is not None:  # CONFIG denied or disabled: no sample (alert on absent() if it matters)
            eviction.add_metric([check.maxmemory_policy], 1 if check.unsafe else 0)
        evicted = CounterMetricFamily(
            'rq_policies_redis_evicted_keys',
            "Keys the Redis server evicted (INFO stats evicted_keys, since it started or its last CONFIG RESETSTAT): "
            "any rise may have taken the policies' state with it.",
        )
        rose = GaugeMetricFamily(
            'rq_policies_redis_evicted_keys_rose',
            "1 when Redis's evicted_keys rose since this collector's first scrape (this process started), else 0.",
        )
        if check.evicted_keys is not None:  # INFO denied: no sample
            evicted.add_metric([], check.evicted_keys)
            if self._evicted_baseline is None or check.evicted_keys < self._evicted_baseline:  # first, or a reset
                self._evicted_baseline = check.evicted_keys
            rose.add_metric([], 1 if check.evicted_keys > self._evicted_baseline else 0)
        lapses = CounterMetricFamily(
            'rq_policies_hold_lapses', 'Cap holds found lapsed while their job still ran (re-added).',
            labels=['queue'],
        )
        for field, value in sorted(conn.hgetall(keys.LAPSES).items()):
            kind, _, queue = field.decode().partition(':')
            if kind == 'queue':
                lapses.add_metric([queue], int(value))
        return families + [dropped, eviction, evicted, rose, lapses]


def family(metric: views.Metric) -> Metric:
    """A policy's :class:`rq_policies.engine.views.Metric` as a prometheus_client family."""
    kind = CounterMetricFamily if metric.kind == 'counter' else GaugeMetricFamily
    out = kind(metric.name, metric.help, labels=list(metric.labels))
    for labels, value in metric.samples:
        out.add_metric(list(labels), value)
    return out


def registry_for(connection: Redis, *, read_from_replicas: bool = False) -> CollectorRegistry:
    """A fresh registry holding only a :class:`PolicyCollector` (what the exporter serves); ``read_from_replicas``
    as the collector takes it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PolicyCollector(connection, read_from_replicas=read_from_replicas))
    return registry


def make_server(connection: Redis, port: int, addr: str = '0.0.0.0', *, read_from_replicas: bool = False) -> Any:
    """A WSGI server serving ``/metrics`` for ``connection``; call ``serve_forever()`` on it (the CLI does).

    ``read_from_replicas``: as :class:`PolicyCollector` takes it (a cluster's replicas serve the scrapes'
    reads, a moment behind the primary); the server's ``server_close()`` closes the reader it built."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
    from wsgiref.simple_server import make_server as _make_server

    from prometheus_client import make_wsgi_app

    collector = PolicyCollector(connection, read_from_replicas=read_from_replicas)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    class _Server(ThreadingMixIn, WSGIServer):
        # A request is served on its own daemon thread, so one stalled client neither blocks other scrapes nor
        # keeps the exporter from stopping; the loop itself only accepts.
        daemon_threads = True

        def server_close(self) -> None:
            super().server_close()
            collector.close()  # the replica reader it built, if any

    class _QuietHandler(WSGIRequestHandler):
        timeout = 30  # a client that never finishes its request is dropped instead of holding a thread forever

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
            logger.debug('rq-policies exporter: ' + format, *args)

    return _make_server(addr, port, make_wsgi_app(registry), server_class=_Server, handler_class=_QuietHandler)
