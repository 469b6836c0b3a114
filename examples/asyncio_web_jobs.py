"""The jobs of examples/asyncio_web.py (a module of their own, so a worker imports them without the web app)."""

from __future__ import annotations

from rq_policies import Concurrency, Loner, policy


@policy(Loner())
def send_welcome(user_id: int) -> str:
    """One welcome mail per user while one waits: a second request's enqueue is dropped."""
    return f'welcome sent to user {user_id}'


@policy(Concurrency(2, key=lambda args, kwargs: args[0], scope='tenant-reports'))
def build_report(tenant: str, report: str) -> str:
    """At most two reports of one tenant run at once, cluster-wide (the others park until one ends)."""
    return f'report {report} of {tenant} built'
