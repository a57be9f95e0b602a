"""Replay failed events from the command line, under their original keys."""

from __future__ import annotations

import getpass
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from ...inbound.failures import failed_event_replay, failed_event_summary
from ...inbound.models import FailedEvent, FailureStatus, Result
from ...presentation import display

STATUSES = (FailureStatus.DEAD, FailureStatus.RETRYING, FailureStatus.DISCARDED)
COLUMNS = ("id", "source", "event_key", "event_type", "result", "detail")
MAX_DETAIL_CHARS = 120


class Command(BaseCommand):
    help = (
        "Replay failed webhook events now: dead ones by default, oldest id first. Each goes "
        "through the claim under its original key, so an already applied key resolves as "
        "a duplicate. Prints a table; exits non-zero when any replay failed."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--source",
            action="append",
            dest="sources",
            metavar="SLUG",
            help="source slug (repeatable)",
        )
        parser.add_argument(
            "--type",
            action="append",
            dest="event_types",
            metavar="TYPE",
            help="event type (repeatable)",
        )
        parser.add_argument(
            "--since",
            metavar="WHEN",
            help="only events first attempted at or after this ISO date or datetime "
            "(a date means the midnight that starts it; a datetime without a UTC offset is "
            "read in the project's TIME_ZONE)",
        )
        parser.add_argument(
            "--id",
            action="append",
            dest="ids",
            type=int,
            metavar="ID",
            help="failed event id (repeatable); with ids and no --status, any status",
        )
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            metavar="STATUS",
            choices=[str(s) for s in STATUSES],
            help="dead, retrying or discarded (repeatable); default: dead",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would be replayed, change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        since = _parse_since(options["since"])
        ids = [int(i) for i in options["ids"] or ()]
        statuses = options["statuses"]
        if statuses:
            unknown = set(statuses) - set(STATUSES)
            if unknown:
                raise CommandError(
                    f"Unknown --status {', '.join(sorted(unknown))}; "
                    f"choose from {', '.join(STATUSES)}."
                )
        elif not ids:
            statuses = [FailureStatus.DEAD]

        selected = FailedEvent.objects.order_by("id").only(
            "id", "source", "event_key", "event_type", "status", "attempts", "last_error_class"
        )
        if statuses:
            selected = selected.filter(status__in=statuses)
        if options["sources"]:
            selected = selected.filter(source__in=options["sources"])
        if options["event_types"]:
            selected = selected.filter(event_type__in=options["event_types"])
        if since is not None:
            selected = selected.filter(first_attempt_at__gte=since)
        if ids:
            selected = selected.filter(id__in=ids)
        events = list(selected)

        missing = sorted(set(ids) - {e.pk for e in events})
        if missing:
            self.stderr.write(
                "Not selected (no such id, or left out by the other options): "
                + ", ".join(map(str, missing))
            )
        if not events:
            self.stdout.write("No failed events match; nothing to replay.")
            return

        if options["dry_run"]:
            rows = [_dry_run_row(failed) for failed in events]
            self._table(rows)
            self.stdout.write(f"Dry run: {len(rows)} would be replayed; nothing was changed.")
            return

        actor = _actor()
        rows = []
        for failed in events:
            result = failed_event_replay(failed_id=failed.pk, actor=actor)
            rows.append(
                (
                    str(failed.pk),
                    failed.source,
                    failed.event_key,
                    failed.event_type,
                    result.result,
                    result.detail,
                )
            )
        self._table(rows)
        counts = Counter(row[4] for row in rows)
        summary = ", ".join(f"{counts[name]} {name}" for name in sorted(counts, key=_order))
        if counts[Result.FAILED]:
            self.stdout.write(self.style.ERROR(f"Replayed {len(rows)}: {summary}."))
            raise CommandError(f"{counts[Result.FAILED]} of {len(rows)} replays failed.")
        self.stdout.write(self.style.SUCCESS(f"Replayed {len(rows)}: {summary}."))

    def _table(self, rows: Sequence[Sequence[str]]) -> None:
        # one line per row whatever an error message holds; only the detail is shortened
        cells = [COLUMNS, *([*map(_one_line, row[:-1]), _shorten(row[-1])] for row in rows)]
        widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
        for n, row in enumerate(cells):
            line = "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True))
            self.stdout.write(line.rstrip())
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))


def _order(result: str) -> tuple[int, str]:
    members: list[str] = list(Result)
    return (members.index(result) if result in members else len(members), result)


def _dry_run_row(failed: FailedEvent) -> tuple[str, ...]:
    summary = failed_event_summary(failed)
    attempts = summary["attempts"]
    detail = f"{summary['status']}, {attempts} attempt{'' if attempts == 1 else 's'}"
    if summary["last_error"]:
        detail += f", last error {summary['last_error']}"
    return (
        str(summary["id"]),
        summary["source"],
        summary["event_key"],
        summary["event_type"],
        "would replay",
        detail,
    )


def _one_line(value: str) -> str:
    """A stored value on one line, its invisible characters shown as escapes."""
    return display.visible(" ".join(str(value).split()))


def _shorten(value: str) -> str:
    text = _one_line(value)
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


def _parse_since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parse_datetime(value)
        if parsed is None:
            day = parse_date(value)
            if day is not None:
                parsed = datetime.combine(day, time.min)
    except ValueError:  # well formed but impossible, e.g. 2024-02-30
        parsed = None
    if parsed is None:
        raise CommandError(
            f"--since {value!r} is not an ISO date or datetime (e.g. 2024-05-01 or "
            "2024-05-01T12:00:00+00:00)."
        )
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed)
    return parsed


def _actor() -> str:
    """Who replayed, as recorded on the event: the OS user running the command."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no login name in some containers
        return "cli"
