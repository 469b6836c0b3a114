"""``@policy(..., on_drop=hook)``: the app is told of each drop in the producer, with the call and the holder."""

from __future__ import annotations

import logging

import pytest

from rq_policies import DroppedCall, DuplicateJob, Loner, PolicyQueue, PolicySet, Throttle, policy
from rq_policies.engine import admission
from tests.helpers import jobs
from tests.helpers import throttle_jobs as tj
from tests.helpers.throttle_helpers import clear_of_a_slot_edge


def test_called_with_the_dropped_call_and_the_holder_not_on_admit(connection, monkeypatch):
    quick = []
    real = admission._dropped
    monkeypatch.setattr(admission, '_dropped', lambda *a, **k: (quick.append(a[1]), real(*a, **k)))
    q = PolicyQueue('watched', connection=connection)
    holder = q.enqueue(jobs.watched, 'a', flag=1)
    assert holder is not None and jobs.DROPS_SEEN == []  # an admitted enqueue calls nothing
    # the first drop of a call takes the full path; the same call again the hinted fast path (no job built, see
    # rq_policies.engine.admission.probe_plan): both tell the hook the function's own arguments, rq's options taken out
    assert q.enqueue(jobs.watched, 'a', flag=1, job_timeout=30) is None
    assert q.enqueue(jobs.watched, 'a', flag=1, job_timeout=30) is None
    assert q.enqueue_call(jobs.watched, args=('a',), kwargs={'flag': 1}, result_ttl=5) is None
    assert quick == ['tests.helpers.jobs.watched']  # one of them went the fast path
    expected = DroppedCall('tests.helpers.jobs.watched', ('a',), {'flag': 1}, 'watched', 'loner')
    assert jobs.DROPS_SEEN == [(expected, holder.id)] * 3
    with pytest.raises(AttributeError):
        expected.queue = 'other'  # frozen
    assert q.enqueue(jobs.watched, 'b') is not None and len(jobs.DROPS_SEEN) == 3  # another identity: admitted


def test_an_exception_in_the_hook_is_logged_not_raised(connection, caplog):
    q = PolicyQueue('watched', connection=connection)
    holder = q.enqueue(jobs.watched_badly, 'a')
    with caplog.at_level(logging.INFO, logger='rq_policies'):
        assert q.enqueue(jobs.watched_badly, 'a') is None  # dropped, as without the hook
        assert q.enqueue(jobs.watched_badly, 'a') is None
    failures = [r for r in caplog.records if 'on_drop hook' in r.getMessage()]
    assert len(failures) == 2 and all(r.levelno == logging.ERROR for r in failures)
    assert 'metrics backend down' in str(failures[0].exc_info[1]) and holder.id in failures[0].getMessage()
    assert f'identity held by job {holder.id}' in caplog.text  # the policy's own log line still comes
    assert q.job_ids == [holder.id]


def test_a_throttle_drop_and_a_raising_loner_call_it_too(connection):
    seen = []
    hooked = policy(Throttle(3600), on_drop=lambda call, holder: seen.append((call.policy, holder)))(tj.poll_minute)
    try:
        q = PolicyQueue('watched', connection=connection)
        clear_of_a_slot_edge(connection, 3600)  # the winner and its drop in one slot
        winner = q.enqueue(hooked, 7)
        assert q.enqueue(hooked, 7) is None
        assert seen == [('throttle', winner.id)]
    finally:
        policy(Throttle(60))(tj.poll_minute)  # as throttle_jobs declares it
    raising = PolicySet((Loner(on_conflict='raise'),), on_drop=lambda call, holder: seen.append((call.policy, holder)))
    first = q.enqueue(jobs.plain, 1, policy=raising)
    with pytest.raises(DuplicateJob):
        q.enqueue(jobs.plain, 1, policy=raising)
    assert seen[-1] == ('loner', first.id)  # told before the raise


def test_on_drop_must_be_callable():
    with pytest.raises(TypeError, match=r"on_drop: expected a callable .* got 'log'"):
        policy(Loner(), on_drop='log')
