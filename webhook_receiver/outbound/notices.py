"""Operational notices through the outbox: silence alerts and terminal deliveries sent
as webhooks to the destination named by OPS_DESTINATION (a chat bridge, an incident
tool), with the same keys, limits and retries as any message.

Each notice has its own stable key, so a notice admitted twice is one message. A
failing ops destination never reports its own failures to itself (no loop).

The notices are in the event catalog like any event (here and in watch/notifiers.py),
opt-in: a merchant's wildcard never reaches them.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, cast

from django.utils import timezone
from rest_framework import serializers

from ..conf import app_settings
from .admission import ADMISSION_FIELDS, enqueue_webhook
from .catalog import webhook_event
from .models import ADMITTING, OutboxMessage, WebhookDestination

logger = logging.getLogger(__name__)


@webhook_event(
    "outbox.message_failed",
    opt_in=True,
    example={
        "destination": "merchant-7",
        "message_id": 81234,
        "key": "order:ord-1042:paid:3",
        "event_type": "order.paid",
        "last_answer": "404",
    },
)
class MessageFailed(serializers.Serializer):
    """Sent to OPS_DESTINATION: a message became terminal (refused by its destination,
    or its attempts spent)."""

    destination = serializers.CharField()
    message_id = serializers.IntegerField()
    key = serializers.CharField(help_text="The failed message's key.")
    event_type = serializers.CharField()
    last_answer = serializers.CharField(allow_blank=True, help_text="Its last answer, in short.")


@webhook_event(
    "outbox.destination_disabled",
    opt_in=True,
    example={
        "destination": "merchant-7",
        "reason": "410 Gone",
        "at": "2026-12-07T03:12:44+00:00",
    },
)
class DestinationDisabled(serializers.Serializer):
    """Sent to OPS_DESTINATION: a destination retired itself (410 Gone, or failing with
    no success for too long); its messages are held until it is enabled."""

    destination = serializers.CharField()
    reason = serializers.CharField()
    at = serializers.DateTimeField()


@webhook_event(
    "outbox.destination_failing",
    opt_in=True,
    example={
        "destination": "merchant-7",
        "reason": "its messages have failed with no success for over 3 days",
        "disabled_after": "5 days",
    },
)
class DestinationFailing(serializers.Serializer):
    """Sent to OPS_DESTINATION: a destination has failed for long enough that it will
    disable itself if nothing changes."""

    destination = serializers.CharField()
    reason = serializers.CharField()
    disabled_after = serializers.CharField(allow_null=True)


def ops_notice_enqueue(*, event_type: str, key: str, data: dict[str, Any]) -> bool:
    """Admit one notice to the ops destination, in a transaction of its own; False when
    none is configured or it is missing or disabled (logged once per call)."""
    name = app_settings().ops_destination
    if not name:
        return False
    # what admission needs, not its secrets (a notice is admitted even while no key
    # reads them; it waits with the rest)
    destination = (
        WebhookDestination.objects.filter(ADMITTING, name=name).only(*ADMISSION_FIELDS).first()
    )
    if destination is None:
        logger.warning("OPS_DESTINATION %r is missing or disabled: notice %s not sent", name, key)
        return False
    payload = {"type": event_type, "timestamp": timezone.now().isoformat(), "data": data}
    return enqueue_webhook(destination, event_type, key, payload).created


def terminal_notice(
    *, destination: str, message_id: int, key: str, event_type: str, answer: str
) -> None:
    """A message became terminal: tell the ops destination, unless it is the one failing."""
    if destination == app_settings().ops_destination:
        return
    notice_key = f"outbox:{destination}:{key}:failed:{message_id}"
    if len(notice_key) > cast(int, OutboxMessage._meta.get_field("key").max_length):
        # the failed message's key is named in the payload; here it only has to be unique
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        notice_key = f"outbox:{destination}:sha256:{digest}:failed:{message_id}"
    ops_notice_enqueue(
        event_type="outbox.message_failed",
        key=notice_key,
        data={
            "destination": destination,
            "message_id": message_id,
            "key": key,
            "event_type": event_type,
            "last_answer": answer,
        },
    )
