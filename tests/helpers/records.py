"""Reading the server's clock and what jobs recorded (``test:ran:<tag>`` and ``test:span:<tag>`` lists)."""

from __future__ import annotations

from redis import Redis


def server_now(conn: Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def ran(conn: Redis, tag: str) -> list[tuple[str, str, float]]:
    """What tests.helpers.throttle_jobs._record wrote for ``tag``: (job id, value, server time), in run order."""
    rows = []
    for raw in conn.lrange(f'test:ran:{tag}', 0, -1):
        job_id, value, at = raw.decode().split(' ')
        rows.append((job_id, value, float(at)))
    return rows


def spans(conn: Redis, tag: str) -> dict[str, list]:
    """job id -> [start, end, worker] from the records the jobs wrote (end None while running)."""
    found: dict[str, list] = {}
    for raw in conn.lrange(f'test:span:{tag}', 0, -1):
        job_id, kind, at, *rest = raw.decode().split()
        entry = found.setdefault(job_id, [None, None, rest[0] if rest else None])
        entry[0 if kind == 'start' else 1] = float(at)
    return found
