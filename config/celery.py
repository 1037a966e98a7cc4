"""The Celery application. Broker and result backend come from REDIS_URL (see settings)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("vgpu_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["billing"])
