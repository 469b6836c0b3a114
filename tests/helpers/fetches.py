"""One fetch by the real fetch script, as a PolicyWorker makes it, with no worker around it."""

from __future__ import annotations

from collections.abc import Sequence

from redis import Redis
from rq.queue import Queue

from rq_policies.engine.fetch import Claim, Look, fetch_call, read_reply


def fetch(conn: Redis, token: str, names: Sequence[str], ttl: int = 90, burst: bool = True) -> Claim | Look:
    """Fetch from the queues ``names`` in order with claim token ``token`` (its holds live ``ttl`` seconds): the
    reply read as the worker reads it, a :class:`~rq_policies.engine.fetch.Claim` or a
    :class:`~rq_policies.engine.fetch.Look`."""
    queues = [Queue(name, connection=conn) for name in names]
    return read_reply(fetch_call(queues, token, ttl, burst=burst).run(conn), queues, token, ttl)
