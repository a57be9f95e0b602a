"""Heartbeats: the last time a periodic process was seen, for /health/."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from .models import Heartbeat

BEAT = "beat"


def heartbeat_record(name: str = BEAT, *, now: datetime | None = None) -> None:
    """Record that ``name`` ran now: one small row per name, overwritten each time."""
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": now or timezone.now()})


def heartbeat_seen_at(name: str = BEAT) -> datetime | None:
    return Heartbeat.objects.filter(name=name).values_list("seen_at", flat=True).first()
