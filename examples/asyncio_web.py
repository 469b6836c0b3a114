"""asyncio doors in a web app: a Starlette app (FastAPI is Starlette underneath: the same code fits its routes) that
enqueues with ``AsyncPolicyQueue`` on ``redis.asyncio``, so a request never blocks the event loop on Redis.

    python examples/asyncio_web.py          # calls the app through Starlette's TestClient and prints the answers
    uvicorn asyncio_web:app                 # serve it (from examples/, with REDIS_URL set; uvicorn not included)

Routes:

* ``POST /welcome/{user_id}``: ``send_welcome`` under a Loner. 202 with the job's id, or 200 with the id of the job
  already waiting for this user (the enqueue was dropped: None).
* ``POST /reports/{tenant}/{report}``: ``build_report`` under a per-key Concurrency (two per tenant at once).
* ``GET /jobs/{job_id}``: ``explain``: the job's status, queue and each policy's verdict on it.

Uses REDIS_URL when it is set; otherwise ``main()`` starts an embedded Valkey (pip install "rq-policies[embedded]").
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent))  # so a worker imports asyncio_web_jobs the same way

from asyncio_web_jobs import build_report, send_welcome  # noqa: E402

from rq_policies.surfaces.aio import AsyncPolicyQueue  # noqa: E402
from rq_policies.surfaces.explainer import UnknownJob  # noqa: E402


async def welcome(request: Request) -> JSONResponse:
    queue: AsyncPolicyQueue = request.app.state.mail
    user_id = int(request.path_params['user_id'])
    job = await queue.enqueue(send_welcome, user_id)
    if job is None:  # dropped: a welcome for this user is already waiting
        return JSONResponse({'dropped': True, 'waiting': await queue.holder(send_welcome, user_id)})
    return JSONResponse({'job': job.id}, status_code=202)


async def report(request: Request) -> JSONResponse:
    queue: AsyncPolicyQueue = request.app.state.reports
    job = await queue.enqueue(build_report, request.path_params['tenant'], request.path_params['report'])
    return JSONResponse({'job': job.id}, status_code=202)


async def job_status(request: Request) -> JSONResponse:
    queue: AsyncPolicyQueue = request.app.state.reports
    try:
        answer = await queue.explain(request.path_params['job_id'])
    except UnknownJob as exc:
        return JSONResponse({'error': str(exc)}, status_code=404)
    return JSONResponse({'status': answer['status'], 'queue': answer['queue'], 'policies': answer['policies']},
                        status_code=200)


def create_app(redis_url: str) -> Starlette:
    """The app, its Redis client opened and closed with it (one pool for every request)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        redis = Redis.from_url(redis_url)
        app.state.mail = AsyncPolicyQueue('mail', connection=redis)
        app.state.reports = AsyncPolicyQueue('reports', connection=redis)
        try:
            yield
        finally:
            await redis.aclose()

    return Starlette(routes=[
        Route('/welcome/{user_id:int}', welcome, methods=['POST']),
        Route('/reports/{tenant}/{report}', report, methods=['POST']),
        Route('/jobs/{job_id}', job_status, methods=['GET']),
    ], lifespan=lifespan)


app = create_app(os.environ.get('REDIS_URL', 'redis://localhost:6379/0'))


def main(url: str) -> None:
    from starlette.testclient import TestClient

    with TestClient(create_app(url)) as client:
        first = client.post('/welcome/7')
        print(f'POST /welcome/7 -> {first.status_code} {first.json()}')
        again = client.post('/welcome/7')
        print(f'POST /welcome/7 -> {again.status_code} {again.json()}   (a welcome for user 7 already waits)')
        for name in ('q1', 'q2', 'q3'):
            answer = client.post(f'/reports/acme/{name}')
            print(f'POST /reports/acme/{name} -> {answer.status_code} {answer.json()}')
        job_id = answer.json()['job']
        status = client.get(f'/jobs/{job_id}')
        print(f'GET /jobs/{job_id} -> {status.status_code} status={status.json()["status"]}')


if __name__ == '__main__':
    if os.environ.get('REDIS_URL'):
        main(os.environ['REDIS_URL'])
    else:
        from rq_policies.surfaces.testing import RedisServer

        server = RedisServer().start()
        try:
            main(server.url)
        finally:
            server.close()
