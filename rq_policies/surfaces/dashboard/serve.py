"""The standalone dashboard's server (``rq-policies dashboard`` serves it until SIGTERM or SIGINT)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.serving import make_server

from .web import create_app


def server(connection: Any, host: str, port: int, *, allow_actions: bool = False, refresh_seconds: float = 2.0,
           read_from_replicas: bool = False) -> tuple[Any, Callable[[], None]]:
    """The dashboard on ``host:port`` with Werkzeug's threaded server (one thread a request), and what closes the
    replica readers its pages built once it has stopped. OSError when it cannot bind.

    The page is for a few operators at a time, so the threaded development server is enough and keeps the dependency
    list at Flask; behind a production WSGI server, serve :func:`rq_policies.surfaces.dashboard.create_app`.
    ``read_from_replicas``: the pages read a cluster's replicas
    (:func:`rq_policies.surfaces.dashboard.create_blueprint`).
    """
    app = create_app(connection, allow_actions=allow_actions, refresh_seconds=refresh_seconds,
                     read_from_replicas=read_from_replicas)

    def close() -> None:
        for blueprint in app.blueprints.values():
            readers = getattr(blueprint, 'replica_readers', None)
            if readers is not None:
                readers.close()

    return make_server(host, port, app, threaded=True), close
