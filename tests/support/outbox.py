"""The outbox's records with known values, written directly: destinations, messages in
any status, and failed messages with their last attempt; and the relays' wake-ups, heard
as a relay hears them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from io import StringIO

import psycopg
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from webhook_receiver.models import (
    DeliveryAttempt,
    MessageStatus,
    OutboxMessage,
    WebhookDestination,
)
from webhook_receiver.outbound.relay.wakeups import CHANNEL

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OLD_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
CLOSED_PORT = "http://127.0.0.1:9/hooks"  # the discard port: nothing listens


def destination(name: str, url: str = CLOSED_PORT, **fields) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name=name,
        url=url,
        secrets=fields.pop("secrets", [SECRET, OLD_SECRET]),
        event_types=fields.pop("event_types", ["order.paid", "order.cancelled"]),
        **fields,
    )


def destination_command(*args: str) -> str:
    """``manage.py webhook_destination *args``; what it printed."""
    out = StringIO()
    call_command("webhook_destination", *args, stdout=out)
    return out.getvalue()


def destination_added(name: str, *args: str) -> str:
    """``webhook_destination add NAME``, at https://NAME.example/hooks signing with
    SECRET, and ``args``; what it printed."""
    url = f"https://{name}.example/hooks"
    return destination_command("add", name, "--url", url, "--secret", SECRET, *args)


def relay_merchant(url: str, **fields) -> WebhookDestination:
    """The relay's tests' destination: "merchant", order.paid only, signing with SECRET."""
    return WebhookDestination.objects.create(
        name=fields.pop("name", "merchant"),
        url=url,
        secrets=fields.pop("secrets", [SECRET]),
        event_types=["order.paid"],
        **fields,
    )


def message(dest, key, status=MessageStatus.PENDING, **fields) -> OutboxMessage:
    now = timezone.now()
    return OutboxMessage.objects.create(
        destination=dest,
        key=key,
        event_type=fields.pop("event_type", "order.paid"),
        payload=fields.pop("payload", {"type": "order.paid", "data": {"key": key}}),
        status=status,
        next_attempt_at=fields.pop("next_attempt_at", now),
        created_at=fields.pop("created_at", now),
        **fields,
    )


def failed(dest, key, *, last_attempt_at, **fields) -> OutboxMessage:
    """A terminal message whose last attempt started at ``last_attempt_at``."""
    row = message(
        dest,
        key,
        MessageStatus.FAILED,
        attempts=1,
        failures=1,
        last_status_code=404,
        last_error='{"error": "no such hook"}',
        next_attempt_at=last_attempt_at,
        **fields,
    )
    DeliveryAttempt.objects.create(
        message=row, number=1, started_at=last_attempt_at, duration_ms=12, status_code=404
    )
    return row


@contextmanager
def listening() -> Iterator[Callable[[], list[int]]]:
    """LISTEN for the relays' wake-ups on a connection of its own (PostgreSQL): yields a
    function that returns the destination ids notified since it was last called."""
    params = {**connection.get_connection_params()}
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")

        def heard() -> list[int]:
            return [int(n.payload) for n in listener.notifies(timeout=0.3)]

        yield heard
