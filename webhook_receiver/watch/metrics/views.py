"""``GET /metrics/``: the stored state read within STATUS_TIMEOUT_SECONDS, then every
process's counters, behind a bearer token (METRICS_TOKEN)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator

from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.views.decorators.csrf import csrf_exempt
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from ...conf import app_settings
from ...core import bounds, logs, outages
from ...inbound.metrics import counters_zero_fill
from ...sources.lookup import sources_all
from .collectors import DatabaseCollector, OutboxCollector
from .exporter import process_collector

logger = logging.getLogger(__name__)


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
    slugs = list(sources_all())
    try:
        # read first: a database that fails fails the scrape, rather than leaving
        # gaps that absence alerts would take for silence; one that does not answer
        # (a locked table) fails it within STATUS_TIMEOUT_SECONDS
        with bounds.database_deadline(app_settings().status_timeout_seconds):
            collected = [*DatabaseCollector(slugs).collect(), *OutboxCollector().collect()]
        stored = _Families(collected)
    except DatabaseError as exc:
        outages.connection_discard_if_broken(exc)
        logs.log_failure(logger, "metrics scrape failed: the database did not answer", exc)
        response = HttpResponse(
            "The database did not answer.\n", status=503, content_type="text/plain; charset=utf-8"
        )
        return logs.mark_logged(response)
    counters_zero_fill(slugs)
    output = generate_latest(_Exposition(process_collector(), stored))
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
