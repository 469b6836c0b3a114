"""The dashboard in a real browser: Debian's headless Chromium, driven by Selenium through Debian's chromedriver.

Nothing downloads a browser or a driver (Selenium Manager is told to stay offline and is given both paths). The
tests skip when Chromium is absent, unless ``RQ_POLICIES_REQUIRE_BROWSER`` is set (CI sets it, so a missing browser
fails there instead of passing silently). ``RQ_POLICIES_UPDATE_SCREENSHOT=1`` copies the screenshot the live test
takes to ``docs/dashboard.png``, the one docs/dashboard.md shows.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.helpers import DOCS, fair_jobs, jobs, key_jobs
from tests.helpers.workers import output, start_worker, stop, wait_for

CHROMIUM = '/usr/bin/chromium'
CHROMEDRIVER = '/usr/bin/chromedriver'
REQUIRED = bool(os.environ.get('RQ_POLICIES_REQUIRE_BROWSER'))
XSS = '<script>alert(1)</script>'
#: The per-key panel of key_jobs.one_per_customer (Concurrency(1) per customer; the scope is the function's path).
PER_KEY = 'Concurrency per key: tests.helpers.key_jobs.one_per_customer'


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f'{path} is not installed (apt-get install chromium chromium-driver)'
    for module in ('selenium', 'flask'):
        try:
            __import__(module)
        except ImportError:
            return f'{module} is not installed (pip install -e .[dev])'
    return None


_why = _missing()
if _why and REQUIRED:
    raise RuntimeError(f'RQ_POLICIES_REQUIRE_BROWSER is set but {_why}')
pytestmark = pytest.mark.skipif(bool(_why), reason=f'{_why}; set RQ_POLICIES_REQUIRE_BROWSER=1 to fail instead')

if not _why:
    from selenium import webdriver
    from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException, TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from rq_policies import Cap, Fair, Loner, PolicyQueue, QueueRate, QueueSlot
    from rq_policies.surfaces.dashboard import create_app


@pytest.fixture(scope='module')
def browser():
    os.environ['SE_OFFLINE'] = 'true'  # Selenium Manager: never look anything up
    profile = tempfile.mkdtemp(prefix='rq-policies-chromium-')
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-dev-shm-usage',
        '--window-size=1280,1150',
        f'--user-data-dir={profile}',
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class _Thread:
    """A Flask app served by Werkzeug from a thread of this process (the rq-dashboard mount)."""

    def __init__(self, app):
        from werkzeug.serving import make_server

        self.server = make_server('127.0.0.1', 0, app, threaded=True)
        self.url = f'http://127.0.0.1:{self.server.server_port}'
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def _until(driver, predicate, timeout=15.0, message=''):
    """Wait for ``predicate(driver)`` to be truthy, re-reading the page each time (the live refresh replaces it);
    on a timeout, the message carries what the page showed."""
    try:
        return WebDriverWait(
            driver, timeout, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
        ).until(predicate)
    except TimeoutException:
        raise AssertionError(f'{message}; the page showed: {driver.find_element(By.TAG_NAME, "main").text}') from None


def _rows(driver, title: str) -> list[list[str]]:
    """The cell texts of the panel called ``title`` (none when the panel is not shown). Read in one script, so the
    live refresh cannot replace the table between two reads of it (a stale element)."""
    return driver.execute_script(
        """return Array.from(document.querySelectorAll(arguments[0]),
                             tr => Array.from(tr.querySelectorAll('td'), td => td.innerText.trim()));""",
        f'section[data-title="{title}"] tbody tr',
    )


def _queue(driver, name: str) -> dict[str, str]:
    """The cells of queue ``name``'s row, by field (one script, as in :func:`_rows`)."""
    return driver.execute_script(
        """for (const tr of document.querySelectorAll('#queues tbody tr')) {
             if (tr.getAttribute('data-queue') !== arguments[0]) continue;
             const out = {};
             for (const td of tr.querySelectorAll('td')) {
               out[td.getAttribute('data-field') || 'name'] = td.innerText.trim();
             }
             return out;
           }
           return {};""",
        name,
    )


def _no_alert(driver) -> None:
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018 - reading it is the check


@pytest.mark.long
def test_live_holds_rates_and_drops_standalone_and_inside_rq_dashboard(
    browser, connection, redis_url, worker_env, tmp_path
):
    rq_dashboard_cli = pytest.importorskip('rq_dashboard.cli', reason='rq-dashboard is not installed')
    from rq_dashboard.web import setup_rq_connection

    from rq_policies.surfaces.contrib.rq_dashboard import blueprint

    QueueSlot.set('capped', 1, connection=connection)
    QueueRate.set('rated', 1, 2, connection=connection)
    port = _free_port()
    standalone = subprocess.Popen(
        [
            sys.executable,
            '-m',
            'rq_policies',
            'dashboard',
            '--port',
            str(port),
            '--refresh',
            '1',
            '--url',
            redis_url,
        ],
        stderr=subprocess.DEVNULL,
    )
    host = rq_dashboard_cli.make_flask_app(None, None, None, '/rq')
    host.config['RQ_DASHBOARD_REDIS_URL'] = redis_url
    setup_rq_connection(host)
    host.register_blueprint(blueprint, url_prefix='/rq/policies')
    mounted = _Thread(host)
    # three workers: one runs the capped queue's jobs one at a time; two share the rest, so the per-key jobs of one
    # key are fetched while another of that key runs, and parked
    procs = [start_worker(redis_url, ['capped', 'rated', 'keyed'], worker_env) for _ in range(3)]
    try:
        capped, rated = PolicyQueue('capped', connection=connection), PolicyQueue('rated', connection=connection)
        spans = [capped.enqueue(jobs.sleep_and_record, 'dash', 1.5) for _ in range(3)]
        for i in range(3):
            rated.enqueue(jobs.plain, i)
        assert capped.enqueue(jobs.sweep_cache, 1) is not None
        for _ in range(3):
            assert capped.enqueue(jobs.sweep_cache, 1) is None  # loner drops, for the chart

        assert wait_for(lambda: _port_open(port), 15), 'the dashboard command did not start'
        browser.get(f'http://127.0.0.1:{port}/')
        keyed = PolicyQueue('keyed', connection=connection)  # enqueued once the page is up, so it sees them parked
        for customer in ('a', 'b'):
            for _ in range(3):
                keyed.enqueue(key_jobs.one_per_customer, 'dash', 1.5, customer=customer)
        holds = _until(
            browser,
            lambda d: [r for r in _rows(d, 'Holds (QueueSlot)') if r[0] == 'capped' and r[2]],
            message='no hold with its job appeared',
        )
        assert len(holds) == 1 and holds[0][2] in {job.id for job in spans}  # the cap: one hold, a running job
        assert re.fullmatch(r'\S+ \(in [0-9.]+ (s|min)\)', holds[0][3]), holds[0][3]  # local time, how far
        assert _rows(browser, 'Queue caps (QueueSlot)')[0][:3] == ['capped', '1', '1']
        assert _queue(browser, 'rated')['policies'].startswith('rate 1/2s burst 1')
        assert _rows(browser, 'Queue rates (QueueRate)')[0][:2] == ['rated', '1/2s burst 1']
        chart = browser.find_element(By.CSS_SELECTOR, '#drops .chart[data-policy="loner"] .label')
        assert chart.text == 'loner 3'
        # a key at its limit: one running (in use 1 / limit 1), the jobs of that key fetched meanwhile parked
        (busy,) = _until(
            browser,
            lambda d: [r for r in _rows(d, PER_KEY) if r[1:3] == ['1', '1'] and int(r[3]) >= 1][:1],
            message='no key with a hold and parked jobs appeared',
        )
        # (its next due time is asserted in tests/surfaces/test_dashboard.py: here a row's cells, read by one pipeline
        # that is not a snapshot, may show the last parked job with no due time as it is given back)
        assert busy[0] in ('a', 'b')
        shot = tmp_path / 'dashboard.png'
        assert browser.save_screenshot(str(shot)) and shot.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
        if os.environ.get('RQ_POLICIES_UPDATE_SCREENSHOT'):
            shutil.copy(shot, DOCS / 'dashboard.png')

        browser.get(f'{mounted.url}/rq/policies/')
        _until(browser, lambda d: _queue(d, 'capped'), message='the mounted page shows no queue')
        assert browser.find_element(By.CSS_SELECTOR, 'a.home').get_attribute('href') == f'{mounted.url}/rq/'
        # the live refresh, with no reload: every capped job ends, its hold goes away, the queues drain
        _until(
            browser,
            lambda d: (
                not [r for r in _rows(d, 'Holds (QueueSlot)') if r[0] == 'capped']
                and _queue(d, 'capped').get('waiting') == '0'
                and _queue(d, 'capped').get('started') == '0'
                and _queue(d, 'rated').get('waiting') == '0'
                and not d.find_elements(By.CSS_SELECTOR, f'section[data-title="{PER_KEY}"]')
                and [_queue(d, 'keyed').get(f) for f in ('waiting', 'deferred', 'started')] == ['0', '0', '0']
            ),
            timeout=30,
            message='the holds did not go away on the live page',
        )
        assert browser.find_element(By.ID, 'updated').text.startswith('updated ')
        assert jobs.max_overlap([line.decode() for line in connection.lrange('test:span:dash', 0, -1)]) == 1
        per_key = key_jobs.spans(connection, 'dash')
        assert sorted(per_key) == ['a', 'b'] and all(key_jobs.max_overlap(events) == 1 for events in per_key.values())
        assert all([what for _, what, _ in events].count('end') == 3 for events in per_key.values())

        browser.get(f'{mounted.url}/rq/policies/job?id={spans[0].id}')
        assert browser.find_element(By.CSS_SELECTOR, '[data-field="status"]').text == 'finished'
        browser.find_element(By.CSS_SELECTOR, 'a.home').click()
        _until(browser, lambda d: '/rq/' in d.current_url and 'RQ' in d.title, message='rq-dashboard did not open')
    except Exception:
        for proc in procs:
            print(output(proc))
        raise
    finally:
        for proc in procs:
            stop(proc)
        mounted.close()
        standalone.terminate()
        standalone.wait(10)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(('127.0.0.1', port)) == 0


def test_a_script_queue_name_is_text_and_an_action_asks_before_it_writes(browser, connection):
    PolicyQueue(XSS, connection=connection).enqueue(jobs.plain, 1, policy=Loner())
    QueueSlot.set('ops', 1, connection=connection)
    served = _Thread(create_app(connection, allow_actions=True, refresh_seconds=0))
    try:
        browser.get(served.url + '/')
        assert _queue(browser, XSS)['name'] == XSS  # shown as the literal text
        assert [row[0] for row in _rows(browser, 'Unique identities (Loner)')] == [XSS]
        _no_alert(browser)
        assert browser.execute_script('return document.querySelectorAll("script").length') == 1  # ours alone

        form = browser.find_element(By.CSS_SELECTOR, 'form[data-action="configure-queue_slot"]')
        form.find_element(By.NAME, 'queue').send_keys('ops')
        form.find_element(By.NAME, 'capacity').send_keys('4')
        form.find_element(By.TAG_NAME, 'button').click()
        _until(browser, lambda d: d.find_elements(By.ID, 'action-what'), message='no confirmation page')
        assert "Set queue_slot of queue 'ops' to capacity=4." in browser.find_element(By.ID, 'action-what').text
        assert 'cap 1' in browser.find_element(By.ID, 'action-now').text
        assert QueueSlot.get('ops', connection=connection) == Cap(1)  # asking wrote nothing
        browser.find_element(By.CSS_SELECTOR, '#confirm button').click()
        _until(browser, lambda d: d.find_elements(By.ID, 'action-done'), message='the action did not complete')
        assert QueueSlot.get('ops', connection=connection) == Cap(4)
    finally:
        served.close()


def test_a_fair_key_is_paused_and_resumed_from_the_page_after_a_confirmation(browser, connection):
    q = PolicyQueue('fairq', connection=connection)
    for _ in range(2):
        q.enqueue(fair_jobs.work, 'browser', tenant=XSS)
    served = _Thread(create_app(connection, allow_actions=True, refresh_seconds=0))
    try:
        for action, paused_before in (('pause', False), ('resume', True)):
            browser.get(served.url + '/')
            form = browser.find_element(By.CSS_SELECTOR, f'form[data-action="{action}-fair"]')
            form.find_element(By.NAME, 'scope').send_keys(fair_jobs.SCOPE)
            form.find_element(By.NAME, 'key').send_keys(XSS)
            form.find_element(By.TAG_NAME, 'button').click()
            _until(browser, lambda d: d.find_elements(By.ID, 'action-what'), message='no confirmation page')
            assert f'fair key {XSS!r} of scope {fair_jobs.SCOPE!r}' in browser.find_element(By.ID, 'action-what').text
            now = browser.find_element(By.ID, 'action-now').text
            assert now == f"now: {'paused' if paused_before else 'not paused'}, 2 waiting job(s) ('fairq': 2)", now
            _no_alert(browser)
            assert Fair.pause_status(fair_jobs.SCOPE, XSS, connection=connection).paused is paused_before
            browser.find_element(By.CSS_SELECTOR, '#confirm button').click()
            _until(browser, lambda d: d.find_elements(By.ID, 'action-done'), message='the action did not complete')
            _no_alert(browser)
            assert Fair.pause_status(fair_jobs.SCOPE, XSS, connection=connection).paused is not paused_before
    finally:
        served.close()


def test_an_expired_hold_is_greyed_not_a_warning(browser, connection):
    """A hold past its expiry no longer counts against the cap: the page greys it as expired, and nothing on the
    page is highlighted as a warning for it (the 0.2 page showed it as one for as long as it sat in the ledger)."""
    QueueSlot.set('greyed', 2, connection=connection)
    assert QueueSlot.acquire('greyed', 2, ttl=60, token='host-a:1:1:1', connection=connection)
    assert QueueSlot.acquire('greyed', 2, ttl=1, token='host-b:2:1:1', connection=connection)
    time.sleep(1.2)
    served = _Thread(create_app(connection, refresh_seconds=0))
    try:
        browser.get(served.url + '/')
        rows = {r[1]: r for r in _until(browser, lambda d: _rows(d, 'Holds (QueueSlot)'), message='no holds')}
        assert rows['host-b:2:1:1'][3].startswith('expired (no longer counts); ') and rows['host-b:2:1:1'][3].endswith(
            ' s ago)')
        assert rows['host-a:1:1:1'][3].endswith(' s)') and '(in ' in rows['host-a:1:1:1'][3]
        cell = browser.find_element(By.CSS_SELECTOR, 'section[data-title="Holds (QueueSlot)"] td.expired')
        assert cell.text == rows['host-b:2:1:1'][3]
        red, green, blue = (int(v) for v in re.findall(r'\d+', cell.value_of_css_property('color'))[:3])
        assert red == green == blue and 100 < red < 200  # a mid grey, not the warning's amber
        assert not browser.find_elements(By.CSS_SELECTOR, 'td.warn')
        assert _rows(browser, 'Queue caps (QueueSlot)')[0] == ['greyed', '2', '1', '1']
    finally:
        served.close()
