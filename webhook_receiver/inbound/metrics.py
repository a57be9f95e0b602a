"""The receive path's metrics, counted where they happen (docs/watching.md#metrics lists each one
and why): requests accepted by result, refused by reason, those the audit bound left
without a record, and the time to receive one.

They exist only in the web processes that served the requests. Under gunicorn's several
workers, prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set up in
deploy/gunicorn.conf.py) keeps each worker's values in a file that any worker's scrape
sums (watch/metrics/). Recording never raises: a metric that cannot be written is
logged, and the answer it was about stands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from types import TracebackType

from prometheus_client import Counter, Histogram

from ..core import logs
from ..exceptions import NotStored, RejectedRequest
from ..sources.lookup import source_known
from .models import Result, Verification

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
    return source if source_known(source) else UNKNOWN_SOURCE


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


def counters_zero_fill(slugs: Iterable[str]) -> None:
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
