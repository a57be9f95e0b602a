"""A ``WebhookSource`` record read into the ``SourceConfig`` the settings produce, so
that everything past the lookup treats both alike."""

from __future__ import annotations

from datetime import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf.keys import key_default, options_of
from ..conf.sources import ActiveHours, SourceConfig, source_config
from .models import WebhookSource

_MIDNIGHT = time(0, 0)
_DAY_END = time(23, 59, 59)


def record_options(record: WebhookSource) -> dict[str, Any]:
    """The record as a source's settings (``WEBHOOK_RECEIVER["SOURCES"][slug]``), each
    value under the key its column stands for."""
    active_hours = None
    if record.active_days or record.active_start or record.active_end:
        active_hours = options_of(
            ActiveHours,
            days=record.active_days or key_default(ActiveHours, "days"),
            # no start: from midnight; no end: to the day's end (days alone: whole days)
            start=(record.active_start or _MIDNIGHT).strftime("%H:%M:%S"),
            end=(record.active_end or _DAY_END).strftime("%H:%M:%S"),
            tz=record.active_time_zone or key_default(ActiveHours, "tz"),
        )
    return options_of(
        SourceConfig,
        scheme=record.scheme,
        event_key=record_event_key(record),
        secrets=list(record.secrets or []),
        tolerance_seconds=record.tolerance_seconds,
        max_body_bytes=record.max_body_bytes,
        silence_after=record.silence_after_seconds or None,
        active_hours=active_hours,
    )


# the key functions a record may name (EVENT_KEY_CHOICES), by their dotted paths
SIGNED_BODY_KEY = "webhook_receiver.schemes.github.signed_body_key"


def record_event_key(record: WebhookSource) -> str | None:
    """The record's EVENT_KEY: the signed body's digest where chosen, and for a GitHub
    record by default (its delivery id is not signed); else the scheme's id (None)."""
    choice = record.event_key or ("signed_body" if record.scheme == "github" else "delivery_id")
    return SIGNED_BODY_KEY if choice == "signed_body" else None


def record_config(record: WebhookSource) -> SourceConfig:
    """The record's ``SourceConfig``; raises ``ImproperlyConfigured`` (with the settings'
    wording) for values the settings would refuse too."""
    return source_config(record.slug, record_options(record))


def record_problem(record: WebhookSource) -> str | None:
    """Why the record cannot serve as a source (its secrets aside), or None."""
    if record.event_key == "signed_body" and record.scheme != "github":
        return (
            "the signed body's SHA-256 keys GitHub's events only: the other schemes sign "
            "their delivery id, which keys their events"
        )
    try:
        record_config(record)
    except (ImproperlyConfigured, ValueError) as exc:
        return str(exc).replace(f"WEBHOOK_RECEIVER['SOURCES'][{record.slug!r}]", "this source")
    return None
