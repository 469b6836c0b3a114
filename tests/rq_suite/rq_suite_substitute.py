"""pytest plugin for ``run.py``: rq's own test suite, with rq-policies' classes in place of rq's.

Loaded with ``-p rq_suite_substitute`` before rq's test modules are imported. It

* points ``redis.Redis()`` (and a URL without a port) at the throwaway server whose port ``run.py`` puts in
  ``RQ_SUITE_PORT`` (see ``rq_suite_port``);
* unless ``RQ_SUITE_STOCK`` is set, replaces ``Queue``, ``Worker``, ``SimpleWorker`` and ``Job`` in ``rq``,
  ``rq.queue``, ``rq.worker`` and ``rq.job`` while the test modules are collected, so every name rq's tests import
  (and every class they derive, such as ``class CustomJob(Job)``) is rq-policies' one, as in an application that
  swapped them in. The originals are put back before the first test runs: rq's own code keeps using its own names,
  exactly as it does under an application that uses PolicyQueue, PolicyWorker and PolicyJob.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

from rq_suite_port import PORT, redirect_default_port

STOCK = bool(os.environ.get('RQ_SUITE_STOCK'))

_saved: list[tuple[Any, str, Any]] = []


def _substitute() -> None:
    import rq
    import rq.job
    import rq.queue
    import rq.worker

    from rq_policies import PolicyJob, PolicyQueue, PolicySimpleWorker, PolicyWorker

    replacements = {'Queue': PolicyQueue, 'Worker': PolicyWorker, 'SimpleWorker': PolicySimpleWorker, 'Job': PolicyJob}
    for module in (rq, rq.queue, rq.worker, rq.job):
        for name, ours in replacements.items():
            if name in vars(module):
                _saved.append((module, name, vars(module)[name]))
                setattr(module, name, ours)


def _restore() -> None:
    while _saved:
        module, name, original = _saved.pop()
        setattr(module, name, original)


def pytest_configure(config: Any) -> None:
    redirect_default_port()
    if not STOCK:
        _substitute()


def pytest_collection_finish(session: Any) -> None:
    _restore()


def pytest_sessionfinish(session: Any) -> None:
    # A failed assertion in some of rq's worker-pool tests skips their stop_workers(): a worker left running would
    # keep pytest from exiting (multiprocessing joins its children at exit).
    for child in multiprocessing.active_children():
        child.terminate()
        child.join(5)


def pytest_report_header(config: Any) -> str:
    import rq

    mode = 'stock rq classes' if STOCK else 'PolicyQueue/PolicyWorker/PolicySimpleWorker/PolicyJob substituted'
    return f'rq {rq.__version__} test suite, {mode}, server on port {PORT}'
