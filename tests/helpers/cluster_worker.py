"""A PolicyWorker (or PolicySimpleWorker) on a Redis Cluster, as a subprocess.

``python -m tests.helpers.cluster_worker CLASS [--burst] QUEUE...`` (CLASS: a name in ``rq_policies``, or a dotted
path such as ``tests.helpers.eviction_jobs.QuickWatchWorker``) with ``CLUSTER_URL`` (any node) and
``RQ_KEY_PREFIX`` in the environment; ``CLUSTER_NODES`` (``host:port,...``) to start from any of several,
``CLUSTER_RETRIES`` for retries of a command (backing off up to 1 s apart). The same as ``rq worker -w
rq_policies.PolicyWorker --connection-class redis.cluster.RedisCluster --url ...``, with a client built here
(several start nodes, retries)."""

from __future__ import annotations

import logging
import os
import sys

from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry


def main(argv: list[str]) -> None:
    import importlib

    import rq_policies

    if '.' in argv[0]:
        module, _, name = argv[0].rpartition('.')
        worker_class = getattr(importlib.import_module(module), name)
    else:
        worker_class = getattr(rq_policies, argv[0])
    burst = '--burst' in argv
    queues = [name for name in argv[1:] if not name.startswith('--')]
    logging.basicConfig(level=logging.WARNING)
    options: dict = {'socket_timeout': 5}
    retries = int(os.environ.get('CLUSTER_RETRIES') or 0)
    if retries:  # retry a command through a failover: 0.1 s, 0.2 s, ... at most 1 s apart
        options['retry'] = Retry(ExponentialBackoff(cap=1.0, base=0.1), retries)
    nodes = os.environ.get('CLUSTER_NODES')  # 'host:port,...': any one of them reachable at start is enough
    if nodes:
        startup = [ClusterNode(*node.rsplit(':', 1)) for node in nodes.split(',')]
        connection = RedisCluster(startup_nodes=startup, **options)
    else:
        connection = RedisCluster.from_url(os.environ['CLUSTER_URL'], **options)
    try:
        worker = worker_class(queues, connection=connection)
        worker.work(burst=burst, logging_level='WARNING', with_scheduler=False)
    finally:
        connection.close()


if __name__ == '__main__':
    main(sys.argv[1:])
