"""A web page of policy state: ``rq-policies dashboard``, or a blueprint inside rq-dashboard's Flask app.

Needs Flask (``pip install 'rq-policies[dashboard]'``). :func:`create_app` is the standalone app the command serves;
:func:`create_blueprint` mounts the same pages in any Flask app (``rq_policies.surfaces.contrib.rq_dashboard`` does it
for rq-dashboard). What the pages show comes from the registry (:mod:`rq_policies.surfaces.dashboard.data`): every
policy contributes its own panels (its views' :meth:`~rq_policies.engine.views.PolicyViews.panels`).
"""

from __future__ import annotations

try:
    import flask  # noqa: F401
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("the rq-policies dashboard needs Flask: pip install 'rq-policies[dashboard]'") from exc

from .data import overview
from .web import create_app, create_blueprint

__all__ = ['create_app', 'create_blueprint', 'overview']
