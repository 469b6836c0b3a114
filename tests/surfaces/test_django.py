"""Django-RQ: PolicyQueue and PolicyWorker chosen through django-rq's settings (tests/helpers/django_settings.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

django = pytest.importorskip('django')
if importlib.util.find_spec('django_rq') is None:  # importing it needs configured settings: only look for it
    pytest.skip('django-rq is not installed', allow_module_level=True)

from rq_policies import PolicyQueue, PolicyWorker, QueueSlot  # noqa: E402
from rq_policies.engine.compat import KEY_PREFIX as RQ  # noqa: E402
from tests.helpers import jobs  # noqa: E402

SETTINGS = 'tests.helpers.django_settings'


@pytest.fixture(scope='module')
def django_rq(redis_url):
    # The settings module reads REDIS_URL when Django loads it, so the session server must be known first.
    os.environ['REDIS_URL'] = redis_url
    os.environ['DJANGO_SETTINGS_MODULE'] = SETTINGS
    django.setup()
    import django_rq

    return django_rq


@pytest.fixture
def django_env(worker_env):
    return dict(worker_env, DJANGO_SETTINGS_MODULE=SETTINGS)


def policy_django_queue_settings():
    from django.conf import settings
    from django.test import override_settings

    return override_settings(RQ=dict(settings.RQ, QUEUE_CLASS='rq_policies.surfaces.contrib.django.PolicyDjangoQueue'))


def test_settings_select_policy_queue_and_worker(django_rq, connection):
    queue = django_rq.get_queue('default')
    assert isinstance(queue, PolicyQueue)
    first = queue.enqueue(jobs.sweep_cache, 1)
    assert first is not None
    assert queue.enqueue(jobs.sweep_cache, 1) is None  # the Loner declared on the function applies
    assert queue.enqueued(jobs.sweep_cache, 1)
    worker = django_rq.get_worker('default')
    assert isinstance(worker, PolicyWorker)
    assert issubclass(worker.queue_class, PolicyQueue)
    worker.work(burst=True)
    assert not queue.enqueued(jobs.sweep_cache, 1)
    assert queue.finished_job_registry.count == 1


def test_rqworker_command_runs_policy_worker_under_a_cap(django_rq, connection, django_env):
    """`manage.py rqworker` builds its worker from WORKER_CLASS: two of them honour a cluster-wide cap of 1."""
    queue = django_rq.get_queue('capped')
    QueueSlot.set('capped', 1, connection=connection)
    for _ in range(4):
        assert queue.enqueue(jobs.sleep_and_record, 'dj', 0.3, policy=None) is not None
    procs = [
        subprocess.Popen(
            [sys.executable, '-m', 'django', 'rqworker', 'capped', '--burst'],
            env=django_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    errors = [proc.communicate(timeout=60)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors
    spans = []
    starts = {}
    for raw in connection.lrange('test:span:dj', 0, -1):
        job_id, kind, stamp = raw.decode().split()
        if kind == 'start':
            starts[job_id] = float(stamp)
        else:
            spans.append((starts[job_id], float(stamp)))
    assert len(spans) == 4
    spans.sort()
    assert all(prev_end <= start for (_, prev_end), (start, _) in zip(spans, spans[1:])), spans  # never two at once
    assert QueueSlot.status('capped', connection=connection).in_use == 0


def test_policy_django_queue_defers_to_commit_and_admits_then(django_rq, connection):
    from django.db import transaction

    from rq_policies.surfaces.contrib.django import PolicyDjangoQueue

    with policy_django_queue_settings():
        queue = django_rq.get_queue('default')
        assert isinstance(queue, PolicyDjangoQueue)
        with transaction.atomic():
            assert queue.enqueue(jobs.sweep_cache, 5) is None  # held until the commit, as django-rq does
            assert queue.enqueue(jobs.sweep_cache, 5) is None
            assert queue.enqueue(jobs.plain, 5, policy=None) is None
            assert queue.count == 0
        # At the commit both were written through the door: the Loner admitted one of the two.
        assert queue.count == 2
        assert queue.enqueued(jobs.sweep_cache, 5)
        assert connection.hget(f'{RQ}:policies:drops', 'loner:default') == b'1'

        with transaction.atomic():
            queue.enqueue(jobs.sweep_cache, 5, policy=None)  # the per-call override survives the deferral
        assert queue.count == 3

        # Outside a transaction it enqueues at once and returns the job or None.
        assert queue.enqueue(jobs.sweep_cache, 6) is not None
        assert queue.enqueue(jobs.sweep_cache, 6) is None
        assert queue.enqueue_call(jobs.sweep_cache, args=(6,), policy=None) is not None


def test_policy_django_queue_rolled_back_enqueue_never_happens(django_rq, connection):
    from django.db import transaction

    with policy_django_queue_settings():
        queue = django_rq.get_queue('default')
        with pytest.raises(RuntimeError), transaction.atomic():
            queue.enqueue(jobs.sweep_cache, 7)
            raise RuntimeError('roll back')
        assert queue.count == 0
        assert not queue.enqueued(jobs.sweep_cache, 7)
        assert queue.enqueue(jobs.sweep_cache, 7) is not None  # the identity was never taken


@pytest.mark.parametrize('job_class', [None, 'rq_policies.PolicyJob'])
def test_admin_enqueue_of_a_deferred_job_takes_the_stock_job_the_view_fetched(django_rq, connection, job_class):
    """django-rq's admin "Enqueue" (views.enqueue_job -> utils.requeue_job) fetches a stock rq Job and hands it to
    the queue's ``_enqueue_job``: with ``JOB_CLASS`` set to PolicyJob it failed with ``DataError: Invalid input of
    type: 'Job'`` (rq removes the deferred job from the queue's registry by object only for the queue's job_class)."""
    from django.conf import settings
    from django.test import override_settings
    from django_rq.utils import requeue_job
    from rq.job import Job, JobStatus

    with override_settings(RQ=dict(settings.RQ, **({'JOB_CLASS': job_class} if job_class else {}))):
        queue = django_rq.get_queue('default')
    assert isinstance(queue, PolicyQueue)
    assert queue.job_class.__name__ == ('PolicyJob' if job_class else 'Job')
    parent = queue.enqueue(jobs.plain, 0)
    child = queue.enqueue(jobs.sweep_cache, 8, depends_on=parent)
    assert child.get_status() == JobStatus.DEFERRED
    stock = Job.fetch(child.id, connection=connection)
    assert type(stock) is Job
    requeue_job(queue, stock)
    assert Job.fetch(child.id, connection=connection).get_status() == JobStatus.QUEUED
    assert child.id in queue.job_ids
    assert queue.deferred_job_registry.get_job_ids() == []
    assert queue.enqueued(jobs.sweep_cache, 8)  # still the identity's holder, now queued
    assert queue.enqueue(jobs.sweep_cache, 8) is None


@pytest.mark.parametrize('call', ['enqueue', 'enqueue_call', 'delay'])
def test_a_call_held_for_the_request_end_is_recorded_as_django_rq_records_it(django_rq, connection, call):
    """COMMIT_MODE 'request_finished' keeps each call's (args, kwargs) until the request ends: a PolicyDjangoQueue
    records the same shape as django-rq's own queue (no positional func, no private keyword)."""
    from django_rq import thread_queue
    from django_rq.queues import DjangoRQ

    from rq_policies.surfaces.contrib.django import PolicyDjangoQueue

    def recorded(queue):
        thread_queue.clear()
        if call == 'enqueue':
            queue.enqueue(jobs.sweep_cache, 9, job_timeout=30)
        elif call == 'enqueue_call':
            queue.enqueue_call(func=jobs.sweep_cache, args=(9,), timeout=30)
        else:
            from rq.decorators import job as job_decorator

            job_decorator(queue, connection=connection, timeout=30)(jobs.sweep_cache).delay(9)
        held = [(args, kwargs) for _, args, kwargs in thread_queue.get_queue()]
        thread_queue.clear()
        return held

    stock = DjangoRQ('default', connection=connection, commit_mode='request_finished')
    ours = PolicyDjangoQueue('default', connection=connection, commit_mode='request_finished')
    expected = recorded(stock)
    assert len(expected) == 1
    assert recorded(ours) == expected
    if call == 'enqueue':
        # A call that names its policies carries them as the policy= it was given, and nothing else.
        ours.enqueue(jobs.sweep_cache, 9, job_timeout=30, policy=None)
        (_, args, kwargs), = thread_queue.get_queue()
        thread_queue.clear()
        assert kwargs.pop('policy') is None
        assert (args, kwargs) == expected[0]
