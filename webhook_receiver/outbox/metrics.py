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
worker serves them itself (``webhook_receiver.metrics.worker_metrics_serve``). The stored
state below is read from the database at scrape time, so it is right on any topology:

- ``webhook_receiver_outbox_backlog{destination}``: pending and sending messages;
- ``webhook_receiver_outbox_oldest_eligible_age_seconds{destination}``: how long the
  oldest message that may be sent now has existed (0: none);
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

from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from .models import MessageStatus, OutboxMessage, WebhookDestination

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
    """The outbox's stored state per destination, read at scrape time: two grouped
    queries (messages by destination, served by webhook_outbox_due and the claim index)
    and the destinations themselves."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        destinations = list(
            WebhookDestination.objects.values_list("id", "name", "max_in_flight", "paused_until")
        )
        queued = (MessageStatus.PENDING, MessageStatus.SENDING)
        open_statuses = (*queued, MessageStatus.FAILED)
        rows = (
            OutboxMessage.objects.filter(status__in=open_statuses)
            .values("destination_id")
            .annotate(
                backlog=Count(
                    "id", filter=Q(status__in=(MessageStatus.PENDING, MessageStatus.SENDING))
                ),
                failed=Count("id", filter=Q(status=MessageStatus.FAILED)),
                in_flight=Count("id", filter=Q(status=MessageStatus.SENDING, lease_until__gt=now)),
                oldest=Min(
                    "created_at",
                    filter=Q(status=MessageStatus.PENDING, next_attempt_at__lte=now),
                ),
            )
            .order_by()
        )
        stats = {row["destination_id"]: row for row in rows}
        families = {
            "backlog": GaugeMetricFamily(
                "webhook_receiver_outbox_backlog",
                "Messages pending or being sent.",
                labels=["destination"],
            ),
            "oldest": GaugeMetricFamily(
                "webhook_receiver_outbox_oldest_eligible_age_seconds",
                "Age of the oldest message that may be sent now (0: none).",
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
        for pk, name, max_in_flight, paused_until in destinations:
            row = stats.get(pk, {})
            oldest = row.get("oldest")
            in_flight = row.get("in_flight", 0)
            families["backlog"].add_metric([name], row.get("backlog", 0))
            families["oldest"].add_metric(
                [name], max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
            )
            families["failed"].add_metric([name], row.get("failed", 0))
            families["in_flight"].add_metric([name], in_flight)
            families["utilisation"].add_metric([name], in_flight / max(1, max_in_flight))
            families["breaker"].add_metric([name], 1 if paused_until and paused_until > now else 0)
        yield from families.values()
