"""Repairs of reconciliation's items: always by a person, always on record.

Each action locks its item, does its work through the path that already exists for it
(a failed event's replay; the claim, for a missing event the sender's list supplied),
and appends what happened to the item's history: when, who, which action, the note,
the result. An action that succeeds resolves the item.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ..conf import get_source
from ..inbound.claim import event_claim_and_apply
from ..inbound.failures import failed_event_replay
from ..inbound.handlers import WebhookEvent
from ..inbound.models import FailedEvent, Result
from .adapters import get_adapter
from .models import RepairItem, RepairKind, RepairStatus

REPLAY, APPLY, REDELIVER, RESOLVE = "replay", "fetch and apply", "request redelivery", "resolve"
REQUESTED = "requested"


@dataclass(frozen=True)
class RepairResult:
    item_id: int
    action: str
    result: str  # a Result (applied, duplicate, failed, skipped, …), or "requested"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.result not in (Result.FAILED, Result.SKIPPED)


def repair_item_replay(*, item_id: int, actor: str, note: str = "") -> RepairResult:
    """Replay the failed event a ``failed`` item points at, under its original key."""
    with transaction.atomic():
        item = _locked(item_id)
        if item is None or item.kind != RepairKind.FAILED:
            return _skipped(item_id, REPLAY, "only a failed item can be replayed")
        failed = FailedEvent.objects.filter(source=item.source, event_key=item.event_key).first()
        if failed is None:
            return _done(item, REPLAY, actor, note, Result.SKIPPED, "no failed event holds it now")
        outcome = failed_event_replay(failed_id=failed.pk, actor=actor)
        return _done(item, REPLAY, actor, note, outcome.result, outcome.detail)


def repair_item_fetch_and_apply(*, item_id: int, actor: str, note: str = "") -> RepairResult:
    """Apply a ``missing`` event as the sender's list gave it, through the claim under
    its own key. The sender's API is the authentication here, not a signature: the
    receipt records that reconciliation applied it, and who approved it. A second
    click answers duplicate."""
    with transaction.atomic():
        item = _locked(item_id)
        if item is None or item.kind != RepairKind.MISSING:
            return _skipped(item_id, APPLY, "only a missing item can be fetched and applied")
        sender = item.sender_says
        if "data" not in sender:
            return _done(item, APPLY, actor, note, Result.SKIPPED, "the sender gave no payload")
        payload = {"id": sender.get("id"), "type": sender.get("type"), "data": sender["data"]}
        event = WebhookEvent(
            source=item.source,
            event_key=item.event_key,
            event_type=item.event_type,
            payload=payload,
            message_id=sender.get("id"),
        )
        body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        headers = {"X-Webhook-Receiver-Applied-By": f"reconciliation, approved by {actor}"}
        try:
            with transaction.atomic():
                outcome = event_claim_and_apply(event=event, body=body, headers=headers)
        except Exception as exc:
            return _done(item, APPLY, actor, note, Result.FAILED, f"{type(exc).__name__}: {exc}")
        return _done(item, APPLY, actor, note, outcome.status)


def repair_item_request_redelivery(*, item_id: int, actor: str, note: str = "") -> RepairResult:
    """Ask the sender to deliver the event again, where the source's adapter has a
    ``redeliver(*, options, event_ids)`` hook. The item resolves itself once a later
    run finds the event received."""
    with transaction.atomic():
        item = _locked(item_id)
        if item is None or item.kind != RepairKind.MISSING:
            return _skipped(item_id, REDELIVER, "only a missing item can be redelivered")
        source = get_source(item.source)
        config = source.reconcile if source else None
        hook = getattr(get_adapter(config.adapter), "redeliver", None) if config else None
        if hook is None or config is None:  # no config: no hook either
            detail = "this source's adapter cannot ask for a redelivery"
            return _done(item, REDELIVER, actor, note, Result.SKIPPED, detail)
        try:
            hook(options=config.options, event_ids=[item.sender_says.get("id", item.event_key)])
        except Exception as exc:
            return _done(
                item, REDELIVER, actor, note, Result.FAILED, f"{type(exc).__name__}: {exc}"
            )
        return _done(item, REDELIVER, actor, note, REQUESTED, resolve=False)


def repair_item_resolve(*, item_id: int, actor: str, note: str) -> RepairResult:
    """Close an item by hand, with the reason on record."""
    if not note.strip():
        raise ValueError("Resolving a repair item needs a note.")
    with transaction.atomic():
        item = _locked(item_id)
        if item is None or item.status == RepairStatus.RESOLVED:
            return _skipped(item_id, RESOLVE, "missing, or resolved already")
        return _done(item, RESOLVE, actor, note, RESOLVE)


def _locked(item_id: int) -> RepairItem | None:
    return RepairItem.objects.select_for_update().filter(pk=item_id).first()


def _skipped(item_id: int, action: str, detail: str) -> RepairResult:
    return RepairResult(item_id, action, Result.SKIPPED, detail)


def _done(
    item: RepairItem,
    action: str,
    actor: str,
    note: str,
    result: str,
    detail: str = "",
    *,
    resolve: bool = True,
) -> RepairResult:
    now: datetime = timezone.now()
    item.history = [
        *item.history,
        {
            "at": now.isoformat(),
            "by": actor,
            "action": action,
            "note": note.strip(),
            "result": str(result),
            "detail": detail[:2000],
        },
    ]
    outcome = RepairResult(item.pk, action, str(result), detail)
    if resolve and outcome.ok and item.status == RepairStatus.OPEN:
        item.status = RepairStatus.RESOLVED
        item.resolved_by = actor[:150]
        item.resolved_at = now
        item.resolution_note = note.strip() if action == RESOLVE else f"{action}: {result}"
        if note.strip() and action != RESOLVE:
            item.resolution_note += f"; {note.strip()}"
    item.updated_at = now
    item.save()
    return outcome
