"""Django project configuration, the Celery app and the demo launcher."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
