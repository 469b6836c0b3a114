"""The lost-reply kit the fault tests share: a producer connection that retries as production clients do, the faults
the proxy injects (:func:`lose_reply`), and readers of what was queued and what ran."""

from __future__ import annotations

from redis import Redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

from rq_policies import PolicyQueue, PolicySimpleWorker
from rq_policies.engine import scripts
from rq_policies.engine.compat import KEY_PREFIX as RQ

#: What only an admission call that writes a job carries: EVALSHA (or EVAL) with the job's fields, ``created_at``
#: among them (lua/admit.lua's inside its msgpack argument, lua/admit_narrow.lua's as its ARGV tail; a probe or a
#: claim carries no fields).
ADMIT_WRITE = (b'EVAL', b'created_at')

FAULTS = ['delay', 'drop', 'stall']


def producer(proxy, timeout: float = 0.2) -> Redis:
    """A producer connection through the proxy, retrying as production clients do.

    redis-py >= 6 retries ConnectionError and TimeoutError by default (a Retry with 3 or more attempts and a
    backoff); older versions only when told. The retry is given explicitly, so every version behaves the same: a
    reply that does not come within ``socket_timeout`` (or a connection that closes) sends the same command again.
    """
    conn = Redis.from_url(
        proxy.url, socket_timeout=timeout, socket_connect_timeout=1,
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3), retry_on_error=[ConnectionError, TimeoutError],
    )
    conn.ping()  # connected: a stall hits the next command, not the connection's handshake
    return conn


def lose_reply(proxy, fault: str, match) -> None:
    """The next matching command's reply comes 0.4 s late (past the 0.2 s timeout), or not at all; or the network
    stalls 0.4 s both ways, so the client's retry and its first attempt reach the server together, in either order."""
    if fault == 'delay':
        proxy.delay_reply(0.4, match=match)
    elif fault == 'drop':
        proxy.drop_reply(match=match)
    else:
        proxy.stall(0.4, match=match)


def load(connection: Redis, *names: str) -> None:
    """Have the server know these scripts, so the first attempt runs the script (not a NOSCRIPT answer). ``admit``
    loads both admission scripts: lua/admit.lua and the narrow one its commonest calls go to (admit_narrow)."""
    for name in names:
        for each in (name, 'admit_narrow') if name == 'admit' else (name,):
            connection.script_load(scripts.script(each).script)


def queued(connection: Redis, name: str) -> list[str]:
    return [raw.decode() for raw in connection.lrange(f'{RQ}:queue:{name}', 0, -1)]


def ran_ids(connection: Redis, tag: str) -> list[str]:
    return [raw.decode() for raw in connection.lrange(f'test:ran:{tag}', 0, -1)]


def burst(connection: Redis, name: str, scheduler: bool = False) -> None:
    PolicySimpleWorker([PolicyQueue(name, connection=connection)], connection=connection).work(
        burst=True, with_scheduler=scheduler)
