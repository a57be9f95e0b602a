"""Admission: an outbox message is written in the caller's transaction, so it exists if
and only if that transaction commits (the transactional outbox).

Two guards against a second message for one logical delivery:

- the durable rule, a unique constraint on (destination, key): whenever a second
  admission comes, it creates nothing;
- the admission window, a cheap pre-check in Django's cache: a key admitted (and
  committed) in the last five minutes is answered from the cache without touching the
  table. It is an optimisation, never the identity: it is written only after commit, so
  an admission that rolled back never blocks a later one, and once it expires the
  constraint still holds. A cache that does not answer is a window that is empty: the
  admission goes on to the table (outages.Outage says so once an outage).

The insert waits for a lock on the outbox table at most ADMISSION_LOCK_TIMEOUT_MS (on
PostgreSQL), far less than the claim's LOCK_TIMEOUT_MS: an insert into the outbox never
waits in normal work, so a wait means the table is held (a migration, a VACUUM FULL), and
an event whose effect admits a message is better deferred fast than holding a web
worker for the whole bound.

A message may carry ``metadata`` beside its payload: a small JSON object saying how the
payload was made (a prompt's version, a model's token usage). It is stored, shown on the
message's page and its event's trace, and never sent; it is not part of the identity, so
a second admission of the key with other metadata is a duplicate that changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from ..conf import app_settings
from ..core import bounds, outages, sql, storable, tracing
from . import queries
from .catalog import admission_checked, subscribed
from .filters import filter_verdict
from .metrics import dedup_hit_count
from .models import ADMITTING, MessageStatus, OutboxMessage, WebhookDestination

logger = logging.getLogger(__name__)

# The admission window is an optimisation: without the cache, admissions go on to the
# table, whose unique constraint decides as it always does.
cache_outage = outages.Outage(
    logger,
    "outbox cache",
    "admissions rely on the unique constraint alone until it answers",
)

ADMISSION_WINDOW_SECONDS = 5 * 60
# a message's metadata, as compact UTF-8 JSON, at most: a few labels and numbers
METADATA_MAX_BYTES = 4096
# what admission reads of a destination
ADMISSION_FIELDS = ("id", "name", "filter")
# who discarded a message the destination's filter left out (its discarded_by)
FILTER = "filter"


@dataclass(frozen=True)
class Admission:
    destination: str
    key: str
    # whether this call created the message (else it existed: a dedup hit)
    created: bool
    # answered by the admission window, without a statement
    coalesced: bool = False
    # left out by the destination's filter: written discarded, never sent
    filtered: bool = False


def message_key(aggregate: str, aggregate_id: str, event: str, version: int) -> str:
    """The stable logical key of one event of an aggregate at one version
    (``order:ord_1042:paid:v3``): the same for every attempt and every re-admission of
    that event at that version. Never an attempt number, a timestamp or a random id:
    those describe an attempt, not the effect."""
    return f"{aggregate}:{aggregate_id}:{event}:v{version}"


def destinations_for(event_type: str) -> list[WebhookDestination]:
    """The enabled destinations subscribed to ``event_type``, by its name or a ``group.*``
    pattern (catalog.subscribed; one small query, the subscriptions read here, the same
    way on every database)."""
    enabled = WebhookDestination.objects.filter(ADMITTING).only(*ADMISSION_FIELDS, "event_types")
    return [d for d in enabled if subscribed(d.event_types or [], event_type)]


def enqueue_webhook(
    destination: WebhookDestination | str,
    event_type: str,
    key: str,
    payload: dict[str, Any],
    *,
    ordering_key: str | None = None,
    origin: tuple[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Admission:
    """Admit one message for ``destination``, inside the caller's transaction.

    ``key`` is the delivery's logical key (see ``message_key``); the receiving end
    deduplicates on it. Messages sharing an ``ordering_key`` (one aggregate's: an
    order's) are delivered to this destination one after another, in admission order.
    ``origin`` is the inbound event (source, event key) whose handler admits it, for the
    trace page. ``metadata`` (a JSON object of at most METADATA_MAX_BYTES; None: ``{}``)
    is kept beside the message, outside its identity: a duplicate leaves the first
    message's as it is. Invalid metadata raises ValueError before anything is written,
    and so does a message outside the event catalog, as ``CATALOG_CHECK`` says
    (``EventRefused``: catalog.py). An event the destination's filter leaves out is
    written as a message discarded by ``filter``, with the reason (filters.py). Returns
    whether a message was created, and whether the filter discarded it.
    """
    metadata = _checked_metadata(metadata)
    if not isinstance(destination, WebhookDestination):
        destination = WebhookDestination.objects.only(*ADMISSION_FIELDS).get(name=destination)
    admission_checked(destination.name, event_type, payload)
    window_key = _window_key(destination.pk, key)
    if cache_outage.call(lambda: cache.get(window_key), None):
        dedup_hit_count(destination.name)
        return Admission(destination=destination.name, key=key, created=False, coalesced=True)

    now = timezone.now()
    filtered = filter_verdict(destination.filter, event_type, payload, metadata)
    row = {
        "destination_id": destination.pk,
        "key": key,
        "event_type": event_type,
        "payload": payload,
        "metadata": metadata,
        "ordering_key": ordering_key or "",
        **as_filtered(filtered, now),
        "next_attempt_at": now,
        "origin_source": origin[0] if origin else "",
        "origin_event_key": origin[1] if origin else "",
        # the admitting span (the handler's, in a traced delivery): its deliveries
        # continue that trace
        "traceparent": tracing.current_traceparent(),
        "created_at": now,
    }
    params = sql.adapt(row, OutboxMessage)
    params["admission_lock_timeout"] = f"{app_settings().admission_lock_timeout_ms}ms"
    with connection.cursor() as cursor:
        bounds.execute_bounded(
            cursor,
            queries.INSERT_MESSAGE[connection.vendor],
            params,
            bound=queries.SHORTEN_LOCK_BOUND,
            restore=queries.RESTORE_LOCK_BOUND,
        )
        inserted = cursor.fetchone()
    created = inserted is not None
    # Remembered only once the admission has committed: a rollback leaves no trace.
    transaction.on_commit(lambda: _remember(window_key), robust=True)
    if not created:
        dedup_hit_count(destination.name)
    return Admission(
        destination=destination.name, key=key, created=created, filtered=filtered is not None
    )


def as_filtered(left_out: str | None, now: datetime) -> dict[str, Any]:
    """A new message's status and discard fields as the destination's filter decided
    (``left_out``: filter_verdict's reason, None when it passed): pending, or discarded
    by ``filter`` with the reason."""
    if left_out is None:
        return {"status": MessageStatus.PENDING, "discarded_by": "", "discard_reason": "",
                "discarded_at": None}  # fmt: skip
    return {"status": MessageStatus.DISCARDED, "discarded_by": FILTER,
            "discard_reason": storable.text(left_out, 500), "discarded_at": now}  # fmt: skip


def _checked_metadata(metadata: Any) -> dict[str, Any]:
    """``metadata`` as admission stores it: ``{}`` for None, else a JSON object that a
    JSON column stores as it is (storable.json_problem: str keys, JSON values, no NaN,
    NUL nor lone surrogate, at most JSON_PROBLEM_DEPTH levels) of at most
    METADATA_MAX_BYTES as compact UTF-8 JSON; ValueError otherwise."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ValueError(
            f"metadata must be a JSON object (a dict with str keys), not {type(metadata).__name__}"
        )
    problem = storable.json_problem(metadata)
    if problem:
        raise ValueError(
            "metadata must be JSON a column stores as it is (str keys, JSON values, no NaN "
            f"nor infinity, no NUL nor lone surrogate, at most {storable.JSON_PROBLEM_DEPTH} "
            f"levels): {problem}"
        )
    text = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > METADATA_MAX_BYTES:
        raise ValueError(
            f"metadata is {size} bytes as JSON, over the limit of {METADATA_MAX_BYTES} "
            "(METADATA_MAX_BYTES): keep it to a few labels and numbers"
        )
    return metadata


def _remember(window_key: str) -> None:
    cache_outage.call(lambda: cache.set(window_key, 1, ADMISSION_WINDOW_SECONDS), None)


def _window_key(destination_id: int, key: str) -> str:
    # keys may hold anything: hashed into a cache key every backend accepts
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"webhook_receiver:admitted:{destination_id}:{digest}"
