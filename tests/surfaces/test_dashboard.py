"""The dashboard's views against a real server: what each page shows, escaping, actions and their guards, bounds."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any, ClassVar

import pytest

from tests.helpers import fair_jobs, jobs, key_jobs
from tests.helpers.throttle_helpers import clear_of_a_slot_edge
from tests.helpers.workers import output, start_worker, stop, wait_for

flask = pytest.importorskip('flask', reason="the dashboard needs Flask: pip install 'rq-policies[dashboard]'")

from rq.job import Job  # noqa: E402

from rq_policies import (  # noqa: E402
    Cap,
    Concurrency,
    Debounce,
    Fair,
    KeyLimit,
    Loner,
    PolicyQueue,
    QueueRate,
    QueueSlot,
    Rate,
    Throttle,
)
from rq_policies.engine import keys  # noqa: E402
from rq_policies.engine.fetch import Claim, Look  # noqa: E402
from rq_policies.engine.policy import _REGISTRY, ADMISSION, AdmissionPolicy, registered  # noqa: E402
from rq_policies.engine.reading import PANEL_BUDGET, SAMPLE_BUDGET  # noqa: E402
from rq_policies.engine.views import PolicyViews  # noqa: E402
from rq_policies.surfaces import state  # noqa: E402
from rq_policies.surfaces.dashboard import create_app, data  # noqa: E402
from rq_policies.surfaces.dashboard.web import CSRF_COOKIE  # noqa: E402
from tests.helpers import PACKAGE, fetches  # noqa: E402

XSS = '<script>alert(1)</script>'


def client(connection, allow_actions=False):
    return create_app(connection, allow_actions=allow_actions).test_client()


def page(c, path='/'):
    response = c.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    return response.get_data(as_text=True)


def text_of(html: str) -> str:
    """The page's visible text, tags stripped and whitespace squeezed (entities left as they are)."""
    return re.sub(r'\s+', ' ', re.sub(r'<[^>]+>', ' ', html))


def csrf(c) -> str:
    page(c)  # sets the cookie
    cookie = c.get_cookie(CSRF_COOKIE)
    assert cookie is not None and re.fullmatch(r'[0-9a-f]{64}', cookie.value)
    return cookie.value


# -- what the page shows --------------------------------------------------------------------------------------------


def test_a_queue_named_script_renders_as_text_everywhere(connection):
    q = PolicyQueue(XSS, connection=connection)
    job = q.enqueue(jobs.plain, 1, policy=Loner())
    assert job is not None
    assert q.enqueue(jobs.plain, 1, policy=Loner()) is None
    c = client(connection, allow_actions=True)
    for path in ('/', '/partial', '/?q=%3Cscript', f'/job?id={job.id}', '/job?id=%3Cb%3Enope%3C%2Fb%3E'):
        html = c.get(path).get_data(as_text=True)
        assert '<script>alert' not in html and '<b>nope' not in html, path
    html = page(c)
    assert '&lt;script&gt;alert(1)&lt;/script&gt;' in html
    assert 'value="&lt;script"' in page(c, '/?q=%3Cscript')  # the search box echoes the search as text
    csp = c.get('/').headers['Content-Security-Policy']
    assert "script-src 'self'" in csp and 'unsafe-inline' not in csp


def test_queues_table_counts_and_policy_words(connection):
    q = PolicyQueue('billing', connection=connection)
    for i in range(3):
        q.enqueue(jobs.plain, i)
    q.enqueue_in(__import__('datetime').timedelta(seconds=600), jobs.plain, 9)
    QueueSlot.set('billing', 2, connection=connection)
    QueueRate.set('billing', 5, 60, burst=2, connection=connection)
    view = data.overview(connection)
    (row,) = [row for row in view['queues']['rows'] if row['name'] == 'billing']
    assert (row['waiting'], row['scheduled'], row['deferred'], row['started']) == (3, 1, 0, 0)
    assert 'cap 2, 0 in use' in row['policies'] and 'rate 5/60s burst 2, 2 available' in row['policies']
    html = page(client(connection))
    assert re.search(r'data-queue="billing".*?data-field="waiting">3<', html, re.S)


def test_holds_show_holder_job_expiry_and_expired_ones_greyed_not_as_warnings(connection):
    QueueSlot.set('capped', 3, connection=connection)
    assert QueueSlot.acquire('capped', 3, ttl=60, token='host-a:11:1:1', connection=connection)
    assert QueueSlot.acquire('capped', 3, ttl=1, token='host-b:22:1:1', connection=connection)
    time.sleep(1.2)  # the second hold's holder stopped refreshing: it lapses, and stays until a fetch purges it
    panels = {p['title']: p for p in data.overview(connection)['panels']}
    caps = panels['Queue caps (QueueSlot)']
    assert caps['columns'][3] == 'expired holds (not counted)'
    assert [[c['text'] for c in row] for row in caps['rows']] == [['capped', '3', '1', '1']]
    holds = panels['Holds (QueueSlot)']['rows']
    by_holder = {row[1]['text']: row for row in holds}
    assert set(by_holder) == {'host-a:11:1:1', 'host-b:22:1:1'}
    gone = by_holder['host-b:22:1:1'][3]
    # an expired hold no longer counts: shown as expired (greyed), not as a warning, with when it expired
    assert gone['expired'] and not gone['warn']
    assert re.fullmatch(r'expired \(no longer counts\); \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d \([0-9.]+ s ago\)',
                        gone['text']), gone['text']
    live = by_holder['host-a:11:1:1'][3]
    assert not live['warn'] and not live['expired']
    assert re.fullmatch(r'\S+ \(in (5\d|60) s\)', live['text']), live['text']  # local time, then how far
    html = page(client(connection))
    assert re.search(r'<td class="expired">expired \(no longer counts\); [^<]+ ago\)</td>', html)
    assert '<td class="warn">' not in html


def test_rates_and_backoff(connection):
    QueueRate.set('feeds', 2, 10, connection=connection)
    QueueRate.backoff('feeds', 30, connection=connection)
    (panel,) = [p for p in data.overview(connection)['panels'] if p['policy'] == 'queue_rate']
    (row,) = panel['rows']
    assert [c['text'] for c in row[:3]] == ['feeds', '2/10s burst 1', '0']
    assert row[4]['warn'] and re.fullmatch(r'until \S+ \(in (2[89]|30) s\)', row[4]['text']), row[4]['text']
    assert row[3]['text'] == 'now' or re.fullmatch(r'\S+ \(in [0-9.]+ s\)', row[3]['text'])  # the next start


def test_identity_panels_link_to_their_jobs(connection):
    q = PolicyQueue('ids', connection=connection)
    marker = q.enqueue(jobs.sweep_cache, 1, policy=Loner())
    clear_of_a_slot_edge(connection, 60)  # the window and its trailing job in one slot
    window = q.enqueue(jobs.plain, 2, policy=Throttle(60, trailing=True))
    trailing = q.enqueue(jobs.plain, 2, policy=Throttle(60, trailing=True))
    debounced = q.enqueue(jobs.sync_account, 3, policy=Debounce(30))
    assert marker and window and trailing and debounced
    panels = {p['title']: p for p in data.overview(connection)['panels']}
    expect = {
        'Unique identities (Loner)': marker.id,
        'Throttle windows (Throttle)': window.id,
        'Pending trailing jobs (Throttle)': trailing.id,
        'Pending debounced jobs (Debounce)': debounced.id,
    }
    for title, job_id in expect.items():
        rows = panels[title]['rows']  # a trailing job also owns the next window: two window rows
        assert all(row[0]['text'] == 'ids' and re.fullmatch(r'[0-9a-f]{64}', row[1]['sub']) for row in rows)
        assert job_id in [c['job'] for row in rows for c in row], title
        # the identity reads as its holder job's description; the digest is there, under it
        holder = Job.fetch(job_id, connection=connection)
        assert holder.description in [row[1]['text'] for row in rows], (title, [row[1] for row in rows])
    (window_row, *_) = panels['Throttle windows (Throttle)']['rows']
    # the end's date only when it is another day's (a window that ends at midnight)
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:00[+-]\d\d:\d\d to '
                        r'(\d\d:\d\d:00|\d{4}-\d\d-\d\dT\d\d:\d\d:00[+-]\d\d:\d\d)', window_row[2]['text'])
    html = page(client(connection))
    for job_id in expect.values():
        assert f'href="/job?id={job_id}"' in html


def test_search_narrows_queues_and_panels(connection):
    for name in ('alpha', 'beta'):
        PolicyQueue(name, connection=connection).enqueue(jobs.plain, 1, policy=Loner())
    view = data.overview(connection, search='alp')
    assert [row['name'] for row in view['queues']['rows']] == ['alpha']
    (panel,) = [p for p in view['panels'] if p['policy'] == 'loner']
    assert [row[0]['text'] for row in panel['rows']] == ['alpha']
    assert 'beta' not in text_of(page(client(connection), '/?q=alp'))


def test_drops_of_the_last_hour_are_charted_from_bounded_minute_counters(connection):
    q = PolicyQueue('dups', connection=connection)
    assert q.enqueue(jobs.plain, 1, policy=Loner())
    for _ in range(4):
        assert q.enqueue(jobs.plain, 1, policy=Loner()) is None
    minute_keys = [k.decode() for k in connection.scan_iter(keys.DROPS_MINUTE_PREFIX + '*')]
    assert len(minute_keys) in (1, 2)  # the drops may straddle a minute
    for key in minute_keys:
        assert 0 < connection.ttl(key) <= (keys.DROPS_MINUTE_KEEP + 1) * 60
    view = data.overview(connection)
    (series,) = view['drops_chart']['series']
    assert (series['policy'], series['total']) == ('loner', 4)
    (row,) = [row for row in view['queues']['rows'] if row['name'] == 'dups']
    assert (row['drops_hour'], row['drops_total']) == (4, 4)
    html = page(client(connection))
    assert re.search(r'data-policy="loner">\s*<span class="label">loner <b>4</b>', html)
    assert len(re.findall(r'<rect class="bar"', html)) == len(minute_keys)


def test_an_hour_old_minute_is_out_of_the_chart(connection):
    now = state.server_now(connection)
    old = int(now // 60) - keys.DROPS_MINUTE_KEEP  # a minute just outside the last hour
    connection.hset(f'{keys.DROPS_MINUTE_PREFIX}{old}', 'loner:q', 7)
    connection.hset(f'{keys.DROPS_MINUTE_PREFIX}{old + 1}', 'loner:q', 2)
    history = state.drop_history(connection, now)
    assert len(history['minutes']) == keys.DROPS_MINUTE_KEEP
    assert [s['total'] for s in history['series']] == [2]


def test_limited_capacity_worker_gauges(connection):
    connection.zadd(keys.LCW_INDEX, {'app.workers.Small': time.time()})
    connection.hset(
        keys.lcw_state('app.workers.Small'),
        mapping={'queue': 'media', 'max': 4, 'remaining': 7, 'updated': state.server_now(connection)},
    )
    (row,) = data.overview(connection)['limited_capacity_workers']
    assert (row['class'], row['max_running_jobs'], row['remaining_work_count']) == ('app.workers.Small', 4, 7)
    html = page(client(connection))
    assert 'data-class="app.workers.Small"' in html and '0 / 4' in html


def test_eviction_warning_when_the_server_may_evict(connection):
    assert 'eviction-warning' not in page(client(connection))
    before = connection.config_get('maxmemory-policy')['maxmemory-policy']
    connection.config_set('maxmemory-policy', 'allkeys-lru')
    try:
        html = page(client(connection))
        assert 'id="eviction-warning"' in html and 'allkeys-lru' in html
    finally:
        connection.config_set('maxmemory-policy', before)


def test_job_page_explains_and_refuses_bad_ids(connection):
    q = PolicyQueue('explained', connection=connection)
    job = q.enqueue(jobs.plain, 1, policy=Loner())
    c = client(connection)
    html = page(c, f'/job?id={job.id}')
    assert 'data-field="status">queued<' in html and 'data-policy="loner"' in html
    missing = c.get('/job?id=no-such-job')
    assert missing.status_code == 404 and 'no job' in missing.get_data(as_text=True)
    assert c.get('/job?id=has%20space').status_code == 400


def test_state_json(connection):
    PolicyQueue('js', connection=connection).enqueue(jobs.plain, 1, policy=Loner())
    body = client(connection).get('/state.json').get_json()
    assert [row['name'] for row in body['queues']['rows']] == ['js']
    assert {p['policy'] for p in body['panels']} == {'loner'}


# -- panels of any policy, rendered generically ---------------------------------------------------------------------


class _Probe(AdmissionPolicy):
    """A stand-in for a policy this repository does not have yet (per-key limits): registered only inside the
    ``probe`` fixture (no kind until then, so the rest of the suite never sees it), it offers a per-key limit
    (``set``/``get``/``clear``, the admin API's shape) and its views (:class:`_ProbeViews`) show every kind of cell,
    so the page's generic rendering and actions are tested."""

    name: ClassVar[str] = 'dash_probe'
    kind: ClassVar[str] = ''
    calls: ClassVar[list[Any]] = []
    broken: ClassVar[bool] = False

    @classmethod
    def set(cls, scope, key, limit, connection=None):
        cls.calls.append(('set', scope, key, limit, connection is not None))
        return KeyLimit(limit)

    @classmethod
    def get(cls, scope, key, connection=None):
        return None

    @classmethod
    def clear(cls, scope, key, connection=None):
        cls.calls.append(('clear', scope, key, connection is not None))
        return False


class _ProbeViews(PolicyViews):
    policy = _Probe
    key_limit_setting = True

    @classmethod
    def panels(cls, connection, now, limit, search=None):
        _Probe.calls.append(('panels', limit, search))
        if _Probe.broken:
            raise RuntimeError('probe panel failed')
        rows = [
            ['acme', 2, 2.5, None, {'text': 'job-1', 'job': 'job-1'}, {'text': 'at limit', 'warn': True}],
            [XSS, 0, 0.0, 'x', {'text': XSS, 'job': XSS}, 'ok'],
        ]
        return [
            {
                'title': 'Busiest keys (probe)',
                'columns': ['key', 'in use', 'ratio', 'none', 'job', 'state'],
                'rows': [row for row in rows if not search or search in row[0]][:limit],
                'note': 'probe note',
            }
        ]


@pytest.fixture
def probe():
    _Probe.kind, _REGISTRY[_Probe.name] = ADMISSION, _Probe
    _Probe.calls, _Probe.broken = [], False
    try:
        yield _Probe
    finally:
        _REGISTRY.pop(_Probe.name, None)
        _Probe.kind = ''


def test_any_policys_panel_renders_generically_and_gets_the_search(connection, probe):
    assert probe in registered(ADMISSION)
    c = client(connection)
    html = page(c, '/?q=acme&limit=5')
    assert ('panels', 5, 'acme') in probe.calls
    section = re.search(r'<section class="panel" data-policy="dash_probe".*?</section>', html, re.S).group(0)
    assert (
        '<td>acme</td><td>2</td><td>2.5</td><td></td><td><a href="/job?id=job-1">job-1</a></td>'
        '<td class="warn">at limit</td>' in section
    )
    assert 'probe note' in section and XSS not in section
    html = page(c)
    assert '&lt;script&gt;alert(1)&lt;/script&gt;' in html and '<script>alert' not in html
    assert 'href="/job?id=%3Cscript%3Ealert(1)%3C/script%3E"' in html  # a job link's URL is encoded too


def test_a_failing_panel_is_shown_as_such_and_the_page_still_answers(connection, probe):
    probe.broken = True
    html = page(client(connection))
    assert 'dash_probe: could not be read' in html and 'RuntimeError: probe panel failed' in html


def test_override_action_calls_the_policy_through_the_registry(connection, probe):
    c = client(connection, allow_actions=True)
    token = csrf(c)
    form = {'csrf': token, 'policy': 'dash_probe', 'scope': 'billing', 'key': 'acme', 'limit': '10'}
    confirm = c.post('/action/override', data=form)
    assert confirm.status_code == 200 and 'Yes, do it' in confirm.get_data(as_text=True)
    assert not [call for call in probe.calls if call[0] in ('set', 'clear')]
    done = c.post('/action/override', data={**form, 'confirmed': 'yes'})
    assert done.status_code == 200 and 'Overrode' in done.get_data(as_text=True)
    c.post('/action/override', data={**form, 'limit': '', 'confirmed': 'yes'})
    assert [call for call in probe.calls if call[0] in ('set', 'clear')] == [
        ('set', 'billing', 'acme', 10, True),
        ('clear', 'billing', 'acme', True),
    ]


# -- per-key limits (Concurrency, Rate), with real parked jobs -------------------------------------------------------

CUSTOMERS = 'tests.helpers.key_jobs.per_customer'  # Concurrency(2) per customer: the scope is the function's path
SHOPS = 'tests.helpers.key_jobs.per_shop'  # Rate(5, per=1, burst=2) per shop


def fetch(connection, token: str, name: str = 'keys') -> Claim | Look:
    """One fetch by the real fetch script, as a PolicyWorker's (the claim's hold lives 90 s)."""
    return fetches.fetch(connection, token, [name])


def _cells(panel: dict[str, Any]) -> list[list[str]]:
    return [[c['text'] for c in row] for row in panel['rows']]


def test_per_key_panels_show_in_use_limit_parked_and_next_due_and_the_queue_counts_parked_as_deferred(
    connection
):
    q = PolicyQueue('keys', connection=connection)
    acme = [q.enqueue(key_jobs.per_customer, 't', 0, customer='acme') for _ in range(4)]
    globex = q.enqueue(key_jobs.per_customer, 't', 0, customer='globex')
    shops = [q.enqueue(key_jobs.per_shop, 't', shop='s1') for _ in range(4)]
    taken = []
    while isinstance(claim := fetch(connection, f'h:41:0:{len(taken)}'), Claim):
        taken.append(claim.job_id)
    # acme: two run (its limit), two parked; globex runs; s1: its burst of two start, two parked on its rate
    assert taken == [acme[0].id, acme[1].id, globex.id, shops[0].id, shops[1].id]
    assert Concurrency.parked(CUSTOMERS, 'acme', connection=connection) == [acme[2].id, acme[3].id]
    assert Rate.parked(SHOPS, 's1', connection=connection) == [shops[2].id, shops[3].id]

    view = data.overview(connection)
    panels = {p['title']: p for p in view['panels']}
    customers = panels[f'Concurrency per key: {CUSTOMERS}']
    assert customers['columns'] == ['key', 'in use', 'limit', 'parked', 'waiting for']
    rows = _cells(customers)
    assert [row[:4] for row in rows] == [['acme', '2', '2', '2'], ['globex', '1', '', '0']]  # busiest first
    # acme waits for a release (a running job's end); its due time is only the crash expiry of its oldest hold
    assert re.fullmatch(r"a release \(a running job ends\); a dead worker's hold expires \S+ \(in (8[5-9]|90) s\)",
                        rows[0][4]), rows[0][4]
    assert rows[1][4] == ''  # nothing parked on globex: not in the due index
    shop_rows = _cells(panels[f'Rate per key: {SHOPS}'])
    assert [row[:2] + row[3:] for row in shop_rows] == [['s1', '2', '5/1s burst 2']]
    # the next start 5/s allows (one every 0.2 s)
    assert re.fullmatch(r'its rate; next start \S+ \((now|in 0\.[0-2] s)\)', shop_rows[0][2]), shop_rows[0][2]
    # rq's deferred registry of the queue holds the parked jobs: the queue table's deferred column counts them
    (queue,) = view['queues']['rows']
    assert (queue['name'], queue['waiting'], queue['deferred']) == ('keys', 0, 4)

    html = page(client(connection))
    section = re.search(r'<section class="panel" data-policy="concurrency".*?</section>', html, re.S).group(0)
    assert '<td>acme</td><td>2</td><td>2</td><td>2</td>' in section
    assert re.search(r'data-queue="keys".*?data-field="deferred">4<', html, re.S)
    assert 'parked per key' in html  # the deferred column's header says it counts them

    narrowed = {p['title']: p for p in data.overview(connection, search='glob')['panels']}
    assert [row[0] for row in _cells(narrowed[f'Concurrency per key: {CUSTOMERS}'])] == ['globex']
    assert f'Rate per key: {SHOPS}' not in narrowed  # no shop key matches: no panel
    shown = text_of(page(client(connection), '/?q=glob'))
    assert 'globex' in shown and 'acme' not in shown


def test_a_key_with_only_a_running_job_shows_the_limit_that_job_declares(connection, redis_url, worker_env):
    """No parked job names the key's limit: the job a real forking worker runs under the key's hold does (found
    through rq's worker registry); a hold whose holder runs no job leaves it blank rather than guessed."""
    other = PolicyQueue('other', connection=connection)
    other.enqueue(key_jobs.per_customer, 't', 0, customer='hooli')
    assert isinstance(fetch(connection, 'h:43:0:1', 'other'), Claim)  # a hold, and no worker runs its job
    PolicyQueue('keys', connection=connection).enqueue(key_jobs.per_customer, 'dash', 2, customer='initech')
    proc = start_worker(redis_url, ['keys'], worker_env)
    try:
        def shown():
            (panel,) = [p for p in data.overview(connection)['panels'] if p['policy'] == 'concurrency']
            return _cells(panel)

        assert wait_for(lambda: ['initech', '1', '2', '0', ''] in shown(), 15), (shown(), output(proc))
        assert ['hooli', '1', '', '0', ''] in shown()
    finally:
        stop(proc)


def test_override_action_sets_and_clears_a_real_concurrency_limit(connection):
    q = PolicyQueue('keys', connection=connection)
    made = [q.enqueue(key_jobs.per_customer, 't', 0, customer='acme') for _ in range(3)]
    for i in range(3):
        fetch(connection, f'h:42:0:{i}')  # two holds, the third job parked
    assert Concurrency.parked(CUSTOMERS, 'acme', connection=connection) == [made[2].id]
    c = client(connection, allow_actions=True)
    token = csrf(c)
    assert 'data-action="override-concurrency"' in page(c)
    form = {'csrf': token, 'policy': 'concurrency', 'scope': CUSTOMERS, 'key': 'acme', 'limit': '3'}

    confirm = c.post('/action/override', data=form).get_data(as_text=True)
    assert 'id="action-now">now: no override<' in confirm
    assert Concurrency.get(CUSTOMERS, 'acme', connection=connection) is None  # asking wrote nothing
    done = c.post('/action/override', data={**form, 'confirmed': 'yes'}).get_data(as_text=True)
    assert 'id="action-done"' in done and 'now: override 3' in done
    assert Concurrency.get(CUSTOMERS, 'acme', connection=connection) == KeyLimit(3)
    got = fetch(connection, 'h:42:0:9')  # the raised limit: the next fetch gives the parked job back and starts it
    assert isinstance(got, Claim) and got.job_id == made[2].id

    cleared = {**form, 'limit': ''}
    confirm = c.post('/action/override', data=cleared).get_data(as_text=True)
    assert 'Clear the override' in confirm and 'now: override 3' in confirm
    done = c.post('/action/override', data={**cleared, 'confirmed': 'yes'}).get_data(as_text=True)
    assert 'Cleared the override' in done and 'now: no override' in done
    assert Concurrency.get(CUSTOMERS, 'acme', connection=connection) is None
    later = q.enqueue(key_jobs.per_customer, 't', 0, customer='acme')
    assert isinstance(fetch(connection, 'h:42:0:10'), Look)  # the declared 2 applies again: 3 run, this one parks
    assert Concurrency.parked(CUSTOMERS, 'acme', connection=connection) == [later.id]

    before = {k: connection.dump(k) for k in connection.keys('*')}
    for bad, message in (({'scope': 'a:b'}, 'scope must be'), ({'limit': '0', 'confirmed': 'yes'}, 'limit must be')):
        response = c.post('/action/override', data={**form, **bad})
        assert response.status_code == 400 and message in response.get_data(as_text=True), bad
    assert {k: connection.dump(k) for k in connection.keys('*')} == before


# -- pausing a Fair key ---------------------------------------------------------------------------------------------

TENANTS = fair_jobs.SCOPE  # Fair per tenant, scope 'tenants'


def _fair_jobs(connection) -> tuple[list[Job], list[Job]]:
    q = PolicyQueue('fairq', connection=connection)
    return (
        [q.enqueue(fair_jobs.work, 'dash', tenant='acme') for _ in range(2)],
        [q.enqueue(fair_jobs.work, 'dash', tenant='bob') for _ in range(2)],
    )


def _starts(connection, n: int) -> list[str | None]:
    """The job ids the next ``n`` fetches (the real fetch script, no worker) start, None where one starts nothing."""
    got = [fetch(connection, f'h:fp:0:{next(_fetch_tokens)}', 'fairq') for _ in range(n)]
    return [g.job_id if isinstance(g, Claim) else None for g in got]


_fetch_tokens = iter(range(10**9))


def test_read_only_page_offers_no_pause_and_refuses_its_post(connection):
    _fair_jobs(connection)
    c = client(connection)
    html = page(c)
    assert 'data-action="pause-fair"' not in html and 'data-action="resume-fair"' not in html
    for action in ('pause', 'resume'):
        response = c.post(f'/action/{action}', data={'policy': 'fair', 'scope': TENANTS, 'key': 'acme',
                                                      'confirmed': 'yes'})
        assert response.status_code == 403 and '--allow-actions' in response.get_data(as_text=True)
    assert not Fair.pause_status(TENANTS, 'acme', connection=connection).paused


def test_pause_and_resume_a_fair_key_after_a_confirmation_and_the_fetch_obeys(connection):
    acme, bob = _fair_jobs(connection)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    html = page(c)
    assert 'data-action="pause-fair"' in html and 'data-action="resume-fair"' in html
    form = {'csrf': token, 'policy': 'fair', 'scope': TENANTS, 'key': 'acme'}

    confirm = c.post('/action/pause', data=form)
    body = text_of(confirm.get_data(as_text=True)).replace('&#39;', "'")
    assert confirm.status_code == 200 and 'Yes, do it' in body
    assert f"Pause fair key 'acme' of scope '{TENANTS}' on every queue" in body
    assert "now: not paused, 2 waiting job(s) ('fairq': 2)" in body
    assert not Fair.status(TENANTS, 'acme', 'fairq', connection=connection).paused  # asking wrote nothing

    done = text_of(c.post('/action/pause', data={**form, 'confirmed': 'yes'}).get_data(as_text=True))
    done = done.replace('&#39;', "'")
    assert f"Paused fair key 'acme' of scope '{TENANTS}'." in done and 'now: paused, 2 waiting job(s)' in done
    status = Fair.status(TENANTS, 'acme', 'fairq', connection=connection)
    assert status.paused and status.waiting == 2
    # the state the fetch script reads changed: only bob's jobs start, acme's stay deferred
    assert _starts(connection, 3) == [bob[0].id, bob[1].id, None]
    assert all(Job.fetch(j.id, connection=connection).get_status() == 'deferred' for j in acme)
    again = c.post('/action/pause', data={**form, 'confirmed': 'yes'}).get_data(as_text=True)
    assert 'It was paused already.' in again

    confirm = text_of(c.post('/action/resume', data=form).get_data(as_text=True)).replace('&#39;', "'")
    assert "Resume fair key 'acme'" in confirm and "now: paused, 2 waiting job(s) ('fairq': 2)" in confirm
    assert Fair.status(TENANTS, 'acme', 'fairq', connection=connection).paused
    done = text_of(c.post('/action/resume', data={**form, 'confirmed': 'yes'}).get_data(as_text=True))
    assert 'Resumed fair key' in done and 'now: not paused, 2 waiting job(s)' in done
    assert not Fair.status(TENANTS, 'acme', 'fairq', connection=connection).paused
    assert _starts(connection, 3) == [acme[0].id, acme[1].id, None]


def test_a_pause_s_pages_escape_the_key(connection):
    c = client(connection, allow_actions=True)
    form = {'csrf': csrf(c), 'policy': 'fair', 'scope': TENANTS, 'key': XSS}
    for extra in ({}, {'confirmed': 'yes'}):
        body = c.post('/action/pause', data={**form, **extra}).get_data(as_text=True)
        assert '&lt;script&gt;alert(1)&lt;/script&gt;' in body and XSS not in body, extra
    assert Fair.pause_status(TENANTS, XSS, connection=connection).paused


def test_a_pause_without_the_csrf_token_is_refused(connection):
    _fair_jobs(connection)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    form = {'policy': 'fair', 'scope': TENANTS, 'key': 'acme', 'confirmed': 'yes'}
    assert c.post('/action/pause', data=form).status_code == 403
    assert c.post('/action/pause', data={**form, 'csrf': '0' * 64}).status_code == 403
    assert not Fair.pause_status(TENANTS, 'acme', connection=connection).paused
    assert c.post('/action/pause', data={**form, 'csrf': token}).status_code == 200
    assert Fair.pause_status(TENANTS, 'acme', connection=connection).paused


def test_a_bad_scope_or_key_for_a_pause_names_the_field_and_writes_nothing(connection):
    _fair_jobs(connection)
    Fair.pause(TENANTS, 'bob', connection=connection)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    before = {k: connection.dump(k) for k in connection.keys('*')}
    cases = [
        ('pause', {'scope': 'a:b', 'key': 'acme'}, 'scope must be'),
        ('pause', {'scope': 'a:b', 'key': 'acme', 'confirmed': 'yes'}, 'scope must be'),
        ('resume', {'scope': 'a:b', 'key': 'bob', 'confirmed': 'yes'}, 'scope must be'),
        ('pause', {'scope': TENANTS, 'key': '', 'confirmed': 'yes'}, 'key is required'),
        ('pause', {'scope': TENANTS, 'key': 'x' * 1001, 'confirmed': 'yes'}, 'key must be'),
        ('pause', {'policy': 'concurrency', 'scope': TENANTS, 'key': 'acme', 'confirmed': 'yes'},
         'policy must be one of'),
    ]
    for action, fields, message in cases:
        response = c.post(f'/action/{action}', data={'csrf': token, 'policy': 'fair', **fields})
        body = response.get_data(as_text=True)
        assert response.status_code == 400 and message in body and 'id="confirm"' not in body, (action, fields)
    assert {k: connection.dump(k) for k in connection.keys('*')} == before


# -- actions --------------------------------------------------------------------------------------------------------


def test_read_only_by_default(connection):
    QueueSlot.set('ro', 2, connection=connection)
    c = client(connection)
    html = page(c)
    assert 'id="actions"' not in html and 'read-only' in html and c.get_cookie(CSRF_COOKIE) is None
    response = c.post(
        '/action/configure', data={'policy': 'queue_slot', 'queue': 'ro', 'capacity': '9', 'confirmed': 'yes'}
    )
    assert response.status_code == 403 and '--allow-actions' in response.get_data(as_text=True)
    assert QueueSlot.get('ro', connection=connection) == Cap(2)


def test_actions_need_the_csrf_token_and_the_same_origin(connection):
    QueueSlot.set('guarded', 2, connection=connection)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    form = {'policy': 'queue_slot', 'queue': 'guarded', 'capacity': '9', 'confirmed': 'yes'}
    assert c.post('/action/configure', data=form).status_code == 403  # no token
    assert c.post('/action/configure', data={**form, 'csrf': '0' * 64}).status_code == 403  # not the cookie's
    other = c.post('/action/configure', data={**form, 'csrf': token}, headers={'Origin': 'http://evil.example'})
    assert other.status_code == 403
    fresh = client(connection, allow_actions=True)  # a token without its cookie (another browser's)
    assert fresh.post('/action/configure', data={**form, 'csrf': token}).status_code == 403
    assert QueueSlot.get('guarded', connection=connection) == Cap(2)
    assert c.post('/action/configure', data={**form, 'csrf': token}).status_code == 200
    assert QueueSlot.get('guarded', connection=connection) == Cap(9)


def test_cap_and_rate_set_and_clear_each_after_a_confirmation(connection):
    PolicyQueue('ops', connection=connection).enqueue(jobs.plain, 1)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    html = page(c)
    assert 'data-action="configure-queue_slot"' in html and 'data-action="configure-queue_rate"' in html
    steps = [
        (
            'configure',
            {'policy': 'queue_slot', 'capacity': '3'},
            lambda: QueueSlot.get('ops', connection=connection),
            None,
            Cap(3),
        ),
        (
            'configure',
            {'policy': 'queue_rate', 'limit': '10', 'per': '60', 'burst': ''},
            lambda: QueueRate.get('ops', connection=connection),
            None,
            QueueRate(10, 60),
        ),
        ('unconfigure', {'policy': 'queue_slot'}, lambda: QueueSlot.get('ops', connection=connection), Cap(3), None),
        (
            'unconfigure',
            {'policy': 'queue_rate'},
            lambda: QueueRate.get('ops', connection=connection),
            QueueRate(10, 60),
            None,
        ),
    ]
    for action, fields, read, before, after in steps:
        form = {'csrf': token, 'queue': 'ops', **fields}
        confirm = c.post(f'/action/{action}', data=form)
        body = confirm.get_data(as_text=True)
        assert confirm.status_code == 200 and 'id="confirm"' in body and "queue 'ops'" in body.replace('&#39;', "'")
        assert read() == before, (action, fields)  # asking writes nothing
        done = c.post(f'/action/{action}', data={**form, 'confirmed': 'yes'})
        assert done.status_code == 200 and 'id="action-done"' in done.get_data(as_text=True)
        assert read() == after, (action, fields)


def test_a_bad_setting_names_the_field_and_writes_nothing(connection):
    PolicyQueue('bad', connection=connection).enqueue(jobs.plain, 1)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    before = {k: connection.dump(k) for k in connection.keys('*')}
    cases = [
        ({'policy': 'queue_slot', 'queue': 'bad', 'capacity': '-1'}, 'capacity must be a whole number'),
        ({'policy': 'queue_slot', 'queue': 'bad', 'capacity': '0', 'confirmed': 'yes'}, 'capacity must be'),
        ({'policy': 'queue_rate', 'queue': 'bad', 'limit': '5', 'burst': '9', 'confirmed': 'yes'}, 'burst must be'),
        ({'policy': 'queue_slot', 'queue': 'nowhere', 'capacity': '2'}, 'queue &#39;nowhere&#39; is unknown'),
        ({'policy': 'nope', 'queue': 'bad'}, 'policy must be one of'),
    ]
    for form, message in cases:
        response = c.post('/action/configure', data={'csrf': token, **form})
        assert response.status_code == 400 and message in response.get_data(as_text=True), form
    assert {k: connection.dump(k) for k in connection.keys('*')} == before


def test_a_setting_the_policy_refuses_is_refused_before_its_confirmation(connection):
    """per=0 and a cap of 0 pass the form's digits check; the policy refuses them, and now before the confirmation
    page offers them (before: the page asked to confirm, then refused)."""
    PolicyQueue('early', connection=connection).enqueue(jobs.plain, 1)
    c = client(connection, allow_actions=True)
    token = csrf(c)
    before = {k: connection.dump(k) for k in connection.keys('*')}
    for form, message in [
        ({'policy': 'queue_rate', 'limit': '5', 'per': '0'}, 'per must be'),
        ({'policy': 'queue_rate', 'limit': '5', 'burst': '9'}, 'burst must be'),
        ({'policy': 'queue_rate', 'per': '60'}, 'limit is required'),
        ({'policy': 'queue_slot', 'capacity': '0'}, 'capacity must be'),
    ]:
        response = c.post('/action/configure', data={'csrf': token, 'queue': 'early', **form})
        body = response.get_data(as_text=True)
        assert response.status_code == 400 and message in body and 'id="confirm"' not in body, (form, body[-600:])
    assert {k: connection.dump(k) for k in connection.keys('*')} == before


def test_a_rate_s_confirmation_shows_the_rate_and_a_cap_s_the_cap(connection):
    PolicyQueue('both', connection=connection).enqueue(jobs.plain, 1)
    QueueSlot.set('both', 3, connection=connection)
    c = client(connection, allow_actions=True)
    form = {'csrf': csrf(c), 'queue': 'both', 'policy': 'queue_rate', 'limit': '10', 'per': '60'}
    confirm = text_of(c.post('/action/configure', data=form).get_data(as_text=True))
    assert 'now: no queue_rate setting' in confirm and 'cap 3' not in confirm, confirm
    done = text_of(c.post('/action/configure', data={**form, 'confirmed': 'yes'}).get_data(as_text=True))
    now = done.split('now:')[1]
    assert now.startswith(' rate 10/60s burst 1') and 'cap' not in now, done
    cap = {**form, 'policy': 'queue_slot', 'capacity': '4'}
    confirm = text_of(c.post('/action/configure', data=cap).get_data(as_text=True))
    assert 'now: cap 3, 0 in use' in confirm and 'rate' not in confirm.split('now:')[1], confirm


def test_a_fair_weight_set_and_cleared_after_a_confirmation(connection):
    c = client(connection, allow_actions=True)
    token = csrf(c)
    assert 'data-action="weight-fair"' in page(c)
    form = {'csrf': token, 'policy': 'fair', 'scope': fair_jobs.SCOPE, 'key': 'acme', 'weight': '5'}
    confirm = text_of(c.post('/action/weight', data=form).get_data(as_text=True))
    assert "now: no weight set: its jobs' declared weight applies" in confirm.replace('&#39;', "'"), confirm
    assert Fair.get(fair_jobs.SCOPE, 'acme', connection=connection) is None  # asking writes nothing
    done = c.post('/action/weight', data={**form, 'confirmed': 'yes'})
    assert done.status_code == 200 and 'now: weight 5' in text_of(done.get_data(as_text=True))
    assert Fair.get(fair_jobs.SCOPE, 'acme', connection=connection).weight == 5
    cleared = c.post('/action/weight', data={**form, 'weight': '', 'confirmed': 'yes'})
    assert cleared.status_code == 200 and Fair.get(fair_jobs.SCOPE, 'acme', connection=connection) is None
    before = {k: connection.dump(k) for k in connection.keys('*')}
    for bad, message in (('0', 'weight must be'), ('1001', 'weight must be'), ('x', 'weight must be a whole number')):
        refused = c.post('/action/weight', data={**form, 'weight': bad})  # before any confirmation
        body = refused.get_data(as_text=True)
        assert refused.status_code == 400 and message in body and 'id="confirm"' not in body, (bad, body[-400:])
    assert {k: connection.dump(k) for k in connection.keys('*')} == before


def test_reset_one_identity(connection):
    q = PolicyQueue('resets', connection=connection)
    held = q.enqueue(jobs.sweep_cache, 5, policy=Loner())
    assert q.enqueue(jobs.sweep_cache, 5, policy=Loner()) is None
    (panel,) = [p for p in data.overview(connection)['panels'] if p['policy'] == 'loner']
    digest = panel['rows'][0][1]['sub']
    c = client(connection, allow_actions=True)
    token = csrf(c)
    form = {'csrf': token, 'queue': 'resets', 'digest': digest}
    body = c.post('/action/reset', data=form).get_data(as_text=True)
    assert '1 key(s) of this identity' in body
    assert connection.exists(keys.loner('resets', digest))
    assert 'removed 1 key(s)' in c.post('/action/reset', data={**form, 'confirmed': 'yes'}).get_data(as_text=True)
    assert not connection.exists(keys.loner('resets', digest))
    assert q.enqueue(jobs.sweep_cache, 5, policy=Loner()) is not None and held.get_status() == 'queued'
    bad = c.post('/action/reset', data={**form, 'digest': 'abc'})
    assert bad.status_code == 400 and 'digest must be' in bad.get_data(as_text=True)


# -- bounds ---------------------------------------------------------------------------------------------------------


def _commands(connection) -> dict[str, int]:
    return {name: int(stats['calls']) for name, stats in connection.info('commandstats').items()}


def _fill_identities(connection, queue: str, count: int) -> None:
    with connection.pipeline(transaction=False) as pipe:
        for i in range(count):
            pipe.set(keys.loner(queue, f'{i:064x}'), f'job-{i}')
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()


def test_a_page_with_100000_identities_is_bounded(connection):
    """The page's reads are bounded: no KEYS, SCAN within each family's budget, and no more commands with 100,000
    identities than the budget allows with 1,000. How long it takes (the issue's 300 ms) is bench/dashboard.py's
    figure: a wall-clock bound here failed with three CI cells side by side."""
    c = client(connection)
    # Each identity family's sample, and each per-key policy's one walk of the per-key keys.
    per_key = [cls for cls in registered() if getattr(cls, 'per_job', False)]
    scan_bound = len(state.families()) * (SAMPLE_BUDGET // 1000 + 1) + len(per_key) * (PANEL_BUDGET // 1000 + 1)

    def cost() -> dict[str, int]:
        page(c)  # warm (script loads, first connections)
        before = _commands(connection)
        html = page(c)
        after = _commands(connection)
        assert 'showing 20 of ' in html
        return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}

    _fill_identities(connection, 'many', 1000)
    small = cost()
    _fill_identities(connection, 'many', 100_000)
    large = cost()
    assert 'cmdstat_keys' not in large
    assert large.get('cmdstat_scan', 0) <= scan_bound
    assert sum(large.values()) - large.get('cmdstat_scan', 0) <= sum(small.values()) - small.get('cmdstat_scan', 0)


# -- how it is served -----------------------------------------------------------------------------------------------


def test_the_dashboard_modules_name_no_policy_class():
    names = [cls.__name__ for cls in registered()]
    pattern = re.compile(r'\b(' + '|'.join(names) + r')\b')
    for path in sorted((PACKAGE / 'dashboard').glob('*.py')) + [PACKAGE / 'contrib' / 'rq_dashboard.py']:
        found = [(i + 1, line) for i, line in enumerate(path.read_text().splitlines()) if pattern.search(line)]
        assert found == [], f'{path.name} names a policy: {found}'


def test_every_page_asset_is_package_data_of_the_wheel():
    """setup.py's package_data globs cover every template, script and stylesheet (test_packaging builds the wheel)."""
    import ast

    tree = ast.parse((PACKAGE.parent / 'setup.py').read_text())
    call = next(
        node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, 'id', '') == 'setup'
    )
    package_data = next(kw.value for kw in call.keywords if kw.arg == 'package_data')
    globs = next(
        ast.literal_eval(v)
        for k, v in zip(package_data.keys, package_data.values)
        if k is not None and ast.literal_eval(k) == 'rq_policies.surfaces.dashboard'
    )
    root = PACKAGE / 'surfaces' / 'dashboard'
    assets = {p.relative_to(root) for p in root.rglob('*') if p.is_file() and p.suffix in ('.html', '.js', '.css')}
    assert assets and all(any(asset.match(g) for g in globs) for asset in assets), (assets, globs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_the_command_serves_on_localhost_read_only_and_stops_on_sigterm(connection, redis_url):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, '-m', 'rq_policies', 'dashboard', '--port', str(port), '--url', redis_url],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        assert f'read-only) on http://127.0.0.1:{port}/' in line, line
        with urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=10) as response:
            assert response.status == 200 and 'rq-policies' in response.read().decode()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        proc.stderr.close()


def test_bad_port_is_refused_before_connecting():
    result = subprocess.run(
        [sys.executable, '-m', 'rq_policies', 'dashboard', '--port', '70000'], capture_output=True, text=True
    )
    assert result.returncode == 2 and "Invalid value for '--port'" in result.stderr


def test_mounted_under_rq_dashboard(connection, redis_url):
    rq_dashboard_cli = pytest.importorskip('rq_dashboard.cli', reason='rq-dashboard is not installed')
    from rq_dashboard.web import setup_rq_connection

    from rq_policies.surfaces.contrib.rq_dashboard import blueprint

    PolicyQueue(XSS, connection=connection).enqueue(jobs.plain, 1, policy=Loner())
    app = rq_dashboard_cli.make_flask_app(None, None, None, '/rq')
    app.config['RQ_DASHBOARD_REDIS_URL'] = redis_url
    setup_rq_connection(app)
    app.register_blueprint(blueprint, url_prefix='/rq/policies')
    c = app.test_client()
    assert c.get('/rq/').status_code == 200  # rq-dashboard itself still answers, on this rq version too
    listed = c.get('/rq/0/data/queues.json').get_json()
    assert XSS in [queue['name'] for queue in listed['queues']]
    html = page(c, '/rq/policies/')
    assert 'class="home" href="/rq/"' in html  # the link back to rq-dashboard
    assert '/rq/policies/static/rq_policies/dashboard.js' in html
    assert '&lt;script&gt;alert(1)&lt;/script&gt;' in html and '<script>alert' not in html
    with c.get('/rq/policies/static/rq_policies/dashboard.css') as css:
        assert css.status_code == 200 and 'text/css' in css.content_type
    assert c.post('/rq/policies/action/reset', data={}).status_code == 403  # read-only
