"""Celery tasks: the interface through which Celery runs the app's services.

Each task is thin: it imports its service inside its body (the one lazy import the app
allows, as the HackSoft styleguide does: a service may then queue a task by importing
this module at its top, with no import cycle) and calls it. Their registered names
(``webhook_receiver.<name>``) are what a beat schedule and a queue hold: renaming one is
a breaking change.

Names: a task's function is its registered name with ``_task``, and the service it calls
is named for what it does, verb first: ``purge_receipts_task`` (registered
``webhook_receiver.purge_receipts``) calls ``inbound.retention.purge_receipts``. Beat's
heartbeat calls ``record_heartbeat``, which records any named heartbeat.

Schedule them with beat (the demo project does, in ``project/settings.py``). They are
safe to run on several workers at once and to run again after a lost worker: sweeps
claim rows with ``SKIP LOCKED``, and every effect goes through a claim. A database error
is one log line a run (``outages.tolerates_database_errors``), and the next run tries again.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import TypedDict

from celery import shared_task
from celery.signals import beat_embedded_init, beat_init

from .conf import app_settings
from .core.logs import SaidOnce
from .core.outages import tolerates_database_errors

logger = logging.getLogger(__name__)


class _TaskOptions(TypedDict):
    acks_late: bool
    reject_on_worker_lost: bool
    ignore_result: bool


class _PurgeOptions(_TaskOptions):
    soft_time_limit: int
    time_limit: int


# at-least-once: acknowledged after the work, redelivered if the worker dies
AT_LEAST_ONCE: _TaskOptions = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "ignore_result": True,
}
# a retention purge, the same for every table: stopped at 9 minutes (soft), killed at 10
PURGE: _PurgeOptions = {"soft_time_limit": 540, "time_limit": 600, **AT_LEAST_ONCE}


# --- inbound ---------------------------------------------------------------------------


@shared_task(
    name="webhook_receiver.retry_failed_events",
    soft_time_limit=240,
    time_limit=300,
    **AT_LEAST_ONCE,
)
@tolerates_database_errors
def retry_failed_events_task() -> int:
    """Retry the failed events that are due, one bounded batch per run.

    A full batch means more may be due: queue another run, so a backlog drains across
    all workers instead of waiting for the next beat.
    """
    from .inbound.failures import retry_failed_events

    tried = retry_failed_events()
    if tried >= app_settings().sweep_batch_size:
        retry_failed_events_task.delay()
    return tried


@shared_task(name="webhook_receiver.purge_audit_records", **PURGE)
@tolerates_database_errors
def purge_audit_records_task() -> int:
    """Delete audit records past ``AUDIT_RETENTION_DAYS``: the receive side's, and the
    merchant portal's (its actions, and its links and sessions that ended)."""
    from .inbound.audit import purge_audit_records
    from .portal.access import purge_portal_records

    return purge_audit_records() + purge_portal_records()


@shared_task(name="webhook_receiver.purge_receipts", **PURGE)
@tolerates_database_errors
def purge_receipts_task() -> int:
    """Delete receipts past ``RECEIPT_RETENTION_DAYS`` (hourly on beat)."""
    from .inbound.retention import purge_receipts

    return purge_receipts()


@shared_task(name="webhook_receiver.purge_failed_events", **PURGE)
@tolerates_database_errors
def purge_failed_events_task() -> int:
    """Delete resolved and discarded failed events past ``FAILED_EVENT_RETENTION_DAYS``."""
    from .inbound.failures import purge_failed_events

    return purge_failed_events()


# --- outbound --------------------------------------------------------------------------


# The relay is a process of its own (manage.py webhook_relay) since 0.2. These two names
# stay registered for one release, so that a beat schedule or a queue that still holds
# them gets a line saying so instead of Celery's "unregistered task" error each time.
_relay_task_said = SaidOnce()


def _relay_task_gone(name: str) -> None:
    if _relay_task_said.met(name):
        logger.warning(
            "webhook_receiver.%s does nothing since 0.2: the relay runs in its own process "
            "(manage.py webhook_relay), which finds due messages itself; remove the task "
            "from beat's schedule (docs/upgrading.md)",
            name,
        )


@shared_task(name="webhook_receiver.relay_destination", ignore_result=True)
def relay_destination_task(destination_id: int) -> None:
    """Gone: the relay process relays every destination (see above)."""
    _relay_task_gone("relay_destination")


@shared_task(name="webhook_receiver.relay_sweep", ignore_result=True)
def relay_sweep_task() -> None:
    """Gone: the relay process polls for due messages itself (see above)."""
    _relay_task_gone("relay_sweep")


@shared_task(name="webhook_receiver.purge_outbox", **PURGE)
@tolerates_database_errors
def purge_outbox_task() -> int:
    """Delete delivered and discarded messages past their retention (daily on beat)."""
    from .outbound.retention import purge_outbox

    return purge_outbox()


# --- watch and reconcile ---------------------------------------------------------------


@shared_task(
    name="webhook_receiver.reconcile_sources",
    soft_time_limit=840,
    time_limit=900,
    **AT_LEAST_ONCE,
)
@tolerates_database_errors
def reconcile_sources_task() -> dict[str, str]:
    """Reconcile every source that has a RECONCILE block; one run per source at a time,
    enforced by the database (a source already running is skipped). A failed run is
    logged at ERROR and shown in the admin."""
    from .reconcile.run import reconcile_sources

    return reconcile_sources()


@shared_task(
    name="webhook_receiver.beat_heartbeat", soft_time_limit=20, time_limit=30, ignore_result=True
)
@tolerates_database_errors
def beat_heartbeat_task() -> None:
    """Schedule this on beat every 30 to 60 seconds: /health/ reports beat as down once
    its heartbeat is older than HEARTBEAT_MAX_AGE_SECONDS. (Not acks_late: a lost beat is
    the next one's job.)"""
    from .watch.heartbeat import record_heartbeat

    record_heartbeat()


@beat_init.connect
@beat_embedded_init.connect
def beat_heartbeat_at_start(**kwargs: object) -> None:
    """A beat whose schedule holds the heartbeat sends one as it starts, not only after
    the first interval: a new install's status and /health/ see beat within seconds
    rather than saying "beat never seen" for 20 s. Not retried: a broker that does not
    answer is beat's own first line to write, and its next heartbeat is on schedule."""
    from .watch.pickup import schedule_entry

    if schedule_entry(beat_heartbeat_task.name) is not None:
        with suppress(Exception):
            beat_heartbeat_task.apply_async(retry=False)


@shared_task(
    name="webhook_receiver.check_silence", soft_time_limit=50, time_limit=60, ignore_result=True
)
@tolerates_database_errors
def check_silence_task() -> dict[str, str]:
    """Schedule this on beat every minute: a source silent for longer than its
    SILENCE_AFTER_SECONDS opens one alert (and one notice); accepted traffic resolves it
    (one recovery notice). Safe on several workers at once: the database arbitrates.
    (Not acks_late: a lost check is the next one's job.)"""
    from .watch.silence import check_silence

    return {check.source: check.state for check in check_silence()}
