import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _metrics_serve(**kwargs) -> None:
    """With CELERY_METRICS_PORT set (and PROMETHEUS_MULTIPROC_DIR, for the worker alone),
    the worker serves what its pool processes count (inbound retries' outcomes) for
    Prometheus: on CELERY_METRICS_ADDR, 127.0.0.1 unless set (docs/watching.md). The
    relay's counters are the relay process's (manage.py webhook_relay --metrics-port)."""
    port = os.environ.get("CELERY_METRICS_PORT")
    if port:
        from webhook_receiver.watch.metrics import worker_metrics_serve

        addr = os.environ.get("CELERY_METRICS_ADDR", "127.0.0.1")
        worker_metrics_serve(int(port), addr=addr)
