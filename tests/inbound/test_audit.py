"""Audit retention: the purge service, its Celery task and its beat schedule."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import crontab
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.settings import WEBHOOK_RECEIVER
from tests.support.signing import reserved, standard_headers
from webhook_receiver.inbound.audit import AuditDraft, purge_audit_records
from webhook_receiver.inbound.receive import webhook_receive
from webhook_receiver.models import RequestAudit, WebhookReceipt
from webhook_receiver.tasks import purge_audit_records_task

pytestmark = pytest.mark.django_db

TASK_NAME = "webhook_receiver.purge_audit_records"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def audit_at(received_at: datetime, *, result: str = "applied") -> RequestAudit:
    """An audit record written the way the receive path writes it."""
    draft = AuditDraft(source="shop", received_at=received_at, remote_addr="192.0.2.1")
    draft.set_body(b'{"type":"x"}')
    draft.record(result=result, response_status=200)
    return RequestAudit.objects.latest("id")


def remaining() -> set[int]:
    return set(RequestAudit.objects.values_list("id", flat=True))


def deletes(queries) -> int:
    return sum(q["sql"].lstrip().upper().startswith("DELETE") for q in queries.captured_queries)


def test_records_older_than_the_retention_are_deleted_and_newer_ones_stay():
    # given: the default retention of 30 days
    old = [
        audit_at(NOW - timedelta(days=365)),
        audit_at(NOW - timedelta(days=31)),
        audit_at(NOW - timedelta(days=30, seconds=1)),
    ]
    kept = [
        audit_at(NOW - timedelta(days=30)),  # exactly at the cutoff: not older, kept
        audit_at(NOW - timedelta(days=29, hours=23)),
        audit_at(NOW - timedelta(days=1)),
        audit_at(NOW),
    ]

    # when
    deleted = purge_audit_records(now=NOW)

    # then
    assert deleted == len(old)
    assert remaining() == {a.id for a in kept}


def test_purge_uses_the_current_time_by_default():
    now = timezone.now()
    audit_at(now - timedelta(days=45))
    recent = audit_at(now - timedelta(days=2))

    assert purge_audit_records() == 1
    assert remaining() == {recent.id}


def test_nothing_to_purge_returns_zero():
    kept = audit_at(NOW - timedelta(days=1))

    assert purge_audit_records(now=NOW) == 0
    assert remaining() == {kept.id}


def test_retention_days_come_from_settings():
    # given
    eight_days = audit_at(NOW - timedelta(days=8))
    six_days = audit_at(NOW - timedelta(days=6))

    # when
    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "AUDIT_RETENTION_DAYS": 7}):
        deleted = purge_audit_records(now=NOW)

    # then
    assert deleted == 1
    assert remaining() == {six_days.id}
    assert eight_days.id not in remaining()


def test_purge_deletes_in_batches_of_the_configured_size():
    # given: 5 expired records, batches of 2
    for days in range(31, 36):
        audit_at(NOW - timedelta(days=days))
    kept = audit_at(NOW - timedelta(days=1))

    # when
    with (
        override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "PURGE_BATCH_SIZE": 2}),
        CaptureQueriesContext(connection) as queries,
    ):
        deleted = purge_audit_records(now=NOW)

    # then: all 5 deleted, by 3 DELETE statements (2 + 2 + 1)
    assert deleted == 5
    assert remaining() == {kept.id}
    assert deletes(queries) == 3


def test_max_batches_bounds_one_run_and_the_next_run_continues():
    # given
    expired = [audit_at(NOW - timedelta(days=40 + i)) for i in range(5)]
    kept = audit_at(NOW)

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "PURGE_BATCH_SIZE": 2}):
        # when: one batch only
        first = purge_audit_records(now=NOW, max_batches=1)
        # then: the oldest ids go first, the rest wait
        assert first == 2
        assert remaining() == {a.id for a in expired[2:]} | {kept.id}

        # when: the next runs
        second = purge_audit_records(now=NOW, max_batches=1)
        third = purge_audit_records(now=NOW)

    # then
    assert (second, third) == (2, 1)
    assert remaining() == {kept.id}


def test_purge_leaves_receipts_alone():
    # given: a delivery, and its audit record and receipt both long past the retention
    body = reserved("ord_old", ("SKU-1", 1))
    webhook_receive(
        source_slug="shop",
        stream=io.BytesIO(body),
        content_length=len(body),
        headers=standard_headers(body, msg_id="msg_old"),
    )
    RequestAudit.objects.update(received_at=NOW - timedelta(days=90))
    WebhookReceipt.objects.update(received_at=NOW - timedelta(days=90))

    # when
    deleted = purge_audit_records(now=NOW)

    # then: the audit record went; the receipt, which guards idempotency, stays
    assert deleted == 1
    assert not RequestAudit.objects.exists()
    assert WebhookReceipt.objects.filter(event_key="msg_old").exists()


# --- the Celery task ---------------------------------------------------------------------


def test_task_called_directly_returns_the_count():
    now = timezone.now()
    for days in (31, 32, 33):
        audit_at(now - timedelta(days=days))
    kept = audit_at(now)

    assert purge_audit_records_task() == 3
    assert remaining() == {kept.id}


def test_task_applied_eagerly_returns_the_count():
    now = timezone.now()
    audit_at(now - timedelta(days=60))
    audit_at(now - timedelta(days=61))

    with override_settings(WEBHOOK_RECEIVER={**WEBHOOK_RECEIVER, "PURGE_BATCH_SIZE": 1}):
        result = purge_audit_records_task.apply()

    assert result.successful()
    assert result.get() == 2
    assert not RequestAudit.objects.exists()


def test_task_has_its_stable_name():
    assert purge_audit_records_task.name == TASK_NAME


def test_beat_schedule_names_the_task():
    from project import settings as project_settings

    entries = [
        entry
        for entry in project_settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"] == TASK_NAME
    ]

    assert len(entries) == 1
    schedule = entries[0]["schedule"]
    assert isinstance(schedule, crontab)
    assert schedule.hour == set(range(24))  # hourly, as docs/operations.md says


def test_the_scheduled_task_is_registered_in_the_celery_app():
    # given: the project's Celery app, with its default modules imported
    from project.celery import app

    app.loader.import_default_modules()

    # then: every task the beat schedule names is registered
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks
    assert TASK_NAME in app.tasks


def test_a_fresh_worker_process_discovers_the_task_by_itself():
    # This process has imported webhook_receiver.tasks already; a fresh interpreter shows
    # that the app's autodiscovery, not this test module, registers the task.
    script = (
        "from project.celery import app; "
        "app.loader.import_default_modules(); "
        f"print({TASK_NAME!r} in app.tasks)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
