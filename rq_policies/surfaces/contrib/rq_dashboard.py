"""The rq-policies dashboard inside rq-dashboard's Flask app, on rq-dashboard's own Redis connection.

Two lines, after rq-dashboard's app is built (``rq_dashboard.cli.make_flask_app``, or your app with
``rq_dashboard.blueprint`` registered and ``rq_dashboard.web.setup_rq_connection(app)`` called)::

    from rq_policies.surfaces.contrib.rq_dashboard import blueprint as rq_policies_blueprint
    app.register_blueprint(rq_policies_blueprint, url_prefix='/rq/policies')

The pages then read ``current_app.redis_conn``, the connection rq-dashboard set up (for a multi-instance
rq-dashboard, the instance it last served). This blueprint is read-only; :func:`make_blueprint` with
``allow_actions=True`` builds one with actions, which should only be mounted behind the host app's own
authentication (rq-dashboard's ``--username``/``--password`` protect only its own blueprint).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, url_for
from werkzeug.routing import BuildError

from rq_policies.surfaces.dashboard import create_blueprint


def _connection() -> Any:
    conn = getattr(current_app, 'redis_conn', None)
    if conn is None:
        raise RuntimeError(
            'rq-policies dashboard: the app has no redis_conn; call '
            'rq_dashboard.web.setup_rq_connection(app) after registering rq-dashboard'
        )
    return conn


def _home() -> str | None:
    try:
        return url_for('rq_dashboard.queues_overview', instance_number=0)
    except BuildError:
        return None


def make_blueprint(
    *, allow_actions: bool = False, refresh_seconds: float = 2.0, name: str = 'rq_policies',
    read_from_replicas: bool = False,
) -> Blueprint:
    """A dashboard blueprint reading rq-dashboard's connection, with a link back to rq-dashboard's queues
    (``read_from_replicas``: when that connection is a ``RedisCluster``, the pages read its replicas, as
    :func:`rq_policies.surfaces.dashboard.create_blueprint` says)."""
    return create_blueprint(
        _connection, allow_actions=allow_actions, refresh_seconds=refresh_seconds, name=name, home=_home,
        read_from_replicas=read_from_replicas,
    )


#: The read-only blueprint to register under rq-dashboard's app.
blueprint = make_blueprint()
