"""``rq-policies info``'s text and its ``--json`` come from one typed object per policy (:class:`views.Section`), and
a policy written before sections (dict hooks: ``queue_state``/``summary``/``describe_queue``, ``cluster_state``/
``describe_cluster``) or before its views stood apart (``explain``, ``panels``, ... on the policy class) is refused
when its class is defined, naming the hook and what replaces it."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from rq_policies import AdmissionPolicy, PolicyConfigurationError, PolicyQueue, QueueRate, QueueSlot
from rq_policies.engine.policy import FetchPolicy
from rq_policies.engine.views import Section, Shown, text_only, views_of
from rq_policies.policies.queue_slot.views import SlotHold, SlotState
from rq_policies.surfaces import state
from rq_policies.surfaces.cli import main
from tests.helpers import jobs


def info(redis_url, *args):
    result = CliRunner().invoke(main, ['info', *args, '--url', redis_url])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_section_s_json_is_its_fields_and_its_text_reads_the_same_fields():
    found = SlotState(3, 2, [SlotHold('w:1:1:1', 12.5)])
    assert found.as_json() == {'capacity': 3, 'holds_in_use': 2, 'holds': [{'holder': 'w:1:1:1', 'expires_in': 12.5}]}
    assert found.headline() == 'cap 3, 2 in use'
    (hold, more) = found.rows(Shown(1000.0))
    assert hold.label == 'hold' and hold.text.startswith('w:1:1:1 ') and '(in 12 s)' in hold.text
    assert more == '  ... and 1 more (--limit 0 lists all)'
    assert SlotState(None, 0, []).headline() == 'uncapped, 0 holds'


def test_a_text_only_field_stays_out_of_the_json():
    @dataclass(frozen=True)
    class Probe(Section):
        count: int
        policy: type = text_only()

    assert Probe(2, FetchPolicy).as_json() == {'count': 2}


def test_info_text_and_json_come_from_one_survey(connection, redis_url):
    PolicyQueue('sections', connection=connection).enqueue(jobs.plain, 1)
    QueueSlot.set('sections', 4, connection=connection)
    QueueRate.set('sections', 5, per=60, connection=connection)
    found = state.survey(connection, ['sections'])
    entry = found.as_json()['queues']['sections']
    assert {'capacity': 4, 'holds_in_use': 0, 'holds': []}.items() <= entry.items()
    assert entry['rate'] == {'limit': 5, 'per': 60, 'burst': 1} and entry['rate_available'] == 1
    assert state.headline(found.queues['sections']) == ['rate 5/60s burst 1, 1 available', 'cap 4, 0 in use']
    out = info(redis_url, 'sections')
    assert out.splitlines()[0] == 'queue sections  (rate 5/60s burst 1, 1 available, cap 4, 0 in use)'
    kinds = [type(found).__name__ for found in found.queues['sections']]
    # the queue's jobs wherever they wait, the fetch policies' sections, then one per identity family (the engine's,
    # worded by its policy), then drops
    assert kinds[:3] == ['Jobs', 'RateState', 'SlotState'] and kinds[-1] == 'Drops'
    assert set(kinds[3:-1]) == {'IdentityFamily'} and len(kinds[3:-1]) == len(state.families())
    assert set(entry) >= {'jobs', 'loner', 'throttle', 'trailing', 'debounce', 'drops'} and entry['drops'] == {}
    assert entry['jobs'] == {'queued': 1, 'deferred': 0, 'scheduled': 0, 'total': 1, 'due': []}
    data = json.loads(info(redis_url, 'sections', '--json'))
    assert {k: v for k, v in data['queues']['sections'].items() if k not in ('rate_next_at',)} == \
        {k: v for k, v in entry.items() if k not in ('rate_next_at',)}


RETIRED = [
    # the dict hooks of before sections, found by getattr, and what replaces each
    (FetchPolicy, 'queue_state', 'queue_info'), (FetchPolicy, 'summary', 'headline()'),
    (FetchPolicy, 'describe_queue', 'rows()'), (FetchPolicy, 'cluster_state', 'cluster_info'),
    (FetchPolicy, 'describe_cluster', 'rows()'),
    # the views hooks, now on a PolicyViews subclass; the rules hooks merged or made data
    (FetchPolicy, 'panels', 'PolicyViews'), (AdmissionPolicy, 'explain', 'PolicyViews'),
    (AdmissionPolicy, 'describe', 'PolicyViews'), (AdmissionPolicy, 'conflicts', 'excludes'),
    (AdmissionPolicy, 'call_fields', 'job_fields'), (AdmissionPolicy, 'ended', 'ended=True'),
    (FetchPolicy, 'configure', 'SETTINGS'), (FetchPolicy, 'configured_queues', 'queue_settings'),
]


@pytest.mark.parametrize('base, hook, instead', RETIRED, ids=[hook for _, hook, _ in RETIRED])
def test_a_policy_that_still_defines_a_retired_hook_is_refused_when_defined(base, hook, instead):
    with pytest.raises(PolicyConfigurationError, match=rf'OldStyle defines {hook}, .*{re.escape(instead)}'):
        type('OldStyle', (base,), {'name': 'old_style_probe', hook: classmethod(lambda cls, *args: {})})
    with pytest.raises(PolicyConfigurationError, match='identity_families is a method'):
        type('OldStyle', (AdmissionPolicy,), {'identity_families': classmethod(lambda cls: ())})


def test_the_data_of_a_queue_section_is_its_fields(connection):
    # what the removed ``queue_state`` returned, the section's own ``as_json`` gives
    PolicyQueue('legacyq', connection=connection).enqueue(jobs.plain, 1)
    assert views_of('queue_slot').queue_info(connection, ['legacyq'], 1.0, None)['legacyq'].as_json() == {
        'capacity': None, 'holds_in_use': 0, 'holds': []}
