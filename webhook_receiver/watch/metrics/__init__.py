"""Prometheus metrics at ``GET /metrics/`` (docs/metrics.md lists each one and why).

Two kinds of value, each kept where it stays right:

- What requests did (counters, the histogram) exists only in the web processes that
  served them. Under gunicorn's several workers, prometheus_client's multiprocess mode
  (``PROMETHEUS_MULTIPROC_DIR``, set up in deploy/gunicorn.conf.py) keeps each worker's
  values in a file that any worker's scrape sums. Without the variable (runserver,
  tests) they live in the process's default registry.
- What is stored (failed events, silence alerts, repair items, the last event) is read
  from the database at scrape time by ``DatabaseCollector``: right whichever process
  answers the scrape, after a restart, and for work that Celery workers did. Every read
  is an index range (tests/bench/metrics.py shows the plans and times a scrape).

- What Celery workers count (the relay's delivery time, attempts and terminal messages)
  exists in the worker's pool processes. ``/metrics/`` sees it when the worker shares
  the web server's multiprocess directory (one host); anywhere else, the worker serves
  it itself (``worker_metrics_serve``).

Recording never raises: a metric that cannot be written is logged, and the response it
was about stands.

A host mounts the view with one line: ``path("metrics/", include("webhook_receiver.watch.metrics.urls"))``.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ...conf import app_settings
from ...core import faults, logs
from ...exceptions import NotStored, RejectedRequest
from ...inbound.models import FailedEvent, FailureStatus, Result, Verification
from ...outbound.metrics import OutboxCollector
from ...reconcile.models import RepairItem, RepairKind, RepairStatus
from ..models import SilenceAlert
from ..traffic import last_accepted_at

logger = logging.getLogger(__name__)

# The source label of a request to a slug that is not configured: whatever a prober
# puts in the URL becomes this one value, so it cannot grow the number of series.
UNKNOWN_SOURCE = "unknown"
# The reason of a verified request answered 503 (neither applied nor captured).
NOT_STORED = NotStored.code

# What a request can end with, once accepted, and the reasons a configured source's
# request can be refused (all but unknown_source, which is UNKNOWN_SOURCE's): each source
# shows every one (at 0 until it happens), so that rate() has a series from the start.
ACCEPTED_RESULTS = (
    Result.APPLIED,
    Result.DUPLICATE,
    Result.STALE,
    Result.IGNORED,
    Result.DEFERRED,
    Result.DEAD_LETTERED,
)
_OTHERS = (Verification.VERIFIED, Verification.UNKNOWN_SOURCE)
SOURCE_REJECTIONS = (*(c for c in Verification.values if c not in _OTHERS), NOT_STORED)
OPEN_FAILURES = (FailureStatus.RETRYING, FailureStatus.DEAD)

# --- recorded by the web processes ---------------------------------------------------

EVENTS = Counter(
    "webhook_receiver_events",
    "Accepted webhook requests, by how they ended.",
    ["source", "result"],
)
REJECTED = Counter(
    "webhook_receiver_rejected",
    "Refused webhook requests, by reason: the rejection code, or temporarily_unavailable "
    "for a 503 (nothing stored; the sender retries).",
    ["source", "reason"],
)
UNRECORDED = Counter(
    "webhook_receiver_rejected_unrecorded",
    "Refused webhook requests beyond REJECTED_AUDIT_PER_MINUTE (per source and reason in a "
    "minute): counted in the minute's rejection tally, with no audit record of their own.",
    ["source", "reason"],
)
RECEIVE_SECONDS = Histogram(
    "webhook_receiver_receive_seconds",
    "Time to receive a webhook request that was not refused, from reading its body to its commit.",
    ["source"],
    # the fast path is a few milliseconds; the top is past the claim's 5 s statement
    # timeout and at GitHub's 10 s wait
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


class ReceiveObservation:
    """Times one ``webhook_receive`` call and counts how it ended.

    The caller sets ``result`` once the call returns; an exception leaving the block is
    counted as a refusal (its code) or as not stored (any other error: the view answers
    503), and goes on unchanged.
    """

    __slots__ = ("source", "result", "_started")

    def __init__(self, source: str) -> None:
        self.source = source
        self.result: str | None = None
        self._started = 0.0

    def __enter__(self) -> ReceiveObservation:
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = time.perf_counter() - self._started
        try:
            _record(self.source, self.result, exc, elapsed)
        except Exception as error:  # a metric never changes the answer
            logs.log_failure(logger, "webhook metrics not recorded", error)


def receive_observed(source: str) -> ReceiveObservation:
    """``with metrics.receive_observed(source) as observed:`` around the call, and
    ``observed.result = outcome.status`` once it returned."""
    return ReceiveObservation(source)


def refusal_unrecorded(source: str, reason: str) -> None:
    """Count a refused request that the audit bound left without a record of its own."""
    try:
        UNRECORDED.labels(_source_label(source), reason).inc()
    except Exception as error:  # a metric never changes the answer
        logs.log_failure(logger, "webhook metrics not recorded", error)


def _source_label(source: str) -> str:
    return source if source in app_settings().sources else UNKNOWN_SOURCE


def _record(source: str, result: str | None, exc: BaseException | None, seconds: float) -> None:
    label = _source_label(source)
    if isinstance(exc, RejectedRequest):
        # refusals are counted, not timed: a flood of bad requests must not hide the
        # time real deliveries take
        REJECTED.labels(label, exc.code).inc()
    elif isinstance(exc, Exception):
        REJECTED.labels(label, NOT_STORED).inc()
        RECEIVE_SECONDS.labels(label).observe(seconds)
    elif exc is None and result is not None:
        EVENTS.labels(label, str(result)).inc()
        RECEIVE_SECONDS.labels(label).observe(seconds)


def _counters_zero_fill(slugs: Iterable[str]) -> None:
    """Create every configured source's series, at 0 until something happens."""
    for slug in slugs:
        for result in ACCEPTED_RESULTS:
            EVENTS.labels(slug, str(result))
        for reason in SOURCE_REJECTIONS:
            REJECTED.labels(slug, reason)
            if reason != NOT_STORED:  # a 503 always has its record
                UNRECORDED.labels(slug, reason)
        RECEIVE_SECONDS.labels(slug)
    REJECTED.labels(UNKNOWN_SOURCE, Verification.UNKNOWN_SOURCE.value)
    UNRECORDED.labels(UNKNOWN_SOURCE, Verification.UNKNOWN_SOURCE.value)


_process_collector: Collector | None = None


def process_collector() -> Collector:
    """The counters and histogram of every web process: the files of multiprocess mode
    when ``PROMETHEUS_MULTIPROC_DIR`` is set, else this process's default registry."""
    global _process_collector
    if _process_collector is None:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            _process_collector = registry
        else:
            _process_collector = REGISTRY
    return _process_collector


def worker_metrics_serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve what a Celery worker's pool processes count (the relay's delivery time,
    attempts and terminal messages) at ``http://addr:port/metrics``, for Prometheus.

    Call it once in the worker's main process, before its pool starts (Celery's
    ``worker_init`` signal; the demo's project/celery.py does with CELERY_METRICS_PORT).
    ``PROMETHEUS_MULTIPROC_DIR`` must name a directory of the worker's own, set before
    the worker starts: each pool process writes its counters there and a scrape sums
    them. It is emptied here, as a fresh server's must be. Like most exporters it asks
    for no token: bind it to an address only Prometheus reaches.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        raise ImproperlyConfigured(
            "Serving a worker's metrics needs PROMETHEUS_MULTIPROC_DIR: set it to an "
            "empty directory of the worker's own before the worker starts."
        )
    Path(directory).mkdir(parents=True, exist_ok=True)
    for stale in Path(directory).glob("*.db"):
        stale.unlink()
    start_http_server(port, addr=addr, registry=process_collector())
    logger.info("serving the worker's metrics at http://%s:%s/metrics", addr, port)


# --- read from the database at scrape time --------------------------------------------


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
        yield self._oldest_retry_age()
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

    def _oldest_retry_age(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "webhook_receiver_oldest_retry_age_seconds",
            "How long the most overdue retrying event has been due for its retry (0: none is due).",
            labels=["source"],
        )
        now = timezone.now()
        for slug in self.slugs:
            # the first entry of webhook_failed_source's (source, "retrying") range
            due = (
                FailedEvent.objects.filter(source=slug, status=FailureStatus.RETRYING)
                .order_by("next_attempt_at")
                .values_list("next_attempt_at", flat=True)
                .first()
            )
            overdue = (now - due).total_seconds() if due is not None else 0.0
            family.add_metric([slug], max(overdue, 0.0))
        return family

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


class _Families:
    """Metric families already read, served as a collector."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class _Exposition:
    def __init__(self, *collectors: Collector) -> None:
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            yield from collector.collect()


# --- the view -------------------------------------------------------------------------


# A scraper never logs in nor holds a CSRF token; the bearer token is its credential.
@csrf_exempt
@login_not_required
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = app_settings().metrics_token
    if token is None:
        raise Http404("Metrics are off: set WEBHOOK_RECEIVER['METRICS_TOKEN'].")
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    if not _bearer_matches(request, token):
        return HttpResponse(
            "A bearer token is required.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    slugs = list(app_settings().sources)
    try:
        # read first: a database that fails fails the scrape, rather than leaving
        # gaps that absence alerts would take for silence; one that does not answer
        # (a locked table) fails it within STATUS_TIMEOUT_SECONDS
        with faults.database_deadline(app_settings().status_timeout_seconds):
            collected = [*DatabaseCollector(slugs).collect(), *OutboxCollector().collect()]
        stored = _Families(collected)
    except DatabaseError as exc:
        faults.connection_discard_if_broken(exc)
        logs.log_failure(logger, "metrics scrape failed: the database did not answer", exc)
        response = HttpResponse(
            "The database did not answer.\n", status=503, content_type="text/plain; charset=utf-8"
        )
        return logs.logged_already(response)
    _counters_zero_fill(slugs)
    output = generate_latest(_Exposition(process_collector(), stored))  # type: ignore[arg-type]
    return HttpResponse(output, content_type=CONTENT_TYPE_PLAIN_0_0_4)


def _bearer_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    # bytes: compare_digest refuses non-ASCII str, and a header may hold anything
    return hmac.compare_digest(
        presented.strip().encode("utf-8", "surrogateescape"),
        token.encode("utf-8", "surrogateescape"),
    )


urlpatterns = [path("", metrics_view, name="webhook_receiver_metrics")]
