"""Job functions of the lock-mode tests (Loner until= and on_conflict=); importable by worker subprocesses."""

from __future__ import annotations

import os
import time

from redis import Redis
from rq import get_current_job

from rq_policies import Loner, policy
from tests.helpers.cluster import connect


def _conn() -> Redis:
    return connect(os.environ['REDIS_URL'])


@policy(Loner(until='finished'))
def held(tag, seconds=0.0, fail=False):
    """Record this job's id and horse pid, sleep, then return or fail: a run that holds its identity to the end."""
    conn = _conn()
    conn.rpush(f'test:ran:{tag}', get_current_job().id)
    conn.rpush(f'test:pid:{tag}', os.getpid())
    time.sleep(seconds)
    if fail:
        raise RuntimeError(f'failing on purpose: {tag}')
    return tag


@policy(Loner(on_conflict='replace'), unique_context=lambda args, kwargs: args[0])
def replaced(account, reason, check=None):
    """Record (job id, reason, check): a complete payload has reason == check."""
    _conn().rpush(f'test:ran:{account}', f'{get_current_job().id} {reason} {check}')
    return reason


@policy(Loner(on_conflict='replace'), unique_context=lambda args, kwargs: args[0])
def replaced_slow(account, reason, check=None, seconds=0.0):
    _conn().rpush(f'test:ran:{account}', f'{get_current_job().id} {reason} {check}')
    time.sleep(seconds)
    return reason


@policy(Loner(until='finished', on_conflict='replace'), unique_context=lambda args, kwargs: args[0])
def replaced_held(account, reason, check=None, seconds=0.0):
    _conn().rpush(f'test:ran:{account}', f'{get_current_job().id} {reason} {check}')
    time.sleep(seconds)
    return reason


@policy(Loner(on_conflict='raise'))
def raising(x):
    return x


@policy(Loner(until='finished', ttl=4))
def held_capped(tag, seconds=0.0):
    """Like ``held``, with the identity held at most 4 s (Loner(ttl=4)) whatever the run does."""
    conn = _conn()
    conn.rpush(f'test:ran:{tag}', get_current_job().id)
    time.sleep(seconds)
    return tag


@policy(Loner(until='finished', on_conflict='keep_last'), unique_context=lambda args, kwargs: args[0])
def kept_last(account, payload, seconds=0.0):
    """Loner keep_last: record 'start <job id> <payload> <time>' and 'end <job id> <payload> <time>' (server time,
    so records of several horses sort on one clock) around a sleep."""
    conn = _conn()
    jid = get_current_job().id
    sec, usec = conn.time()
    conn.rpush(f'test:kl:{account}', f'start {jid} {payload} {sec}.{usec:06d}')
    conn.rpush(f'test:pid:{account}', os.getpid())
    time.sleep(seconds)
    sec, usec = conn.time()
    conn.rpush(f'test:kl:{account}', f'end {jid} {payload} {sec}.{usec:06d}')
    return payload


def _horse_alive(pid: int) -> bool:
    """Does process ``pid`` still run (a zombie, killed but not yet reaped, runs nothing)?"""
    try:
        with open(f'/proc/{pid}/stat') as stat:
            return stat.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@policy(Loner(until='finished', on_conflict='cancel'), unique_context=lambda args, kwargs: args[0])
def cancelled(account, payload, seconds=0.0):
    """Loner cancel: record 'start <job id> <payload> <time>', then 'tick ...' every 50 ms while it runs (a stopped
    run's last sign of life, its horse being killed), then 'end ...' (server time, so records of several horses sort
    on one clock). At its start it records 'overlap ...' for any earlier horse of ``account`` still alive."""
    conn = _conn()
    jid = get_current_job().id
    for pid in conn.lrange(f'test:pid:{account}', 0, -1):
        if _horse_alive(int(pid)):
            conn.rpush(f'test:overlap:{account}', f'{jid} {int(pid)}')
    conn.rpush(f'test:pid:{account}', os.getpid())

    def record(kind: str) -> None:
        sec, usec = conn.time()
        conn.rpush(f'test:kl:{account}', f'{kind} {jid} {payload} {sec}.{usec:06d}')

    record('start')
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        time.sleep(min(0.05, max(ends - time.monotonic(), 0)))
        record('tick')
    record('end')
    return payload


def kl_records(connection, account):
    """The start/tick/end records ``kept_last`` and ``cancelled`` runs of ``account`` wrote: (kind, job id, payload,
    server time)."""
    found = []
    for line in connection.lrange(f'test:kl:{account}', 0, -1):
        kind, jid, payload, at = line.decode().split()
        found.append((kind, jid, payload, float(at)))
    return found
