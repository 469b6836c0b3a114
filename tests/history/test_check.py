"""The history checker on hand-made histories (no server): for each property of issue 31, one history with exactly
one violation of it, which the checker flags naming its events, and the same history repaired, which passes; the
edges (a start exactly at a slot edge, a run killed by a nemesis and run again, a lapse inside the lease, an info call
whose job ran, a replaced job, the stamps' uncertainty); the command line; and a simulated clean history of every
policy, which must pass every property."""

from __future__ import annotations

import json

import pytest

from tests.history import check
from tests.history.synth import History, simulate

#: A whole minute of the server's clock (1_700_000_040 = 28_333_334 x 60), so slot edges are easy to name.
T = 1_700_000_040.0
P = 'producer-1'


def base(dt: float = 0.0, queues: tuple[str, ...] = ('q',), workers: tuple[str, ...] = ('w1', 'w2')) -> History:
    h = History(dt=dt)
    for name in workers:
        h.worker(name, T - 10, list(queues))
    return h


def admit(h: History, job: str, t: float, *, queue: str = 'q', verdict: str = 'admitted', took: float = 0.01,
          **fields) -> str:
    """A call admitted (or whatever ``verdict``) between ``t`` and ``t + took``."""
    return h.call(P, t, t + took, job=job, queue=queue, verdict=verdict, **fields)


def run(h: History, worker: str, job: str, t0: float, t1: float | None, **fields) -> str:
    """A run whose fetch is known to a millisecond (``fetched``) just before its start."""
    fields.setdefault('fetched', (t0 - 0.002, t0 - 0.001))
    return h.run(worker, job, t0, t1, **fields)


def results(h: History, tmp_path, bounds: dict | None = None) -> dict[int, check.Result]:
    folder = h.write(tmp_path / 'history')
    table = check.load_bounds(None)
    table.update(bounds or {})
    return {r.number: r for r in check.check(check.read_history(folder, table))}


def only(found: dict[int, check.Result], number: int, count: int = 1) -> list[check.Finding]:
    """Property ``number`` has ``count`` violations and every other property none; its findings."""
    others = {n: [f.what for f in r.violations] for n, r in found.items() if n != number and r.violations}
    assert not others, others
    assert len(found[number].violations) == count, [f.what for f in found[number].violations]
    return found[number].violations


def clean(found: dict[int, check.Result]) -> None:
    bad = {n: [f.what for f in r.violations] for n, r in found.items() if r.violations}
    assert not bad, bad


def named(finding: check.Finding, field: str) -> set:
    """The values of ``field`` (job, op, run) in the finding's events."""
    return {e.get(field) for e in finding.events} - {None}


# -- 1. no loss ------------------------------------------------------------------------------------------------------

def loss(status: str, kill: bool = False) -> History:
    h = base()
    admit(h, 'j1', T)
    admit(h, 'j2', T + 1)
    run(h, 'w1', 'j1', T + 2, T + 3)
    if kill:
        run(h, 'w2', 'j2', T + 4, None)
        h.nemesis(T + 4.5, 'kill_horse', workers=['w2'])
    h.final(T + 10, {'j1': 'finished', 'j2': status})
    return h


def test_no_loss_flags_an_acknowledged_job_that_never_ran_and_is_gone(tmp_path):
    [finding] = only(results(loss('missing'), tmp_path), 1)
    assert named(finding, 'job') >= {'j2'} and 'j2' in finding.what and 'missing' in finding.what


@pytest.mark.parametrize('status', ['queued', 'scheduled', 'deferred'])
def test_no_loss_passes_a_job_still_visibly_waiting(tmp_path, status):
    clean(results(loss(status), tmp_path))


def test_no_loss_passes_a_killed_run_that_final_shows_ended_and_flags_one_failed_without_running(tmp_path):
    clean(results(loss('failed', kill=True), tmp_path / 'a'))
    [finding] = only(results(loss('failed'), tmp_path / 'b'), 1)
    assert 'never started' in finding.what


def test_no_loss_counts_a_loss_in_a_failovers_lost_window_as_a_lapse(tmp_path):
    h = loss('missing')
    h.nemesis(T + 1.5, 'failover_kill', T + 5, target='node-1')
    found = results(h, tmp_path)
    clean(found)
    assert len(found[1].lapses) == 1 and 'j2' in found[1].lapses[0].what


# -- 2. no double run ------------------------------------------------------------------------------------------------

def twice(first_end: float | None = T + 2, retry: bool = False, nemesis: str | None = None) -> History:
    h = base()
    admit(h, 'j1', T)
    run(h, 'w1', 'j1', T + 1, first_end, retry=retry, outcome='failed' if retry else 'ok')
    if nemesis:
        h.nemesis(T + 1.5, nemesis, workers=['w1'], lease=90)
    run(h, 'w2', 'j1', T + 3, T + 4)
    h.final(T + 10, {'j1': 'finished'})
    return h


def test_no_double_run_flags_a_second_run_after_an_ok_end(tmp_path):
    [finding] = only(results(twice(), tmp_path), 2)
    assert named(finding, 'run') == {'w1:1', 'w2:2'}


def test_no_double_run_passes_a_second_run_after_a_retry(tmp_path):
    clean(results(twice(retry=True), tmp_path))
    # The worker could not read whether rq would run it again (retry None): not a violation either.
    h = twice()
    h.files['horse-w1'][-1]['retry'] = None
    clean(results(h, tmp_path / 'unknown'))


def test_a_run_killed_by_a_nemesis_may_run_again_but_not_without_one(tmp_path):
    clean(results(twice(first_end=None, nemesis='kill_worker'), tmp_path / 'killed'))
    [finding] = only(results(twice(first_end=None), tmp_path / 'not'), 2)
    assert 'no death or stop of w1' in finding.what


def test_no_double_run_flags_runs_that_overlap_even_after_a_kill(tmp_path):
    h = base()
    admit(h, 'j1', T)
    run(h, 'w1', 'j1', T + 1, T + 5)  # the worker is killed, its horse runs on (the guard keeps it)
    h.nemesis(T + 1.5, 'kill_worker', workers=['w1'], lease=90)
    run(h, 'w2', 'j1', T + 3, T + 4)
    h.final(T + 10, {'j1': 'finished'})
    [finding] = only(results(h, tmp_path), 2)
    assert 'twice at once' in finding.what


# -- 3. no phantom ---------------------------------------------------------------------------------------------------

def phantom(result: str, verdict: str = 'admitted') -> History:
    h = base()
    admit(h, 'j1', T)
    h.call(P, T + 1, T + 2, job='j2', result=result, verdict=verdict)
    run(h, 'w1', 'j1', T + 3, T + 4)
    run(h, 'w2', 'j2', T + 3, T + 4)
    h.final(T + 10, {'j1': 'finished', 'j2': 'finished'})
    return h


def test_no_phantom_flags_a_run_of_a_dropped_call(tmp_path):
    [finding] = only(results(phantom('ok', verdict='dropped'), tmp_path), 3)
    assert named(finding, 'job') == {'j2'} and 'dropped' in finding.what


def test_an_info_call_whose_job_ran_is_no_phantom(tmp_path):
    clean(results(phantom('info'), tmp_path / 'info'))
    clean(results(phantom('ok'), tmp_path / 'ok'))


def test_no_phantom_flags_a_run_before_its_call(tmp_path):
    h = base()
    run(h, 'w1', 'j1', T, T + 1)
    admit(h, 'j1', T + 2)
    h.final(T + 10, {'j1': 'finished'})
    [finding] = only(results(h, tmp_path), 3)
    assert 'before the call' in finding.what


# -- 4. Loner --------------------------------------------------------------------------------------------------------

def loner_policy(until: str = 'started', on_conflict: str = 'drop') -> list[dict]:
    return [{'kind': 'loner', 'identity': 'x', 'until': until, 'on_conflict': on_conflict, 'ttl': None}]


def two_holders(second_at: float, until: str = 'started') -> History:
    h = base()
    admit(h, 'j1', T, policies=loner_policy(until))
    run(h, 'w1', 'j1', T + 5, T + 8, policies=loner_policy(until))
    admit(h, 'j2', second_at, policies=loner_policy(until))
    run(h, 'w2', 'j2', T + 20, T + 21, policies=loner_policy(until))
    h.final(T + 30, {'j1': 'finished', 'j2': 'finished'})
    return h


def test_loner_flags_a_second_holder_admitted_while_the_first_waited(tmp_path):
    [finding] = only(results(two_holders(T + 2), tmp_path), 4)
    assert named(finding, 'job') >= {'j1', 'j2'}


def test_loner_started_lets_a_second_in_once_the_first_started_finished_does_not(tmp_path):
    clean(results(two_holders(T + 6), tmp_path / 'started'))
    only(results(two_holders(T + 6, until='finished'), tmp_path / 'running'), 4)
    clean(results(two_holders(T + 9, until='finished'), tmp_path / 'ended'))


def dropped(at: float, holder: str = 'j1') -> History:
    h = base()
    admit(h, 'j1', T, policies=loner_policy())
    run(h, 'w1', 'j1', T + 5, T + 8, policies=loner_policy())
    admit(h, 'j2', at, policies=loner_policy(), verdict='dropped', holder=holder, policy='loner')
    h.final(T + 30, {'j1': 'finished'})
    return h


def test_loner_flags_a_drop_when_no_holder_was_alive(tmp_path):
    [finding] = only(results(dropped(T + 7), tmp_path), 4)
    assert named(finding, 'op') == {'producer-1:2', 'producer-1:1'} and 'could not have held' in finding.what


def test_loner_passes_a_drop_whose_holder_waited_even_at_the_window_edge(tmp_path):
    clean(results(dropped(T + 2), tmp_path / 'waiting'))
    # The call's window reaches the fetch of the holder (fetched T + 4.998): it may have come just before.
    clean(results(dropped(T + 4.99), tmp_path / 'edge'))


def dropped_after_a_death(at: float, in_process: bool) -> History:
    """j1 (until='finished') starts at T + 5 on w1, which is SIGKILLed at T + 6: its run never ends."""
    policies = loner_policy(until='finished')
    h = base()
    admit(h, 'j1', T, policies=policies)
    run(h, 'w1', 'j1', T + 5, None, policies=policies, in_process=in_process)
    h.nemesis(T + 6, 'kill_worker', T + 6, workers=['w1'], target=1)
    h.exit(T + 6, 'w1')
    admit(h, 'j2', at, policies=policies, verdict='dropped', holder='j1', policy='loner')
    h.final(T + 400, {'j1': 'failed'})
    return h


def test_loner_a_dead_in_process_workers_holder_counts_for_its_keys_start_ttl(tmp_path):
    """A SimpleWorker's key lives the job's timeout + 60 s from the start (rq: it cannot beat during the job), so
    its dead run's identity is held that long; a forking worker's, job_monitoring_interval + 60 s after its death
    (the one-server long run on b2c50d9: 19 drops 95 to 221 s after a SimpleWorker's SIGKILL, read as holder-less)."""
    clean(results(dropped_after_a_death(T + 150, in_process=True), tmp_path / 'simple'))
    [finding] = only(results(dropped_after_a_death(T + 150, in_process=False), tmp_path / 'forking'), 4)
    assert 'could not have held' in finding.what
    only(results(dropped_after_a_death(T + 300, in_process=True), tmp_path / 'simple-past'), 4)


def test_loner_flags_a_drop_naming_a_job_that_never_held_the_identity(tmp_path):
    [finding] = only(results(dropped(T + 2, holder='nobody'), tmp_path), 4)
    assert 'never admitted' in finding.what


def replaced(ran: str) -> History:
    policies = loner_policy(on_conflict='replace')
    h = base()
    admit(h, 'j1', T, policies=policies, payload='first')
    admit(h, 'j2', T + 1, policies=policies, payload='second', verdict='replaced', into='j1')
    run(h, 'w1', 'j1', T + 5, T + 6, policies=policies, payload=ran)
    h.final(T + 30, {'j1': 'finished'})
    return h


def test_a_replaced_job_must_run_the_last_payload(tmp_path):
    clean(results(replaced('second'), tmp_path / 'last'))
    [finding] = only(results(replaced('first'), tmp_path / 'lost'), 4)
    assert '"first"' in finding.what and '"second"' in finding.what


def test_replacing_calls_whose_order_is_unknown_may_each_be_the_last(tmp_path):
    policies = loner_policy(on_conflict='replace')
    h = base()
    admit(h, 'j1', T, policies=policies, payload='first')
    admit(h, 'j2', T + 1, policies=policies, payload='second', verdict='replaced', into='j1', took=1.0)
    h.call('producer-2', T + 1.5, T + 1.6, job='j3', payload='third', policies=policies, verdict='replaced',
           into='j1')
    run(h, 'w1', 'j1', T + 5, T + 6, policies=policies, payload='second')
    h.final(T + 30, {'j1': 'finished'})
    clean(results(h, tmp_path))


# -- 5. QueueSlot and Concurrency ------------------------------------------------------------------------------------

def capped(second: tuple[float, float], dt: float = 0.0, fetched: bool = True) -> History:
    h = base(dt=dt)
    h.setting(T - 1, 'cap', 1, queue='q', t0=T - 1.01)
    admit(h, 'j1', T)
    admit(h, 'j2', T)
    extra = {} if fetched else {'fetched': None}
    run(h, 'w1', 'j1', T + 1, T + 3, **extra)
    run(h, 'w2', 'j2', *second, **extra)
    h.final(T + 10, {'j1': 'finished', 'j2': 'finished'})
    return h


def test_queue_slot_flags_two_runs_at_once_on_a_cap_of_one(tmp_path):
    [finding] = only(results(capped((T + 2, T + 4)), tmp_path), 5)
    assert named(finding, 'job') == {'j1', 'j2'} and finding.size == 1


def test_queue_slot_passes_runs_one_after_the_other(tmp_path):
    clean(results(capped((T + 3.5, T + 4)), tmp_path))


def test_an_overlap_the_stamps_uncertainty_explains_is_not_flagged(tmp_path):
    # 5 ms of overlap: flagged on exact stamps, not with a 20 ms round trip (10 ms either way).
    only(results(capped((T + 2.995, T + 4)), tmp_path / 'exact'), 5)
    clean(results(capped((T + 2.995, T + 4), dt=0.02), tmp_path / 'uncertain'))


def test_a_raised_cap_allows_more_and_a_start_in_its_window_may_use_it(tmp_path):
    h = capped((T + 2, T + 4))
    h.setting(T + 1.5, 'cap', 2, queue='q', t0=T + 1.4)
    clean(results(h, tmp_path))


def cap_lowered(during_failover: bool, previous: int = 3) -> History:
    """The operator lowers the cap by one from ``previous``, during a graceful failover or 30 s before it; 18.5 s
    after the failover's end three jobs run at once (the shape of the Sentinel long runs' overshoots,
    docs/guarantees.md)."""
    h = base(workers=('w1', 'w2', 'w3'))
    h.setting(T - 60, 'cap', previous, queue='q')
    h.nemesis(T - 5, 'failover_graceful', T + 5, target='127.0.0.1:1')
    h.setting(T - 4.5 if during_failover else T - 35, 'cap', previous - 1, queue='q')
    for job, worker, t0, t1 in (('j1', 'w1', 22, 27), ('j2', 'w2', 23, 24), ('j3', 'w3', 23.5, 24.5)):
        admit(h, job, T + 21)
        run(h, worker, job, T + t0, T + t1)
    h.final(T + 40, {'j1': 'finished', 'j2': 'finished', 'j3': 'finished'})
    return h


@pytest.mark.parametrize(('during_failover', 'previous', 'explained'), [(True, 3, True), (False, 3, False),
                                                                         (True, 2, False)])
def test_a_queues_cap_lost_in_a_failover_explains_what_the_previous_cap_allowed(tmp_path, during_failover, previous,
                                                                                 explained):
    # The checker holds the cap the operator wrote; a SENTINEL FAILOVER lost it with the old master, and the promoted
    # one kept the previous cap until the cap's next setting: a known break (test_history_run.KNOWN_BREAKS), but only
    # for a cap written during a failover and up to the previous cap. Its matcher read the settings of keys only, so
    # the queue's lost cap was reported unexplained (the Sentinel long runs 7597d11 and 962ea40).
    from tests.history.test_history_run import History as RunHistory
    from tests.history.test_history_run import checked, unexplained

    folder = cap_lowered(during_failover, previous).write(tmp_path / 'history')
    report = checked(folder)
    [prop] = [p for p in report['properties'] if p['number'] == 5]
    assert len([v for v in prop['violations'] if 'queue q: 3 running' in v['what']]) == 1, prop['violations']
    bad, known = unexplained(report, RunHistory(folder))
    three = [line for line in bad + known if 'queue q: 3 running' in line]
    assert len(three) == 1
    if explained:
        assert not bad and 'written during a failover was rolled back' in three[0], (bad, known)
    else:
        assert three[0] in bad, (bad, known)


def frozen(second_at: float, lease: float = 9.0) -> History:
    h = base()
    h.setting(T - 1, 'cap', 1, queue='q')
    admit(h, 'j1', T)
    admit(h, 'j2', T)
    run(h, 'w1', 'j1', T + 1, T + 30)
    h.nemesis(T + 2, 'stop_group', workers=['w1'], lease=lease, target='w1')
    h.nemesis(T + 20, 'cont', workers=['w1'], target='w1')
    run(h, 'w2', 'j2', second_at, second_at + 1)
    h.final(T + 40, {'j1': 'finished', 'j2': 'finished'})
    return h


def test_a_lapse_inside_the_lease_is_a_violation_and_after_it_a_lapse(tmp_path):
    # Frozen at T + 2 with a 9 s lease: the hold may lapse from T + 2 + 9 x 2/3 = T + 8 (refreshed every third).
    [finding] = only(results(frozen(T + 5), tmp_path / 'inside'), 5)
    assert named(finding, 'job') == {'j1', 'j2'}
    found = results(frozen(T + 10), tmp_path / 'after')
    clean(found)
    assert len(found[5].lapses) == 1 and found[5].lapses[0].size == 1 and 'stop_group' in found[5].lapses[0].what
    # After SIGCONT (T + 20) and the guard's recount (1 s), the frozen job counts again.
    only(results(frozen(T + 22), tmp_path / 'recounted'), 5)


def test_concurrency_flags_a_key_over_its_limit_with_costs(tmp_path):
    def policies(cost: int) -> list[dict]:
        return [{'kind': 'concurrency', 'scope': 's', 'key': 'acme', 'limit': 3, 'cost': cost}]

    def history(cost: int) -> History:
        h = base()
        admit(h, 'j1', T, policies=policies(2))
        admit(h, 'j2', T, policies=policies(cost))
        run(h, 'w1', 'j1', T + 1, T + 3, policies=policies(2))
        run(h, 'w2', 'j2', T + 2, T + 4, policies=policies(cost))
        h.final(T + 10, {'j1': 'finished', 'j2': 'finished'})
        return h

    clean(results(history(1), tmp_path / 'fits'))
    [finding] = only(results(history(2), tmp_path / 'over'), 5)
    assert 'key s:acme' in finding.what and finding.size == 1


# -- 6. QueueRate, Rate, Throttle, Debounce --------------------------------------------------------------------------

def rated(starts: list[float]) -> History:
    h = base(workers=('w1', 'w2', 'w3', 'w4', 'w5'))
    h.setting(T - 1, 'rate', [2, 1, 1], queue='q')  # 2 a second, burst 1
    for n, at in enumerate(starts):
        admit(h, f'j{n}', T - 1)
        run(h, f'w{n + 1}', f'j{n}', at + 0.002, at + 0.1, fetched=(at - 0.0005, at + 0.0005))
    h.final(T + 10, {f'j{n}': 'finished' for n in range(len(starts))})
    return h


def test_queue_rate_flags_a_window_with_one_start_too_many(tmp_path):
    clean(results(rated([T, T + 0.5, T + 1.0, T + 1.5]), tmp_path / 'paced'))
    [finding] = only(results(rated([T, T + 0.5, T + 1.0, T + 1.2]), tmp_path / 'fast'), 6)
    assert named(finding, 'job') == {'j2', 'j3'} and 'rate x window + burst' in finding.what


def test_rate_per_key_counts_each_start_by_its_cost(tmp_path):
    def history(cost: int, starts: int) -> History:
        h = base(workers=tuple(f'w{n}' for n in range(1, starts + 1)))
        policies = [{'kind': 'rate', 'scope': 's', 'key': 'shop', 'limit': 2, 'per': 1, 'burst': 2, 'cost': cost}]
        for n in range(starts):
            at = T + 0.1 * n
            admit(h, f'j{n}', T - 5, policies=policies)
            run(h, f'w{n + 1}', f'j{n}', at + 0.002, at + 0.05, fetched=(at - 0.0005, at + 0.0005), policies=policies)
        h.final(T + 10, {f'j{n}': 'finished' for n in range(starts)})
        return h

    clean(results(history(1, 2), tmp_path / 'one'))
    # Three starts of cost 2 in 0.2 s: the first two are 4 > 2 x 0.1 + burst 2 + (cost 2 - 1), and the three still
    # over 2 x 1.2 + 3 if each was paid up to given_back_lag (1 s) before its fetch.
    [finding] = only(results(history(2, 3), tmp_path / 'three'), 6)
    assert named(finding, 'job') == {'j0', 'j1'} and 'key s:shop' in finding.what


def test_a_rate_keys_starts_that_paid_ahead_of_their_fetch_may_explain_are_a_lapse(tmp_path):
    """docs/per-key.md: a rate-parked job comes back with its start already paid, so its fetch may come later than
    the moment the rate allowed it: two fetches 0.28 s apart on Rate(3/s, burst 1) are a lapse, not a violation,
    unless given_back_lag says no start is paid ahead (0)."""
    h = base()
    policies = [{'kind': 'rate', 'scope': 's', 'key': 'k', 'limit': 3, 'per': 1, 'burst': 1, 'cost': 1}]
    for n, at in enumerate((T, T + 0.28)):
        admit(h, f'j{n}', T - 5, policies=policies)
        run(h, f'w{n + 1}', f'j{n}', at + 0.002, at + 0.05, fetched=(at - 0.0005, at + 0.0005), policies=policies)
    h.final(T + 10, {'j0': 'finished', 'j1': 'finished'})
    found = results(h, tmp_path / 'lapse')
    clean(found)
    assert len(found[6].lapses) == 1 and 'given back' in found[6].lapses[0].what
    only(results(h, tmp_path / 'strict', bounds={'given_back_lag': 0}), 6)


def throttled(second: float, dt: float = 0.0, now: bool = True) -> History:
    policies = [{'kind': 'throttle', 'identity': 'acct-7', 'slot': 60, 'trailing': False}]
    h = base(dt=dt)
    for job, at in (('j1', T + 10), ('j2', second)):
        admit(h, job, at - 0.005, policies=policies, **({'now': at} if now else {}))
        run(h, 'w1', job, at + 1, at + 2, policies=policies)
    h.final(T + 200, {'j1': 'finished', 'j2': 'finished'})
    return h


def test_throttle_flags_two_leading_jobs_in_one_slot(tmp_path):
    [finding] = only(results(throttled(T + 59.999), tmp_path), 6)
    assert named(finding, 'job') == {'j1', 'j2'} and 'Throttle(60)' in finding.what


def test_throttle_an_admission_exactly_at_the_slot_edge_belongs_to_the_next_slot(tmp_path):
    clean(results(throttled(T + 60), tmp_path / 'edge'))
    # Without the door's own instant, a call open across the edge could have been in either slot.
    clean(results(throttled(T + 60.001, now=False), tmp_path / 'across'))


def test_throttle_a_trailing_job_counts_as_the_next_slots(tmp_path):
    policies = [{'kind': 'throttle', 'identity': 'acct-7', 'slot': 60, 'trailing': True}]
    h = base()
    admit(h, 'lead', T + 1, policies=policies, now=T + 1)
    admit(h, 'trail', T + 30, policies=policies, now=T + 30, verdict='scheduled', runs_at=T + 60)
    admit(h, 'next', T + 61, policies=policies, now=T + 61)  # the trailing job holds this slot: a violation
    for n, job in enumerate(('lead', 'trail', 'next')):
        run(h, f'w{n % 2 + 1}', job, T + 2 + 60 * n, T + 3 + 60 * n, policies=policies)
    h.final(T + 300, {'lead': 'finished', 'trail': 'finished', 'next': 'finished'})
    [finding] = only(results(h, tmp_path), 6)
    assert named(finding, 'job') == {'trail', 'next'}


def debounced(ran: str, start: float, busy: bool = False, dues: tuple | None = (T + 5, T + 9, T + 10)) -> History:
    """A Debounce(5, max_wait=10) burst: three calls merged into d1 (first at T), its run at ``start``; the calls
    report their run times ``dues`` (None: they report none)."""
    policies = [{'kind': 'debounce', 'identity': 'doc-1', 'wait': 5, 'max_wait': 10}]
    h = base(workers=('w1',))
    dues = dues or (None, None, None)
    admit(h, 'd1', T, policies=policies, payload='v1', verdict='scheduled', now=T, runs_at=dues[0])
    admit(h, 'd2', T + 4, policies=policies, payload='v2', verdict='replaced', into='d1', now=T + 4, runs_at=dues[1])
    admit(h, 'd3', T + 8, policies=policies, payload='v3', verdict='replaced', into='d1', now=T + 8, runs_at=dues[2])
    if busy:
        admit(h, 'long', T)
        run(h, 'w1', 'long', T + 0.5, start - 0.1)
    run(h, 'w1', 'd1', start, start + 1, policies=policies, payload=ran)
    h.final(T + 60, {'d1': 'finished', 'long': 'finished'} if busy else {'d1': 'finished'})
    return h


def test_debounce_runs_the_last_payload(tmp_path):
    clean(results(debounced('v3', T + 10.2), tmp_path / 'last'))
    [finding] = only(results(debounced('v2', T + 10.2), tmp_path / 'older'), 6)
    assert '"v2"' in finding.what and '"v3"' in finding.what


def test_debounce_never_sets_a_run_time_past_max_wait(tmp_path):
    [finding] = only(results(debounced('v3', T + 13.2, dues=(T + 5, T + 9, T + 13)), tmp_path), 6)
    assert 'later than max_wait' in finding.what and named(finding, 'op') == {'producer-1:1', 'producer-1:3'}


def test_debounce_starts_within_max_wait_and_the_fetch_delay_while_a_worker_fetches(tmp_path):
    # Due by T + 10 (max_wait after the first call); an idle worker fetching until T + 14 is late: without run
    # times reported, Debounce says so; with them, liveness does (the same start, counted once).
    [finding] = only(results(debounced('v3', T + 14, dues=None), tmp_path / 'late'), 6)
    assert 'max_wait' in finding.what and 'idle' in finding.what
    only(results(debounced('v3', T + 14), tmp_path / 'late-due'), 9)
    clean(results(debounced('v3', T + 14, busy=True, dues=None), tmp_path / 'busy'))
    clean(results(debounced('v3', T + 11.5, dues=None), tmp_path / 'in-time'))


# -- 7. Fair ---------------------------------------------------------------------------------------------------------

def fair_history(order: str, weights: dict[str, int] | None = None) -> History:
    """Keys a and b (weights 1), each with enough jobs to stay backlogged; turns in ``order``, 1 s apart."""
    weights = weights or {'a': 1, 'b': 1}
    h = base(queues=('f',), workers=('w1',))
    count = {k: order.count(k) + 1 for k in weights}
    for key in weights:
        for n in range(count[key]):
            admit(h, f'{key}{n}', T, queue='f', policies=[{'kind': 'fair', 'scope': 's', 'key': key,
                                                             'weight': weights[key]}])
    seen = {k: 0 for k in weights}
    for i, key in enumerate(order + ''.join(weights)):
        job = f'{key}{seen[key]}'
        seen[key] += 1
        run(h, 'w1', job, T + 1 + i, T + 1.5 + i, queue='f',
            policies=[{'kind': 'fair', 'scope': 's', 'key': key, 'weight': weights[key]}])
    h.final(T + 100, {f'{k}{n}': 'finished' for k in weights for n in range(count[k])})
    return h


def test_fair_flags_a_key_starved_while_both_stayed_backlogged(tmp_path):
    [finding] = only(results(fair_history('abaaaab'), tmp_path), 7)
    assert 'key s:a' in finding.what and 'key s:b' in finding.what


def test_fair_passes_round_robin_and_a_weighted_share(tmp_path):
    found = results(fair_history('abababab'), tmp_path / 'even')
    clean(found)
    assert found[7].figures['jain_index']['f'] > 0.95
    clean(results(fair_history('aabaabaab', weights={'a': 2, 'b': 1}), tmp_path / 'weighted'))


# -- 8. priority and pause -------------------------------------------------------------------------------------------

def prioritised(first: str) -> History:
    h = base(queues=('f',), workers=('w1',))
    policies = [{'kind': 'fair', 'scope': 's', 'key': 'a', 'weight': 1}]
    admit(h, 'low', T, queue='f', policies=policies, priority=0)
    admit(h, 'high', T, queue='f', policies=policies, priority=5)
    second = 'low' if first == 'high' else 'high'
    run(h, 'w1', first, T + 1, T + 2, queue='f', policies=policies)
    run(h, 'w1', second, T + 3, T + 4, queue='f', policies=policies)
    h.final(T + 10, {'low': 'finished', 'high': 'finished'})
    return h


def test_a_lower_priority_job_of_a_key_never_starts_before_a_waiting_higher_one(tmp_path):
    clean(results(prioritised('high'), tmp_path / 'right'))
    [finding] = only(results(prioritised('low'), tmp_path / 'wrong'), 8)
    assert named(finding, 'job') == {'low', 'high'}


def paused(start: float) -> History:
    h = base(queues=('f',), workers=('w1',))
    policies = [{'kind': 'fair', 'scope': 's', 'key': 'a', 'weight': 1}]
    admit(h, 'j1', T, queue='f', policies=policies)
    h.setting(T + 1, 'fair_pause', None, scope='s', key='a', t0=T + 0.9)
    h.setting(T + 5, 'fair_resume', None, scope='s', key='a', t0=T + 4.9)
    run(h, 'w1', 'j1', start, start + 0.5, queue='f', policies=policies)
    h.final(T + 10, {'j1': 'finished'})
    return h


def test_no_turn_of_a_paused_key_starts_between_the_pause_and_the_resume(tmp_path):
    [finding] = only(results(paused(T + 3), tmp_path / 'paused'), 8)
    assert named(finding, 'job') == {'j1'}
    clean(results(paused(T + 5.5), tmp_path / 'resumed'))
    clean(results(paused(T + 4.95), tmp_path / 'in-the-resume'))


# -- 9. liveness -----------------------------------------------------------------------------------------------------

def due(start: float, outage: tuple[float, float] | None = None) -> History:
    h = base(workers=('w1',))
    admit(h, 'j1', T, door='enqueue_in', due=T + 5)
    if outage:
        h.nemesis(outage[0], 'outage', outage[1], target='proxy')
    run(h, 'w1', 'j1', start, start + 1)
    h.final(T + 60, {'j1': 'finished'})
    return h


def test_liveness_flags_a_due_job_left_waiting_while_a_worker_fetched(tmp_path):
    # Due T + 5 (+1 s of whole-second rounding); fetched at T + 9.998: 3.998 s idle > 2 s.
    [finding] = only(results(due(T + 10), tmp_path), 9)
    assert named(finding, 'job') == {'j1'} and 'idle' in finding.what
    clean(results(due(T + 7.5), tmp_path / 'in-time'))


def test_liveness_excuses_a_delay_across_an_outage_only_up_to_the_documented_delay_after_it(tmp_path):
    found = results(due(T + 10.5, outage=(T + 4, T + 9)), tmp_path / 'after')
    clean(found)
    assert len(found[9].lapses) == 1 and 'outage' in found[9].lapses[0].what
    only(results(due(T + 12, outage=(T + 4, T + 9)), tmp_path / 'too-late'), 9)


def test_liveness_counts_only_time_when_a_worker_of_the_queue_fetched(tmp_path):
    h = base(workers=('w1',))
    admit(h, 'j1', T, door='enqueue_in', due=T + 5)
    admit(h, 'long', T)
    run(h, 'w1', 'long', T + 1, T + 9)  # the only worker is busy until T + 9
    run(h, 'w1', 'j1', T + 10, T + 11)
    h.final(T + 60, {'j1': 'finished', 'long': 'finished'})
    clean(results(h, tmp_path))


def test_liveness_needs_one_worker_idle_past_the_bound_not_the_union_of_several_moments(tmp_path):
    """Two workers busy with a backlog, each 0.7 s between one job's end and its next fetch, in turn: at every instant
    one of them is between jobs, but neither stayed idle 2 s; the due job waited behind the others. The union of those
    moments (T + 6 to T + 10) is not a worker left idle (a Redis 7 short run under load flagged 2.07 s made of them).
    One worker idle 2.5 s is."""
    def backlog(pause: float) -> History:
        h = base()
        admit(h, 'j1', T, door='enqueue_in', due=T + 5)
        t, n = T + 5.5, 0
        while t < T + 10:  # w1 runs at t, w2 at t + 0.6, 0.5 s each: each is between jobs 0.7 s of every 1.2 s
            for worker, at in (('w1', t), ('w2', t + 0.6)):
                n += 1
                admit(h, f'b{n}', T)
                run(h, worker, f'b{n}', at, at + 0.5)
            t += 1.2
        run(h, 'w1', 'j1', t + pause, t + pause + 0.1)
        h.final(T + 60, {'j1': 'finished', **{f'b{i}': 'finished' for i in range(1, n + 1)}})
        return h

    clean(results(backlog(0.0), tmp_path / 'turns'))
    [finding] = only(results(backlog(2.5), tmp_path / 'one-idle'), 9)  # w1 and w2 both idle 2.5 s and more
    assert named(finding, 'job') == {'j1'}


@pytest.mark.parametrize('said', ['due', 'delay'])
def test_liveness_checks_a_retry_against_its_due_time(tmp_path, said):
    h = base(workers=('w1',))
    admit(h, 'j1', T)
    run(h, 'w1', 'j1', T + 1, T + 2, outcome='snoozed', retry=True, due=T + 3 if said == 'due' else None)
    if said == 'delay':
        h.files['horse-w1'][-1]['delay'] = 1  # rq waits 1 s from the end: due T + 3
    run(h, 'w1', 'j1', T + 9, T + 10)
    h.final(T + 60, {'j1': 'finished'})
    [finding] = only(results(h, tmp_path), 9)
    assert 'due at' in finding.what


# -- the command line and the whole --------------------------------------------------------------------------------

def test_the_command_line_reports_the_lines_and_exits_1_on_a_violation(tmp_path, capsys):
    folder = capped((T + 2, T + 4)).write(tmp_path / 'bad')
    assert check.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert '5. QueueSlot and Concurrency: VIOLATED (1)' in out and 'VIOLATIONS FOUND' in out
    assert '"job":"j2"' in out and 'horse-w2.jsonl@' in out  # the event's own line, where it is
    good = capped((T + 3.5, T + 4)).write(tmp_path / 'good')
    assert check.main([str(good), '--json']) == 0
    report = json.loads(capsys.readouterr().out)
    assert report['ok'] and [p['number'] for p in report['properties']] == list(range(1, 10))
    assert report['figures']['runs'] == 2 and report['bounds']['due_delay'] == 2.0


def test_bounds_from_a_file_override_the_table_and_a_bad_one_is_refused(tmp_path, capsys):
    folder = due(T + 10).write(tmp_path / 'late')
    assert check.main([str(folder)]) == 1
    (tmp_path / 'b.json').write_text(json.dumps({'due_delay': 5}))
    assert check.main([str(folder), '--bounds', str(tmp_path / 'b.json')]) == 0
    (tmp_path / 'bad.json').write_text(json.dumps({'due_dealy': 5}))
    with pytest.raises(SystemExit, match="unknown bound 'due_dealy'"):
        check.main([str(folder), '--bounds', str(tmp_path / 'bad.json')])


def test_an_ending_stamped_before_its_beginning_is_still_paired(tmp_path):
    # Two processes' offsets (or one process's across a recalibration) may put an ok before its invoke, or a
    # worker's end for a killed horse before the horse's start: they still belong together.
    h = base()
    h.call(P, T + 1, T + 0.999, job='j1')
    run(h, 'w1', 'j1', T + 2, T + 1.999, end_by='worker', outcome='failed')
    h.final(T + 10, {'j1': 'failed'})
    found = results(h, tmp_path)
    clean(found)
    assert found[1].figures['acknowledged'] == 1


def test_a_torn_last_line_is_counted_and_skipped(tmp_path):
    folder = capped((T + 3.5, T + 4)).write(tmp_path / 'h')
    with (folder / 'horse-w1.jsonl').open('a') as handle:
        handle.write('{"t": 1700000050.1, "p": "horse-w1", "e": "end", "jo')
    ix = check.read_history(folder, check.load_bounds(None))
    assert ix.torn == 1 and all(r.ok for r in check.check(ix))


def test_a_simulated_history_of_every_policy_passes_every_property(tmp_path):
    found = results(simulate(40_000, seed=3), tmp_path)
    clean(found)
    assert found[2].figures['jobs_run_more_than_once'] > 0  # killed horses, retried
    assert found[5].figures['peaks']['queue capped'] == 2
    assert found[6].figures['debounce_identities'] == 4 and found[6].figures['throttle_identities'] == 6
    assert found[7].figures['keys'] == 4 and found[9].figures['delays']['count'] > 100


@pytest.mark.parametrize(('broken', 'number'), [('cap', 5), ('loner', 4), ('replay', 2), ('fair', 7),
                                                ('debounce', 6)])
def test_a_simulated_broken_build_is_flagged(tmp_path, broken, number):
    """The same simulation with one promise broken as a faulty build would break it (the cap check removed, the
    Loner check removed, a lost reply's resend writing the job again, Fair's turns by key name, a Debounce keeping
    its first payload): the property it breaks is flagged."""
    found = results(simulate(15_000, seed=3, broken=broken), tmp_path)
    assert found[number].violations, f'{broken}: property {number} not flagged'


def test_docs_list_every_bound():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / 'docs' / 'history.md').read_text()
    missing = [name for name in check.BOUNDS if f'| `{name}` |' not in page]
    assert not missing, f'docs/history.md does not list the bound(s) {missing}'


@pytest.mark.parametrize('logged', [True, False])
def test_a_job_failed_as_abandoned_after_its_worker_was_killed_is_rqs_own_bound_when_the_log_says_so(tmp_path, logged):
    # The one-server long run on b2c50d9: producer-3-2442, admitted 0.25 s before its forking worker's SIGKILL, never
    # recorded a start and ended failed: rq's started registry cleanup failed it as abandoned (the worker's log says
    # so). Started and then its worker gone, no one can know whether its function ran: rq's own bound, as a job left
    # started is. Failed for another reason (no such line), it stays a loss.
    from tests.history.test_history_run import History as RunHistory
    from tests.history.test_history_run import checked, unexplained

    h = base()
    admit(h, 'j1', T)
    h.nemesis(T + 0.25, 'kill_worker', workers=['w1'])
    h.exit(T + 0.3, 'w1')
    h.final(T + 90, {'j1': 'failed'})
    folder = h.write(tmp_path / 'history')
    (folder / 'logs').mkdir(exist_ok=True)
    line = ('StartedJobRegistry cleanup: j1 Moved to FailedJobRegistry, due to AbandonedJobError, at 2026-12-07'
            if logged else 'StartedJobRegistry cleanup: j2 Moved to FailedJobRegistry, due to AbandonedJobError')
    (folder / 'logs' / 'w2.log').write_text(f'12:00:00 Worker w2: cleaning registries\n{line}\n')
    report = checked(folder)
    [prop] = [p for p in report['properties'] if p['number'] == 1]
    assert len(prop['violations']) == 1 and 'j1' in prop['violations'][0]['what'], prop['violations']
    bad, known = unexplained(report, RunHistory(folder))
    if logged:
        assert not bad and "rq's own bound: a job left started" in known[0], (bad, known)
    else:
        assert len(bad) == 1 and 'j1' in bad[0], (bad, known)
