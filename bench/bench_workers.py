"""Worker classes bench/worker.py runs beside stock rq's; the worker subprocesses import them from bench/."""

from __future__ import annotations

from typing import Any

from rq.worker import Worker

from rq_policies.engine.worker import _resolve_driver_info_once


class DriverInfoWorker(Worker):
    """Stock rq's Worker with the one connection-pool change PolicyWorker makes at bootstrap (redis-py's driver info
    resolved once, not in every work horse's new connection): measured beside PolicyWorker, it shows what the
    policies themselves cost per job, apart from that saving."""

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        _resolve_driver_info_once(self.connection)
