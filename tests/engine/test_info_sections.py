"""``rq-policies info``'s text and its ``--json`` come from one typed object per policy (:class:`views.Section`), and
a policy written before sections (dict hooks: ``queue_state``/``summary``/``describe_queue``, ``cluster_state``/
``describe_cluster``) still shows as it did."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from rq_policies import PolicyQueue, QueueRate, QueueSlot
from rq_policies.engine.policy import _REGISTRY, FETCH, FetchPolicy
from rq_policies.engine.views import Heading, Row, Section, Shown, text_only
from rq_policies.policies.queue_slot.rules import SlotHold, SlotState
from rq_policies.surfaces import state
from rq_policies.surfaces.cli import main
from tests.helpers import jobs


class _OldStyle(FetchPolicy):
    """A third-party fetch policy of before sections: its state as dicts, its words written from them."""

    name = 'old_style_probe'
    kind = ''  # registered by the fixture only

    @classmethod
    def queue_state(cls, connection, names, now, limit):
        return {name: {'old_level': 7, 'old_seen_at': now} for name in names if name == 'legacyq'}

    @classmethod
    def summary(cls, entry):
        return f'level {entry["old_level"]}' if 'old_level' in entry else ''

    @classmethod
    def describe_queue(cls, entry):
        if 'old_level' not in entry:
            return []
        return [Row('old', f'level {entry["old_level"]}, read at the server time: {entry["server_time"] > 0}')]

    @classmethod
    def cluster_state(cls, connection, now, limit):
        return {'things': ['a', 'b']}

    @classmethod
    def describe_cluster(cls, found):
        return [Heading('Old style', f'  ({len(found["things"])} things)'), '  thing a']


@pytest.fixture
def old_style():
    _OldStyle.kind, _REGISTRY[_OldStyle.name] = FETCH, _OldStyle
    try:
        yield _OldStyle
    finally:
        _REGISTRY.pop(_OldStyle.name, None)
        _OldStyle.kind = ''


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
    # the fetch policies' sections, then one per identity family (the engine's, worded by its policy), then drops
    assert kinds[:2] == ['RateState', 'SlotState'] and kinds[-1] == 'Drops'
    assert set(kinds[2:-1]) == {'IdentityFamily'} and len(kinds[2:-1]) == len(state.families())
    assert set(entry) >= {'loner', 'throttle', 'trailing', 'debounce', 'drops'} and entry['drops'] == {}
    data = json.loads(info(redis_url, 'sections', '--json'))
    assert {k: v for k, v in data['queues']['sections'].items() if k not in ('rate_next_at',)} == \
        {k: v for k, v in entry.items() if k not in ('rate_next_at',)}


def test_a_policy_with_the_old_dict_hooks_shows_as_before(connection, redis_url, old_style):
    PolicyQueue('legacyq', connection=connection).enqueue(jobs.plain, 1)
    out = info(redis_url)
    assert 'queue legacyq  (level 7, uncapped, 0 holds)' in out
    assert '  old       level 7, read at the server time: True' in out
    assert 'Old style  (2 things)\n  thing a\n' in out
    data = json.loads(info(redis_url, '--json'))
    assert data['queues']['legacyq']['old_level'] == 7
    assert data['policies']['old_style_probe'] == {'things': ['a', 'b']}
    # the derived data hooks read the sections, whichever way a policy wrote them
    assert old_style.queue_state(connection, ['legacyq'], 1.0, None) == {'legacyq': {'old_level': 7,
                                                                                     'old_seen_at': 1.0}}
    assert QueueSlot.queue_state(connection, ['legacyq'], 1.0, None) == {
        'legacyq': {'capacity': None, 'holds_in_use': 0, 'holds': []}}
