"""What makes an enqueue take the probe first (rq_policies.engine.admission.probe_plan): identity hints and the
drop-rate predictor.

Either only chooses which script runs first; every test here also checks that the outcome is the one the full path
gives (the probe never decides alone).
"""

from __future__ import annotations

import pytest

from rq_policies import Loner, PolicyQueue
from rq_policies.engine import admission, keys
from rq_policies.engine.admission import DropRates
from tests.helpers import jobs


@pytest.fixture
def probes(monkeypatch):
    """The identities every admission probe of the test ran for, in order."""
    seen: list[str] = []
    real = admission.probed
    monkeypatch.setattr(admission, 'probed', lambda plan, verdict: seen.append(plan.digest) or real(plan, verdict))
    return seen


def _hold(q: PolicyQueue, count: int, prefix: str) -> None:
    """Admit ``count`` identities: held, and never seen dropped by this process (no identity hint)."""
    for i in range(count):
        assert q.enqueue(jobs.sweep_cache, f'{prefix}-{i}') is not None


def _state(connection) -> dict[bytes, dict]:
    """Every key but the drop counters, with its value."""
    found = {}
    for key in connection.keys('*'):
        kind = connection.type(key)
        if not keys.is_drop_counter(key.decode()):
            found[key] = connection.hgetall(key) if kind == b'hash' else connection.dump(key)
    return found


def test_cold_drops_probe_first_once_most_of_a_functions_enqueues_are_dropped(connection, probes):
    q = PolicyQueue('predict-cold', connection=connection)
    _hold(q, 30, 'held')
    before = _state(connection)
    for i in range(30):
        assert q.enqueue(jobs.sweep_cache, f'held-{i}') is None
    # the first cold drops took the full path (job built, then dropped); once most were drops, the rest probed first
    assert 10 <= len(probes) <= 15, len(probes)  # a run of 16 drops starts the probes
    assert connection.hget(keys.DROPS, 'loner:predict-cold') == b'30'
    assert q.count == 30
    assert _state(connection) == before  # nothing written but the drop counters


def test_a_mispredicted_probe_admits_through_the_full_path_and_the_rate_falls_back(connection, probes):
    q = PolicyQueue('predict-wrong', connection=connection)
    _hold(q, 20, 'held')
    for i in range(20):
        assert q.enqueue(jobs.sweep_cache, f'held-{i}') is None
    assert admission._rates.likely(('predict-wrong', admission.spec_token(jobs.sweep_cache.__rq_policies__),
                                    jobs.sweep_cache))
    before = len(probes)
    fresh = [q.enqueue(jobs.sweep_cache, f'fresh-{i}') for i in range(10)]
    assert all(job is not None for job in fresh)  # a probe that finds nothing to drop never drops
    assert q.count == 30 and q.holder(jobs.sweep_cache, 'fresh-0') == fresh[0].id
    mispredicted = len(probes) - before
    assert mispredicted == 1, mispredicted  # one admission brings the rate back under the threshold


def test_the_predictor_weighs_recent_outcomes():
    rates = DropRates()
    key = ('q', 0, 'f')
    assert not rates.likely(key) and not rates.likely(None)
    for _ in range(15):
        rates.record(key, True)
    assert not rates.likely(key)  # 15 drops in a row: not yet
    rates.record(key, True)
    assert rates.likely(key)
    rates.record(key, False)  # one admission stops the probes
    assert not rates.likely(key)
    for _ in range(200):  # a 1:1 mix never probes
        rates.record(key, True)
        assert not rates.likely(key)
        rates.record(key, False)
    rates.record(key, True)  # and one drop after it does not either
    assert not rates.likely(key)


def test_hint_keys_tell_equal_values_of_different_types_apart(connection, probes):
    q = PolicyQueue('hint-types', connection=connection)
    held = q.enqueue(jobs.sweep_cache, 1)
    assert q.enqueue(jobs.sweep_cache, 1) is None  # the full path's drop leaves the hint
    assert q.enqueue(jobs.sweep_cache, 1) is None and len(probes) == 1  # the hinted probe
    # 1 == True == 1.0 for Python, three identities for the policies: none of them is dropped by 1's hint
    others = [q.enqueue(jobs.sweep_cache, True), q.enqueue(jobs.sweep_cache, 1.0), q.enqueue(jobs.sweep_cache, '1')]
    assert all(job is not None for job in others)
    assert q.holder(jobs.sweep_cache, 1) == held.id
    assert q.count == 4


def test_a_hint_seen_under_one_unique_context_is_not_used_under_another(connection):
    q = PolicyQueue('hint-context', connection=connection)
    assert q.enqueue(jobs.sync_account, 'acct', 'first') is not None  # declared: identity is the account
    assert q.enqueue(jobs.sync_account, 'acct', 'first') is None
    assert q.enqueue(jobs.sync_account, 'acct', 'first') is None  # hinted
    # the same call and policies without the declared unique_context is another identity: admitted
    assert q.enqueue(jobs.sync_account, 'acct', 'first', policy=Loner()) is not None
    assert q.count == 2


def test_a_hinted_probe_with_a_chosen_job_id_records_the_drop(connection, probes):
    q = PolicyQueue('hint-id', connection=connection)
    q.enqueue(jobs.sweep_cache, 'x')
    for n in range(3):
        assert q.enqueue(jobs.sweep_cache, 'x', job_id=f'mine-{n}') is None
    assert q.enqueue(jobs.sweep_cache, 'x', job_id='mine-1') is None  # an equal call: the hinted, packed probe
    assert len(probes) >= 1
    assert connection.exists(keys.dropped('mine-1'))
