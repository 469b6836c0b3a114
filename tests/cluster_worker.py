"""A PolicyWorker (or PolicySimpleWorker) on a Redis Cluster, as a subprocess: ``python cluster_worker.py CLASS
[--burst] QUEUE...`` with ``CLUSTER_URL`` (any node) and ``RQ_KEY_PREFIX`` in the environment (``CLUSTER_NODES``, ``host:port,...``, to start from any of several). rq's CLI builds a
``redis.Redis`` only, so a cluster worker is started from Python, as here."""

from __future__ import annotations

import logging
import os
import sys

from redis.cluster import ClusterNode, RedisCluster

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv: list[str]) -> None:
    import rq_policies

    worker_class = getattr(rq_policies, argv[0])
    burst = '--burst' in argv
    queues = [name for name in argv[1:] if not name.startswith('--')]
    logging.basicConfig(level=logging.WARNING)
    nodes = os.environ.get('CLUSTER_NODES')  # 'host:port,...': any one of them reachable at start is enough
    if nodes:
        startup = [ClusterNode(*node.rsplit(':', 1)) for node in nodes.split(',')]
        connection = RedisCluster(startup_nodes=startup, socket_timeout=5)
    else:
        connection = RedisCluster.from_url(os.environ['CLUSTER_URL'], socket_timeout=5)
    try:
        worker = worker_class(queues, connection=connection)
        worker.work(burst=burst, logging_level='WARNING', with_scheduler=False)
    finally:
        connection.close()


if __name__ == '__main__':
    main(sys.argv[1:])
