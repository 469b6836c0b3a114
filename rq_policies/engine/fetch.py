"""The fetch: how a PolicyWorker takes its next job, through every fetch policy, in one script.

``lua/fetch.lua`` first promotes the due jobs of the queues' scheduled registries, by the server's clock (see
:func:`fetch_call` and lua/lib/promote.lua), then pops in the worker's queue order and asks each fetch policy's Lua part
(``gate``) whether a queue may be taken from now; after the pop it runs every policy's ``taken`` hook (a loner frees its
identity) and each fetch policy's ``take`` (a cap's hold). The Python side here builds that call from the registry
(:meth:`rq_policies.engine.protocols.FetchSide.fetch_keys`), turns the reply into a :class:`Claim`, and waits when
nothing can be taken. :meth:`rq_policies.PolicyQueue.dequeue_any` delegates here, inside a PolicyWorker only: a worker
installs its :class:`Fetcher` in :data:`current_fetcher` around each fetch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions
from rq.exceptions import DequeueTimeout, NoSuchJobError
from rq.executions import ExecutionRegistry
from rq.job import Job, parse_job_id
from rq.queue import Queue
from rq.registry import DeferredJobRegistry, ScheduledJobRegistry
from rq.scheduler import RQScheduler

from . import compat, events, keys, ledger
from .admission import ending as admission_ending
from .compat import SCHEDULER_RATE_LIMITS
from .ledger import Hold
from .ops import Call, pack, text
from .policy import FETCH, by_name, registered

#: How long an idle PolicyWorker waits for a wake-up before it looks again (seconds). Admissions and releases wake
#: it at once over pub/sub; this bounds the delay for jobs pushed by stock rq producers or schedulers, which do not
#: publish, and for holds that expired because their worker died.
IDLE_POLL_SECONDS = 1.0

#: The longest an idle worker goes without looking again at queues it found full (see :meth:`Fetcher.relook_seconds`).
IDLE_RELOOK_MAX_SECONDS = 10.0


#: Due scheduled jobs a fetch promotes at most (oldest first, over its queues in order): a fetch costs the same however
#: many are due; the next fetches promote the rest.
PROMOTE_BATCH = 100

#: The value promotion writes to rq's scheduler lock of a queue it promotes (``rq:scheduler-lock:<queue>``): rq's
#: schedulers see the queue taken, as by another scheduler, and leave it to the PolicyWorkers.
PROMOTE_OWNER = 'rq-policies'

#: Seconds promotion's lock lives (rq's own: its scheduler's interval + 60), refreshed by a promoting fetch once less
#: than ``PROMOTE_LOCK_TTL - 10`` are left.
PROMOTE_LOCK_TTL = 61

#: A scheduler's lock not refreshed for this many seconds (rq refreshes it to interval + 60 s every interval) belongs
#: to a scheduler that died (as it does on a connection error) or stopped: promotion takes the queue over.
PROMOTE_STALE_SECONDS = 5


def promote_args() -> dict[str, Any]:
    """The ``promote`` argument of ``lua/fetch.lua`` (see lua/lib/promote.lua)."""
    return {
        'batch': PROMOTE_BATCH, 'owner': PROMOTE_OWNER, 'lock_ttl': PROMOTE_LOCK_TTL, 'refresh': 10,
        'stale': PROMOTE_STALE_SECONDS, 'timeout': Queue.DEFAULT_TIMEOUT, 'rate_limited': SCHEDULER_RATE_LIMITS,
        'deferred': DeferredJobRegistry.key_template.format(''),
    }


@dataclass
class Claim:
    """What one fetch took: the job, the queue and the holds its fetch policies took with it (none when uncapped)."""

    job_id: str
    queue_name: str
    holds: tuple[Hold, ...] = ()
    #: Wall-clock time just before the fetch that took the job: the job stopped waiting after this instant.
    fetched_after: float = 0.0
    #: The fetch's claim record (``rq:policies:claim:<token>``): needed until the reply arrived (a replay answers it)
    #: and, while it lives, the fetch's take is live (:func:`hand_back`), so the worker deletes it with the pipeline
    #: that starts the job; it expires by itself (the worker's ``hold_ttl``) anyway.
    record: str = ''
    #: The job hash as the fetch read it (HGETALL), for building the job without reading it again; None when the
    #: reply carried none (a replay).
    raw: dict[Any, Any] | None = field(default=None, repr=False, compare=False)
    #: The admission policies whose end-of-run release may have work for this job (``admission.ending``, read from
    #: ``raw``); None when unknown (a replay): the end of its run then runs every one.
    ending: tuple[str, ...] | None = field(default=None, repr=False, compare=False)
    #: The claim token of the fetch that took the job (its holds carry it too, when it took any): it names the take
    #: the fetch noted (``rq:policies:taken:<queue>``), which the worker asks about before it starts the job.
    fetch_token: str = field(default='', repr=False, compare=False)

    @property
    def token(self) -> str | None:
        """The claim token naming the claim's holds, or None when it took none."""
        return self.holds[0].token if self.holds else None


@dataclass
class Look:
    """What one run of the fetch script found when it took nothing."""

    #: How many skipped queues still have jobs (a burst worker waits for them instead of quitting).
    waiting: int = 0
    #: The names of the queues skipped (full): a push to one of them is no news for an idle worker.
    full: frozenset[str] = field(default_factory=frozenset)
    #: The earliest server time (epoch s) a gate skipped a queue until, or None: nothing can change before it.
    until: float | None = None


#: Errors that say the server could not be reached (or is a replica for now): the outcome of a call is unknown.
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, redis.exceptions.ReadOnlyError)

logger = logging.getLogger('rq_policies')


class Fetcher:
    """Per-worker fetch state: the claim just made, the hold ttl, and the idle wait.

    PolicyWorker installs its own (with a pub/sub wake-up) around each fetch; without one,
    ``PolicyQueue.dequeue_any`` is rq's own.
    """

    hold_ttl: int = ledger.TTL_SECONDS

    #: Promote due scheduled jobs inside the fetch (see :func:`fetch_call`).
    promote: bool = True

    #: How often the estimate of the server's clock (:meth:`server_now`) is measured again (seconds).
    CLOCK_CHECK_SECONDS = 60.0

    def __init__(self) -> None:
        self.claim: Claim | None = None
        self._clock: tuple[float, float] | None = None  # (server minus local clock, local time measured)
        #: Claim records whose reply has arrived, to be deleted with the worker's next pipeline.
        self.records: list[str] = []
        #: The earliest due time (server clock) announced or probed during the current idle wait.
        self.due_at: float | None = None
        #: The claim token of a fetch whose outcome this worker never saw (the reply, or the job's hash after it,
        #: was lost to an unreachable server): the next fetch sends it again, so the claim record answers the job
        #: that fetch took, with its holds, instead of a new token popping a second job and stranding the first
        #: on the intermediate list until rq's cleanup fails it unrun.
        self.resume_token: str | None = None
        #: The queues of the fetch ``resume_token`` names, in its order (its claim record names a queue by index).
        self.resume_queues: Sequence[Queue] = ()
        #: The claim whose job this worker has fetched and not started yet: its take (``rq:policies:taken:<queue>``)
        #: is live while its claim record lives, so the record is kept until the job starts (:func:`hand_back`).
        self.starting: Claim | None = None
        #: Whether the take of ``starting`` was still this worker's once rq wrote the job's execution
        #: (``lua/claim_start.lua``): None until that answer is read.
        self.start_state: bool | None = None
        #: ``(job id, start time)`` of the job ``lua/start.lua`` started on rq's prepare_execution pipeline: rq's own
        #: start (prepare_job_execution) is not sent again for it.
        self.started: tuple[str, Any] | None = None
        #: ``(job id, asking job id)`` when ``lua/start.lua`` found the job's stop asked before its start
        #: (``keys.STOP_ASKED_FIELD``): the worker ends it stopped without running it.
        self.stop_asked: tuple[str, str] | None = None
        #: When this worker next hands back the lapsed takes of its queues (:meth:`hand_back`; monotonic seconds).
        self.hand_back_at = 0.0
        #: The queues known full, left out of the fetch calls (:meth:`fetch_queues`): name -> when (monotonic
        #: seconds) the skip ends at the latest.
        self.skip: dict[str, float] = {}
        #: The queues whose releases this fetcher heard of while the last fetch ran (:meth:`hearing`).
        self.heard: frozenset[str] = frozenset()

    def lost_claim(self, connection: Any) -> Claim | None:
        """What the fetch whose outcome this worker never saw (``resume_token``) took, read from its claim record, or
        None (it took nothing, its record is gone, or the server cannot say now). For a worker that quits before it
        sends that fetch again: a stop request can land while the fetch's reply is on its way."""
        token = self.resume_token
        if token is None or not self.resume_queues:
            return None
        try:
            recorded = connection.get(keys.claim(token))
        except _UNREACHABLE:
            return None
        if recorded is None:
            return None
        items = unpack_strings(recorded)
        reply = ['queue', int(items[0]), 'job', items[1], 'holds', items[2:], 'replayed', 1]
        found = read_reply(reply, self.resume_queues, token, self.hold_ttl)
        if isinstance(found, Claim):
            found.record = keys.claim(token)
            found.fetch_token = token
            return found
        return None

    def server_now(self, connection: Any) -> float:
        """The server's clock (epoch s) estimated from this host's, measured with TIME once a minute at most."""
        local = time.time()
        if self._clock is None or local - self._clock[1] > self.CLOCK_CHECK_SECONDS:
            seconds, micros = connection.time()
            after = time.time()
            self._clock = (seconds + micros / 1e6 - (local + after) / 2, after)
            local = after
        return local + self._clock[0]

    def until_wait(self, connection: Any, look: Look, seconds: float) -> float:
        """``seconds``, or less when ``look`` says nothing can be taken before a server time: until then (a gate that
        skipped a queue until a time, as a start rate does; the wait still ends early on a wake-up)."""
        if look.until is None:
            return seconds
        return min(seconds, max(look.until - self.server_now(connection), 0.001))

    def on_claim(self, claim: Claim) -> None:
        self.claim = claim
        self.starting, self.start_state, self.started, self.stop_asked = claim, None, None, None
        if claim.record:
            self.records.append(claim.record)
        for hold in claim.holds:
            ledger.PROCESS.add(hold)  # the heartbeat refreshes it from now on

    def fetch_queues(self, connection: Any, queues: Sequence[Queue]) -> Sequence[Queue]:
        """The queues the next fetch looks at: ``queues`` less those known full (:attr:`skip`).

        A full queue costs every fetch its gates (a capped one a ZCARD, a ZCOUNT and more), whichever queue the job
        comes from: a worker over 40 full queues paid for 40 gates per job. So a queue a fetch that took a job found
        full (the reply's ``skipped``) is left out of the fetches after it while this fetcher hears of its releases
        (:meth:`hearing`; a release and a capacity change publish on its wake channel: :meth:`unskip`), and no longer
        than its gate's ``until`` or :meth:`relook_seconds` (a hold that ages out, its worker killed, publishes
        nothing). Leaving a queue out of a fetch only ever takes less: no cap can be exceeded by it. A fetch that
        takes nothing looks at every queue again first (:func:`dequeue`), before a burst worker quits or an idle
        one waits. This base fetcher hears nothing, so it leaves no queue out.
        """
        self.check_news(connection)
        if self.skip:
            now = time.monotonic()
            for name in [name for name, ends in self.skip.items() if ends <= now]:
                del self.skip[name]
        self.heard = self.hearing()
        if not self.skip:
            return queues
        return [q for q in queues if q.name not in self.skip]

    def saw(self, connection: Any, queues: Sequence[Queue], reply: FetchReply) -> None:
        """The fetch over ``queues`` answered ``reply``: when it took a job, the queues it skipped (full, or at a
        rate until a time) are left out of the next fetches (:meth:`fetch_queues`), those whose releases this
        fetcher heard of while the fetch ran; it starts hearing of the others' (:meth:`hear`), so a next fetch that
        finds them full again leaves them out from then on."""
        if reply.job is None:
            return
        now = time.monotonic()
        relook = now + self.relook_seconds()
        new = []
        for i, _policy, until in reply.news.skipped if reply.news is not None else ():
            name = queues[i - 1].name
            if name not in self.heard:
                new.append(name)
            elif until is None:
                self.skip[name] = relook
            else:
                self.skip[name] = min(relook, now + max(until - self.server_now(connection), 0.0))
        self.hear(connection, new)

    def unskip(self, queue_name: str) -> None:
        """News that ``queue_name`` may be taken from again (a release, a capacity change): the next fetch looks."""
        self.skip.pop(queue_name, None)

    def forget_full(self) -> None:
        """Look at every queue in the next fetch."""
        self.skip.clear()

    def check_news(self, connection: Any) -> None:
        """Read the news heard since the last fetch (without waiting), :meth:`unskip` the queues it frees."""

    def hearing(self) -> frozenset[str]:
        """The queues whose releases and capacity changes this fetcher hears of now (none: it cannot)."""
        return frozenset()

    def hear(self, connection: Any, queue_names: list[str]) -> None:
        """Start hearing of the releases and capacity changes of ``queue_names`` too (this fetcher cannot)."""

    def listen(self, connection: Any, queue_names: list[str]) -> bool:
        """Get ready to be woken for ``queue_names``; True when that only starts now (look once more first)."""
        return False

    def wait(self, connection: Any, queue_names: list[str], seconds: float, full: frozenset[str] = frozenset()) -> bool:
        """Wait up to ``seconds`` (at most IDLE_POLL_SECONDS) for something that could make a look succeed.

        ``full`` names the queues the last look skipped (a capped one at its cap): a push to one of them is
        no news. Returns True when news came (a wake-up), False when the time ran out.
        """
        time.sleep(min(seconds, IDLE_POLL_SECONDS))
        return False

    def relook_seconds(self) -> float:
        """How often an idle worker looks again at queues its last look found full, with no news of them.

        A release and a capacity change publish a wake-up; a hold that ages out (its worker SIGKILLed) does not, so
        the full queues are looked at again this often: a third of the hold ttl (the ttl is the bound on when a dead
        worker's capacity returns anyway), between 1 and :data:`IDLE_RELOOK_MAX_SECONDS` seconds.
        """
        return min(max(self.hold_ttl / 3, IDLE_POLL_SECONDS), IDLE_RELOOK_MAX_SECONDS)

    def hand_back_seconds(self) -> float:
        """How often a worker hands back the lapsed takes of its queues (:func:`hand_back`): as often as it looks
        again at full queues (a third of the hold ttl, 1 to 10 s), so a job whose taker died between its fetch and
        its start is back on its queue within ``hold_ttl`` plus that."""
        return self.relook_seconds()

    def hand_back(self, connection: Any, queues: Sequence[Queue]) -> list[str]:
        """Hand back the lapsed takes of ``queues`` if it is time (:func:`hand_back`), logging each job; the ids."""
        now = time.monotonic()
        if now < self.hand_back_at:
            return []
        self.hand_back_at = now + self.hand_back_seconds()
        handed = hand_back(connection, queues)
        for job_id, queue_name in handed:
            logger.warning('rq-policies: job %s was taken from %r by a worker that never started it (its claim '
                           'lapsed: the worker died or stopped between its fetch and the start); handed back to '
                           'its queue', job_id, queue_name)
        return [job_id for job_id, _ in handed]

    def idle(self, connection: Any, queues: Sequence[Queue], look: Look, seconds: float) -> None:
        """Wait, up to ``seconds``, until another run of the fetch script could take something.

        That is: news on pub/sub (a push to a queue ``look`` did not find full, a release, a capacity change);
        once a second, a probe (one EXISTS over the queues the look did not find full) finding a job there, which a
        stock rq producer pushed without a wake-up; or every :meth:`relook_seconds` when the look found some queue
        full (a hold that ages out silently frees it). A look runs the whole fetch script over every queue (a full
        capped queue costs it a ZCARD, a ZCOUNT and more), so an idle worker over many full queues looks rarely,
        and probes.

        Scheduled jobs: the look's ``until`` already covers the earliest due time it saw. A job scheduled since is
        announced by PolicyQueue (a ``scheduled <time>`` wake-up, :meth:`note_due`), which moves the end of the wait
        to its due time; one scheduled by stock rq (no wake-up) is found by the schedule probe (the head of each
        queue's scheduled registry, one ZRANGE each, every :meth:`schedule_probe_seconds`).
        """
        names = [q.name for q in queues]
        probe = [q.key for q in queues if q.name not in look.full]
        now = time.monotonic()
        end = now + seconds
        relook = now + self.relook_seconds() if look.full else end
        self.due_at = None
        registries = [ScheduledJobRegistry.key_template.format(name) for name in names] if self.promote else []
        schedule_every = self.schedule_probe_seconds(len(registries))
        next_schedule_probe = now + schedule_every
        while True:
            if self.due_at is not None:
                end = min(end, time.monotonic() + max(self.due_at - self.server_now(connection), 0.0))
                self.due_at = None
            left = min(end, relook) - time.monotonic()
            if left <= 0:
                return
            if self.wait(connection, names, left, look.full):
                return
            # A taker that died leaves nothing that wakes anyone: its takes are looked at here, and only a job
            # handed back ends the wait (an idle worker's hand-back costs a read of its queues' takes).
            if self.hand_back(connection, queues):
                return
            now = time.monotonic()
            if probe and now < min(end, relook) and connection.exists(*probe):
                return
            if registries and now >= next_schedule_probe and now < min(end, relook):
                next_schedule_probe = now + schedule_every
                self.note_due(self._earliest_due(connection, registries))

    def note_due(self, at: float | None) -> None:
        """A job of these queues is due at server time ``at``: the idle wait ends then at the latest."""
        if at is not None and (self.due_at is None or at < self.due_at):
            self.due_at = at

    @staticmethod
    def schedule_probe_seconds(registries: int) -> float:
        """How often an idle worker reads the heads of its queues' scheduled registries: once a second for up to 5
        queues, and less often over more (one ZRANGE per queue: at most 5 commands a second, whatever the count)."""
        return max(IDLE_POLL_SECONDS, registries / 5)

    @staticmethod
    def _earliest_due(connection: Any, registries: list[str]) -> float | None:
        with connection.pipeline(transaction=False) as pipe:
            for key in registries:
                pipe.zrange(key, 0, 0, withscores=True)
            heads = pipe.execute()
        scores = [head[0][1] for head in heads if head]
        return min(scores) if scores else None


#: The fetcher of the PolicyWorker fetching in this context, or None (then ``dequeue_any`` is stock rq's).
current_fetcher: ContextVar[Fetcher | None] = ContextVar('rq_policies_fetcher', default=None)


#: The phases of ``lua/fetch.lua``, in the order they run (its header says what each does): a call run with
#: ``trace`` reports the phases and hooks it ran, in order, each hook as ``'<phase>:<policy>'``.
PHASES = ('probe', 'replay', 'state', 'due', 'promote', 'gate', 'pop', 'admit_job', 'taken', 'take', 'take_job',
          'record', 'idle')


class FetchCall(Call):
    """The ``lua/fetch.lua`` call: built by name like any :class:`rq_policies.engine.ops.Call`, sent as flat ARGV.

    The scalars a fetch always needs travel as plain arguments and the rest as two msgpack blobs, packed once per
    call object and decoded by the script only when needed: the queue names, the policies' order and the named keys
    when a gate or a per-job part runs, the per-key prefixes and promotion's settings only when those run. A fetch of
    queues without any policy state decodes nothing (the decode of one blob of everything was a sixth of the fetch's
    server time). KEYS start with the claim record, the queues, their intermediate lists, their takes and their
    scheduled registries, at the positions the script's header gives.
    """

    __slots__ = ('_blob', 'trace')
    #: The arguments sent flat (the rest go in the two blobs).
    FLAT = frozenset({'token', 'ttl', 'claim_ttl', 'burst', 'job_prefix', 'tombstone'})
    #: The first blob's arguments, what a gate or a per-job part needs (the second: the per-key prefixes and
    #: promotion's settings, decoded only when read).
    CORE = frozenset({'names', 'order', 'k', 'kl'})

    def __init__(self, **args: Any) -> None:
        super().__init__('fetch', **args)
        self._blob: tuple[bytes, bytes] | None = None
        #: Ask the script for the phases and hooks it ran (the reply's ``trace``): tests.
        self.trace = False

    def arg(self, name: str, value: Any) -> Call:
        if name not in self.FLAT:
            self._blob = None
        return super().arg(name, value)

    def key_list(self, name: str, values: list[str]) -> Call:
        self._blob = None
        return super().key_list(name, values)

    def key(self, name: str, value: str) -> Call:
        self._blob = None
        return super().key(name, value)

    def argv(self) -> list[Any]:
        a = self.args
        if self._blob is None:
            # A key list goes as its first index only (the script knows each list's length): a table fewer per list
            # to decode.
            core = {name: value for name, value in a.items() if name in self.CORE}
            core['kl'] = {name: first for name, (first, _count) in core.get('kl', {}).items()}
            self._blob = (pack(core),
                          pack({name: value for name, value in a.items() if name not in self.CORE | self.FLAT}))
        state = a.get('state')
        first, count = state if state is not None else (0, -1)
        return [a['token'], a['ttl'], a['claim_ttl'], len(a['names']), '1' if a['burst'] else '0',
                '1' if a.get('promote') else '0', a['job_prefix'], a['tombstone'], first, count, self._blob[0],
                '1' if self.trace else '0', self._blob[1], a['k']['tombstones']]


def fetch_call(
    queues: Sequence[Queue], token: str, ttl: int, job_prefix: str = Job.redis_job_namespace_prefix,
    burst: bool = True, promote: bool = True,
) -> FetchCall:
    """The ``lua/fetch.lua`` call taking the next job of ``queues`` (in that order), holds named ``token``.

    ``burst``: count the skipped queues that still have jobs (a burst worker waits for them rather than quit).
    ``promote``: first move the due jobs of the queues' scheduled registries onto them (at most
    :data:`PROMOTE_BATCH`, by the server's clock, as rq's scheduler would), and report the earliest due time to an
    idle look.
    """
    names = [q.name for q in queues]
    policies = registered(FETCH)
    call = FetchCall(
        job_prefix=job_prefix, names=names, order=[p.name for p in policies], token=token, ttl=ttl,
        burst=burst, tombstone=keys.SUPERSEDED_PREFIX, claim_ttl=ttl,
    )
    call.key('claim', keys.claim(token))
    call.key_list('queues', [q.key for q in queues])
    call.key_list('intermediate', [q.intermediate_queue_key for q in queues])
    call.key_list('taken', [keys.taken(name) for name in names])
    if promote:
        call.key_list('scheduled', [ScheduledJobRegistry.key_template.format(name) for name in names])
        call.arg('promote', promote_args())
        call.key('queues_set', Queue.redis_queues_keys)
        call.key_list('scheduler_lock', [RQScheduler.get_locking_key(name) for name in names])
    lists = call.args['kl']
    if lists['queues'][0] != 2 or lists['intermediate'][0] != 2 + len(names) or lists['taken'][0] != 2 + 2 * len(
            names) or (promote and lists['scheduled'][0] != 2 + 3 * len(names)):
        raise RuntimeError(f'fetch_call: the fixed KEYS of lua/fetch.lua are out of place: {lists}')
    for policy in policies:
        policy.fetch_keys(call, names)
    # The tombstones' marker: the tombstone prefix itself, alive while any tombstone is (lua/lib/pending.lua).
    call.key('tombstones', keys.SUPERSEDED_MARKER)
    # The state keys: while none of them exists, no gate, take or due key has anything to do (FetchSide.fetch_state).
    state: list[str] = []
    always = False
    named, lists = call.args['k'], call.args.get('kl', {})
    for policy in policies:
        declared = policy.fetch_state
        if declared is None or any(name not in named and name not in lists for name in declared):
            always = True  # a policy that declares none (or names a key it did not pass): its hooks always run
            continue
        for name in declared:
            if name in named:
                found = [call.keys[named[name] - 1]]
            else:  # a key list: one key per queue
                first, count = lists[name]
                found = call.keys[first - 1:first - 1 + count]
            state.extend(key for key in found if key not in state)
    if not always:
        if named['tombstones'] != len(call.keys):
            raise RuntimeError('fetch_call: the probe range of lua/fetch.lua must start at the tombstones marker')
        call.arg('state', (len(call.keys) + 1, len(state)))
        call.key_list('state', state)
        if promote:
            # The probe reads KEYS from the marker to the end (the marker, the state keys, these): one range.
            call.key_list('probe', [ScheduledJobRegistry.key_template.format(name) for name in names])
    return call


@dataclass(frozen=True)
class FetchReply:
    """``lua/fetch.lua``'s reply, a named map (its header), decoded here and only here.

    A fetch that took a job has ``job`` (and ``queue``, its queue's 1-based index in the call, and ``holds``, the
    ``(policy name, flag)`` of each hold a policy took: flag ``'1'`` for one in the policy's queue ledger, else the
    ledger key); one that took nothing has ``waiting``, ``full`` (the indices of the skipped queues) and ``until``.
    Either has, when it happened, what else the fetch did: ``news`` (a :class:`FetchNews`; None when nothing), which
    :meth:`events` names for :mod:`rq_policies.engine.events`.
    """

    queue: int = 0
    job: str | None = None
    holds: tuple[tuple[str, str], ...] = ()
    replayed: bool = False
    waiting: int = 0
    full: tuple[int, ...] = ()
    until: float | None = None
    trace: tuple[str, ...] = ()
    news: FetchNews | None = None
    #: The taken job's hash (field, value, ... as HGETALL answers), or None (a replay, or nothing taken).
    hash: tuple[Any, ...] | None = field(default=None, repr=False)

    @classmethod
    def decode(cls, reply: list[Any]) -> FetchReply:
        named = {text(reply[n]): reply[n + 1] for n in range(0, len(reply) - 1, 2)}
        unknown = named.keys() - _REPLY_FIELDS
        if unknown:
            raise ValueError(f'lua/fetch.lua answered fields this version does not know: {sorted(unknown)}')
        pairs = [text(item) for item in named.get('holds') or ()]
        until = named.get('until')
        return cls(
            queue=int(named.get('queue', 0)),
            job=text(named['job']) if 'job' in named else None,
            holds=tuple(zip(pairs[::2], pairs[1::2])),
            replayed=bool(named.get('replayed')),
            waiting=int(named.get('waiting', 0)),
            full=tuple(int(i) for i in named.get('full') or ()),
            until=None if until is None else float(until),
            trace=tuple(text(item) for item in named.get('trace') or ()),
            hash=tuple(named['hash']) if named.get('hash') else None,
            news=FetchNews.decode(named),
        )

    def events(self, queues: Sequence[Queue]) -> list[tuple[str, str, dict[str, Any]]]:
        """What else the fetch did, as :func:`rq_policies.engine.events.fetched` reports it: ``(event, queue name,
        detail)`` for each ``park`` and ``unpark`` (detail: ``job_id``, ``policy``, ``scope``, ``key``), ``skip``
        (``policy``, ``until``: the server time, epoch s, the gate named, or None: until a release) and ``promote``
        (``count``), in that order."""
        news = self.news
        found: list[tuple[str, str, dict[str, Any]]] = []
        if news is None:
            return found
        for i, jid, member in news.parked:
            found.append(('park', queues[i - 1].name, dict(_member(member), job_id=jid)))
        for i, policy, until in news.skipped:
            found.append(('skip', queues[i - 1].name, {'policy': policy, 'until': until}))
        for i, count in news.promoted:
            found.append(('promote', queues[i - 1].name, {'count': count}))
        for jid, queue_name, member in news.unparked:
            found.append(('unpark', queue_name, dict(_member(member), job_id=jid)))
        return found


@dataclass(frozen=True)
class FetchNews:
    """What else a fetch did, as its reply says (only when it did; ``lua/fetch.lua``'s header): ``parked`` (queue
    index, job id, due-index member ``<policy>:<scope>:<key>``), ``skipped`` (queue index, the gating policy, the
    server time it named or None), ``promoted`` (queue index, count) and ``unparked`` (job id, queue name, member)."""

    parked: tuple[tuple[int, str, str], ...] = ()
    skipped: tuple[tuple[int, str, float | None], ...] = ()
    promoted: tuple[tuple[int, int], ...] = ()
    unparked: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def decode(cls, named: dict[str, Any]) -> FetchNews | None:
        """The news in a fetch reply's named fields, or None when it has none."""
        if not named.keys() & _NEWS_FIELDS:
            return None
        return cls(
            parked=tuple((int(i), text(jid), text(member)) for i, jid, member in _triples(named.get('parked'))),
            skipped=tuple((int(i), text(policy), float(until) if until not in (b'', '') else None)
                          for i, policy, until in _triples(named.get('skipped'))),
            promoted=tuple((int(i), int(count)) for i, count in _pairs(named.get('promoted'))),
            unparked=tuple((text(jid), text(queue), text(member))
                           for jid, queue, member in _triples(named.get('unparked'))),
        )


_NEWS_FIELDS = frozenset(f.name for f in dataclasses.fields(FetchNews))
#: The names a fetch reply may have (FetchReply's fields, the news's, not ``news`` itself).
_REPLY_FIELDS = frozenset(f.name for f in dataclasses.fields(FetchReply)) - {'news'} | _NEWS_FIELDS


def _pairs(items: Any) -> list[tuple[Any, Any]]:
    items = list(items or ())
    return list(zip(items[::2], items[1::2]))


def _triples(items: Any) -> list[tuple[Any, Any, Any]]:
    items = list(items or ())
    return list(zip(items[::3], items[1::3], items[2::3]))


def _member(member: str) -> dict[str, str]:
    """A due-index member ``<policy>:<scope>:<key>`` as its parts (a scope holds no colon; a key may)."""
    policy, _, key_id = member.partition(':')
    scope, _, key = key_id.partition(':')
    return {'policy': policy, 'scope': scope, 'key': key}


def read_reply(reply: list[Any] | FetchReply, queues: Sequence[Queue], token: str, ttl: int) -> Claim | Look:
    """The fetch script's reply (or its decoding) as the :class:`Claim` it made, or the :class:`Look` that found
    nothing to take."""
    found = reply if isinstance(reply, FetchReply) else FetchReply.decode(reply)
    if found.job is not None:
        queue = queues[found.queue - 1]
        holds = tuple(_hold(by_name(policy), flag, queue.name, token, ttl, found.job) for policy, flag in found.holds)
        raw = dict(zip(found.hash[::2], found.hash[1::2])) if found.hash else None
        return Claim(found.job, queue.name, holds, raw=raw)
    return Look(found.waiting, frozenset(queues[i - 1].name for i in found.full), found.until)


def unpack_strings(record: bytes | str) -> list[str]:
    """The items of a claim record, each ``<length>:<bytes>`` (lua/fetch.lua's ``record``; lua/lib/rewrite_guard.lua's
    ``unpack_strings``): the queue's index, the job id, then policy, flag for each hold. Lengths count bytes."""
    raw = record.encode() if isinstance(record, str) else record
    items, at = [], 0
    while at < len(raw):
        colon = raw.index(b':', at)
        size = int(raw[at:colon])
        items.append(raw[colon + 1:colon + 1 + size].decode())
        at = colon + 1 + size
    return items


def _hold(policy: Any, flag: Any, queue_name: str, token: str, ttl: int, job_id: str) -> Hold:
    """The hold a policy's take reported: 1 for one in the queue's ledger (:func:`keys.holds`), or the name of the
    ledger it took one in (a per-key hold, given back by that policy's ``release_hold``)."""
    if flag == '1':
        return Hold(keys.holds(queue_name), token, ttl, job_id)
    return Hold(text(flag), token, ttl, job_id, policy=policy.name)


#: Lapsed takes a hand-back looks at, at most, per call (each costs the script a few O(1) commands and an LPOS).
HAND_BACK_BATCH = 100


def hand_back(connection: Any, queues: Sequence[Queue], own: Claim | None = None) -> list[tuple[str, str]]:
    """Put back on their queues the jobs of ``queues`` that a PolicyWorker's fetch took and never started, once
    their take lapsed (``lua/hand_back.lua``); the ``(job id, queue name)`` of each one handed back.

    A fetch notes each take in ``rq:policies:taken:<queue>`` (the job id, the claim token, the job's enqueued_at),
    which the work horse's start removes. A take outliving its claim record (the worker's ``hold_ttl``) belongs to a
    worker that died, was stopped or starved between its fetch and the start: the job never ran, so it goes back to
    the head of its queue, where rq's own cleanup would fail it unrun minutes later. Reads the takes and their
    records first (one round trip, and one more when any take exists), then sends only the lapsed ones to the
    script, which checks each again, atomically (and leaves a job whose execution rq already wrote: its worker
    starts it, and a taker that lapsed before that deletes the execution and does not: ``lua/claim_start.lua``).

    ``own``: instead, the claim of the caller's own fetch whose job it will not start (a stop between the fetch and
    the start), handed back whether or not its record lapsed.
    """
    if own is not None:
        queue = next((q for q in queues if q.name == own.queue_name), None)
        if queue is None or not own.fetch_token:
            return []
        queues = [queue]
        entry = connection.hget(keys.taken(queue.name), own.job_id)
        value = text(entry) if entry is not None else ''
        candidates = [(0, own.job_id, value, value.split(' ', 1)[1], own.fetch_token)] if value.startswith(
            own.fetch_token + ' ') else []
    else:
        with connection.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.hgetall(keys.taken(queue.name))
            tables = pipe.execute()
        noted = [(i, text(jid), text(value)) for i, table in enumerate(tables) for jid, value in table.items()]
        if not noted:
            return []
        tokens = [value.split(' ', 1)[0] for _, _, value in noted]
        with connection.pipeline(transaction=False) as pipe:
            for token in tokens:
                pipe.exists(keys.claim(token))
            live = pipe.execute()
        candidates = [(i, jid, value, value.split(' ', 1)[1] if ' ' in value else '', token)
                      for (i, jid, value), token, alive in zip(noted, tokens, live) if not alive][:HAND_BACK_BATCH]
    if not candidates:
        return []
    handed = hand_back_call(queues, candidates, own is not None).run(connection)
    by_job = {jid: queues[i].name for i, jid, *_ in candidates}
    return [(text(jid), by_job[text(jid)]) for jid in handed or ()]


def hand_back_call(queues: Sequence[Queue], candidates: list[tuple[int, str, str, str, str]], own: bool) -> Call:
    """The ``lua/hand_back.lua`` call for ``candidates``: each ``(queue index, job id, the take as read, its
    enqueued_at, its claim token)``."""
    call = Call('hand_back', wake=keys.wake(''), names=[q.name for q in queues])
    call.key_list('taken', [keys.taken(q.name) for q in queues])
    call.key_list('queues', [q.key for q in queues])
    call.key_list('intermediate', [q.intermediate_queue_key for q in queues])
    items = []
    for i, jid, expect, enqueued_at, token in candidates:
        at = len(call.keys)
        call.keys.extend([queues[i].job_class.redis_job_namespace_prefix + jid,
                          ExecutionRegistry.key_template.format(jid), keys.claim(token)])
        items.append([i + 1, jid, expect, enqueued_at, own, at + 1, at + 2, at + 3])
    call.arg('items', items)
    return call.answered()  # a replay after a lost reply answers the ids the first run handed back


def release_claim(claim: Claim, connection: Any) -> None:
    """Give back every hold of ``claim`` (on a pipeline: with it), waking idle workers of its queue. A redis-py
    ``RedisCluster`` is adopted first (:func:`compat.adopt_cluster`: a per-key release runs its script on a pipeline,
    and redis-py's cluster pipeline refuses EVALSHA by name)."""
    connection = compat.adopt_cluster(connection)
    for hold in claim.holds:
        if hold.policy:
            by_name(hold.policy).release_hold(connection, hold, keys.wake(claim.queue_name))
        else:
            ledger.PROCESS.release(connection, hold, wake=keys.wake(claim.queue_name))


def dequeue(
    queue_class: Any,
    fetcher: Fetcher,
    queues: Sequence[Queue],
    timeout: int | None,
    connection: Any,
    job_class: type[Job],
    serializer: Any = None,
    death_penalty_class: Any = None,
) -> tuple[Job, Queue] | None:
    """The fetch loop behind ``PolicyQueue.dequeue_any`` in a PolicyWorker (``fetcher`` is the worker's).

    Queues are tried in order; a queue a fetch policy gates (a capped one at its cap) is skipped. When nothing
    can be taken and ``timeout`` is not None, waits (woken by admissions and releases) until ``timeout`` seconds have
    passed, then raises DequeueTimeout, as rq's own dequeue does. With ``timeout=None`` (burst) it returns None once
    nothing is waiting, but keeps waiting while a skipped queue still has jobs: those are work not yet done.
    """
    names = [q.name for q in queues]
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fetcher.hand_back(connection, queues)  # takes whose taker died before the start: back on their queues
        sent = fetcher.fetch_queues(connection, queues)  # less those known full (Fetcher.fetch_queues)
        if fetcher.resume_token and fetcher.resume_queues and all(q.name in names for q in fetcher.resume_queues):
            sent = fetcher.resume_queues  # the lost fetch's queues: its claim record names a queue by its index
        call = _worker_call(fetcher, sent, job_class.redis_job_namespace_prefix, timeout is None)
        token = fetcher.resume_token or ledger.claim_token()
        fetcher.resume_token = token  # until this fetch's outcome is known (see Fetcher.resume_token)
        fetcher.resume_queues = sent
        fetched_after = time.time()
        call.arg('token', token).set_key('claim', keys.claim(token))
        reply = FetchReply.decode(call.run(connection))
        if events.FETCHES:  # a surface watches the fetch's parks, skips, promotions and unparks (tracing)
            events.fetched(reply.events(sent))
        found = read_reply(reply, sent, token, fetcher.hold_ttl)
        fetcher.saw(connection, sent, reply)
        if not isinstance(found, Claim):
            fetcher.resume_token = None
        else:
            found.fetched_after = fetched_after
            found.record = keys.claim(token)
            found.fetch_token = token
            queue = queues[names.index(found.queue_name)]
            try:
                job = _job(job_class, found, connection, serializer)
                if found.raw:
                    found.ending = admission_ending(found.raw)
                found.raw = None  # read: the claim travels on (to the hold guard's slot) without the job's data
            except _UNREACHABLE:
                raise  # the claim stands: the next fetch replays it (resume_token) and reads the job again
            except NoSuchJobError:
                fetcher.resume_token = None
                # Deleted between the pop and the fetch: give the holds back and look again.
                with connection.pipeline(transaction=False) as pipe:
                    pipe.lrem(queue.intermediate_queue_key, 1, found.job_id)
                    pipe.hdel(keys.taken(queue.name), found.job_id)
                    pipe.delete(found.record)
                    release_claim(found, pipe)
                    pipe.execute()
                continue
            except BaseException:
                # An unreadable job: the holds go back now, the id stays on the intermediate list for rq (its take
                # goes: handed back, it would fail the same way at every fetch instead of once in rq's cleanup).
                fetcher.resume_token = None
                with contextlib.suppress(Exception):  # else they age out; the fetch error is the news
                    connection.hdel(keys.taken(queue.name), found.job_id)
                    release_claim(found, connection)
                raise
            fetcher.resume_token = None
            fetcher.on_claim(found)
            return job, rebuild(queue_class, queue, connection, job_class, serializer, death_penalty_class)
        if len(sent) < len(queues):
            fetcher.forget_full()  # nothing in the queues not known full: look at every queue before waiting
            continue
        if deadline is None and not found.waiting:
            return None
        if fetcher.listen(connection, names):
            continue  # a wake-up published before the subscription landed is lost: look once more first
        if deadline is None:
            fetcher.idle(connection, queues, found, fetcher.until_wait(connection, found, IDLE_POLL_SECONDS))
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DequeueTimeout(timeout, [q.key for q in queues])
        fetcher.idle(connection, queues, found, fetcher.until_wait(connection, found, remaining))


def _worker_call(fetcher: Fetcher, queues: Sequence[Queue], job_prefix: str, burst: bool) -> FetchCall:
    """The fetch call of ``fetcher``'s worker for ``queues``, built once and kept on the fetcher (a worker fetches
    with the same call for every job, only its token changes: building and packing it anew cost about 0.2 ms of the
    worker's CPU a job)."""
    policies = tuple(policy.name for policy in registered(FETCH))
    key = (tuple(q.key for q in queues), job_prefix, burst, fetcher.promote, fetcher.hold_ttl, policies)
    calls = fetcher.__dict__.setdefault('_fetch_calls', {})
    call = calls.get(key)
    if call is None:
        if len(calls) >= 16:  # a worker whose queue list keeps changing: keep the newest only
            calls.clear()
        call = calls[key] = fetch_call(queues, '', fetcher.hold_ttl, job_prefix, burst=burst, promote=fetcher.promote)
    return call


def _job(job_class: type[Job], claim: Claim, connection: Any, serializer: Any) -> Job:
    """The job ``claim`` took, built from the hash the fetch read with it (``Job.fetch`` without its HGETALL: rq's
    ``Job.fetch`` is ``refresh()``, an HGETALL then ``restore()``), or fetched when the reply carried none."""
    if not claim.raw:
        return job_class.fetch(claim.job_id, connection=connection, serializer=serializer)
    job = job_class(parse_job_id(claim.job_id), connection=connection, serializer=serializer)
    job.restore(claim.raw)
    return job


def rebuild(
    queue_class: Any, queue: Queue, connection: Any, job_class: Any, serializer: Any, death_penalty_class: Any
) -> Queue:
    """``queue`` as an instance of ``queue_class`` on ``connection``, as rq's own dequeue returns it."""
    kwargs: dict[str, Any] = {'connection': connection, 'job_class': job_class, 'serializer': serializer}
    if death_penalty_class is not None:
        kwargs['death_penalty_class'] = death_penalty_class
    return queue_class.from_queue_key(queue.key, **kwargs)
