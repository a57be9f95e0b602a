"""A ``WebhookSource`` record read into the ``SourceConfig`` the settings produce, so
that everything past the lookup treats both alike."""

from __future__ import annotations

from datetime import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf.sources import SourceConfig, source_config
from .models import WebhookSource

_MIDNIGHT = time(0, 0)
_DAY_END = time(23, 59, 59)


def record_options(record: WebhookSource) -> dict[str, Any]:
    """The record as a source's settings (``WEBHOOK_RECEIVER["SOURCES"][slug]``)."""
    active_hours = None
    if record.active_days or record.active_start or record.active_end:
        active_hours = {
            "DAYS": record.active_days or "mon-sun",
            # no start: from midnight; no end: to the day's end (days alone: whole days)
            "START": (record.active_start or _MIDNIGHT).strftime("%H:%M:%S"),
            "END": (record.active_end or _DAY_END).strftime("%H:%M:%S"),
            "TIME_ZONE": record.active_time_zone or "UTC",
        }
    return {
        "SCHEME": record.scheme,
        "SECRETS": list(record.secrets or []),
        "TOLERANCE_SECONDS": record.tolerance_seconds,
        "MAX_BODY_BYTES": record.max_body_bytes,
        "SILENCE_AFTER_SECONDS": record.silence_after_seconds or None,
        "ACTIVE_HOURS": active_hours,
    }


def record_config(record: WebhookSource) -> SourceConfig:
    """The record's ``SourceConfig``; raises ``ImproperlyConfigured`` (with the settings'
    wording) for values the settings would refuse too."""
    return source_config(record.slug, record_options(record))


def record_problem(record: WebhookSource) -> str | None:
    """Why the record cannot serve as a source (its secrets aside), or None."""
    try:
        record_config(record)
    except (ImproperlyConfigured, ValueError) as exc:
        return str(exc).replace(f"WEBHOOK_RECEIVER['SOURCES'][{record.slug!r}]", "this source")
    return None
