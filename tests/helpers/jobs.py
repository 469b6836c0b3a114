"""Job functions the tests enqueue; importable by worker subprocesses as ``tests.helpers.jobs`` (the repository's
root is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time

from redis import Redis
from rq import get_current_job

from rq_policies import Loner, policy
from tests.helpers.cluster import connect


def _conn() -> Redis:
    return connect(os.environ['REDIS_URL'])


def plain(x):
    return x


@policy(Loner())
def sweep_cache(article_id):
    return article_id


@policy(Loner(), unique_context=lambda args, kwargs: args[0])
def sync_account(account_id, reason=None):
    return account_id


@policy(Loner())
def record(tag, *args, **kwargs):
    """Append this job's id to the list `tag` (so tests see which jobs ran, and in what order)."""
    job = get_current_job()
    _conn().rpush(f'test:ran:{tag}', job.id)
    return tag


def record_plain(tag, *args, **kwargs):
    job = get_current_job()
    _conn().rpush(f'test:ran:{tag}', job.id)
    return tag


def sleep_and_record(tag, seconds):
    """Record start and end (server clock) so a test can compute overlap; the cap tests use it."""
    conn = _conn()
    job = get_current_job()
    start = conn.time()
    conn.rpush(f'test:span:{tag}', f'{job.id} start {start[0] + start[1] / 1e6:.6f}')
    time.sleep(seconds)
    end = conn.time()
    conn.rpush(f'test:span:{tag}', f'{job.id} end {end[0] + end[1] / 1e6:.6f}')
    return tag


def fail(x):
    raise RuntimeError(f'failing on purpose: {x}')


class Greeter:
    def hello(self, name):
        return f'hello {name}'


@policy(Loner())
def slow_loner(tag, seconds):
    """A loner that records its start, then sleeps: lets a test enqueue the same identity while it runs."""
    conn = _conn()
    conn.rpush(f'test:ran:{tag}', get_current_job().id)
    time.sleep(seconds)
    return tag


def span_to_file(path, seconds):
    """Append this job's start and end (wall clock) to a local file: records that survive a Redis failover."""
    job_id = get_current_job().id
    with open(path, 'a') as f:
        f.write(f'{job_id} start {time.time():.6f}\n')
    time.sleep(seconds)
    with open(path, 'a') as f:
        f.write(f'{job_id} end {time.time():.6f}\n')
    return job_id


def fail_first_to_file(path):
    """Like :func:`span_to_file` with no sleep, failing its first run (a retry then ends ok)."""
    job_id = get_current_job().id
    with open(path, 'a') as f:
        f.write(f'{job_id} start {time.time():.6f}\n')
    with open(path) as f:
        if sum(1 for line in f if line.startswith(f'{job_id} start ')) == 1:
            raise RuntimeError(f'first run of {job_id} fails on purpose')
    return job_id


def max_overlap(lines, since=float('-inf')):
    """The largest number of spans open at one instant at or after `since`, from 'id start|end t' lines.

    Ends sort before starts at the same instant: a slot handed from one job to the next is not an overlap.
    """
    events = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            events.append((float(parts[2]), 0 if parts[1] == 'end' else 1))
    running = peak = 0
    for at, kind in sorted(events):
        running += 1 if kind else -1
        if at >= since:
            peak = max(peak, running)
    return peak


def pid_and_sleep(tag, seconds):
    """Record this work horse's pid (so a test can SIGKILL it), then sleep."""
    _conn().rpush(f'test:pid:{tag}', os.getpid())
    time.sleep(seconds)
    return tag


def span_on_worker(tag, seconds):
    """Like sleep_and_record, plus the name of the worker that ran the job (rq sets RQ_WORKER_ID in the horse)."""
    conn = _conn()
    job = get_current_job()
    worker = os.environ.get('RQ_WORKER_ID', '?')
    start = conn.time()
    conn.rpush(f'test:span:{tag}', f'{job.id} start {start[0] + start[1] / 1e6:.6f} {worker}')
    time.sleep(seconds)
    end = conn.time()
    conn.rpush(f'test:span:{tag}', f'{job.id} end {end[0] + end[1] / 1e6:.6f} {worker}')
    return tag


def exit_horse(code):
    """Leave the work horse without a word, as a crash in C code would: rq's 'work-horse terminated' path."""
    os._exit(code)


def raising_callback(job, connection, *args, **kwargs):
    """An on_success callback that fails: rq then marks the job failed, and its dependents never run."""
    raise RuntimeError('callback failed')


def account_of(args, kwargs):
    """A unique_context that fails on a call without ``account=`` (KeyError)."""
    return kwargs['account']


@policy(Loner(), unique_context=account_of)
def by_account(*args, **kwargs):
    return kwargs.get('account')


#: What the on_drop hooks below were told: (DroppedCall, holder id), in call order.
DROPS_SEEN: list = []


def remember_drop(call, holder):
    DROPS_SEEN.append((call, holder))


def failing_drop_hook(call, holder):
    raise RuntimeError('metrics backend down')


@policy(Loner(), on_drop=remember_drop)
def watched(item, flag=None):
    return item


@policy(Loner(), on_drop=failing_drop_hook)
def watched_badly(item):
    return item


def announced() -> list[str]:
    """Run in a work horse: the lib-name and lib-ver the horse's own connection sent with CLIENT SETINFO."""
    info = get_current_job().connection.client_info()
    return [info.get('lib-name', ''), info.get('lib-ver', '')]


def suspend_workers(tag):
    """Suspend every worker (``rq suspend``) from inside a job, and record that it ran."""
    from rq.suspension import suspend

    job = get_current_job()
    conn = _conn()
    conn.rpush(f'test:ran:{tag}', job.id)
    suspend(conn)
    return tag


def worker_state(tag):
    """Record the state and ttl of the worker running this job, as Redis has them while it runs."""
    from rq.worker import Worker

    job = get_current_job()
    conn = _conn()
    key = Worker.redis_worker_namespace_prefix + job.worker_name
    state = conn.hget(key, 'state')
    conn.rpush(f'test:state:{tag}', f'{state.decode() if state else None} {conn.ttl(key)}')
    return tag


def horse_client(tag):
    """The id of the server connection this work horse's job uses, after a write and read of its own through it."""
    conn = get_current_job().connection
    conn.set(f'test:horse:{tag}', tag)
    assert conn.get(f'test:horse:{tag}') == tag.encode()
    return conn.client_id()


def horse_leaves_a_reply_unread(tag):
    """Sends a PING on the job's connection (the one the horse adopted: the only one in its pool) and returns
    without reading the reply, keeping that connection out of the pool (rq's end of run opens another): the horse
    exits normally with the PONG left on it. (Released to the pool instead, the horse's own redis-py would read the
    PONG as the reply to rq's next command when the PONG had not arrived yet.)"""
    pool = get_current_job().connection.connection_pool
    conn = pool.get_connection()
    conn.send_command('PING')
    return tag


def horse_dies_mid_command(tag):
    """Writes half a command on the job's connection, then SIGKILLs its own work horse: the server waits for the
    rest of that command on the socket."""
    import signal

    pool = get_current_job().connection.connection_pool
    conn = pool.get_connection()
    conn._sock.sendall(b'*3\r\n$3\r\nSET\r\n$8\r\ntest:cut\r\n')  # two of its three parts
    os.kill(os.getpid(), signal.SIGKILL)


def horse_closes_its_connection(tag):
    """Has the server close the connection this job runs on (CLIENT KILL of its own id: the server replies, then
    closes it)."""
    conn = get_current_job().connection
    conn.client_kill_filter(_id=conn.client_id(), skipme=False)
    return tag
