"""What is stored, read from the database at scrape time: right whichever process answers
the scrape, after a restart, and for work that Celery workers did. Every read is an
index range (tests/bench/metrics.py shows the plans and times a scrape).

- ``DatabaseCollector``: failed events, the oldest retry and whether retries run, the
  last accepted event, silence alerts and repair items, for every configured source;
- ``OutboxCollector``: each destination's backlog, oldest eligible message, held-back and
  failed messages, requests in flight, the breaker and whether the relay sends, from the
  one query the destinations page and the status read (outbound/selectors.py), judged
  by the status's own conditions (watch/conditions.py), so they never disagree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from django.db.models import Count, QuerySet
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from ...core.encryption import with_stored_secrets
from ...inbound.models import FailedEvent, FailureStatus
from ...outbound.breaker import destination_breaker
from ...outbound.models import WebhookDestination
from ...outbound.selectors import destinations_with_health
from ...reconcile.models import RepairItem, RepairKind, RepairStatus
from ..destinations import destination_status
from ..models import SilenceAlert
from ..pickup import retry_pickup
from ..statuses import DestinationStatus
from ..traffic import last_accepted_at

OPEN_FAILURES = (FailureStatus.RETRYING, FailureStatus.DEAD)


class DatabaseCollector:
    """Gauges of what is stored, for every configured source: 0 when there is nothing,
    but for the last event's time, which has no sample until there is one.

    Sources no longer configured are left out: their rows stay in the admin, and the
    number of series stays bounded by the settings.
    """

    def __init__(self, slugs: Sequence[str]) -> None:
        self.slugs = list(slugs)

    def collect(self) -> Iterator[Metric]:
        yield self._failed_events()
        yield from self._overdue_retries()
        yield self._last_event()
        yield self._silence_alerts()
        yield self._repair_items()

    def _failed_events(self) -> GaugeMetricFamily:
        # one index-only range per (source, status) of webhook_failed_source
        rows = FailedEvent.objects.filter(source__in=self.slugs, status__in=OPEN_FAILURES)
        return self._counts(
            "webhook_receiver_failed_events",
            "Failed events waiting for a retry (retrying) or for an operator (dead).",
            rows,
            "status",
            OPEN_FAILURES,
        )

    def _overdue_retries(self) -> Iterator[GaugeMetricFamily]:
        oldest = GaugeMetricFamily(
            "webhook_receiver_oldest_retry_age_seconds",
            "How long the most overdue retrying event has been due for its retry (0: none is due).",
            labels=["source"],
        )
        stalled = GaugeMetricFamily(
            "webhook_receiver_retries_stalled",
            "1 while a retry is overdue for longer than a running sweep leaves one (the "
            "overview's retries_stalled), else 0.",
            labels=["source"],
        )
        now = timezone.now()
        for slug in self.slugs:
            retrying = FailedEvent.objects.filter(source=slug, status=FailureStatus.RETRYING)
            # the first entry of webhook_failed_source's (source, "retrying") range
            due = retrying.order_by("next_attempt_at").values_list("next_attempt_at", flat=True)
            first = due.first()
            overdue = max((now - first).total_seconds(), 0.0) if first is not None else 0.0
            oldest.add_metric([slug], overdue)
            # how many are due, for the sweep's pickup: read only when one is overdue
            late = (
                overdue
                and overdue
                > retry_pickup(retrying.filter(next_attempt_at__lte=now).count()).total_seconds()
            )
            stalled.add_metric([slug], 1 if late else 0)
        yield oldest
        yield stalled

    def _last_event(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "webhook_receiver_last_event_timestamp_seconds",
            "When the source's last accepted event arrived, in Unix seconds.",
            labels=["source"],
        )
        for slug in self.slugs:
            moment = last_accepted_at(slug)
            # none yet: no sample rather than 1970, which would look like a long silence
            # (the silence check does not count a source before its first event either)
            if moment is not None:
                family.add_metric([slug], moment.timestamp())
        return family

    def _silence_alerts(self) -> GaugeMetricFamily:
        # the partial unique index webhook_silence_one_open holds exactly the open ones
        silent = set(
            SilenceAlert.objects.filter(source__in=self.slugs, resolved_at__isnull=True)
            .values_list("source", flat=True)
            .order_by()
        )
        family = GaugeMetricFamily(
            "webhook_receiver_silence_alert_open",
            "1 while the source has an open silence alert, else 0.",
            labels=["source"],
        )
        for slug in self.slugs:
            family.add_metric([slug], 1 if slug in silent else 0)
        return family

    def _repair_items(self) -> GaugeMetricFamily:
        rows = RepairItem.objects.filter(status=RepairStatus.OPEN, source__in=self.slugs)
        return self._counts(
            "webhook_receiver_repair_items_open",
            "Open reconciliation repair items, by kind.",
            rows,
            "kind",
            tuple(RepairKind),
        )

    def _counts(
        self, name: str, documentation: str, rows: QuerySet, label: str, values: Sequence[str]
    ) -> GaugeMetricFamily:
        """``rows`` counted by source and ``label``, with a 0 for every configured source
        and value that has none (so that an alert on absence can tell 0 from missing)."""
        counts = dict.fromkeys(((s, str(v)) for s in self.slugs for v in values), 0)
        grouped = (
            rows.values("source", label)
            .annotate(n=Count("*"))
            .values_list("source", label, "n")
            .order_by()
        )
        counts.update({(source, value): n for source, value, n in grouped})
        family = GaugeMetricFamily(name, documentation, labels=["source", label])
        for (source, value), n in counts.items():
            family.add_metric([source, value], n)
        return family


# the outbox's gauges: (name after webhook_receiver_outbox_, help)
OUTBOX_GAUGES = {
    "backlog": ("backlog", "Messages pending or being sent."),
    "oldest": (
        "oldest_eligible_age_seconds",
        "Age of the oldest message that may be sent now: due, and not behind an open message "
        "of its ordering key (0: none).",
    ),
    "held_back": ("held_back", "Messages waiting behind a failed one of their ordering key."),
    "failed": ("failed", "Terminal messages awaiting an operator."),
    "in_flight": ("in_flight", "Requests in flight (unexpired leases), on every worker."),
    "utilisation": (
        "limiter_utilisation",
        "Requests in flight as a share of the destination's concurrency limit.",
    ),
    "breaker": ("breaker_open", "1 while the circuit breaker pauses the destination, else 0."),
    "not_sending": (
        "not_sending",
        "1 while messages are due and nothing is answered for longer than a running relay "
        "takes to pick one up (the overview's relay_not_sending), else 0.",
    ),
}


class OutboxCollector:
    """The outbox's stored state per destination, read at scrape time: the figures the
    destinations page, the overview and webhook_status read (selectors.py), from one
    grouped query, so that they never disagree."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        # the secrets as stored, never decrypted: a scrape needs none of them, only
        # whether the keys read them (nor, when the key is wrong, to fail)
        destinations = destinations_with_health(
            with_stored_secrets(WebhookDestination.objects.order_by("name")), now=now
        )
        families = {
            key: GaugeMetricFamily(f"webhook_receiver_outbox_{name}", help, labels=["destination"])
            for key, (name, help) in OUTBOX_GAUGES.items()
        }
        for dest in destinations:
            oldest = dest.oldest_eligible_at
            paused = destination_breaker(dest, now=now).state == "open"
            values = {
                "backlog": dest.backlog,
                "oldest": max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
                "held_back": dest.held_back,
                "failed": dest.failed_count,
                "in_flight": dest.in_flight,
                "utilisation": dest.in_flight / max(1, dest.max_in_flight),
                "breaker": 1 if paused else 0,
                "not_sending": int(_not_sending(destination_status(dest, now=now))),
            }
            for key, value in values.items():
                families[key].add_metric([dest.name], value)
        yield from families.values()


def _not_sending(status: DestinationStatus) -> bool:
    return any(r.code == "relay_not_sending" for r in status.reasons)
