"""How long a running relay or retry sweep takes to pick up work that is due: the
thresholds past which a backlog that does not move is a state (watch/conditions.py:
``relay_not_sending``, ``behind``, ``retries_stalled``), derived from the configuration
rather than fixed, so that a stopped worker shows within a minute, not ten.

The relay's poll is RELAY_POLL_SECONDS; the retry sweep's interval is read from beat's
schedule (``CELERY_BEAT_SCHEDULE``: the entry whose task is
``webhook_receiver.retry_failed_events``); a schedule that is not a plain interval (a
crontab), or none, is taken to be the shipped default. docs/watching.md states each
threshold and its reason.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, Protocol

from ..conf import app_settings

# the shipped beat schedule's interval (project/settings.py), for a schedule that does
# not say (no entry, or a crontab)
RETRY_SWEEP_DEFAULT = timedelta(seconds=15)
# on top of the expected pickup: a relay's round behind others, a retry's place in the
# worker's queue, the statements, clocks a little apart
SLACK = timedelta(seconds=15)
# a retry sweep's batch is cut short after this long (inbound/failures.py)
RETRY_BATCH_TIME = timedelta(seconds=0.5)


class Limits(Protocol):
    """A destination's limits (WebhookDestination's fields)."""

    rate_count: int
    rate_seconds: float
    timeout_seconds: float


def schedule_entry(task: str) -> dict[str, Any] | None:
    """Beat's schedule entry for ``task`` (Celery's ``beat_schedule``), or None."""
    from celery import current_app

    for entry in (current_app.conf.beat_schedule or {}).values():
        if entry.get("task") == task:
            return dict(entry)
    return None


def schedule_interval(task: str) -> timedelta | None:
    """The interval of beat's schedule entry for ``task``; None when no entry names it
    at a fixed interval (none, or a crontab or solar schedule: no one interval)."""
    from celery.schedules import maybe_schedule, schedule

    entry = schedule_entry(task)
    if entry is None or "schedule" not in entry:
        return None
    every = maybe_schedule(entry["schedule"])
    return timedelta(seconds=every.seconds) if isinstance(every, schedule) else None


def sweep_interval(task: str, default: timedelta) -> timedelta:
    """The interval of beat's schedule entry for ``task``, or ``default``."""
    interval = schedule_interval(task)
    return default if interval is None else interval


def relay_pickup(limits: Limits) -> timedelta:
    """The longest a running relay leaves a due message of this destination without an
    answer of any kind: its poll, which finds what no notification reached, the wait
    for one token of its rate limit, the request's own timeout (a hanging endpoint
    answers by timing out), and SLACK. Defaults: 1 s + 0.1 s + 10 s + 15 s ≈ 26 s."""
    token = limits.rate_seconds / max(1, limits.rate_count)
    poll = app_settings().relay_poll_seconds
    return timedelta(seconds=poll + token + limits.timeout_seconds) + SLACK


def retry_pickup(due: int) -> timedelta:
    """The longest a running retry sweep leaves a retry overdue, with ``due`` retries
    due at once: the sweep's interval, one batch cut short (RETRY_BATCH_TIME) per
    SWEEP_BATCH_SIZE retries ahead of it (a full batch queues the next at once), and
    SLACK. Defaults, a few retries due: 15 s + 0.5 s + 15 s ≈ 30 s."""
    batches = max(1, math.ceil(due / app_settings().sweep_batch_size))
    return (
        sweep_interval("webhook_receiver.retry_failed_events", RETRY_SWEEP_DEFAULT)
        + batches * RETRY_BATCH_TIME
        + SLACK
    )
