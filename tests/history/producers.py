"""The history run's producers: processes that call the doors of a ``PolicyQueue`` (sync) or an
``AsyncPolicyQueue`` (asyncio) with the workload of :mod:`tests.history.jobs`, recording each call as Jepsen does:
``invoke`` before, then ``ok`` (with the door's verdict), ``fail`` (certainly not applied) or ``info`` (unknown: a
timeout, a connection error) after.

    python -m tests.history.producers --index 2 --connect single:redis://127.0.0.1:7000/0 --seed 9 \\
        --until 1700000000 --quota 1000 [--asyncio] [--rate 20]

``--connect`` names the topology's way in: ``single:URL`` (through the fault proxy, with a retrying client),
``sentinel:HOST:PORT,HOST:PORT/MASTER`` or ``cluster:URL``. The history's folder, clock and topology come from the
environment (:mod:`tests.history.record`). The producer stops at ``--until`` (epoch seconds) or after ``--quota``
calls (a batch or a burst counts each of its calls), or once ``--stop-file`` exists, whichever comes first.

The verdict of an ``ok`` is what the door returned, read as a user reads it: None is ``dropped`` (with the holder
the policy's ``on_drop`` named), ``DuplicateJob`` is ``raised`` (its ``holder``), a job whose id is not the one the
call chose is ``replaced`` (the waiting or pending job took the payload in place), and otherwise the job's status
after the door: ``scheduled`` (a due job, a debounced or trailing one), ``parked`` (a Fair job waiting in its key's
line, status deferred) or ``admitted``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from rq import Retry
from rq.decorators import job as job_decorator
from rq.job import JobStatus

from rq_policies import DuplicateJob, InvalidArgument, PolicyQueue
from rq_policies.engine.exceptions import PolicyConfigurationError
from tests.history import jobs, record

#: Seconds a producer's call waits for a reply before its client resends (a reply held longer is a lost reply).
SOCKET_TIMEOUT = 1.0

#: The functions whose admitted job may be a pending one, rewritten in place by later calls (the door's ``due``).
PENDING = ('debounced', 'trailing')

#: Errors that say the call was certainly not applied (refused before anything was sent).
REFUSED = (InvalidArgument, PolicyConfigurationError, ValueError, TypeError)


# -- connections ----------------------------------------------------------------------------------------------------

def connect(spec: str, use_asyncio: bool = False) -> Any:
    """The client ``spec`` names (see the module docstring), synchronous or asyncio, as production clients are
    built: retrying a call whose connection dropped or whose reply did not come in ``SOCKET_TIMEOUT``."""
    kind, _, where = spec.partition(':')
    if kind == 'single':
        if use_asyncio:
            from redis.asyncio import Redis as AsyncRedis
            from redis.asyncio.retry import Retry as AsyncRetry
            from redis.backoff import ExponentialBackoff

            return AsyncRedis.from_url(where, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=2,
                                       retry=AsyncRetry(ExponentialBackoff(cap=0.05, base=0.01), 3))
        from redis import Redis

        from tests.helpers.faultproxy import retrying

        return Redis.from_url(where, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=2, retry=retrying())
    if kind == 'sentinel':
        addresses, _, master = where.rpartition('/')
        instances = record.parse_addresses(addresses)
        if use_asyncio:
            from redis.asyncio.sentinel import Sentinel as AsyncSentinel

            return AsyncSentinel(instances, socket_timeout=SOCKET_TIMEOUT).master_for(
                master, socket_timeout=SOCKET_TIMEOUT)
        from redis.sentinel import Sentinel

        from tests.helpers.faultproxy import retrying

        return Sentinel(instances, socket_timeout=SOCKET_TIMEOUT).master_for(
            master, socket_timeout=SOCKET_TIMEOUT, retry=retrying())
    if kind == 'cluster':
        if use_asyncio:
            from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

            return AsyncRedisCluster.from_url(where, socket_timeout=SOCKET_TIMEOUT)
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(where, socket_timeout=SOCKET_TIMEOUT)
    raise ValueError(f'--connect must be single:URL, sentinel:HOST:PORT,.../MASTER or cluster:URL, got {spec!r}')


# -- the workload: what one call is -------------------------------------------------------------------------------

class Call:
    """One door call to make: the function (its short name), the queue, the payload, and the door's options."""

    def __init__(self, func: str, queue: str, payload: dict, door: str = 'enqueue', delay: float | None = None,
                 priority: int | None = None, options: dict | None = None) -> None:
        self.func, self.queue, self.payload, self.door = func, queue, payload, door
        self.delay, self.priority, self.options = delay, priority, dict(options or {})
        self.due: float | None = None


def _sleep(rng: random.Random) -> float:
    """How long a job runs: mostly a blink, sometimes long enough for a kill or a stop to catch it running."""
    roll = rng.random()
    if roll < 0.85:
        return round(rng.uniform(0, 0.01), 3)
    if roll < 0.98:
        return round(rng.uniform(0.05, 0.2), 3)
    return round(rng.uniform(0.5, 1.5), 3)


def choose(rng: random.Random) -> list[Call]:
    """The next call(s) of a producer (a burst of several for the kinds whose point is many calls at once); their
    payloads get their ``op`` from :meth:`Producer.next_calls`."""
    base = {'op': None, 'sleep': _sleep(rng)}

    def payload(**more: Any) -> dict:
        return {**base, **more}

    roll = rng.random()
    if roll < 0.18:
        return [Call('plain', jobs.MAIN, payload(id=None, key=None))]
    if roll < 0.28:
        return [Call('plain', jobs.CAPPED, payload(id=None, key=None, sleep=round(rng.uniform(0.02, 0.2), 3)))]
    if roll < 0.34:
        return [Call('plain', jobs.RATED, payload(id=None, key=None))]
    if roll < 0.46:
        func = rng.choice(['loner_started_drop', 'loner_started_raise', 'loner_started_replace',
                           'loner_finished_drop', 'loner_finished_raise', 'loner_finished_replace', 'loner_ttl'])
        return [Call(func, jobs.MAIN, payload(id=f'i{rng.randrange(3)}', key=None))]
    if roll < 0.55:
        func = rng.choice(['throttled', 'trailing', 'debounced'])
        ident = f'i{rng.randrange(3)}'
        return [Call(func, jobs.MAIN, payload(id=ident, key=None)) for _ in range(rng.randrange(1, 4))]
    if roll < 0.63:
        return [Call('keyed', jobs.MAIN, payload(id=None, key=f'ck{rng.randrange(3)}'))]
    if roll < 0.69:
        return [Call('key_rated', jobs.MAIN, payload(id=None, key=f'rk{rng.randrange(2)}'))]
    if roll < 0.80:
        tenant = rng.choice(list(jobs.TENANTS))
        return [Call('fair', jobs.FAIR, payload(id=None, key=tenant, w=jobs.TENANTS[tenant]),
                     priority=rng.choice((None, 0, 5, 10)))
                for _ in range(rng.randrange(1, 5))]
    if roll < 0.90:  # due jobs: plain, on the capped queue, per key, a scheduled Loner
        func, queue, key, ident = rng.choice((('plain', jobs.MAIN, None, None), ('plain', jobs.CAPPED, None, None),
                                              ('keyed', jobs.MAIN, f'ck{rng.randrange(3)}', None),
                                              ('loner_started_drop', jobs.MAIN, None, f'd{rng.randrange(3)}')))
        door = rng.choice(('enqueue_in', 'enqueue_at'))
        return [Call(func, queue, payload(id=ident, key=key), door=door, delay=rng.choice((1, 2, 3)))]
    if roll < 0.94:
        fails = rng.choice((1, 1, 2, 3))  # 3: every attempt fails, and the job ends failed
        return [Call('flaky', jobs.MAIN, payload(id=None, key=None, fail=fails, retries=jobs.RETRIES),
                     options={'retry': Retry(max=jobs.RETRIES, interval=jobs.RETRY_INTERVAL)})]
    if roll < 0.99:
        return [Call('snoozer', jobs.MAIN, payload(id=None, key=None, snoozes=rng.choice((1, 2))))]
    return [Call('sleeper', jobs.MAIN, payload(id=None, key=None, sleep=1.5), options={'job_timeout': 1})]


# -- the recording around a door call -----------------------------------------------------------------------------

#: The admission script's verdict (``rq_policies.admission.Verdict``) of each call of this process, by its ``op``:
#: what the door decided with, read where every door reads it (:func:`capture_verdicts`).
VERDICTS: dict[str, Any] = {}


def capture_verdicts() -> None:
    """Note each admission's :class:`~rq_policies.engine.admission.Verdict` by the call's ``op``, as every door (sync,
    asyncio, each job of ``enqueue_many``, a probe that drops) decides it: the server's instant of the decision
    (``now``), a pending job's run time, the deciding policy. Through the engine's door observers
    (:mod:`rq_policies.engine.events`), which read the door's own data and change nothing."""
    from rq_policies.engine import events

    events.observe(door=_observe_door)


def _observe_door(event: str, plan: Any, detail: Any, state: Any) -> None:
    verdict = detail if event == 'decided' else getattr(plan, 'verdict', None)
    if event == 'planned' or verdict is None:
        return
    write = getattr(plan, 'write', None)
    if write is not None:
        args = write.job.args
    else:  # a probe: the call it was made for
        caller = getattr(plan, 'caller', None)
        args = caller[2] if caller else ()
    payload = args[0] if args else None
    if isinstance(payload, dict) and payload.get('op'):
        VERDICTS[payload['op']] = verdict


def verdict_of(result: Any, chosen: str, delayed: bool) -> tuple[str, str | None]:
    """The verdict of a door that returned ``result`` for a call that chose job id ``chosen`` (``delayed``: an
    ``enqueue_in``/``enqueue_at``), and the job id now waiting for the call: ``scheduled`` is a pending job (a
    Debounce's, a trailing Throttle's), not a job the call itself asked to run later (that one is ``admitted``)."""
    if result is None:
        return 'dropped', None
    if result.id != chosen:
        return 'replaced', result.id
    status = result.get_status(refresh=False)
    if status == JobStatus.SCHEDULED and not delayed:
        return 'scheduled', result.id
    if status == JobStatus.DEFERRED:
        return 'parked', result.id
    return 'admitted', result.id


class Producer:
    """One producer process's calls and their records (the sync and the asyncio producer share it)."""

    def __init__(self, rec: record.Recorder, seed: int, quota: int, until: float, rate: float,
                 stop_file: Path | None = None, only: list[str] | None = None) -> None:
        self.rec, self.rng, self.quota, self.until, self.rate = rec, random.Random(seed), quota, until, rate
        self.stop_file = stop_file
        self.only = set(only or ())
        self.count = 0  # door calls made (a batch or a burst counts each of its calls)
        self._stopped = False
        self._next_look = 0.0

    def done(self) -> bool:
        if self.count >= self.quota or time.time() >= self.until:
            return True
        if self.stop_file is not None and time.monotonic() >= self._next_look:
            self._next_look = time.monotonic() + 0.5
            self._stopped = self._stopped or self.stop_file.exists()
        return self._stopped

    def next_calls(self) -> list[Call]:
        """The next door call(s), each with an ``op`` of its own (``<p>:<n>``, n counting this producer's calls)."""
        calls = choose(self.rng)
        while self.only and calls[0].func not in self.only:  # a focused run: only the functions asked for
            calls = choose(self.rng)
        if len(calls) == 1 and calls[0].door == 'enqueue' and not calls[0].options:
            roll = self.rng.random()
            if roll < 0.1:
                calls[0].door = 'delay'
                calls[0].priority = None  # .delay() and enqueue_many take no priority=: the job gets its default
            elif roll < 0.2 and not calls[0].func.endswith('_raise'):
                # A batch: this call and more of the same queue (enqueue_many takes no options). A raise would end
                # the batch half-written (each of its calls then unknown), so raising kinds stay out of it.
                more = [choose(self.rng) for _ in range(self.rng.randrange(1, 4))]
                calls += [c[0] for c in more if len(c) == 1 and c[0].door == 'enqueue' and not c[0].options
                          and c[0].queue == calls[0].queue and not c[0].func.endswith('_raise')
                          and (not self.only or c[0].func in self.only)]
                for call in calls:
                    call.door = 'enqueue_many'
                    call.priority = None
        for call in calls:
            self.count += 1
            call.payload['op'] = f'{self.rec.p}:{self.count}'
            if call.func == 'fair':
                call.payload['prio'] = call.priority  # the job reads its resolved priority from its payload
        return calls

    def pause(self) -> float:
        return self.rng.expovariate(self.rate) if self.rate > 0 else 0.0

    def invoke(self, call: Call, door: str | None = None) -> str:
        """Record ``invoke`` for ``call``; returns the job id it chooses."""
        op = call.payload['op']
        job_id = op.replace(':', '-')  # rq takes letters, digits, - and _
        if call.delay is not None:
            # rq scores a scheduled job in whole seconds of the caller's clock (truncated), and the fetch promotes it
            # once the server's clock reaches that score: the due time, in server time, is the score itself. For
            # enqueue_in, rq reads its clock after this one: the score is this or, across a second's edge, one more.
            call.due = float(int(time.time() + call.delay))
        self.rec.event('invoke', op=op, door=door or call.door, queue=call.queue, job=job_id, func=call.func,
                       payload=call.payload, due=call.due, priority=call.priority,
                       policies=jobs.resolve(call.func, call.queue, call.payload))
        return job_id

    def complete(self, call: Call, job_id: str, result: Any = None, error: BaseException | None = None,
                 unknown: bool = False) -> None:
        """Record the call's completion: ``ok`` with its verdict (and what the admission script answered:
        ``now``, a pending job's ``due``, the deciding ``policy``), ``fail`` (refused before anything was sent),
        or ``info`` (unknown: an error after the call may have been sent, or ``unknown``)."""
        op = call.payload['op']
        holder = jobs.DROPS.pop(op, None)
        found = VERDICTS.pop(op, None)
        facts: dict[str, Any] = {}
        if found is not None:
            facts['now'] = found.server_now or None
            if found.dropped:
                facts['dropped_jobs'] = [job for _, job in found.dropped]
        if unknown and error is not None:
            self.rec.event('info', op=op, error=repr(error)[:200])
            self.rec.reconnected()
        elif error is None:
            verdict, waiting = verdict_of(result, job_id, call.delay is not None)
            if found is not None and verdict in ('dropped', 'raised'):
                facts['policy'] = found.policy or None
                holder = holder or found.job_id or None
            if found is not None and (verdict == 'scheduled' or (verdict == 'replaced' and found.number
                                                                 and call.func in PENDING)):
                facts['due'] = found.number
            self.rec.event('ok', op=op, verdict=verdict, job=waiting, holder=holder if verdict == 'dropped' else None,
                           **facts)
        elif isinstance(error, DuplicateJob):
            if found is not None:
                facts['policy'] = found.policy or None
            self.rec.event('ok', op=op, verdict='raised', job=None, holder=error.holder, **facts)
        elif isinstance(error, REFUSED):
            self.rec.event('fail', op=op, error=repr(error)[:200])
        else:
            self.rec.event('info', op=op, error=repr(error)[:200])
            self.rec.reconnected()

    def kwargs(self, call: Call, job_id: str) -> dict:
        found = dict(call.options, job_id=job_id)
        if call.priority is not None:
            found['priority'] = call.priority
        return found


def _when(call: Call) -> datetime:
    return datetime.fromtimestamp(call.due if call.due is not None else time.time(), timezone.utc)


def run_sync(producer: Producer, conn: Any) -> None:
    queues = {name: PolicyQueue(name, connection=conn) for name in jobs.QUEUES}
    while not producer.done():
        calls = producer.next_calls()
        door = calls[0].door
        if door == 'enqueue_many':
            ids = [producer.invoke(call) for call in calls]
            queue = queues[calls[0].queue]
            try:
                results = queue.enqueue_many([PolicyQueue.prepare_data(jobs.FUNCTIONS[call.func], (call.payload,),
                                                                       job_id=job_id)
                                              for call, job_id in zip(calls, ids)])
            except Exception as exc:  # some of the batch may have been written before the error: each is unknown
                for call, job_id in zip(calls, ids):
                    producer.complete(call, job_id, error=exc, unknown=True)
            else:
                for call, job_id, result in zip(calls, ids, results):
                    producer.complete(call, job_id, result)
        else:
            for call in calls:
                job_id = producer.invoke(call)
                queue, func = queues[call.queue], jobs.FUNCTIONS[call.func]
                try:
                    if call.door == 'enqueue_in':
                        result = queue.enqueue_in(timedelta(seconds=call.delay), func, call.payload,
                                                  **producer.kwargs(call, job_id))
                    elif call.door == 'enqueue_at':
                        result = queue.enqueue_at(_when(call), func, call.payload, **producer.kwargs(call, job_id))
                    elif call.door == 'delay':
                        result = job_decorator(queue, connection=conn)(func).delay(call.payload, job_id=job_id)
                    else:
                        result = queue.enqueue(func, call.payload, **producer.kwargs(call, job_id))
                except Exception as exc:
                    producer.complete(call, job_id, error=exc)
                    time.sleep(0.2)  # a server away: do not spin
                else:
                    producer.complete(call, job_id, result)
        time.sleep(producer.pause())


async def run_asyncio(producer: Producer, conn: Any, tasks: int = 3) -> None:
    from rq_policies.surfaces.aio import AsyncPolicyQueue

    queues = {name: AsyncPolicyQueue(name, connection=conn) for name in jobs.QUEUES}

    async def loop() -> None:
        while not producer.done():
            for call in producer.next_calls():
                job_id = producer.invoke(call, door='aio')
                queue, func = queues[call.queue], jobs.FUNCTIONS[call.func]
                try:
                    if call.door == 'enqueue_in':
                        result = await queue.enqueue_in(timedelta(seconds=call.delay), func, call.payload,
                                                        **producer.kwargs(call, job_id))
                    elif call.door == 'enqueue_at':
                        result = await queue.enqueue_at(_when(call), func, call.payload,
                                                        **producer.kwargs(call, job_id))
                    else:
                        result = await queue.enqueue(func, call.payload, **producer.kwargs(call, job_id))
                except Exception as exc:
                    producer.complete(call, job_id, error=exc)
                    await asyncio.sleep(0.2)
                else:
                    producer.complete(call, job_id, result)
            await asyncio.sleep(producer.pause() * tasks)

    try:
        await asyncio.gather(*(loop() for _ in range(tasks)))
    finally:
        await conn.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--index', type=int, required=True)
    parser.add_argument('--connect', required=True)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--until', type=float, required=True, help='stop at this epoch time')
    parser.add_argument('--quota', type=int, default=10 ** 9, help='stop after this many calls')
    parser.add_argument('--rate', type=float, default=10.0, help='calls a second, on average')
    parser.add_argument('--asyncio', action='store_true', help='the asyncio doors (AsyncPolicyQueue)')
    parser.add_argument('--stop-file', type=Path, help='stop once this file exists (looked for twice a second)')
    parser.add_argument('--only', help='only calls of these job functions, comma-separated (a focused run)')
    opts = parser.parse_args(argv)
    rec = record.from_env(f'producer-{opts.index}', 'producer', asyncio=opts.asyncio)
    capture_verdicts()
    producer = Producer(rec, opts.seed, opts.quota, opts.until, opts.rate, opts.stop_file,
                        opts.only.split(',') if opts.only else None)
    if opts.asyncio:
        asyncio.run(run_asyncio(producer, connect(opts.connect, use_asyncio=True)))
    else:
        run_sync(producer, connect(opts.connect))
    rec.close()


if __name__ == '__main__':
    main()
