"""Every Redis key rq-policies writes, in one place.

All keys live under ``<prefix>:policies:``, where ``<prefix>`` is rq's own key prefix: ``rq`` by default, so the table
below spells it ``rq:``; on rq 3 the ``RQ_KEY_PREFIX`` environment variable moves rq's keys and ours together
(``RQ_KEY_PREFIX='{app}'`` gives ``{app}:queue:<q>``, ``{app}:job:<id>`` and ``{app}:policies:...``); rq 2.12 has no
such setting and its keys and ours stay under ``rq:`` (:data:`rq_policies.engine.compat.KEY_PREFIX`). Like rq, the
prefix is read once, when the module is imported: set it in the environment before the process imports rq or
rq-policies, and give every producer and worker the same one. One prefix for both families keeps three things true: a
Redis ACL granting ``~rq:*`` (``~{app}:*``) covers our keys; a hash-tagged prefix (``{app}``) puts every key of rq and
of ours in one Redis Cluster slot, which the scripts need (docs/cluster.md); and none of ours can collide with rq's own
``<prefix>:queue:*``, ``<prefix>:job:*``, ``<prefix>:scheduled:*`` or ``<prefix>:rl:*``: the segment after
``<prefix>:policies:`` names the key's kind, and a per-identity key ends in a fixed-width hex digest, so no queue name
can make one kind's key equal another's. The only user input that reaches a key is the queue name.

=====================================================  =======  ===================================================
key                                                    type     meaning
=====================================================  =======  ===================================================
``rq:policies:loner:<queue>:<digest>``                 STRING   id of the job holding this identity while it waits
                                                                (``until='finished'``: until it ends, deleted by the
                                                                worker's end-of-run pipeline);
                                                                deleted when a PolicyWorker takes the job, or when
                                                                the job is deleted, cancelled or removed; expires
                                                                with the job when the job has a ``ttl``
``rq:policies:throttle:<queue>:<digest>:<slot>``       STRING   id of the job that won slot number ``<slot>`` (epoch
                                                                seconds // slot width, server clock), or of the
                                                                trailing job that runs at its start; expires when
                                                                the slot ends
``rq:policies:trailing:<queue>:<digest>``              STRING   id of the pending trailing job (in
                                                                ``rq:scheduled:<queue>``); expires at its run time
``rq:policies:debounce:<queue>:<digest>``              HASH     ``job``: id of the pending debounced job (in
                                                                ``rq:scheduled:<queue>``), ``first``: epoch seconds
                                                                of the enqueue that started the pending period;
                                                                expires at the job's run time
``rq:policies:slots:<queue>``                          ZSET     the queue's hold ledger (QueueSlot): member = the
                                                                hold's claim token, score = epoch second the hold
                                                                expires (:func:`holds`)
``rq:policies:claim:<token>``                          STRING   what the fetch under claim token ``<token>`` took
                                                                (the queue's index, the job id, then each hold's
                                                                policy and flag), so a replayed
                                                                fetch answers the same job, and while it lives
                                                                the fetch's take (below) is live; deleted with
                                                                the worker's pipeline after the one that
                                                                confirmed the job's start (its heartbeat), and
                                                                expires after the worker's ``hold_ttl`` anyway,
                                                                as the fetch's holds do
``rq:policies:taken:<queue>``                          HASH     job id -> ``<claim token> <enqueued_at>``: a job a
                                                                PolicyWorker's fetch took off the queue (onto its
                                                                intermediate list) and has not started yet; live
                                                                while the fetch's claim record lives (the worker's
                                                                ``hold_ttl``), and ``enqueued_at`` is the job
                                                                hash's as the fetch read it (an id enqueued again
                                                                since is not this take's). Removed by the
                                                                worker's start confirmation
                                                                (``lua/claim_start.lua``), or by the hand-back
                                                                (``lua/hand_back.lua``) of any PolicyWorker of the
                                                                queue, which puts the job of a lapsed take back on
                                                                its queue (:func:`taken`); the hash expires an
                                                                hour (twice the hold ttl, if longer) after the
                                                                queue's last take
``rq:policies:answer:<request id>``                    STRING   the answer of one admin call whose answer depends
                                                                on what it changed (a ``clear``: was there a
                                                                setting; Fair's ``pause``/``resume``; a ``reset``'s
                                                                count; ``QueueSlot.release``), so a replay of that
                                                                call (redis-py resending it after a lost reply)
                                                                answers the same and writes nothing
                                                                (lua/lib/answer.lua); expires after
                                                                :data:`ANSWER_TTL` seconds
``rq:policies:endguard:<job id>``                      STRING   written (PX 1 s) only by ``lua/end_guard.lua``,
                                                                the guard of a job's successful end, so that the
                                                                transaction it guards (whose connection WATCHes
                                                                it) runs nothing: the job has dependents (rq's own
                                                                end hands them over) or the end was written already
``rq:policies:capacity``                               HASH     queue name -> cluster-wide cap (QueueSlot)
``rq:policies:superseded:<job id>``                   STRING   tombstone of a pending job a force (or, before
                                                                0.3, a later enqueue) deleted: ``<policy> <id of
                                                                that enqueue's job>`` (``reset `` after
                                                                ``rq-policies reset``); a PolicyWorker drops that
                                                                id should a skewed scheduler bring it back, and
                                                                ``explain`` names the replacement. ``<policy>
                                                                <pending id> merged <created_at>``: the merge
                                                                record of an enqueue rewritten into pending job
                                                                ``<pending id>`` in place (a resend of that very
                                                                call, the same created_at, is a replay).
                                                                ``rewrite <payload>``: the rewrite guard of a
                                                                pending job rewritten in place, until its run time
                                                                (lua/lib/rewrite_guard.lua). Each expires after
                                                                SUPERSEDED_SECONDS (the guard: after the run time)
``rq:policies:superseded:``                           STRING   the tombstones' marker (the tombstone of no job),
                                                                kept alive as long as the longest-lived tombstone
                                                                (lua/lib/pending.lua): while it is absent, the
                                                                fetch reads no tombstone
``rq:policies:dropped:<job id>``                      STRING   JSON record of an enqueue a policy dropped, written
                                                                only when the caller chose the job id
                                                                (``job_id=``): ``policy``, ``holder``, ``n``,
                                                                ``queue`` (when: its ttl's start); read by
                                                                ``explain``; expires after DROPPED_SECONDS
``rq:policies:rate``                                   HASH     queue name -> ``<limit> <per> <burst>``: at most
                                                                ``limit`` job starts every ``per`` seconds, up to
                                                                ``burst`` at once (QueueRate); with several windows
                                                                each word a comma-separated list, one entry per
                                                                window, shortest period first
``rq:policies:tat:<queue>``                            STRING   ``<tat> <interval>``: the queue's theoretical
                                                                arrival time (QueueRate's GCRA, epoch s, server
                                                                clock) and the emission interval it was reached at
                                                                (s); with several windows ``<tat> <interval>
                                                                <per>`` per window; expires once the last tat is
                                                                past, where it allows as much as no key
``rq:policies:backoff``                                ZSET     member = queue name, score = epoch second (server
                                                                clock) until which no PolicyWorker starts a job of
                                                                it (BackOff); past members are trimmed on write
``rq:policies:keyholds:<scope>:<key>``                 ZSET     one key's hold ledger (Concurrency): member = claim
                                                                token, or ``unpark:<job id>`` (a unit reserved for
                                                                a parked job given back to its queue), score =
                                                                epoch second it expires; the key expires with its
                                                                last hold
``rq:policies:keyunits:<scope>:<key>``                 ZSET     the cost of each hold of the key above 1
                                                                (``Concurrency(cost=)``): member as keyholds' ->
                                                                cost
``rq:policies:keyparked:<policy>:<scope>:<key>``       LIST     ids of the key's parked jobs (status ``deferred``,
                                                                in rq's deferred registry), oldest first; gone
                                                                once the last is given back
``rq:policies:keydue``                                 ZSET     member = ``<policy>:<scope>:<key>`` of a key with
                                                                parked jobs, score = earliest epoch second it could
                                                                free (its oldest hold's expiry, its rate's next
                                                                start, its back-off's end); removed with the key's
                                                                last parked job
``rq:policies:keylimits``                              HASH     ``<scope>:<key>`` -> a limit set at run time
                                                                (``Concurrency.set``)
``rq:policies:keyrates``                               HASH     ``<scope>:<key>`` -> ``<limit> <per> <burst>`` (as
                                                                ``rq:policies:rate``'s): a rate set at run time
                                                                (``Rate.set``)
``rq:policies:keyrules``                               HASH     ``<policy>:<scope>`` -> a scope's stated rule
                                                                (``Concurrency.set_rule``, ``Rate.set_rule``): a
                                                                msgpack array ``[default, prefix, setting, ...]``
                                                                (``lua/lib/key_rule.lua``); removed by
                                                                ``clear_rule``
``rq:policies:keyblock:<scope>:<key>``                 STRING   epoch second until which no job of the key starts
                                                                (``BackOff(key=True)``); expires then
``rq:policies:keytat:<scope>:<key>``                   STRING   ``<tat> <interval>`` (per window with several): one
                                                                key's GCRA state (Rate), as
                                                                ``rq:policies:tat:<queue>``
``rq:policies:lapses``                                 HASH     ``queue:<queue>`` / ``lcw:<class>`` /
                                                                ``key:<scope>:<key>`` -> holds found
                                                                lapsed under a running job and re-added (a counter,
                                                                :func:`lapse_field`)
``rq:policies:drops``                                  HASH     ``<policy>:<queue>`` -> dropped enqueues (a counter)
``rq:policies:drops-minute:<minute>``                  HASH     ``<policy>:<queue>`` -> enqueues dropped during epoch
                                                                minute ``<minute>`` (server clock, epoch s // 60);
                                                                expires an hour after the minute ends, so at most
                                                                61 are live (the dashboard's last-hour chart)
``rq:policies:slot-guard``                             (none)   never exists: the last of KEYS of every script on a
                                                                cluster, so none runs while the slot is migrated
                                                                (:data:`SLOT_GUARD`)
``rq:policies:wake:<queue>``                           channel  sharded pub/sub (SPUBLISH, SSUBSCRIBE): a job was
                                                                admitted or a hold freed
                                                                (:mod:`rq_policies.engine.wake`)
``rq:policies:woken:<release>``                        STRING   an idle worker answered the release named
                                                                ``<release>`` (its ledger and token); expires
``rq:policies:fair:...``                               (many)   Fair's: ``wait:<queue>:<scope>:<key>``,
                                                                ``seq:<queue>:<scope>:<key>``, ``active:<queue>``,
                                                                ``pausedin:<scope>:<key>``, ``paused``, ``weights``
                                                                (docs/fair.md)
``rq:policies:lcw``                                    ZSET     LimitedCapacityWorker classes seen: member = class
                                                                import path, score = epoch second last seen;
                                                                members older than a day are trimmed on write
``rq:policies:lcw:<class>``                            HASH     the class's last reported gauges: ``queue``,
                                                                ``max``, ``remaining``, ``updated`` (epoch s);
                                                                expires a day after the last write
``rq:policies:lcw-running:<class>``                    ZSET     the class's hold ledger of running jobs (the same
                                                                shape): member = hold ``<host>:<pid>:<job id>``,
                                                                score = epoch second the hold expires
``rq:policies:lcw-queued:<class>``                     ZSET     ids of the class's jobs enqueued and not yet
                                                                started (score = enqueue epoch s); an entry whose
                                                                job is gone or ended is pruned on the next count
``rq:policies:lcw-finish:<successor id>``              STRING   what the finish call that drew successor id
                                                                ``<successor id>`` answered (``<released>:<id or
                                                                nothing>``), so a replayed finish answers the same
                                                                and writes nothing; expires after :data:`CLAIM_TTL`
``rq:policies:pushed:<job id>``                       STRING   the tokens of the last pushes PolicyQueue made of a
                                                                job rq deletes soon after it runs (``result_ttl``
                                                                under :data:`PUSHED_SECONDS`), so a resent push
                                                                that arrives after the job ran and was deleted is
                                                                still recognised (``lua/push.lua``); or, for such a
                                                                job a door wrote without a policy
                                                                (``lua/admit.lua``), its ``created_at``, which a
                                                                resent write finds; expires after
                                                                :data:`PUSHED_SECONDS`
``rq:policies:alive:<job id>``                        STRING   a ``Loner(until='finished')`` job's horse still
                                                                runs: kept by its worker's hold guard every third
                                                                of ``hold_ttl`` while the horse lives, whatever
                                                                becomes of the worker (``lua/keep_horse.lua``);
                                                                ``lua/lib/holder_running.lua`` counts a started
                                                                job as running while its worker's key or this key
                                                                exists; expires ``hold_ttl`` after the last keep
``rq:policies:replicated``                             STRING   written by :func:`rq_policies.surfaces.replicas.
                                                                wait_for_replicas` just before its ``WAIT``, on
                                                                the same connection (WAIT counts the replicas that
                                                                have this connection's last write, and so every
                                                                write before it); expires after a minute
=====================================================  =======  ===================================================

A member of a hold ledger is a *hold* (see :mod:`rq_policies.engine.ledger`); "slot" is a throttle's time window. The
hold ledger of a queue keeps the key string ``rq:policies:slots:<queue>`` of 0.1, where it was called the slot ledger,
so that during a rolling upgrade from 0.1 old and new workers count their holds in one ledger and the cap holds across
both.

A ``<class>`` is a LimitedCapacityWorker's import path (``module.Class``): dots and identifiers, never a colon.

The slot number of a throttle key is computed inside the scripts from the server's clock, so those scripts receive
the identity's prefix in KEYS and append the number; every other key arrives whole.

Job hashes (``rq:job:<id>``) written by an admission carry extra fields: ``policies_loner`` names the job's loner
marker, so the fetch script can clear the marker of the job it pops without a second round trip;
``policies_loner_until`` (``finished``), ``policies_loner_taken`` (set at fetch under ``until='finished'``) and
``policies_replaced_by`` (the enqueue whose payload replaced this one's) are Loner's modes; ``policies_throttle``,
``policies_throttle_slot``, ``policies_trailing`` and ``policies_debounce`` name the other policies' state, for
``rq-policies explain``. ``policies_push`` (on every job PolicyQueue pushes, with or without a policy) holds the
tokens of its last four pushes (``lua/push.lua``: a resent push finds its own token and pushes nothing). rq and
rq-dashboard ignore fields they do not know.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .compat import KEY_PREFIX

#: The prefix of every key of ours: rq's key prefix (:data:`rq_policies.engine.compat.KEY_PREFIX`) and ``:policies:``.
PREFIX = KEY_PREFIX + ':policies:'


class Space(str):
    """A family of keys: the family's prefix (a ``str``, passed to the scripts as it is), and, called, one key of it:
    ``space(a, b)`` is ``<prefix>a:b``, the key ``key_of(prefix, a, b)`` of ``lua/lib/keys.lua`` builds from the same
    prefix (``tests/engine/test_keys_lua.py`` checks the two agree, family by family)."""

    __slots__ = ()

    def __call__(self, *parts: str) -> str:
        return self + ':'.join(parts)


#: The single keys (the table above), and :data:`REPLICATED`: the write
#: :func:`rq_policies.surfaces.replicas.wait_for_replicas` makes before its WAIT (STRING, expires after a minute).
CAPACITY, RATE, BACKOFF, DROPS, LAPSES, REPLICATED, KEY_DUE, KEY_LIMITS, KEY_RATES, KEY_RULES, LCW_INDEX = (
    PREFIX + name for name in
    ('capacity', 'rate', 'backoff', 'drops', 'lapses', 'replicated', 'keydue', 'keylimits', 'keyrates', 'keyrules',
     'lcw'))
#: A key that never exists, passed as the last of KEYS of every script a Redis Cluster runs
#: (:func:`rq_policies.engine.scripts.run`). While the prefix's slot is being migrated to another node, the server
#: refuses a script with a key it does not have (``TRYAGAIN``, or ``ASK`` and then ``TRYAGAIN`` on the importing node),
#: so no script runs on a slot whose keys are split between two nodes: its reads of keys it is not given (a popped job's
#: hash, a marker a job hash names) would fail midway there, after its first writes, or read a key not moved yet as
#: missing. Nothing reads or writes it.
SLOT_GUARD = PREFIX + 'slot-guard'
#: The families of keys named by one id or a few (the table above; a per-key family by a key id, :func:`key_id`).
(SUPERSEDED_PREFIX, dropped, taken, holds, rate_tat, claim, ANSWER, ALIVE_PREFIX, wake, woken, lcw_state, lcw_running,
 lcw_queued, lcw_finish, pushed, DROPS_MINUTE_PREFIX, KEY_HOLDS_PREFIX, KEY_PARKED_PREFIX, KEY_BLOCK_PREFIX,
 KEY_UNITS_PREFIX, KEY_TAT_PREFIX, FAIR_WAIT, FAIR_SEQ, FAIR_ACTIVE, FAIR_PAUSED_IN) = (
    Space(PREFIX + name + ':') for name in
    ('superseded', 'dropped', 'taken', 'slots', 'tat', 'claim', 'answer', 'alive', 'wake', 'woken', 'lcw',
     'lcw-running', 'lcw-queued', 'lcw-finish', 'pushed', 'drops-minute', 'keyholds', 'keyparked', 'keyblock',
     'keyunits', 'keytat', 'fair:wait', 'fair:seq', 'fair:active', 'fair:pausedin'))
superseded = SUPERSEDED_PREFIX
alive = ALIVE_PREFIX
#: The key ``lua/end_guard.lua`` writes to stop the EXEC of the job end it guards (the table above).
end_guard = Space(PREFIX + 'endguard:')
#: Fair's single keys: the paused keys (HASH ``<scope>:<key>`` -> 1) and the run-time weights (HASH -> weight).
FAIR_PAUSED, FAIR_WEIGHTS = PREFIX + 'fair:paused', PREFIX + 'fair:weights'
#: Minutes a per-minute drop counter outlives its minute (``lua/lib/count_drop.lua`` sets the expiry).
DROPS_MINUTE_KEEP = 60

#: Field of the job hash naming the job's loner marker key.
LONER_FIELD = 'policies_loner'
#: Field of the job hash of a job whose stop was asked by another job's admission (``Loner(on_conflict='cancel')``):
#: that job's id. A job that has it when a PolicyWorker starts it (``lua/start.lua``) is not run: it ends ``stopped``
#: at once, as rq's stop-job command would have ended it, which rq ignores for a job not yet started.
STOP_ASKED_FIELD = 'policies_cancelled_by'

#: Seconds a superseded job's tombstone lives: far longer than rq's scheduler takes between reading a due job and
#: writing it back to its queue, the window in which a host clock ahead of the server's lets it resurrect the job.
SUPERSEDED_SECONDS = 600

#: The tombstones' marker, alive while any tombstone is: the tombstones' prefix itself (``rq:policies:superseded:``,
#: the tombstone of no job id), which every version's fetch probe reads. Not renamed to a key without the colon:
#: workers of the new name would skip the tombstones producers of the old one wrote during a rolling upgrade, and run
#: jobs those tombstones superseded (docs/reliability.md, the scheduler-clock row).
SUPERSEDED_MARKER = SUPERSEDED_PREFIX


def is_tombstone(key: str) -> bool:
    """Is ``key`` a tombstone (``superseded(job id)``) or the tombstones' marker? Both expire (the table above)."""
    return key.startswith(str(SUPERSEDED_PREFIX))


#: Seconds the record of a dropped enqueue lives (an enqueue given ``job_id=``): long enough to ask ``explain`` why that
#: id never ran, short enough that the records of a busy duplicate path stay few.
DROPPED_SECONDS = 3600


def loner(queue: str, digest: str) -> str:
    """The loner marker for one identity on one queue."""
    return LONER_KEYS.prefix(queue, digest)


def throttle_prefix(queue: str, digest: str) -> str:
    """The prefix the throttle window keys hang off; the scripts append the window number under the server's clock."""
    return THROTTLE_KEYS.prefix(queue, digest)


def trailing(queue: str, digest: str) -> str:
    """The pending trailing job of one throttled identity."""
    return TRAILING_KEYS.prefix(queue, digest)


def debounce(queue: str, digest: str) -> str:
    """The pending debounced job of one identity."""
    return DEBOUNCE_KEYS.prefix(queue, digest)


def key_id(scope: str, key: str) -> str:
    """A key's **key id**, ``<scope>:<key>``: one key of one scope, as the per-key keys, the due index, the run-time
    settings' hashes and the job field name it (a scope holds no colon, so the key value may)."""
    return f'{scope}:{key}'


#: Seconds a record that answers a resent call lives (a LimitedCapacityWorker finish's, an admin call's answer): long
#: enough for redis-py to resend a call whose reply was lost. A fetch's claim record lives the worker's ``hold_ttl``
#: instead: its take is live as long as it (:func:`taken`).
CLAIM_TTL = 60


#: Seconds an admin call's answer is kept under its request id (:func:`answer`): a replay comes within it.
ANSWER_TTL = CLAIM_TTL


def answer(request_id: str | None = None) -> str:
    """Where an admin call keeps its answer (``rq:policies:answer:<request id>``, lua/lib/answer.lua), so that a
    replay of the call answers what its first run did; a fresh request id when none is given."""
    if request_id is None:
        import uuid

        request_id = uuid.uuid4().hex
    return ANSWER(request_id)


def is_answer(key: str) -> bool:
    """Is ``key`` an admin call's kept answer (:func:`answer`: it expires after :data:`ANSWER_TTL` seconds)?"""
    return key.startswith(ANSWER)


def loner_lapse_field(queue: str) -> str:
    """The field of :data:`LAPSES` counting the liveness keys of ``queue``'s ``until='finished'`` jobs found gone
    while their horse still ran (``loner:<queue>``)."""
    return f'loner:{queue}'


#: Seconds the push record of a job with a short ``result_ttl`` lives (:func:`pushed`): far longer than redis-py
#: takes to resend a transaction whose reply was lost.
PUSHED_SECONDS = 60


def lapse_field(ledger: str) -> str:
    """The field of :data:`LAPSES` counting the lapses of hold ledger key ``ledger``: ``queue:<queue>`` for a
    queue's (QueueSlot), ``lcw:<class>`` for a LimitedCapacityWorker class's, ``key:<scope>:<key>`` for a key's
    (Concurrency)."""
    for space, kind in ((holds, 'queue:'), (lcw_running, 'lcw:'), (KEY_HOLDS_PREFIX, 'key:')):
        if ledger.startswith(space):
            return kind + ledger[len(space):]
    return ledger


def numbered(prefix: str, n: int) -> str:
    """Key number ``n`` (an integer) under ``prefix``: a throttle window (:func:`throttle_prefix` and the window
    number) or a per-minute drop counter (:data:`DROPS_MINUTE_PREFIX` and the epoch minute); Lua's ``key_num``."""
    return f'{prefix}{int(n)}'


def is_drop_counter(key: str) -> bool:
    """Is ``key`` one of the drop counters (:data:`DROPS`, or a per-minute one under :data:`DROPS_MINUTE_PREFIX`)?"""
    return key == DROPS or key.startswith(DROPS_MINUTE_PREFIX)


def drop_field(policy: str, queue: str) -> str:
    """The field of :data:`DROPS` counting one policy's drops on one queue."""
    return f'{policy}:{queue}'


@dataclass(frozen=True)
class Family:
    """One kind of per-identity key: how to build it, find it by SCAN, and read a found key back.

    Attributes:
        name: the kind's segment after ``rq:policies:`` (also its block in ``rq-policies info``).
        policy: the name of the policy that writes it.
        hash: the key is a HASH (else a STRING holding a job id).
        windowed: the key ends in ``:<window number>`` after the digest (a throttle window), so its full name needs
            the policy's setting (the window width) and the time.
        while_waiting: the key holds its identity only while its job waits (``info`` counts those that do).
    """

    name: str
    policy: str
    hash: bool = False
    windowed: bool = False
    while_waiting: bool = False
    #: a field of the holder's job hash that, set to ``finished``, makes a started holder still hold its identity
    held_until_field: str = ''
    #: (a windowed family) a field of the holder's job hash carrying the window's width in seconds, from which
    #: ``info`` and the page show the window's start and end instead of its number
    width_field: str = ''

    @property
    def needs_setting(self) -> bool:
        return self.windowed

    @property
    def head(self) -> str:
        """What every key of the family starts with (``rq:policies:<name>:``; a SCAN pattern appends to it)."""
        return f'{PREFIX}{self.name}:'

    def prefix(self, queue: str, digest: str) -> str:
        """The key of one identity (a windowed family's keys are this plus the window number, :func:`numbered`)."""
        base = f'{self.head}{queue}:{digest}'
        return base + ':' if self.windowed else base

    def parse(self, key: str) -> tuple[str, str, str | None] | None:
        """``(queue, digest, window number or None)`` of a key of this family, or None if it is not one."""
        head = self.head
        if not key.startswith(head):
            return None
        # The digest is fixed-width hex and the window a number, so the queue (which may hold colons) is the rest.
        parts = key[len(head):].rsplit(':', 2 if self.windowed else 1)
        if len(parts) != (3 if self.windowed else 2):
            return None
        return parts[0], parts[1], parts[2] if self.windowed else None


LONER_KEYS = Family('loner', 'loner', while_waiting=True, held_until_field='policies_loner_until')
THROTTLE_KEYS = Family('throttle', 'throttle', windowed=True, width_field='policies_throttle_slot')
TRAILING_KEYS = Family('trailing', 'throttle')
DEBOUNCE_KEYS = Family('debounce', 'debounce', hash=True)

#: Every per-identity key family, in the order ``rq-policies info`` shows them.
FAMILIES = (LONER_KEYS, THROTTLE_KEYS, TRAILING_KEYS, DEBOUNCE_KEYS)


def hash_tag(key: str) -> str | None:
    """The hash tag of ``key`` as Redis Cluster reads it (the text between the first ``{`` and the first ``}`` after
    it, when not empty), or None: a key with a tag is placed by the tag alone."""
    start = key.find('{')
    if start < 0:
        return None
    end = key.find('}', start + 1)
    if end <= start + 1:
        return None
    return key[start + 1:end]


def is_cluster(connection: Any) -> bool:
    """Is ``connection`` a redis-py Redis Cluster client (``redis.cluster.RedisCluster`` or a subclass, its asyncio
    twin, or a pipeline of either: redis-py's cluster pipelines are cluster clients too)?"""
    from redis.asyncio.cluster import ClusterPipeline as AsyncClusterPipeline
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    return isinstance(connection, (RedisCluster, AsyncRedisCluster, AsyncClusterPipeline))


def check_connection(connection: Any) -> None:
    """Refuse a Redis Cluster connection when rq's key prefix has no hash tag.

    Every door and every fetch is one script over rq's keys and ours, and a cluster runs a script only when all its
    keys are in one hash slot: a hash-tagged prefix (``RQ_KEY_PREFIX='{rq}'``) puts every key of rq and of
    rq-policies in the slot of its tag. Without one the first door would fail with the server's ``CROSSSLOT``
    (``all keys must map to the same key slot``), which does not say why; this says it at the first door or worker
    start instead. A single server (``redis.Redis``, Sentinel's clients) passes whatever the prefix.

    Raises:
        PolicyConfigurationError: the connection is a cluster's and :data:`PREFIX` has no hash tag.
    """
    if not is_cluster(connection) or hash_tag(PREFIX) is not None:
        return
    from .compat import RQ3
    from .exceptions import PolicyConfigurationError

    how = (
        "set RQ_KEY_PREFIX to a hash-tagged prefix in the environment of every producer and worker before rq is "
        "imported, e.g. RQ_KEY_PREFIX='{rq}'"
        if RQ3 else "rq 2.12 has no RQ_KEY_PREFIX (its keys are always 'rq:...'): use rq 3 with RQ_KEY_PREFIX='{rq}'"
    )
    raise PolicyConfigurationError(
        f'a Redis Cluster connection ({type(connection).__name__}) needs every key of rq and rq-policies in one hash '
        f'slot, and RQ_KEY_PREFIX={KEY_PREFIX!r} has no hash tag ({{...}}): {how}. See docs/cluster.md.'
    )


def scanner(connection: Any) -> Any:
    """The client a cursor-by-cursor SCAN of our keys goes through: ``connection`` itself, or on a cluster the
    client of the node that holds the prefix's slot (every key of ours and rq's lives there: the prefix is
    hash-tagged). A cluster client's own SCAN answers one cursor per node, which cannot be passed back as one.

    A client that balances its reads over replicas (``load_balancing_strategy``: :mod:`rq_policies.surfaces.replicas`)
    scans the slot's first replica (the primary when it has none) through the node client it opened, which sent
    ``READONLY``: always the same one, since a cursor means something only to the node that gave it."""
    if not is_cluster(connection):
        return connection
    node = None
    if getattr(connection, 'load_balancing_strategy', None) is not None:
        node = connection.get_node_from_key(PREFIX, replica=True)
    if node is None:
        node = connection.get_node_from_key(PREFIX)
    return connection.get_redis_connection(node)
