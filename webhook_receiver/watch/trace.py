"""The whole story of one event key, from raw request to committed side effect.

``event_trace`` reads, in the order things happen: every request that carried the key
(audit records), the receipt and its outcome, the effects the host committed (through
its TRACE_EFFECTS hook), the failed-event history, reconciliation's repair items and the
outbox messages the event enqueued. The admin's trace page and ``manage.py
webhook_trace`` both print it. A selector: it writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db.models import Model
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from ..conf import app_settings
from ..inbound.models import FailedEvent, RequestAudit, WebhookReceipt
from ..outbound.models import MessageStatus, OutboxMessage
from ..presentation import display
from ..reconcile.models import RepairItem

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger(__name__)

T = TypeVar("T", bound="DataclassInstance")


@dataclass(frozen=True)
class EffectSection:
    """One table of a host's effects, as its TRACE_EFFECTS hook describes them: e.g. the
    ledger lines an event wrote. ``rows`` hold strings, one per column; ``admin_url``
    links to where the records live. ``note`` says what the rows cannot (e.g. "this
    event did not set it")."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]] = ()
    admin_url: str = ""
    note: str = ""


EffectsHook = Callable[..., Sequence[EffectSection]]


@dataclass(frozen=True)
class OutboxSection(EffectSection):
    """One destination's messages: with each row, its message's metadata as compact JSON
    ("" when it has none), shown under the row."""

    metadata: Sequence[str] = ()

    @property
    def lines(self) -> list[tuple[Sequence[str], str]]:
        """(row, metadata) per message."""
        return list(zip(self.rows, self.metadata, strict=True))


@dataclass(frozen=True)
class Delivery:
    """One request that carried the key (a RequestAudit row)."""

    id: int
    received_at: datetime
    message_id: str
    verification: str
    result: str
    response_status: int
    remote_addr: str | None
    body_sha256: str
    body_size: int | None


@dataclass(frozen=True)
class Receipt:
    id: int
    status: str
    received_at: datetime
    event_type: str
    subject: str
    message_id: str
    outcome: dict[str, Any]


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of a failed event. The traceback is left out unless asked for
    (``event_trace(..., tracebacks=True)``): the admin page shows it folded away."""

    attempt: int | None
    at: datetime | None
    trigger: str
    kind: str
    exception: str
    message: str
    traceback: str = ""
    # an invalid payload's errors, per field: (path, the serializer's words)
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FailedHistory:
    id: int
    status: str
    event_type: str
    attempts: int
    first_attempt_at: datetime
    last_attempt_at: datetime
    next_attempt_at: datetime | None
    resolution: str
    resolved_at: datetime | None
    last_replayed_by: str
    last_replayed_at: datetime | None
    discarded_by: str
    discarded_at: datetime | None
    discard_reason: str
    history: tuple[Attempt, ...]


@dataclass(frozen=True)
class Repair:
    id: int
    kind: str
    status: str
    occurred_at: datetime
    created_at: datetime
    updated_at: datetime
    resolved_by: str
    resolved_at: datetime | None
    resolution_note: str


@dataclass(frozen=True)
class EventTrace:
    source: str
    event_key: str
    deliveries: tuple[Delivery, ...] = ()  # oldest first
    receipt: Receipt | None = None
    effects: tuple[EffectSection, ...] = ()
    # why the host's effects could not be read (TRACE_EFFECTS missing or failing)
    effects_error: str = ""
    failed: FailedHistory | None = None
    repairs: tuple[Repair, ...] = ()
    # the outbox messages its handler enqueued, one section per destination
    outbox: tuple[OutboxSection, ...] = ()

    @property
    def found(self) -> bool:
        """Whether the receiver holds anything for this key (a host's effects commit with
        a receipt, so they never stand alone)."""
        return bool(self.deliveries or self.receipt or self.failed or self.repairs)

    @property
    def summary(self) -> str:
        """The story in one line: "2 deliveries · receipt applied · …"."""
        if not self.found:
            return "nothing holds this key"
        count = len(self.deliveries)
        parts = [f"{count} deliver{'y' if count == 1 else 'ies'}"]
        parts.append(f"receipt {self.receipt.status}" if self.receipt else "no receipt")
        if self.failed:
            attempts = self.failed.attempts
            parts.append(
                f"failed event {self.failed.status} after {attempts} "
                f"attempt{'' if attempts == 1 else 's'}"
            )
        if self.repairs:
            still_open = sum(1 for item in self.repairs if item.status == "open")
            parts.append(f"{len(self.repairs)} repair item(s), {still_open} open")
        return " · ".join(parts)

    @property
    def event_type(self) -> str:
        if self.receipt and self.receipt.event_type:
            return self.receipt.event_type
        return self.failed.event_type if self.failed else ""


def event_trace(*, source: str, event_key: str, tracebacks: bool = False) -> EventTrace:
    """Everything the receiver (and the host, through TRACE_EFFECTS) holds for one key.

    Each read is an index lookup: audit records by event key, receipts and failed events
    by their unique (event_key, source), repair items by (event_key, source, kind).
    """
    effects, effects_error = _host_effects(source=source, event_key=event_key)
    return EventTrace(
        source=source,
        event_key=event_key,
        deliveries=_deliveries(source, event_key),
        receipt=_receipt(source, event_key),
        effects=effects,
        effects_error=effects_error,
        failed=_failed(source, event_key, tracebacks=tracebacks),
        repairs=_repairs(source, event_key),
        outbox=_outbox(source, event_key),
    )


def _outbox(source: str, event_key: str) -> tuple[OutboxSection, ...]:
    """The messages the event's handler admitted (index on origin_event_key), with their
    delivery state and metadata, grouped by destination."""
    rows = (
        OutboxMessage.objects.filter(origin_event_key=event_key, origin_source=source)
        .select_related("destination")
        # its name only: a destination's secrets are decrypted as read, and a trace of
        # one whose key was rotated away must not fail for them
        .defer("destination__secrets")
        .order_by("destination__name", "id")
    )
    sections: dict[str, list[tuple[str, ...]]] = {}
    metadata: dict[str, list[str]] = {}
    for m in rows:
        metadata.setdefault(m.destination.name, []).append(_metadata_text(m.metadata))
        # a discarded message says by whom (an operator, or the destination's filter) and
        # why, where an answer would be: it was never sent, or not again
        discarded = m.status == MessageStatus.DISCARDED and m.discarded_by
        sections.setdefault(m.destination.name, []).append(
            (
                m.key,
                m.event_type,
                f"discarded by {m.discarded_by}" if discarded else m.status,
                str(m.attempts),
                _moment_text(m.delivered_at or (None if discarded else m.next_attempt_at)),
                str(m.last_status_code or m.last_error[:80] or m.discard_reason[:80] or "-"),
            )
        )
    columns = ("key", "type", "status", "attempts", "delivered / next attempt", "last answer")
    return tuple(
        OutboxSection(title=f"to {name}", columns=columns, rows=rows, metadata=metadata[name])
        for name, rows in sections.items()
    )


def _metadata_text(metadata: Any) -> str:
    """A message's metadata on one line, its keys sorted; "" when it has none."""
    if not metadata:
        return ""
    try:
        return json.dumps(metadata, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:  # deeper than admission allows (written some other way)
        return display.json_text(metadata, indent=None)


def _moment_text(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC" if moment else "-"


def event_key_sources(*, event_key: str) -> list[str]:
    """The sources that hold ``event_key`` anywhere (a request, a receipt, a failed event
    or a repair item), sorted: for tracing a key without knowing its source."""
    sources: set[str] = set()
    for model in (RequestAudit, WebhookReceipt, FailedEvent, RepairItem):
        sources.update(
            model.objects.filter(event_key=event_key).values_list("source", flat=True).distinct()
        )
    return sorted(sources)


def _copy(cls: type[T], row: Model, **values: Any) -> T:
    """``cls`` (a dataclass of this module) filled from ``row``'s fields of the same names,
    ``id`` from its primary key, and ``values`` where a field is not stored as shown."""
    names = [f.name for f in fields(cls) if f.name not in values]
    stored = {name: row.pk if name == "id" else getattr(row, name) for name in names}
    return cls(**stored, **values)


def _deliveries(source: str, event_key: str) -> tuple[Delivery, ...]:
    rows = RequestAudit.objects.filter(event_key=event_key, source=source)
    return tuple(_copy(Delivery, row) for row in rows.order_by("received_at", "id"))


def _receipt(source: str, event_key: str) -> Receipt | None:
    # the body and headers stay behind: the receipt's admin page shows them
    rows = WebhookReceipt.objects.filter(event_key=event_key, source=source)
    row = rows.defer("body", "headers").first()
    if row is None:
        return None
    outcome = row.outcome if isinstance(row.outcome, dict) else {"outcome": row.outcome}
    return _copy(Receipt, row, outcome=outcome)


def _failed(source: str, event_key: str, *, tracebacks: bool) -> FailedHistory | None:
    rows = FailedEvent.objects.filter(event_key=event_key, source=source)
    row = rows.defer("body", "headers").first()
    if row is None:
        return None
    errors = row.errors if isinstance(row.errors, list) else []
    history = tuple(_attempt(entry, tracebacks) for entry in errors if isinstance(entry, dict))
    return _copy(FailedHistory, row, history=history)


def _attempt(entry: dict[str, Any], tracebacks: bool) -> Attempt:
    at = entry.get("at")
    number = entry.get("attempt")
    return Attempt(
        attempt=number if isinstance(number, int) else None,
        at=parse_datetime(at) if isinstance(at, str) else None,
        trigger=str(entry.get("trigger", "")),
        kind=str(entry.get("kind", "")),
        exception=str(entry.get("exception", "")),
        message=str(entry.get("message", "")),
        traceback=str(entry.get("traceback", "")) if tracebacks else "",
        fields=_field_errors(entry.get("fields")),
    )


def _field_errors(fields: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(fields, dict):
        return ()
    return tuple(
        (str(path), " ".join(map(str, found)) if isinstance(found, list) else str(found))
        for path, found in fields.items()
    )


def _repairs(source: str, event_key: str) -> tuple[Repair, ...]:
    rows = RepairItem.objects.filter(event_key=event_key, source=source)
    return tuple(_copy(Repair, row) for row in rows.order_by("created_at", "id"))


def _host_effects(*, source: str, event_key: str) -> tuple[tuple[EffectSection, ...], str]:
    """The host's sections, or why there are none. A broken hook must not hide the rest
    of the story, so its failure becomes a message on the page, not an error."""
    path = app_settings().trace_effects
    if not path:
        return (), ""
    try:
        hook: EffectsHook = import_string(path)
    except ImportError as exc:
        return (), f"WEBHOOK_RECEIVER['TRACE_EFFECTS'] = {path!r} cannot be imported: {exc}"
    try:
        sections = tuple(hook(source=source, event_key=event_key))
    except Exception as exc:
        logger.exception(
            "TRACE_EFFECTS %s failed for %s:%s",
            path,
            source,
            event_key,
            extra={"source": source, "event_key": event_key},
        )
        return (), f"WEBHOOK_RECEIVER['TRACE_EFFECTS'] ({path}) raised {type(exc).__name__}: {exc}"
    return sections, ""
