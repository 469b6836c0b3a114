"""Point ``redis.Redis()`` and a connection without a port at ``RQ_SUITE_PORT`` (set by ``run.py``).

rq's tests connect with bare ``Redis()`` calls, that is to ``localhost:6379``. The plugin calls this in the test
process; the ``sitecustomize`` that ``run.py`` writes calls it in the subprocesses some tests start (``rqworker``,
which imports the test modules). A module of its own, so that importing it early does not import the plugin before
pytest can load it.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import redis
import redis.connection

PORT = int(os.environ.get('RQ_SUITE_PORT', '6379'))


def _set_default_port(func: Any, port: int) -> None:
    """Change the default of ``func``'s ``port`` parameter."""
    inner = inspect.unwrap(func)
    if inner.__kwdefaults__ and 'port' in inner.__kwdefaults__:
        inner.__kwdefaults__['port'] = port
        return
    names = inner.__code__.co_varnames[: inner.__code__.co_argcount]
    defaults = list(inner.__defaults__ or ())
    defaults[names.index('port') - (len(names) - len(defaults))] = port
    inner.__defaults__ = tuple(defaults)


def redirect_default_port() -> None:
    """Make ``RQ_SUITE_PORT`` the port of a ``Redis()`` or connection that names none."""
    _set_default_port(redis.Redis.__init__, PORT)
    _set_default_port(redis.connection.Connection.__init__, PORT)
