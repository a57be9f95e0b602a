"""Prometheus metrics at ``GET /metrics/`` (docs/watching.md lists each one and why).

Two kinds of value, each kept where it stays right:

- What requests did (counters, the histogram: inbound/metrics.py, outbound/metrics.py)
  exists only in the processes that did it. Under gunicorn's several workers,
  prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set up in
  deploy/gunicorn.conf.py) keeps each worker's values in a file that any worker's scrape
  sums (exporter.py). Without the variable (runserver, tests) they live in the process's
  default registry.
- What is stored (failed events, silence alerts, repair items, the last event, the
  outbox's backlog) is read from the database at scrape time (collectors.py).
- What a relay process counts (the outbox's delivery time, attempts and terminal
  messages), and what Celery workers count, exists in those processes. ``/metrics/``
  sees it when the process shares the web server's multiprocess directory (one host);
  anywhere else, the process serves it itself (``relay_metrics_serve``,
  ``worker_metrics_serve``).

A host mounts the view (views.py) with one line:
``path("metrics/", include("webhook_receiver.watch.metrics.urls"))``; a relay serves its
own with ``manage.py webhook_relay --metrics-port``, a Celery worker with
``worker_metrics_serve``.
"""

from .exporter import relay_metrics_serve, worker_metrics_serve

__all__ = ["relay_metrics_serve", "worker_metrics_serve"]
