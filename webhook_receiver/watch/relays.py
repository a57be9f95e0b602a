"""Relay processes' heartbeats: each relay (``manage.py webhook_relay``) records that it
runs every RELAY_HEARTBEAT_SECONDS, one row per process ("relay <host> <pid>"); the
status and /health/ say "no relay running" when none has for RELAY_STALE_AFTER while
there is a destination to send to. A relay that stops cleanly removes its own row; the
row of one that was killed is left to go stale, and is deleted a day later by the next
relay's heartbeat.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Max
from django.utils import timezone

from ..outbound.models import ADMITTING, WebhookDestination
from .models import Heartbeat

RELAY_PREFIX = "relay "
# how often a relay records its heartbeat, and how old the newest may be before the
# status says no relay runs: three heartbeats missed, within a minute
RELAY_HEARTBEAT_SECONDS = 10.0
RELAY_STALE_AFTER = timedelta(seconds=3 * RELAY_HEARTBEAT_SECONDS)
# a dead relay's row is kept this long (the overview can say when it was last seen)
FORGET_AFTER = timedelta(days=1)


def record_relay_heartbeat(name: str, *, now: datetime | None = None) -> None:
    """Record that the relay process ``name`` runs; forget relays gone for a day."""
    now = now or timezone.now()
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": now})
    Heartbeat.objects.filter(name__startswith=RELAY_PREFIX, seen_at__lt=now - FORGET_AFTER).delete()


def relay_heartbeat_forget(name: str) -> None:
    """A relay that stopped cleanly: its row goes with it."""
    Heartbeat.objects.filter(name=name).delete()


def relays_seen_at() -> datetime | None:
    """When a relay process was last seen (the newest of their heartbeats), or None."""
    newest = Heartbeat.objects.filter(name__startswith=RELAY_PREFIX).aggregate(seen=Max("seen_at"))
    return newest["seen"]


def relay_needed() -> bool:
    """Whether there is a destination a relay would send to."""
    return WebhookDestination.objects.filter(ADMITTING).exists()
