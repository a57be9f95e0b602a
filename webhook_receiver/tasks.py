"""Celery tasks: thin, idempotent wrappers around services.

Schedule them with beat (the demo project does, in ``project/settings.py``). They are
safe to run on several workers at once and to run again after a lost worker: the
sweeper claims rows with ``SKIP LOCKED``, and every effect goes through the claim.
"""

from __future__ import annotations

from celery import shared_task

from .conf import app_settings
from .core.faults import healing
from .inbound.audit import audit_purge
from .inbound.failures import failed_events_purge, failed_events_retry_due
from .outbound.tasks import purge_outbox, relay_destination, relay_sweep  # noqa: F401 - registered
from .reconcile.run import RunInProgress, reconciliation_run, sources_to_reconcile
from .watch.heartbeat import heartbeat_record
from .watch.silence import silence_check

# at-least-once: acknowledged after the work, redelivered if the worker dies
AT_LEAST_ONCE = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(
    name="webhook_receiver.retry_failed_events",
    soft_time_limit=240,
    time_limit=300,
    **AT_LEAST_ONCE,
)
@healing
def retry_failed_events() -> int:
    """Retry the failed events that are due, one bounded batch per run.

    A full batch means more may be due: queue another run, so a backlog drains across
    all workers instead of waiting for the next beat.
    """
    tried = failed_events_retry_due()
    if tried >= app_settings().sweep_batch_size:
        retry_failed_events.delay()
    return tried


@shared_task(
    name="webhook_receiver.purge_audit_records",
    soft_time_limit=540,
    time_limit=600,
    **AT_LEAST_ONCE,
)
@healing
def purge_audit_records() -> int:
    """Delete audit records past ``AUDIT_RETENTION_DAYS``."""
    return audit_purge()


@shared_task(
    name="webhook_receiver.purge_failed_events",
    soft_time_limit=540,
    time_limit=600,
    **AT_LEAST_ONCE,
)
@healing
def purge_failed_events() -> int:
    """Delete resolved and discarded failed events past ``FAILED_EVENT_RETENTION_DAYS``."""
    return failed_events_purge()


@shared_task(
    name="webhook_receiver.reconcile_sources",
    soft_time_limit=840,
    time_limit=900,
    **AT_LEAST_ONCE,
)
@healing
def reconcile_sources() -> dict[str, str]:
    """Reconcile every source that has a RECONCILE block; one run per source at a time,
    enforced by the database (a source already running is skipped). A failed run is
    logged at ERROR and shown in the admin."""
    outcomes = {}
    for slug in sources_to_reconcile():
        try:
            outcomes[slug] = reconciliation_run(source_slug=slug).outcome
        except RunInProgress:
            outcomes[slug] = "skipped: running elsewhere"
    return outcomes


@shared_task(
    name="webhook_receiver.beat_heartbeat", soft_time_limit=20, time_limit=30, ignore_result=True
)
@healing
def beat_heartbeat() -> None:
    """Schedule this on beat every 30 to 60 seconds: /health/ reports beat as down once
    its heartbeat is older than HEARTBEAT_MAX_AGE_SECONDS. (Not acks_late: a lost beat is
    the next one's job.)"""
    heartbeat_record()


@shared_task(
    name="webhook_receiver.check_silence", soft_time_limit=50, time_limit=60, ignore_result=True
)
@healing
def check_silence() -> dict[str, str]:
    """Schedule this on beat every minute: a source silent for longer than its
    SILENCE_AFTER_SECONDS opens one alert (and one notice); accepted traffic resolves it
    (one recovery notice). Safe on several workers at once: the database arbitrates.
    (Not acks_late: a lost check is the next one's job.)"""
    return {check.source: check.state for check in silence_check()}
