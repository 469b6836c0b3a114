"""pytest plugin for ``run.py``: rq's own test suite, with rq-policies' classes in place of rq's.

Loaded with ``-p rq_suite_substitute`` before rq's test modules are imported. It

* points ``redis.Redis()`` (and a URL without a port) at the throwaway server whose port ``run.py`` puts in
  ``RQ_SUITE_PORT``: rq's tests connect to ``localhost:6379`` with bare ``Redis()`` calls. The ``sitecustomize``
  that ``run.py`` writes does the same in the subprocesses some tests start (``rqworker``, which imports the test
  modules);
* unless ``RQ_SUITE_STOCK`` is set, replaces ``Queue``, ``Worker``, ``SimpleWorker`` and ``Job`` in ``rq``,
  ``rq.queue``, ``rq.worker`` and ``rq.job`` while the test modules are collected, so every name rq's tests import
  (and every class they derive, such as ``class CustomJob(Job)``) is rq-policies' one, as in an application that
  swapped them in. The originals are put back before the first test runs: rq's own code keeps using its own names,
  exactly as it does under an application that uses PolicyQueue, PolicyWorker and PolicyJob.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import redis
import redis.connection

PORT = int(os.environ.get('RQ_SUITE_PORT', '6379'))
STOCK = bool(os.environ.get('RQ_SUITE_STOCK'))


def _set_default_port(func: Any, port: int) -> None:
    """Change the default of ``func``'s ``port`` parameter (which stays 6379 in its signature elsewhere)."""
    inner = inspect.unwrap(func)
    names = inner.__code__.co_varnames[: inner.__code__.co_argcount]
    if inner.__kwdefaults__ and 'port' in inner.__kwdefaults__:
        inner.__kwdefaults__['port'] = port
        return
    defaults = list(inner.__defaults__ or ())
    index = names.index('port') - (len(names) - len(defaults))
    defaults[index] = port
    inner.__defaults__ = tuple(defaults)


def redirect_default_port() -> None:
    """Make ``RQ_SUITE_PORT`` the port of a ``Redis()`` or connection that names none."""
    _set_default_port(redis.Redis.__init__, PORT)
    _set_default_port(redis.connection.Connection.__init__, PORT)

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


def pytest_report_header(config: Any) -> str:
    import rq

    mode = 'stock rq classes' if STOCK else 'PolicyQueue/PolicyWorker/PolicySimpleWorker/PolicyJob substituted'
    return f'rq {rq.__version__} test suite, {mode}, server on port {PORT}'
