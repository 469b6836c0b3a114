"""The history's events: what producers, workers and nemeses record, and what the checker reads.

A history is a folder of files ``*.jsonl``, one per recording process (so a killed process loses at most its last
line, and no two processes write one file). Each line is one JSON object, an *event*. Every event has:

* ``t``: the Redis server's time in seconds (float, microseconds), the clock every script decides by. A process
  measures its offset from the server's ``TIME`` when it starts (the round trip's middle) and stamps each event with
  its local clock plus that offset, measured again after every reconnect; ``dt`` in the process's ``hello`` event
  gives the round trip, the stamp's uncertainty.
* ``p``: the recording process (``producer-3``, ``worker-2``, ``horse-2-17``, ``nemesis``, ``runner``), unique
  within a run.
* ``e``: the event's type, one of :data:`TYPES`.

The types, with their own fields (a field not listed is ignored by the checker; ``None``/absent means unknown):

``hello`` (every process, first line)
    ``role`` (producer | worker | horse | nemesis | runner), ``pid``, ``dt`` (the calibration's round trip, s),
    ``topology`` (single | sentinel | cluster), ``worker`` (the rq worker name, for workers and horses).

``invoke`` (producer, before a door call)
    ``op`` (unique within the run), ``door`` (enqueue | enqueue_in | enqueue_at | enqueue_many | delay | aio),
    ``queue``, ``job`` (the job id the caller passed, so that a lost reply can still be tied to a run), ``func``,
    ``payload`` (a small JSON value the job records when it runs, so "which payload ran" is checkable), ``due`` (server
    time the job is due, for enqueue_in/at; None otherwise), ``priority`` (None or an int), and ``policies``: a list
    of :data:`POLICY_FIELDS`-shaped dicts, one per declared policy, as resolved for this call (the key or identity the
    policy computed, not the function that computes it).

``ok`` / ``fail`` / ``info`` (producer, after the call; Jepsen's three completions)
    ``op``; ``ok``: the call returned, with ``verdict`` (admitted | dropped | raised | replaced | parked | scheduled),
    ``job`` (the id now waiting for the call: the admitted job, the replaced job it merged into), ``holder`` (for
    dropped and raised: the id the door named as holding the identity); ``fail``: certainly not applied (a bad
    argument), ``error``; ``info``: unknown whether it applied (a timeout, a connection error), ``error``.

``start`` (the job's own process, first thing in the job function)
    ``job``, ``run`` (unique per execution: ``<worker>:<pid>:<n>``), ``worker``, ``pid``, ``claim`` (the fetch's claim
    token, None when unknown), ``queue``, ``payload`` (as passed), ``attempt`` (rq's retry number, 0 first), and the
    resolved ``policies`` (as in ``invoke``, read from the job) so the checker needs no producer record to place a run.

``end`` (the job's own process, last thing in the job function; or the worker, for an ending the job cannot see)
    ``job``, ``run``, ``outcome`` (ok | failed | snoozed | backoff | stopped | timeout), ``retry`` (True when rq will
    run it again: a Retry, a Snooze, a BackOff).

``release`` (the worker, when its release of a claim's holds was acknowledged)
    ``job``, ``claim``.

``nemesis`` (the nemesis process, around each fault)
    ``action`` (kill_worker | kill_group | kill_horse | stop_worker | stop_group | stop_horse | cont | restart_aof |
    outage | lost_reply | failover_kill | failover_graceful | migrate_slot), ``phase`` (begin | end), ``target`` (a
    worker name, a pid, a node), and for a kill or a stop ``workers`` (the rq worker names whose runs it ended or
    froze) and ``lease`` (seconds a hold outlives its last refresh: the bound after which a dead worker's holds free).

``exit`` (the runner, when it sees a worker process end)
    ``worker``, ``pid``, ``code`` (exit code or -signal).

``setting`` (whoever changed a policy setting at run time)
    ``what`` (cap | rate | key_limit | key_rate | fair_weight | fair_pause | fair_resume), ``queue`` or ``scope``,
    ``key``, ``value`` (the new value: a cap, ``[limit, per, burst]``, a weight, None for pause/resume).

``final`` (the runner, once, after the drain with every fault healed)
    ``jobs``: {job id: where rq shows it (queued | scheduled | deferred | started | finished | failed | stopped |
    canceled | parked | waiting | missing)} for every job id any ``ok``/``info``/``start`` event named.

Fields added for the checker (optional: the checker reads them when present and says in docs/history.md what it
assumes without them; nothing above was removed or changed in meaning):

``hello``: ``queues`` (workers: the queue names the worker serves; without it, the queues its runs came from).

``ok``: ``now`` (the server's clock when the door's script decided, ``Verdict.server_now``: the exact instant of the
    call, which else lies anywhere between its ``invoke`` and its ``ok``); ``due`` (the run time the door answered
    for a pending job, ``Verdict.number``: a Debounce's or a trailing job's); ``policy`` (for dropped and raised: the
    policy that decided, ``Verdict.policy``); ``dropped_jobs`` (ids of pending jobs the call deleted by design: a
    ``force`` dropping a trailing or debounced job, ``Verdict.dropped``). The verdict ``scheduled`` means admitted as
    a pending job (``Verdict.code`` 2: a trailing Throttle job, a Debounce's pending job); an ``enqueue_in``/``at``
    that admits an ordinary job is ``admitted``, its ``invoke`` carrying ``due``.

``start``: ``fetched``, ``[t0, t1]``: the worker's stamps (its own process's clock and offset) just before it sent the
    fetch that took the job and just after its reply, so the instant the server decided the start (took the hold,
    paid the rate, took the Fair turn) is known to a round trip; without it the checker allows ``start_lag`` (1 s).

``end``: ``due`` (with ``retry``: the server time from which the job may run again: a Snooze's or a retry's scheduled
    time, a BackOff's end); else ``delay`` (seconds from the end); ``retry`` None: the worker could not read whether
    rq will run it again (the checker then allows a second run).

``setting``: ``t0`` (the stamp just before the call; ``t`` is then the stamp after it returned, and the change took
    effect in between).

``nemesis``: ``id`` (the same on a begin and its end; without it, begins and ends pair by action and target, first in
    first out).

Policy fields: ``scope`` for ``concurrency``, ``rate`` and ``fair`` (the key's scope, as ``setting`` events name it:
``key`` alone then names the key within it), ``cost`` for ``rate``, ``priority`` for ``fair`` (the resolved priority
when the enqueue gave none).

What each property reads (``tests/history/check.py``):

1. no loss: ``ok`` admitted/replaced/parked/scheduled -> an ``end`` without ``retry``, or a waiting place in ``final``;
2. no double run: ``start``/``end`` per ``job`` and ``run``, with ``nemesis`` kills and stops and ``exit``;
3. no phantom: every ``start``'s ``job`` named by an ``ok`` or ``info``;
4. Loner: ``invoke``/``ok`` with a ``loner`` policy, ``start``/``end`` of the holders;
5. QueueSlot and Concurrency: ``start``/``end`` with ``setting`` cap and key limits, ``lease`` of kills;
6. QueueRate, Rate, Throttle, Debounce: ``start`` times per queue and key, ``invoke`` payloads and times;
7. Fair: ``invoke``/``ok`` (when a key became backlogged) and ``start`` per key, weights;
8. priority and pause: ``priority`` per job, ``setting`` fair_pause/fair_resume;
9. liveness: ``due`` of each admitted job and its first ``start``, with the nemesis events that excuse a delay.

Fields the recorder writes beyond those (``tests/history/record.py``, ``jobs.py``, ``producers.py``, ``run.py``; all
optional for a reader):

* ``hello``: ``asyncio`` (a producer on the asyncio doors); the runner's: ``servers``, ``server`` (product and
  version), ``seed``, ``broken``. A worker writes its ``hello`` at its first fetch, not while it starts.
* ``invoke``: ``due`` is the scheduled registry's score (rq truncates the caller's time to a whole second, and the
  fetch promotes once the server's clock reaches it); for ``enqueue_in``, rq reads its clock just after the producer
  did, so the true due may be one second later. A Fair call's payload carries its ``prio``. An ``enqueue_many`` that
  raised part-way records ``info`` for each of its calls (some were written).
* ``start``: ``fetched`` begins at the first send of the fetch's claim token (a fetch whose reply was lost is sent
  again under the same token, and its claim record answers what the first send took); ``fetch`` (that claim token,
  which names the claim record ``rq:policies:claim:<token>``, whether or not the fetch took a hold); ``paid`` (True:
  a rate-parked job given back with its Rate start paid for then, before this fetch, which takes it without paying).
* ``end``: ``delay`` (the seconds asked: a Snooze's, a retry's interval), ``by`` (``worker`` when the worker
  recorded it: the job's horse was killed, or rq ended the run where the job could not see).
* ``setting``: ``cleared`` (a run-time setting removed: ``value`` is then the declared one back in force).
* ``nemesis``: a stop's ``end`` is its SIGCONT (no ``cont`` action is recorded apart); ``seconds`` (a stop's or an
  outage's planned length), ``fired`` (lost_reply: the fault met its request), ``promoted`` (a failover's new
  primary), ``keys`` (migrate_slot: keys moved), ``error`` (a fault that could not be performed; its ``end`` ends it).
* ``exit``: ``asked`` (True for the runner's own stop at the end of the run).
* ``final``: the place ``intermediate`` (queued, but on a queue's intermediate list: taken by a fetch and never
  started; rq's cleanup fails it, unrun), and ``drained`` (False when the drain timed out or stopped on parked jobs
  that did not move).
"""

from __future__ import annotations

#: Every event type (the ``e`` field).
TYPES = ('hello', 'invoke', 'ok', 'fail', 'info', 'start', 'end', 'release', 'nemesis', 'exit', 'setting', 'final')

#: The verdicts of an ``ok``.
VERDICTS = ('admitted', 'dropped', 'raised', 'replaced', 'parked', 'scheduled')

#: The outcomes of an ``end``.
OUTCOMES = ('ok', 'failed', 'snoozed', 'backoff', 'stopped', 'timeout')

#: The fields of one resolved policy in ``invoke``/``start`` (``kind`` names it; the rest is per kind).
POLICY_FIELDS = {
    # until: started | finished; on_conflict: drop | raise | replace
    'loner': ('identity', 'until', 'on_conflict', 'ttl'),
    'throttle': ('identity', 'slot', 'trailing'),  # slot: seconds (epoch-aligned)
    'debounce': ('identity', 'wait', 'max_wait'),
    'concurrency': ('scope', 'key', 'limit', 'cost'),  # limit as declared; ``setting`` key_limit overrides it
    'rate': ('scope', 'key', 'limit', 'per', 'burst', 'cost'),
    'fair': ('scope', 'key', 'weight', 'priority'),
    'queue_slot': ('cap',),  # the queue's cap as the producer knew it; ``setting`` events are authoritative
    'queue_rate': ('limit', 'per', 'burst'),
}
