"""Replicas: reads from a cluster's replicas for the surfaces that only read (``rq-policies info`` and ``explain``,
the page and the metrics exporter: ``--read-from-replicas``; ``read_from_replicas=True`` on
:class:`rq_policies.surfaces.metrics.PolicyCollector`, :func:`rq_policies.surfaces.dashboard.create_app` and
``create_blueprint``), and :func:`wait_for_replicas`, an opt-in ``WAIT`` after an admin write.

On a Redis or Valkey cluster every key of rq and of rq-policies is in the prefix's slot (``RQ_KEY_PREFIX='{rq}'``),
so one primary serves every door, every fetch and every read. A page refreshed every 2 seconds by a few operators,
``rq-policies info`` in a loop and a scrape every 15 s are small next to the doors, but they are the one load that
can leave the primary: their reads may as well be served by its replicas.

:func:`replica_reader` gives that client: a new ``RedisCluster`` on the same nodes with the same connection settings
(credentials, TLS, timeouts, RESP version, ``decode_responses``), whose read commands (redis-py's ``READ_COMMANDS``:
``GET``, ``HGETALL``, ``HMGET``, ``ZRANGE``, ``LLEN``, ``SCAN`` through the slot's node and the like) are balanced
over the replicas of the slot with redis-py's ``LoadBalancingStrategy.ROUND_ROBIN_REPLICAS`` (its connections send
``READONLY``, as redis-py does for any load-balancing strategy). Everything else still goes to the slot's primary:
writes, scripts (``EVALSHA``, ``EVAL``: every door, every setting change, every action of the page), transactions
(``MULTI``/``EXEC`` pipelines run where the slot's primary is) and keyless commands (``TIME``, ``INFO``). A slot
with no replica is read from its primary. The caller's connection is not changed: a web app that enqueues through
the same client keeps reading its own writes from the primary.

The choices, named:

* **Opt-in.** A replica is behind its primary by the replication lag (milliseconds on a quiet network, more when
  the primary or the link is loaded, unbounded while the link is down), so a read from it may be a moment stale: a
  job just enqueued may not be listed yet, a cap just set may show its old value, a hold just released may still
  count. For a page, a status command and a gauge that is the trade BullMQ's and Sidekiq's operators make when they
  point a dashboard at a replica; it is not a default because the first refresh after an action should show it.
* **Never for decisions.** Doors, fetches, releases and setting changes are scripts on the primary whatever the
  client's strategy; the page's actions and their confirmation pages (which say what the state is now) use the
  connection given, not the reader. Only what is shown can be stale, never what is decided.
* **Clusters only.** A single server has no replicas to route to, and a Sentinel deployment's replicas are reached
  with a connection of their own (``Sentinel.slave_for``), not a routing option: passing the option with any
  connection but a ``redis.cluster.RedisCluster`` is refused with a :class:`PolicyConfigurationError` that names the
  option, rather than silently reading the primary.
"""

from __future__ import annotations

import copy
from typing import Any

from rq_policies.engine import keys
from rq_policies.engine.exceptions import InvalidArgument, PolicyConfigurationError

#: The connection settings a reader copies from the connection it is built from (redis-py's own list of settings a
#: cluster passes to its nodes), less what is the client's own: its connect hook (the reader has its own, which
#: sends READONLY), the address (the reader's nodes come from the slot map), the node-level retry (redis-py's
#: cluster client retries above its nodes), a client-side cache, and ``db`` (a URL gives 0; a cluster refuses it).
_NOT_COPIED = ('redis_connect_func', 'host', 'port', 'retry', 'connection_pool', 'cache', 'cache_config', 'db')


def is_replica_reader(connection: Any) -> bool:
    """Does ``connection`` already balance its reads over replicas (a ``RedisCluster`` built with a
    ``load_balancing_strategy`` or the deprecated ``read_from_replicas=True``, or a :func:`replica_reader`)?"""
    from redis.cluster import RedisCluster

    return isinstance(connection, RedisCluster) and bool(
        getattr(connection, 'load_balancing_strategy', None) or getattr(connection, 'read_from_replicas', False))


def check(connection: Any, option: str = 'read_from_replicas') -> None:
    """Refuse replica reads on a connection that is not a redis-py ``RedisCluster``, naming ``option`` (as the caller
    spells it: ``read_from_replicas=True``, ``--read-from-replicas``).

    Raises:
        PolicyConfigurationError: ``connection`` is a single server's client, a Sentinel's, an asyncio client, or
            anything else than ``redis.cluster.RedisCluster`` (or a subclass).
    """
    from redis.cluster import RedisCluster

    if isinstance(connection, RedisCluster):
        return
    if option.startswith('--'):
        how = 'pass --connection-class redis.cluster.RedisCluster with the URL of a cluster node, or drop ' + option
    else:
        how = 'pass a redis.cluster.RedisCluster, or read the primary (the default)'
    raise PolicyConfigurationError(
        f'{option} needs a Redis Cluster connection (redis.cluster.RedisCluster), got {type(connection).__name__}: '
        f'a single server has no replicas to route reads to, and a Sentinel replica takes a connection of its own '
        f'(Sentinel.slave_for); {how}. See docs/cluster.md.'
    )


def replica_reader(connection: Any, option: str = 'read_from_replicas') -> Any:
    """A client for the reads of a surface that only reads: ``connection`` itself when it already reads replicas
    (:func:`is_replica_reader`), else a new ``RedisCluster`` on the same nodes and settings whose reads go to the
    replicas (see the module's docstring: what goes where, and why it is opt-in). The caller closes a new one
    (``close()``; :func:`owned` tells which).

    Raises:
        PolicyConfigurationError: ``connection`` is not a ``redis.cluster.RedisCluster`` (:func:`check`), or rq's key
            prefix has no hash tag (:func:`rq_policies.engine.keys.check_connection`).
    """
    check(connection, option)
    keys.check_connection(connection)
    from redis.cluster import REDIS_ALLOWED_KEYS, ClusterNode, LoadBalancingStrategy, RedisCluster

    from rq_policies.engine import compat

    if is_replica_reader(connection):
        return compat.adopt_cluster(connection)
    manager = connection.nodes_manager
    settings = {
        name: value
        for name, value in manager.connection_kwargs.items()
        if name in REDIS_ALLOWED_KEYS and name not in _NOT_COPIED
    }
    if connection.user_on_connect_func is not None:
        settings['redis_connect_func'] = connection.user_on_connect_func
    known = list(manager.nodes_cache.values()) or list(manager.startup_nodes.values())
    # A subclass of the caller's (their own, or the adopted one) keeps what it adds; re-adopted below either way.
    cls = type(connection) if isinstance(connection, RedisCluster) else RedisCluster
    reader = cls(
        startup_nodes=[ClusterNode(node.host, node.port) for node in known],
        retry=copy.copy(connection.retry),
        require_full_coverage=getattr(manager, '_require_full_coverage', True),
        reinitialize_steps=getattr(connection, 'reinitialize_steps', 5),
        dynamic_startup_nodes=getattr(manager, '_dynamic_startup_nodes', True),
        address_remap=manager.address_remap,
        load_balancing_strategy=LoadBalancingStrategy.ROUND_ROBIN_REPLICAS,
        **settings,
    )
    return compat.adopt_cluster(reader)


def owned(reader: Any, connection: Any) -> bool:
    """Was ``reader`` built by :func:`replica_reader` for ``connection`` (and so is the caller's to close)?"""
    return reader is not connection


def wait_for_replicas(connection: Any, replicas: int = 1, timeout_ms: int = 1000) -> int:
    """Block until ``replicas`` replicas of the server (on a cluster: of the prefix slot's primary) have every write
    it took so far, or ``timeout_ms`` passed; return how many have them (``WAIT``'s answer, which may be fewer).

    For an admin write that should outlive a failover: a cap lowered during an incident, a key's limit, a rate, an
    identity reset. Asynchronous replication can lose the writes of the last moment before a primary dies (the
    replication lag, docs/cluster.md *Failover*), and a setting lost so comes back as its old value with nothing to
    say so: after ``QueueSlot.set(...)``, ``wait_for_replicas(connection)`` makes "set" mean "on a replica too", for
    one more round trip and the lag's wait. The doors do the same in their own round trip when asked
    (``wait_replicas=``: :func:`rq_policies.engine.admission.run_replicated`); the fetches never wait. ``WAIT`` does
    not make replication synchronous: a replica that has the write can still lose it if another replica is promoted, and
    a primary that restarts empty can be copied over it.

    ``WAIT`` counts the replicas that have the calling connection's last write, and a client's pool hands out any of its
    connections: a bare ``connection.wait(1, 1000)`` after a write made on another connection of the pool answers at
    once. So this writes one small key of its own (:data:`rq_policies.engine.keys.REPLICATED`, expiring after a minute)
    and sends ``WAIT`` in the same pipeline, on one connection to the primary (a cluster's: the node client of the
    prefix's slot, where every key of ours is): the replication stream is in order, so a replica that has it has every
    write before it, from any client.

    Args:
        connection: a ``redis.Redis`` (a Sentinel master's too) or a ``redis.cluster.RedisCluster``, whose socket
            timeout (if any) is longer than ``timeout_ms``.
        replicas: how many replicas to wait for, a positive integer.
        timeout_ms: the most milliseconds to wait, a positive integer (``WAIT``'s 0, forever, is refused).

    Raises:
        ValueError: ``replicas`` or ``timeout_ms`` is not a positive integer (naming it and the value); nothing is
            written.
    """
    for name, value in (('replicas', replicas), ('timeout_ms', timeout_ms)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(name, message=f'{name} must be a positive integer, got {value!r}')
    from rq_policies.engine.admission import replicated

    return replicated(connection, replicas, timeout_ms)

