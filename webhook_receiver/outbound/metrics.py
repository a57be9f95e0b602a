"""The outbox's metrics, served by /metrics/ beside the receiver's (docs/metrics.md).

Counted where they happen, with prometheus-client (multiprocess mode when
``PROMETHEUS_MULTIPROC_DIR`` is set, as for the web workers):

- ``webhook_receiver_outbox_dedup_hits_total{destination}``: admissions that created
  nothing (the window or the unique key answered);
- ``webhook_receiver_outbox_delivery_seconds{destination}``: enqueue-to-delivery time;
- ``webhook_receiver_outbox_attempts_per_delivery{destination}``: attempts a delivered
  message took;
- ``webhook_receiver_outbox_terminal_total{destination}``: messages that became terminal.

The relay's are counted in the Celery worker that delivered: /metrics/ sees them when
the worker shares the web server's multiprocess directory (one host); elsewhere the
worker serves them itself (``webhook_receiver.watch.metrics.worker_metrics_serve``). The stored
state below is read from the database at scrape time, so it is right on any topology:

- ``webhook_receiver_outbox_backlog{destination}``: pending and sending messages;
- ``webhook_receiver_outbox_oldest_eligible_age_seconds{destination}``: how long the
  oldest message that may be sent now (due, and not behind an open message of its
  ordering key) has existed (0: none);
- ``webhook_receiver_outbox_held_back{destination}``: messages waiting behind a failed
  one of their ordering key (for an operator, as the failed one is);
- ``webhook_receiver_outbox_failed{destination}``: terminal messages awaiting an operator;
- ``webhook_receiver_outbox_in_flight{destination}`` and
  ``webhook_receiver_outbox_limiter_utilisation{destination}``: requests in flight, and
  their share of the destination's limit;
- ``webhook_receiver_outbox_breaker_open{destination}``: 1 while the breaker pauses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from .models import WebhookDestination
from .selectors import destinations_with_health

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


def _safely(record) -> None:
    # a metric that cannot be written (a full disk under multiprocess mode) never fails
    # an admission or a relay round
    try:
        record()
    except Exception:
        logger.exception("outbox metric not recorded")


class OutboxCollector:
    """The outbox's stored state per destination, read at scrape time: the figures the
    destinations page, the overview and webhook_status read (selectors.py), from one
    grouped query, so that they never disagree."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        # no secrets: a scrape needs none of them (nor, when the key is wrong, to fail)
        destinations = destinations_with_health(
            WebhookDestination.objects.defer("secrets").order_by("name"), now=now
        )
        families = {
            "backlog": GaugeMetricFamily(
                "webhook_receiver_outbox_backlog",
                "Messages pending or being sent.",
                labels=["destination"],
            ),
            "oldest": GaugeMetricFamily(
                "webhook_receiver_outbox_oldest_eligible_age_seconds",
                "Age of the oldest message that may be sent now: due, and not behind an "
                "open message of its ordering key (0: none).",
                labels=["destination"],
            ),
            "held_back": GaugeMetricFamily(
                "webhook_receiver_outbox_held_back",
                "Messages waiting behind a failed one of their ordering key.",
                labels=["destination"],
            ),
            "failed": GaugeMetricFamily(
                "webhook_receiver_outbox_failed",
                "Terminal messages awaiting an operator.",
                labels=["destination"],
            ),
            "in_flight": GaugeMetricFamily(
                "webhook_receiver_outbox_in_flight",
                "Requests in flight (unexpired leases), on every worker.",
                labels=["destination"],
            ),
            "utilisation": GaugeMetricFamily(
                "webhook_receiver_outbox_limiter_utilisation",
                "Requests in flight as a share of the destination's concurrency limit.",
                labels=["destination"],
            ),
            "breaker": GaugeMetricFamily(
                "webhook_receiver_outbox_breaker_open",
                "1 while the circuit breaker pauses the destination, else 0.",
                labels=["destination"],
            ),
        }
        for dest in destinations:
            name, oldest = [dest.name], dest.oldest_eligible_at
            families["backlog"].add_metric(name, dest.backlog)
            families["oldest"].add_metric(
                name, max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
            )
            families["held_back"].add_metric(name, dest.held_back)
            families["failed"].add_metric(name, dest.failed_count)
            families["in_flight"].add_metric(name, dest.in_flight)
            families["utilisation"].add_metric(name, dest.in_flight / max(1, dest.max_in_flight))
            paused = dest.paused_until is not None and dest.paused_until > now
            families["breaker"].add_metric(name, 1 if paused else 0)
        yield from families.values()
