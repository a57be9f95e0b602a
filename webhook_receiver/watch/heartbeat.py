"""Heartbeats: the last time a periodic process was seen, for /health/ and the status."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery.app import app_or_default
from django.utils import timezone

from ..conf import app_settings
from .models import Heartbeat

BEAT = "beat"
# the task beat sends to show that beat, the broker and a worker all run (tasks.py)
HEARTBEAT_TASK = "webhook_receiver.beat_heartbeat"


def heartbeat_record(name: str = BEAT, *, now: datetime | None = None) -> None:
    """Record that ``name`` ran now: one small row per name, overwritten each time."""
    Heartbeat.objects.update_or_create(name=name, defaults={"seen_at": now or timezone.now()})


def heartbeat_seen_at(name: str = BEAT) -> datetime | None:
    return Heartbeat.objects.filter(name=name).values_list("seen_at", flat=True).first()


def heartbeat_interval() -> timedelta | None:
    """How often beat sends its heartbeat task, from Celery's beat schedule (the
    ``beat_schedule`` entry whose task is HEARTBEAT_TASK); None when no entry names it
    at a fixed interval (a crontab)."""
    schedules = app_or_default().conf.beat_schedule or {}
    for entry in schedules.values():
        if entry.get("task") != HEARTBEAT_TASK:
            continue
        every = entry.get("schedule")
        if isinstance(every, int | float):
            return timedelta(seconds=every)
        if isinstance(every, timedelta):
            return every
        run_every = getattr(every, "run_every", None)  # celery.schedules.schedule
        return run_every if isinstance(run_every, timedelta) else None
    return None


def heartbeat_stale_after() -> timedelta:
    """How old beat's heartbeat may be before the status says beat is not seen: two of
    its intervals (one is the normal wait for the next beat, the second lets it queue
    behind a worker's other tasks), at most HEARTBEAT_MAX_AGE_SECONDS, which it is when
    the schedule gives no interval."""
    limit = app_settings().heartbeat_max_age
    interval = heartbeat_interval()
    return limit if interval is None else min(2 * interval, limit)
