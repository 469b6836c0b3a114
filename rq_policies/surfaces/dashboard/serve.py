"""Serving the standalone dashboard (``rq-policies dashboard``) until SIGTERM or SIGINT."""

from __future__ import annotations

import signal
import threading
from typing import Any

import click
from werkzeug.serving import make_server

from .web import create_app


def serve(
    connection: Any,
    host: str,
    port: int,
    *,
    allow_actions: bool = False,
    refresh_seconds: float = 2.0,
    read_from_replicas: bool = False,
    error: type[Exception] = click.ClickException,
) -> None:
    """Serve the dashboard on ``host:port`` with Werkzeug's threaded server (one thread a request).

    The page is for a few operators at a time, so the threaded development server is enough and keeps the dependency
    list at Flask; behind a production WSGI server, serve :func:`rq_policies.surfaces.dashboard.create_app`.
    ``read_from_replicas``: the pages read a cluster's replicas
    (:func:`rq_policies.surfaces.dashboard.create_blueprint`).
    """
    app = create_app(connection, allow_actions=allow_actions, refresh_seconds=refresh_seconds,
                     read_from_replicas=read_from_replicas)
    try:
        server = make_server(host, port, app, threaded=True)
    except OSError as exc:
        raise error(f'cannot serve on {host}:{port}: {exc.strerror or exc}') from None

    def stop(signum: int, frame: Any) -> None:
        # shutdown() must come from another thread than serve_forever's (as the exporter's stop does)
        threading.Thread(target=server.shutdown, name='dashboard-stop', daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    mode = 'actions on' if allow_actions else 'read-only'
    click.echo(f'Serving the rq-policies dashboard ({mode}) on http://{host}:{server.server_port}/', err=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        for blueprint in app.blueprints.values():
            readers = getattr(blueprint, 'replica_readers', None)
            if readers is not None:
                readers.close()
