"""Records as the receive path, the failure capture, the silence check and
reconciliation leave them, written directly at known times, so that each state and each
reason of the status can be named exactly; and ``manage.py webhook_status``, run."""

from __future__ import annotations

import io
from datetime import datetime, timedelta

import pytest
from django.core.management import call_command

from webhook_receiver.models import (
    FailedEvent,
    ReconciliationRun,
    RepairItem,
    RepairStatus,
    RequestAudit,
    RunOutcome,
    SilenceAlert,
    WebhookReceipt,
)
from webhook_receiver.watch.heartbeat import record_heartbeat
from webhook_receiver.watch.relays import record_relay_heartbeat


def receipt(source: str, at: datetime, key: str | None = None) -> WebhookReceipt:
    return WebhookReceipt.objects.create(
        source=source,
        event_key=key or f"{source}-{at.timestamp()}",
        event_type="inventory.reserved",
        status="applied",
        received_at=at,
        body=b"{}",
    )


def audit(
    source: str,
    at: datetime,
    *,
    verification: str = "verified",
    result: str = "applied",
    status: int = 200,
) -> RequestAudit:
    return RequestAudit.objects.create(
        source=source,
        verification=verification,
        result=result,
        response_status=status,
        received_at=at,
    )


def refused(source: str, at: datetime, code: str = "invalid_signature") -> RequestAudit:
    return audit(source, at, verification=code, result=code, status=401)


def accepted(source: str, at: datetime, result: str = "applied") -> WebhookReceipt:
    """An accepted request: its audit record, and the receipt a new event leaves."""
    audit(source, at, result=result)
    return receipt(source, at)


def failed(
    source: str,
    status: str,
    *,
    first: datetime,
    due: datetime | None = None,
    key: str | None = None,
    error: tuple[str, str] = ("builtins.TimeoutError", "the warehouse did not answer"),
) -> FailedEvent:
    return FailedEvent.objects.create(
        source=source,
        event_key=key or f"{source}-{status}-{first.timestamp()}",
        event_type="inventory.reserved",
        body=b"{}",
        status=status,
        attempts=3,
        last_error_class=error[0],
        last_error_message=error[1],
        first_attempt_at=first,
        last_attempt_at=first,
        next_attempt_at=due,
    )


def silence(source: str, *, opened: datetime, last: datetime | None, **more) -> SilenceAlert:
    return SilenceAlert.objects.create(
        source=source,
        opened_at=opened,
        last_accepted_at=last,
        silence_after_seconds=1200,
        last_checked_at=opened,
        **more,
    )


def run(source: str, outcome: str, *, started: datetime, **more) -> ReconciliationRun:
    return ReconciliationRun.objects.create(
        source=source,
        window_start=started - timedelta(hours=2),
        window_end=started - timedelta(minutes=10),
        started_at=started,
        finished_at=None if outcome == RunOutcome.RUNNING else started + timedelta(seconds=5),
        outcome=outcome,
        **more,
    )


def repair(
    source: str, kind: str, key: str, by: ReconciliationRun, status: str = RepairStatus.OPEN
) -> RepairItem:
    """An item run ``by`` found, of an event at the start of its window."""
    return RepairItem.objects.create(
        source=source,
        kind=kind,
        event_key=key,
        occurred_at=by.window_start,
        status=status,
        first_run=by,
        last_run=by,
        created_at=by.started_at,
        updated_at=by.started_at,
    )


def status_command(*args: str, beat: bool = True) -> tuple[int, str]:
    """The command's exit code and output; with ``beat``, beat and a relay seen just now
    (as they are every 20 s and 10 s where they run), so that what is judged is the
    rest."""
    if beat:
        processes_seen()
    out = io.StringIO()
    try:
        call_command("webhook_status", *args, stdout=out, no_color=True)
    except SystemExit as exit:
        return exit.code, out.getvalue()
    return 0, out.getvalue()


def processes_seen() -> None:
    """Beat and a relay seen just now, as they are where they run."""
    record_heartbeat()
    record_relay_heartbeat("relay test-host 1")


@pytest.fixture
def beat_seen(db) -> None:
    """Beat and a relay seen just now, as they are every 20 s and 10 s where they run:
    the status judges the rest (a test of their own absence leaves this out)."""
    processes_seen()
