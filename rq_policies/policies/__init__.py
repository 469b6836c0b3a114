"""The built-in policies, one package each: its rules (``rules``), imported with the package, and what it shows
(``views``), imported at the first look at the views (:func:`rq_policies.engine.policy.defer_views`): a worker and a
producer never look at them."""

from __future__ import annotations

from rq_policies.engine.policy import defer_views


def _views() -> None:
    """Import every built-in policy's views (each registers its views when it is defined)."""
    from .batch import views as _batch  # noqa: F401
    from .concurrency import views as _concurrency  # noqa: F401
    from .debounce import views as _debounce  # noqa: F401
    from .fair import views as _fair  # noqa: F401
    from .loner import views as _loner  # noqa: F401
    from .queue_rate import views as _queue_rate  # noqa: F401
    from .queue_slot import views as _queue_slot  # noqa: F401
    from .rate import views as _rate  # noqa: F401
    from .throttle import views as _throttle  # noqa: F401


defer_views(_views)
