"""The history run's workload: the queues, the job functions (one per policy shape), the resolved policies each call
carries, and the recording workers.

Every property of the history check is exercised by some job here: Loner in each ``until`` and each
``on_conflict`` (and with a ``ttl``), a QueueSlot cap (``CAPPED``), Concurrency and Rate per key, a QueueRate
(``RATED``), Throttle leading and trailing, Debounce with ``max_wait``, Fair with weights, priorities and pauses
(``FAIR``), ``enqueue_in``/``enqueue_at`` due jobs, Snooze, retries (rq's ``Retry``) and job timeouts.

A job function records ``start`` first and ``end`` last, from inside the job (its payload as passed, the policies
it was declared with as resolved for this call, its run id and the claim token its worker's fetch took); what the
job cannot see (its horse killed, rq's stop-job) the worker records instead: :class:`HistoryWorker` (forking) and
:class:`HistorySimpleWorker` (in-process), started by ``rq worker -w tests.history.jobs.HistoryWorker``. They record
each release of a claim's holds once the server acknowledged it.

A payload is a small JSON object: ``op`` (the producer's operation id, so a run names the call whose payload it
ran), ``id`` (the identity an identity policy keys on), ``key`` (a per-key policy's key, a Fair tenant), ``sleep``
(seconds the job runs), ``w`` (a Fair weight), ``fail`` (attempts that fail before one succeeds), ``retries``
(rq's ``Retry(max=...)`` it was enqueued with), ``snoozes`` (times it snoozes first).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rq import get_current_job
from rq.job import JobStatus
from rq.timeouts import JobTimeoutException

from rq_policies import (
    Concurrency,
    Debounce,
    Fair,
    Loner,
    PolicySimpleWorker,
    PolicyWorker,
    Rate,
    Snooze,
    Throttle,
    policy,
)
from tests.history import record

#: The queues, in the order workers serve them.
CAPPED = 'hq_capped'
RATED = 'hq_rated'
FAIR = 'hq_fair'
MAIN = 'hq_main'
QUEUES = (CAPPED, RATED, FAIR, MAIN)

#: QueueSlot's cap on CAPPED at the start of a run (the operator changes it: ``setting`` events).
CAP = 2
#: QueueRate on RATED: (limit, per, burst).
QUEUE_RATE = (8, 1, 2)
#: Throttle's slot, Debounce's wait and max_wait (seconds).
SLOT = 2
DEBOUNCE_WAIT, DEBOUNCE_MAX_WAIT = 1, 3
#: Loner(ttl=...) of the capped-identity kind (seconds).
LONER_TTL = 30
#: Concurrency per key (scope KEY_SCOPE): the declared limit.
KEY_LIMIT = 1
KEY_SCOPE = 'hk'
#: Rate per key (scope RATE_SCOPE): (limit, per, burst).
KEY_RATE = (3, 1, 1)
RATE_SCOPE = 'hr'
#: Fair's scope and its tenants with their declared weights.
FAIR_SCOPE = 'hf'
TENANTS = {'t0': 1, 't1': 1, 't2': 2, 't3': 3}
#: rq's Retry of the flaky kind: at most this many retries, one second apart.
RETRIES, RETRY_INTERVAL = 2, 1

#: Seconds a hold lives unrefreshed in the run's workers (``RQ_POLICIES_HOLD_TTL``, the ``lease`` of a kill), and
#: how often a running job's holds are refreshed.
HOLD_TTL = 10
MONITORING_INTERVAL = 3


def _id_of(args: tuple, kwargs: dict) -> Any:
    return args[0]['id']


def _key_of(args: tuple, kwargs: dict) -> Any:
    return args[0]['key']


def _weight_of(args: tuple, kwargs: dict) -> int:
    return args[0]['w']


#: The holder each dropped call's ``on_drop`` named, by the call's ``op`` (read by the producers).
DROPS: dict[str, str] = {}


def _note_drop(call: Any, holder: str | None) -> None:
    """``on_drop`` of every policy here: remember the holder the door named for this call."""
    payload = call.args[0] if call.args else {}
    if isinstance(payload, dict) and 'op' in payload:
        DROPS[payload['op']] = holder


# -- what a call declares, as resolved for it (``invoke`` and ``start`` carry it) ------------------------------------

def _ident(func: str, queue: str, payload: dict) -> str:
    """The identity an identity policy computes (the digest's inputs: function, queue, ``unique_context``)."""
    return f'{func}@{queue}:{payload["id"]}'


#: Per function name (the short name): its declared policies as (kind, fields without identity or key).
DECLARED: dict[str, list[tuple[str, dict[str, Any]]]] = {
    'loner_started_drop': [('loner', {'until': 'started', 'on_conflict': 'drop', 'ttl': None})],
    'loner_started_raise': [('loner', {'until': 'started', 'on_conflict': 'raise', 'ttl': None})],
    'loner_started_replace': [('loner', {'until': 'started', 'on_conflict': 'replace', 'ttl': None})],
    'loner_finished_drop': [('loner', {'until': 'finished', 'on_conflict': 'drop', 'ttl': None})],
    'loner_finished_raise': [('loner', {'until': 'finished', 'on_conflict': 'raise', 'ttl': None})],
    'loner_finished_replace': [('loner', {'until': 'finished', 'on_conflict': 'replace', 'ttl': None})],
    'loner_ttl': [('loner', {'until': 'finished', 'on_conflict': 'drop', 'ttl': LONER_TTL})],
    'throttled': [('throttle', {'slot': SLOT, 'trailing': False})],
    'trailing': [('throttle', {'slot': SLOT, 'trailing': True})],
    'debounced': [('debounce', {'wait': DEBOUNCE_WAIT, 'max_wait': DEBOUNCE_MAX_WAIT})],
    'keyed': [('concurrency', {'scope': KEY_SCOPE, 'limit': KEY_LIMIT, 'cost': 1})],
    'key_rated': [('rate', {'scope': RATE_SCOPE, 'limit': KEY_RATE[0], 'per': KEY_RATE[1], 'burst': KEY_RATE[2],
                            'cost': 1})],
    'fair': [('fair', {'scope': FAIR_SCOPE})],
    'plain': [],
    'flaky': [],
    'snoozer': [],
    'sleeper': [],
}


def resolve(func: str, queue: str, payload: dict) -> list[dict[str, Any]]:
    """The policies a call of ``func`` (its short name) on ``queue`` with ``payload`` is under, one dict per policy
    in the shape of :data:`tests.history.events.POLICY_FIELDS` (``kind`` first; ``scope`` added to the per-key
    kinds), the queue's own fetch policies included (with the values the run starts with; ``setting`` events are
    authoritative)."""
    found: list[dict[str, Any]] = []
    for kind, fields in DECLARED[func]:
        entry: dict[str, Any] = {'kind': kind}
        if kind in ('loner', 'throttle', 'debounce'):
            entry['identity'] = _ident(func, queue, payload)
        elif kind in ('concurrency', 'rate', 'fair'):
            entry['key'] = payload['key']
        entry.update(fields)
        if kind == 'fair':
            entry['weight'] = payload['w']
            entry['priority'] = payload.get('prio') or 0  # the enqueue's priority=, else Fair's default
        found.append(entry)
    if queue == CAPPED:
        found.append({'kind': 'queue_slot', 'cap': CAP})
    elif queue == RATED:
        found.append({'kind': 'queue_rate', 'limit': QUEUE_RATE[0], 'per': QUEUE_RATE[1], 'burst': QUEUE_RATE[2]})
    return found


# -- inside a job: start and end ---------------------------------------------------------------------------------

#: Set by the worker before each job (a forked horse inherits it): the worker's name, the fetch's claim token, and
#: the job's number in this worker (which names its run and a horse's file).
CONTEXT: dict[str, Any] = {}

#: The run the job function of this process is in, and whether it recorded its end (an in-process worker reads it).
LAST_RUN: dict[str, Any] = {}


class Flaky(Exception):
    """The failure the flaky kind raises on its first attempts."""


def _attempt(job: Any, payload: dict) -> int:
    retries = payload.get('retries') or 0
    left = job.retries_left
    return retries - left if retries and left is not None else 0


def _run(func: str, payload: dict) -> str:
    rec = record.here()
    job = get_current_job()
    worker = CONTEXT.get('worker')
    run = f'{worker}:{os.getpid()}:{CONTEXT.get("n", 0)}'
    attempt = _attempt(job, payload)
    LAST_RUN.clear()
    LAST_RUN.update(run=run, job=job.id, ended=False)
    rec.event('start', job=job.id, run=run, worker=worker, pid=os.getpid(), claim=CONTEXT.get('claim'),
              fetched=CONTEXT.get('fetched'), fetch=CONTEXT.get('fetch'), paid=CONTEXT.get('paid', False),
              queue=job.origin, payload=payload, attempt=attempt, policies=resolve(func, job.origin, payload))
    outcome, retry, delay, due = 'ok', False, None, None
    try:
        if payload.get('sleep'):
            time.sleep(payload['sleep'])
        snoozes = int(job.meta.get('policies_snoozes', 0))
        if snoozes < (payload.get('snoozes') or 0):
            # Due at the first whole second of the server's clock at least 1 s after the snooze (rq_policies.Snooze),
            # which the worker writes a moment after this.
            outcome, retry, delay, due = 'snoozed', True, 1, float(math.ceil(rec.now() + 1))
            raise Snooze(1)
        if attempt < (payload.get('fail') or 0):
            left = job.retries_left or 0
            outcome, retry = 'failed', left > 0
            if retry:
                # rq schedules the retry at its clock plus the interval, truncated to a whole second (the scheduled
                # registry's score, which the server's clock is compared with), a moment after this.
                delay, due = RETRY_INTERVAL, float(int(time.time() + RETRY_INTERVAL))
            raise Flaky(f'attempt {attempt} of {job.id} fails')
    except JobTimeoutException:
        outcome, retry, delay = 'timeout', bool(job.retries_left), None
        raise
    finally:
        rec.event('end', job=job.id, run=run, outcome=outcome, retry=retry, delay=delay, due=due)
        LAST_RUN['ended'] = True
    return payload.get('op', '')


def plain(payload: dict) -> str:
    return _run('plain', payload)


def sleeper(payload: dict) -> str:
    """Enqueued with a ``job_timeout`` shorter than its sleep: rq's timeout ends it (recorded as ``timeout``)."""
    return _run('sleeper', payload)


def flaky(payload: dict) -> str:
    """Enqueued with rq's ``Retry(max=RETRIES, interval=RETRY_INTERVAL)``; fails its first ``fail`` attempts."""
    return _run('flaky', payload)


def snoozer(payload: dict) -> str:
    """Raises ``Snooze(1)`` its first ``snoozes`` runs (same job, no retry used)."""
    return _run('snoozer', payload)


@policy(Loner(), unique_context=_id_of, on_drop=_note_drop)
def loner_started_drop(payload: dict) -> str:
    return _run('loner_started_drop', payload)


@policy(Loner(on_conflict='raise'), unique_context=_id_of, on_drop=_note_drop)
def loner_started_raise(payload: dict) -> str:
    return _run('loner_started_raise', payload)


@policy(Loner(on_conflict='replace'), unique_context=_id_of, on_drop=_note_drop)
def loner_started_replace(payload: dict) -> str:
    return _run('loner_started_replace', payload)


@policy(Loner(until='finished'), unique_context=_id_of, on_drop=_note_drop)
def loner_finished_drop(payload: dict) -> str:
    return _run('loner_finished_drop', payload)


@policy(Loner(until='finished', on_conflict='raise'), unique_context=_id_of, on_drop=_note_drop)
def loner_finished_raise(payload: dict) -> str:
    return _run('loner_finished_raise', payload)


@policy(Loner(until='finished', on_conflict='replace'), unique_context=_id_of, on_drop=_note_drop)
def loner_finished_replace(payload: dict) -> str:
    return _run('loner_finished_replace', payload)


@policy(Loner(until='finished', ttl=LONER_TTL), unique_context=_id_of, on_drop=_note_drop)
def loner_ttl(payload: dict) -> str:
    return _run('loner_ttl', payload)


@policy(Throttle(SLOT), unique_context=_id_of, on_drop=_note_drop)
def throttled(payload: dict) -> str:
    return _run('throttled', payload)


@policy(Throttle(SLOT, trailing=True), unique_context=_id_of, on_drop=_note_drop)
def trailing(payload: dict) -> str:
    return _run('trailing', payload)


@policy(Debounce(DEBOUNCE_WAIT, max_wait=DEBOUNCE_MAX_WAIT), unique_context=_id_of, on_drop=_note_drop)
def debounced(payload: dict) -> str:
    return _run('debounced', payload)


@policy(Concurrency(KEY_LIMIT, key=_key_of, scope=KEY_SCOPE), on_drop=_note_drop)
def keyed(payload: dict) -> str:
    return _run('keyed', payload)


@policy(Rate(KEY_RATE[0], per=KEY_RATE[1], burst=KEY_RATE[2], key=_key_of, scope=RATE_SCOPE), on_drop=_note_drop)
def key_rated(payload: dict) -> str:
    return _run('key_rated', payload)


@policy(Fair(key=_key_of, weight=_weight_of, scope=FAIR_SCOPE), on_drop=_note_drop)
def fair(payload: dict) -> str:
    return _run('fair', payload)


# -- the recording workers -----------------------------------------------------------------------------------------

def _run_in_file(path: Path, run: str | None = None) -> tuple[dict | None, bool]:
    """The ``start`` event of the (last) run recorded in ``path`` (a horse's file), and whether it recorded its
    end; a torn last line (the horse killed mid-write) is skipped."""
    start, ended = None, False
    try:
        lines = path.read_text(encoding='utf-8').splitlines()
    except OSError:
        return None, False
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get('e') == 'start' and (run is None or event.get('run') == run):
            start, ended = event, False
        elif event.get('e') == 'end' and start is not None and event.get('run') == start['run']:
            ended = True
    return start, ended


#: The job hash field a rate-parked job carries once it was given back with its start paid for
#: (``lua/policies/key_rate.lua``); its fetch takes it without paying again.
RATE_PAID_FIELD = 'policies_key_rate_paid'

#: The ids of the jobs this worker's fetches found with their start already paid (read from the hash each fetch
#: hands the worker, before the job is built from it).
PAID: set[str] = set()


def watch_paid() -> None:
    """Note each fetched job whose start was paid for when it was given back (a rate-parked job): its Rate start was
    decided then, before the fetch that took it. Read from the job hash the fetch returned, where the worker builds
    the job (``rq_policies.engine.fetch._job``); without that function (a later layout), nothing is noted."""
    from rq_policies.engine import fetch

    original = getattr(fetch, '_job', None)
    if original is None or getattr(original, 'records_history', False):
        return

    def build(job_class: Any, claim: Any, connection: Any, serializer: Any) -> Any:
        raw = claim.raw or {}
        if RATE_PAID_FIELD in raw or RATE_PAID_FIELD.encode() in raw:
            PAID.add(claim.job_id)
        return original(job_class, claim, connection, serializer)

    build.records_history = True  # type: ignore[attr-defined]
    fetch._job = build


#: When each claim token of this worker was made (this host's clock): just before the first fetch sent under it. A
#: fetch whose reply was lost is sent again under the same token (its claim record answers), so the job it took was
#: decided after the first send, not the one whose reply came back.
TOKEN_BORN: dict[str, float] = {}


def watch_tokens() -> None:
    """Note the time each fetch's claim token is made (``rq_policies.engine.ledger.claim_token``, which the fetch
    calls once per new fetch and not for a replay)."""
    from rq_policies.engine import ledger

    original = ledger.claim_token
    if getattr(original, 'records_history', False):
        return

    def claim_token() -> str:
        made = original()
        if len(TOKEN_BORN) > 10000:  # the tokens of fetches that took nothing (an idle worker's looks) are never read
            for old in list(TOKEN_BORN)[:5000]:
                del TOKEN_BORN[old]
        TOKEN_BORN[made] = time.time()
        return made

    claim_token.records_history = True  # type: ignore[attr-defined]
    ledger.claim_token = claim_token


class HistoryMixin:
    """What both recording workers add to their PolicyWorker class: the worker's own history file (``p`` is the rq
    worker name, ``rq worker --name worker-3``), the context a job's ``start`` reads, the ``end`` of a run the job
    could not record, and each acknowledged ``release``."""

    #: As the soak's workers: holds refreshed every 3 s, so a hold TTL short enough for a killed worker's capacity to
    #: come back within a run (``RQ_POLICIES_HOLD_TTL``, set by the runner) is longer than the interval.
    monitoring_interval = MONITORING_INTERVAL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs['job_monitoring_interval'] = self.monitoring_interval
        super().__init__(*args, **kwargs)
        self._recording: record.Recorder | None = None
        self._jobs_run = 0
        self._fetch_returned = 0.0  # this host's clock when the last fetch's reply came back
        watch_paid()
        watch_tokens()

    @property
    def _recorder(self) -> record.Recorder:
        """The worker's recorder, made (its ``hello`` written) at its first fetch: the worker exists for the history
        once it fetches, not while it starts (imports, connects, registers, loads the scripts), which the checker
        would take for a worker idle while due jobs wait."""
        if self._recording is None:
            self._recording = record.from_env(self.name, 'worker', worker=self.name,
                                              queues=[queue.name for queue in self.queues])
        return self._recording

    # -- a job's context and its end ------------------------------------------------------------------------------

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        self._recorder  # noqa: B018 - the hello, before the first fetch is sent
        try:
            return super().dequeue_job_and_maintain_ttl(*args, **kwargs)
        finally:
            self._fetch_returned = time.time()

    def execute_job(self, job: Any, queue: Any) -> Any:
        self._jobs_run += 1
        claim = self._policy_fetcher.claim
        ours = claim is not None and claim.job_id == job.id
        token = claim.token if ours else None
        # The fetch that took the job: just before it was first sent (a replay after a lost reply answers what the
        # first send took) and just after its reply, in server time (the server decided the start, took the hold,
        # paid the rate, inside that window).
        from rq_policies.engine import keys

        fetch = claim.record[len(keys.claim('')):] if ours and claim.record else None
        offset = self._recorder.clock.offset
        sent = min(TOKEN_BORN.pop(fetch, claim.fetched_after), claim.fetched_after) if ours else 0.0
        fetched = ([round(sent + offset, 6), round(self._fetch_returned + offset, 6)]
                   if ours and claim.fetched_after else None)
        CONTEXT.clear()
        CONTEXT.update(worker=self.name, claim=token, n=self._jobs_run, fetched=fetched, fetch=fetch,
                       paid=job.id in PAID)
        PAID.discard(job.id)
        LAST_RUN.clear()
        horse = self._horse_name(self._jobs_run)
        if horse is not None:
            self._recorder.child(horse, 'horse', worker=self.name)
        try:
            return super().execute_job(job, queue)
        finally:
            self._record_unseen_end(job, horse)

    def _horse_name(self, n: int) -> str | None:
        """The history name of the process that runs job ``n`` (a forked horse's own file), None in-process."""
        return None

    def _record_unseen_end(self, job: Any, horse: str | None) -> None:
        """A run the job function started but did not end (its horse killed, rq's timeout in C code, stop-job): the
        worker records its end, with the outcome rq gave the job."""
        if horse is not None:
            start, ended = _run_in_file(self._recorder.folder / f'{horse}.jsonl')
            run = start['run'] if start is not None else None
        else:
            run, ended = LAST_RUN.get('run'), LAST_RUN.get('ended', False)
            if LAST_RUN.get('job') != job.id:
                run = None
        if run is None or ended:
            return
        outcome, retry = 'failed', None
        try:
            status = job.get_status(refresh=True)
            if getattr(self, '_stopped_job_id', None) == job.id:
                outcome = 'stopped'
            elif status == JobStatus.STOPPED:
                outcome = 'stopped'
            retry = status in (JobStatus.QUEUED, JobStatus.SCHEDULED)
        except Exception:  # the server is away: the outcome stays unknown
            self._recorder.reconnected()
        self._recorder.event('end', job=job.id, run=run, outcome=outcome, retry=retry, delay=None, due=None,
                             by='worker')

    # -- releases -------------------------------------------------------------------------------------------------

    def _note_released(self, pending: list) -> None:
        for claim in pending:
            if claim not in self._pending_releases:
                self._recorder.event('release', job=claim.job_id, claim=claim.token)

    def heartbeat(self, timeout: Any = None, pipeline: Any = None) -> None:
        pending = list(self._pending_releases) if pipeline is None else []
        try:
            super().heartbeat(timeout, pipeline=pipeline)
        finally:
            self._note_released(pending)

    def _flush_release(self, grace: float = 0.0) -> None:
        pending = list(self._pending_releases)
        try:
            super()._flush_release(grace)
        finally:
            self._note_released(pending)

    def _through_outage(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        from rq_policies.engine.worker_mixin import UNREACHABLE

        met = []

        def watched(*a: Any, **k: Any) -> Any:
            try:
                return call(*a, **k)
            except UNREACHABLE:
                met.append(True)
                raise

        try:
            return super()._through_outage(watched, *args, **kwargs)
        finally:
            if met and self._recording is not None:
                self._recording.reconnected()  # the server was away: measure the clock again once it answers


class HistoryWorker(HistoryMixin, PolicyWorker):
    """The run's forking worker: ``rq worker -w tests.history.jobs.HistoryWorker --name worker-N ...``."""

    def _horse_name(self, n: int) -> str | None:
        index = self.name.rsplit('-', 1)[-1]
        return f'horse-{index}-{n}'


class HistorySimpleWorker(HistoryMixin, PolicySimpleWorker):
    """The run's in-process worker: ``rq worker -w tests.history.jobs.HistorySimpleWorker --name worker-N ...``."""


#: Every job function by its short name.
FUNCTIONS = {name: globals()[name] for name in DECLARED}
