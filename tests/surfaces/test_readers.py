"""Where rq's own readers show a job waiting under a policy (docs/drop-in.md's table), read from each reader installed:
``rq info`` (rq's CLI in a subprocess), rq-dashboard's JSON, django-rq's statistics and its Prometheus collector; and
``rq-policies info``'s per-queue total beside rq's count.

Two queues, named as django-rq's test settings name them (tests/helpers/django_settings.py): ``default`` holds one
plain queued job, three Fair jobs waiting for their turns (rq's deferred registry) and one debounced job (rq's
scheduled registry); ``capped`` holds two jobs parked at their key's concurrency limit (deferred) while the first
runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
from rq.registry import ScheduledJobRegistry

from rq_policies import Debounce, PolicyQueue
from rq_policies.engine.fetch import Claim
from rq_policies.engine.ops import server_now
from tests.helpers import fair_jobs, fetches, jobs, key_jobs
from tests.helpers.cli import run as run_policies
from tests.helpers.cluster import ON_CLUSTER
from tests.helpers.workers import wait_for

#: What each queue holds: on rq's list, in the deferred registry, in the scheduled registry.
EXPECTED = {'default': (1, 3, 1), 'capped': (0, 2, 0)}


@pytest.fixture
def waiting(connection):
    default = PolicyQueue('default', connection=connection)
    default.enqueue(jobs.plain, 1)
    for tenant in ('acme', 'acme', 'globex'):
        assert default.enqueue(fair_jobs.work, 'r', tenant=tenant).get_status() == 'deferred'
    assert default.enqueue(jobs.plain, 2, policy=Debounce(3600)).get_status() == 'scheduled'
    capped = PolicyQueue('capped', connection=connection)
    parked = [capped.enqueue(key_jobs.one_per_customer, 'r', 0, customer='acme') for _ in range(3)]
    taken = []
    while isinstance(claim := fetches.fetch(connection, f'h:33:0:{len(taken)}', ['capped']), Claim):
        taken.append(claim.job_id)
    assert taken == [parked[0].id]
    assert [job.get_status() for job in parked[1:]] == ['deferred', 'deferred']
    return connection


@pytest.fixture
def env(worker_env):
    return {k: v for k, v in worker_env.items() if not k.startswith('RQ_') or k == 'RQ_KEY_PREFIX'}


def test_rq_info_counts_only_the_queue_list(waiting, env, redis_url):
    """``rq info`` prints LLEN of the queue's list: a Fair, parked or debounced job is in none of its numbers."""
    if ON_CLUSTER:
        pytest.skip("rq info's CLI takes no cluster connection class here; the counts are the same reads")
    rq = os.path.join(os.path.dirname(sys.executable), 'rq')
    result = subprocess.run([rq, 'info', '--url', redis_url, '--only-queues', 'default', 'capped'], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for name, (queued, _, _) in EXPECTED.items():
        line = next(line for line in result.stdout.splitlines() if line.startswith(name))
        assert re.match(rf'{name}\s+\|█*\s+{queued}\b', line), result.stdout
    assert '2 queues, 1 jobs total' in result.stdout


def test_rq_dashboard_counts_them_as_deferred_and_scheduled(waiting, redis_url):
    if ON_CLUSTER:
        pytest.skip("rq-dashboard connects with a plain client, not a cluster's")
    rq_dashboard_cli = pytest.importorskip('rq_dashboard.cli', reason='rq-dashboard is not installed')
    from rq_dashboard.web import setup_rq_connection

    app = rq_dashboard_cli.make_flask_app(None, None, None, '/rq')
    app.config['RQ_DASHBOARD_REDIS_URL'] = redis_url
    setup_rq_connection(app)
    c = app.test_client()
    listed = {queue['name']: queue for queue in c.get('/rq/0/data/queues.json').get_json()['queues']}
    for name, counts in EXPECTED.items():
        row = listed[name]
        assert (row['count'], row['deferred_job_registry_count'], row['scheduled_job_registry_count']) == counts
    # the jobs themselves are listed under the queue's deferred and scheduled tabs
    deferred = c.get('/rq/0/data/jobs/default/deferred/20/asc/1.json').get_json()
    assert sorted(job['description'].split('(')[0] for job in deferred['jobs']) == ['tests.helpers.fair_jobs.work'] * 3
    scheduled = c.get('/rq/0/data/jobs/default/scheduled/20/asc/1.json').get_json()
    assert [job['description'] for job in scheduled['jobs']] == ['tests.helpers.jobs.plain(2)']


@pytest.fixture
def django_rq(redis_url):
    if ON_CLUSTER:
        pytest.skip("django-rq's test settings name a plain server, not a cluster")
    pytest.importorskip('django', reason='Django is not installed')
    if importlib.util.find_spec('django_rq') is None:
        pytest.skip('django-rq is not installed')
    import django

    os.environ['REDIS_URL'] = redis_url
    os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.helpers.django_settings'
    django.setup()
    import django_rq

    return django_rq


def test_django_rq_counts_them_as_deferred_and_scheduled(waiting, django_rq):
    """django-rq's ``stats.json`` view (the statistics its admin page shows: Queued, Deferred and Scheduled Jobs)
    and its Prometheus view (``rq_jobs{status=...}``), each asked with its API token."""
    from types import SimpleNamespace

    from django.test import RequestFactory, override_settings
    from django_rq import stats_views

    requests = RequestFactory()

    def ask(view, path, **headers):
        request = requests.get(path, **headers)
        request.user = SimpleNamespace(is_staff=False)  # not staff: the token alone lets it through
        return view(request)

    with override_settings(RQ_API_TOKEN='token-33'):
        response = ask(stats_views.stats_json, '/django-rq/stats.json', HTTP_AUTHORIZATION='Bearer token-33')
        assert response.status_code == 200, response.content
        stats = {queue['name']: queue for queue in json.loads(response.content)['queues']}
        for name, counts in EXPECTED.items():
            row = stats[name]
            assert (row['jobs'], row['deferred_jobs'], row['scheduled_jobs']) == counts
        if importlib.util.find_spec('prometheus_client') is None:
            return  # django-rq serves no metrics without it
        response = ask(stats_views.prometheus_metrics, '/django-rq/metrics', HTTP_AUTHORIZATION='Bearer token-33')
        assert response.status_code == 200, response.content
    exposed = response.content.decode()
    for name, (queued, deferred, scheduled) in EXPECTED.items():
        for status, count in (('queued', queued), ('deferred', deferred), ('scheduled', scheduled)):
            assert re.search(rf'^rq_jobs\{{(?=[^}}]*queue="{name}")(?=[^}}]*status="{status}")[^}}]*\}} {count}\.0$',
                             exposed, re.M), (name, status, exposed)


def test_rq_policies_info_prints_the_total_beside_rq_s_count(waiting, env, redis_url):
    result = run_policies('info', 'default', 'capped', env=env, url=redis_url)
    assert result.returncode == 0, result.stderr
    assert 'jobs      5 waiting in all; rq info counts 1 (queued 1, deferred 3, scheduled 1)' in result.stdout
    assert 'jobs      2 waiting in all; rq info counts 0 (queued 0, deferred 2, scheduled 0)' in result.stdout
    # with no QUEUE, every queue whose jobs rq info does not all count is listed, with its total
    everything = run_policies('info', env=env, url=redis_url).stdout
    assert re.search(r'^queue default\b.*\n  jobs      5 waiting in all', everything, re.M), everything
    assert re.search(r'^queue capped\b.*\n  jobs      2 waiting in all', everything, re.M), everything
    data = json.loads(run_policies('info', 'default', 'capped', '--json', env=env, url=redis_url).stdout)
    for name, (queued, deferred, scheduled) in EXPECTED.items():
        assert data['queues'][name]['jobs'] == {'queued': queued, 'deferred': deferred, 'scheduled': scheduled,
                                                'total': queued + deferred + scheduled, 'due': []}


def test_a_due_debounced_job_no_worker_moved_is_listed(connection, env, redis_url):
    """Its pointer expires at its run time; with no PolicyWorker (nor rq's scheduler) serving the queue it stays in
    rq's scheduled registry, due: ``info`` lists it (before: the queue vanished from ``info``)."""
    job = PolicyQueue('quiet', connection=connection).enqueue(jobs.plain, 3, policy=Debounce(1))
    due = connection.zscore(ScheduledJobRegistry(queue=PolicyQueue('quiet', connection=connection)).key, job.id)
    assert wait_for(lambda: server_now(connection) > due + 0.1, timeout=10)
    result = run_policies('info', env=env, url=redis_url)
    assert result.returncode == 0, result.stderr
    assert 'queue quiet' in result.stdout, result.stdout
    assert 'jobs      1 waiting in all; rq info counts 0 (queued 0, deferred 0, scheduled 1)' in result.stdout
    assert re.search(rf'due +1 scheduled job\(s\) due, .*\n +job {job.id} due \S+ \((\S+ s ago|now)\)  '
                     r'tests\.helpers\.jobs\.plain\(3\)', result.stdout), result.stdout
    data = json.loads(run_policies('info', 'quiet', '--json', env=env, url=redis_url).stdout)
    assert [row['id'] for row in data['queues']['quiet']['jobs']['due']] == [job.id]
