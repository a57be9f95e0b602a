"""Redact the signature headers of receipts and failed events stored before the
redaction: manage.py webhook_redact_headers [--batch-size N] [--dry-run]."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...inbound.redaction import DEFAULT_BATCH_SIZE, stored_headers_redact


class Command(BaseCommand):
    help = (
        "Rewrite the stored headers of every receipt and failed event by today's rule: "
        "each scheme's signature headers redacted, REDACTED_HEADERS left out. In batches, "
        "each its own short transaction; safe to stop and to run again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"rows read and rewritten per transaction (default {DEFAULT_BATCH_SIZE})",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count the rows it would rewrite, only"
        )

    def handle(self, *args: Any, batch_size: int, dry_run: bool, **options: Any) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        verb = "would redact" if dry_run else "redacted"
        for table in stored_headers_redact(batch_size=batch_size, dry_run=dry_run):
            self.stdout.write(f"{verb} {table.redacted} of {table.rows} {table.name}")
