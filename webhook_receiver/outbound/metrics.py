"""The outbox's metrics, served by /metrics/ beside the receiver's (docs/watching.md).

Counted where they happen, with prometheus-client (multiprocess mode when
``PROMETHEUS_MULTIPROC_DIR`` is set, as for the web workers):

- ``webhook_receiver_outbox_dedup_hits_total{destination}``: admissions that created
  nothing (the window or the unique key answered);
- ``webhook_receiver_outbox_delivery_seconds{destination}``: enqueue-to-delivery time;
- ``webhook_receiver_outbox_attempts_per_delivery{destination}``: attempts a delivered
  message took;
- ``webhook_receiver_outbox_terminal_total{destination}``: messages that became terminal;
- ``webhook_receiver_outbox_uncatalogued_total{destination,reason}``: messages admitted
  outside the event catalog (``CATALOG_CHECK = "record"``): ``undeclared`` type, or
  ``invalid`` body.

The relay's are counted in the Celery worker that delivered: /metrics/ sees them when
the worker shares the web server's multiprocess directory (one host); elsewhere the
worker serves them itself (``webhook_receiver.watch.metrics.worker_metrics_serve``).
The outbox's stored state (backlog, oldest eligible message, breaker…) is read from the
database at scrape time: watch/metrics/collectors.py.
"""

from __future__ import annotations

import logging
from datetime import datetime

from prometheus_client import Counter, Histogram

logger = logging.getLogger(__name__)

DEDUP_HITS = Counter(
    "webhook_receiver_outbox_dedup_hits",
    "Admissions that created no message: the admission window or the unique key answered.",
    ["destination"],
)
DELIVERY_SECONDS = Histogram(
    "webhook_receiver_outbox_delivery_seconds",
    "Time from a message's admission to its delivery.",
    ["destination"],
    buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400),
)
ATTEMPTS_PER_DELIVERY = Histogram(
    "webhook_receiver_outbox_attempts_per_delivery",
    "HTTP attempts a delivered message took.",
    ["destination"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24),
)
TERMINAL = Counter(
    "webhook_receiver_outbox_terminal",
    "Messages that became terminal (refused, or attempts exhausted): for an operator.",
    ["destination"],
)
UNCATALOGUED = Counter(
    "webhook_receiver_outbox_uncatalogued",
    "Messages admitted outside the event catalog: an undeclared type, or an invalid body.",
    ["destination", "reason"],
)


def dedup_hit_count(destination: str) -> None:
    _safely(lambda: DEDUP_HITS.labels(destination).inc())


def delivery_record(
    destination: str, *, created_at: datetime, delivered_at: datetime, attempts: int
) -> None:
    seconds = max(0.0, (delivered_at - created_at).total_seconds())
    _safely(lambda: DELIVERY_SECONDS.labels(destination).observe(seconds))
    _safely(lambda: ATTEMPTS_PER_DELIVERY.labels(destination).observe(attempts))


def terminal_count(destination: str) -> None:
    _safely(lambda: TERMINAL.labels(destination).inc())


def uncatalogued_count(destination: str, reason: str) -> None:
    _safely(lambda: UNCATALOGUED.labels(destination, reason).inc())


def _safely(record) -> None:
    # a metric that cannot be written (a full disk under multiprocess mode) never fails
    # an admission or a relay round
    try:
        record()
    except Exception:
        logger.exception("outbox metric not recorded")
