"""Celery tasks: thin, idempotent wrappers around services."""

from __future__ import annotations

from celery import shared_task

from .services.audit import audit_purge


@shared_task(name="webhook_receiver.purge_audit_records", acks_late=True, ignore_result=True)
def purge_audit_records() -> int:
    """Delete audit records past ``AUDIT_RETENTION_DAYS``; schedule it with beat."""
    return audit_purge()
