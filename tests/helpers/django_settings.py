"""A minimal Django settings module: django-rq configured to use rq-policies' queue and worker classes."""

import os

SECRET_KEY = 'rq-policies-tests'
USE_TZ = True
INSTALLED_APPS = ['django_rq']
DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}

_URL = os.environ.get('REDIS_URL', 'redis://127.0.0.1:6379/0')

RQ_QUEUES = {
    'default': {'URL': _URL},
    'capped': {'URL': _URL},
}

RQ = {
    'QUEUE_CLASS': 'rq_policies.PolicyQueue',
    'WORKER_CLASS': 'rq_policies.PolicyWorker',
}
