"""The Celery app: settings come from Django's (CELERY_* names), tasks from each app's tasks.py.

Background work goes to one queue per kind, so that one kind never waits behind another: a
tenant's upload is validated while another tenant's eval set is scored for minutes. A worker
started without `-Q` consumes every queue (the tests, a one-process deployment); `make run`,
compose and Kubernetes run the evaluation queue in a worker of its own.
"""

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")

DEFAULT_QUEUE = "celery"  # the sweeps, re-checks and the platform's own tasks
VALIDATION_QUEUE = "validation"  # an upload's checks: seconds, bounded by the upload limits
STAGING_QUEUE = "staging"  # copies from object storage to this host's disk
EVALUATION_QUEUE = "evaluation"  # scoring eval sets on an engine: up to minutes each
QUEUES = (DEFAULT_QUEUE, VALIDATION_QUEUE, STAGING_QUEUE, EVALUATION_QUEUE)

# By task name: the registry's tasks are sent by name (registry/queue.py), and the platform
# is below the apps, so it names them rather than importing them.
ROUTES = {
    "registry.validate_adapter_version": {"queue": VALIDATION_QUEUE},
    "registry.stage_adapter_version": {"queue": STAGING_QUEUE},
    "registry.evaluate_adapter_version": {"queue": EVALUATION_QUEUE},
}

app = Celery("platform_site", include=["platform_site.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = DEFAULT_QUEUE
app.conf.task_queues = [Queue(name, routing_key=name) for name in QUEUES]
app.conf.task_routes = ROUTES
app.autodiscover_tasks()
