"""What a sender says it sent: adapters that list a source's events in a time window.

An adapter is a callable::

    adapter(*, options: Mapping[str, Any], since: datetime, until: datetime)
        -> Iterable[list[SenderEvent]]

yielding pages of the events the sender created in ``[since, until)``, oldest first or
in any order. It raises ``SenderUnavailable`` when the sender cannot be read (the run
fails, with that reason). Built in: ``http`` (the contract documented in
docs/watching.md#reconciliation),
``stripe`` (Stripe's Events list, through the official SDK), ``file`` (a JSON-lines
export in the http contract's record format); any other adapter is named by the dotted
path of a callable with this signature.

A sender's event is described in the http contract's terms (id, type, created_at, data);
reconciliation derives our event key from it the way the receive path would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.module_loading import import_string


class SenderUnavailable(Exception):
    """The sender's list could not be read: unreachable, refusing, or answering garbage."""


@dataclass(frozen=True)
class SenderEvent:
    id: str  # the sender's event id: the webhook-id (Standard Webhooks), the Stripe id
    type: str
    created_at: datetime
    data: Mapping[str, Any] = field(default_factory=dict)
    # the whole event as the sender would deliver it, when the sender gives it
    payload: Mapping[str, Any] | None = None


Adapter = Callable[..., Iterable[list[SenderEvent]]]

BUILT_IN = {
    "http": "webhook_receiver.reconcile.adapters.http.list_events",
    "stripe": "webhook_receiver.reconcile.adapters.stripe.list_events",
    "file": "webhook_receiver.reconcile.adapters.file.list_events",
}


@functools.cache
def get_adapter(name: str) -> Adapter:
    """The built-in adapter ``name``, or the callable at that dotted path."""
    return import_string(BUILT_IN.get(name, name))


def parse_event(record: Any) -> SenderEvent:
    """One record of the http contract: ``{"id", "type", "created_at", "data"}``."""
    if not isinstance(record, dict):
        raise SenderUnavailable(f"a record is not a JSON object: {str(record)[:100]}")
    missing = [name for name in ("id", "type", "created_at") if name not in record]
    if missing:
        raise SenderUnavailable(f"a record has no {', '.join(missing)}: {str(record)[:100]}")
    event_id, event_type = record["id"], record["type"]
    try:
        created_at = datetime.fromisoformat(str(record["created_at"]).replace("Z", "+00:00"))
    except ValueError as exc:
        raise SenderUnavailable(
            f"a record's created_at is not ISO 8601: {str(record['created_at'])[:40]!r}"
        ) from exc
    if not isinstance(event_id, str) or not isinstance(event_type, str) or not event_id:
        raise SenderUnavailable(f"a record's id and type must be strings: {str(record)[:100]}")
    if created_at.tzinfo is None:
        raise SenderUnavailable(f"created_at has no time zone: {record['created_at']!r}")
    data = record.get("data")
    return SenderEvent(
        id=event_id,
        type=event_type,
        created_at=created_at,
        data=data if isinstance(data, dict) else {},
        payload=record,
    )
