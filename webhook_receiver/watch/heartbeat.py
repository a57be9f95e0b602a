"""Heartbeats: the last time a periodic process was seen, for /health/ and the status."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from ..conf import app_settings
from .models import Heartbeat
from .pickup import schedule_interval

BEAT = "beat"
# the task beat sends to show that beat, the broker and a worker all run (tasks.py)
HEARTBEAT_TASK = "webhook_receiver.beat_heartbeat"


def record_heartbeat(name: str = BEAT, *, now: datetime | None = None) -> None:
    """Record that ``name`` ran now: one small row per name, overwritten each time."""
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": now or timezone.now()})


def heartbeat_seen_at(name: str = BEAT) -> datetime | None:
    return Heartbeat.objects.filter(name=name).values_list("seen_at", flat=True).first()


def heartbeat_interval() -> timedelta | None:
    """How often beat sends its heartbeat task, from Celery's beat schedule; None when
    no entry names it at a fixed interval (a crontab)."""
    return schedule_interval(HEARTBEAT_TASK)


def heartbeat_stale_after() -> timedelta:
    """How old beat's heartbeat may be before the status says beat is not seen: two of
    its intervals (one is the normal wait for the next beat, the second lets it queue
    behind a worker's other tasks), at most HEARTBEAT_MAX_AGE_SECONDS, which it is when
    the schedule gives no interval."""
    limit = app_settings().heartbeat_max_age
    interval = heartbeat_interval()
    return limit if interval is None else min(2 * interval, limit)
