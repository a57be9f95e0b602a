"""Reconcile a source against its sender's record of truth, now, and print the repair list."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import ngettext

from ...conf import get_source
from ...reconcile.models import RepairItem, RepairStatus, RunOutcome
from ...reconcile.run import RunInProgress, reconciliation_run, sources_to_reconcile

COLUMNS = ("kind", "event_key", "subject", "event_type", "sender_says", "we_hold")
# exit statuses
NOTHING_TO_REPAIR, REPAIR_ITEMS_OPEN, RUN_FAILED = 0, 1, 2


class Command(BaseCommand):
    help = (
        "Compare a source's events, as its sender lists them, with what was received, over "
        "[now - LOOKBACK, now - GRACE) or the window given, and print the open repair items. "
        "Changes no business state. Exit status: 0 nothing to repair, 1 repair items open, "
        "2 the run failed (sender unreachable, bad credentials, another run under way)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--source", required=True, metavar="SLUG")
        parser.add_argument("--since", metavar="WHEN", help="window start, ISO 8601 with zone")
        parser.add_argument("--until", metavar="WHEN", help="window end, ISO 8601 with zone")
        parser.add_argument("--format", choices=("table", "json"), default="table")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["source"]
        source = get_source(slug)
        if source is None:
            raise CommandError(f"No source {slug!r} in WEBHOOK_RECEIVER['SOURCES'].")
        if slug not in sources_to_reconcile():
            raise CommandError(
                f"Source {slug!r} has no RECONCILE block in WEBHOOK_RECEIVER['SOURCES'][{slug!r}]."
            )
        since, until = _moment(options["since"], "--since"), _moment(options["until"], "--until")
        try:
            run = reconciliation_run(source_slug=slug, since=since, until=until)
        except RunInProgress as exc:
            raise CommandError(str(exc), returncode=RUN_FAILED) from exc
        except DatabaseError as exc:  # the run could not even be recorded
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise CommandError(
                f"The run failed: {type(exc).__name__}: {first}", returncode=RUN_FAILED
            ) from exc
        found = list(
            RepairItem.objects.filter(source=slug, last_run=run, status=RepairStatus.OPEN).order_by(
                "kind", "event_key"
            )
        )
        if options["format"] == "json":
            self.stdout.write(json.dumps(_report(run, found), indent=2, default=str))
        else:
            self._table(run, found)
        if run.outcome == RunOutcome.FAILED:
            raise CommandError(f"The run failed: {run.error}", returncode=RUN_FAILED)
        if found:
            raise CommandError(
                ngettext("%d repair item open.", "%d repair items open.", len(found)) % len(found),
                returncode=REPAIR_ITEMS_OPEN,
            )

    def _table(self, run: Any, found: list[RepairItem]) -> None:
        self.stdout.write(
            f"Run {run.pk} of {run.source}, {run.window_start:%Y-%m-%d %H:%M:%S}–"
            f"{run.window_end:%Y-%m-%d %H:%M:%S} UTC: {run.outcome}, "
            f"{run.sender_records} sender events"
        )
        if run.outcome == RunOutcome.FAILED:
            self.stdout.write(f"The run failed: {run.error}")
            return
        if not found:
            resolved = run.counts.get("resolved", 0)
            self.stdout.write(f"Nothing to repair ({resolved} earlier items now consistent).")
            return
        rows = [COLUMNS] + [
            (
                i.kind,
                i.event_key,
                i.subject,
                i.event_type,
                json.dumps(i.sender_says.get("data", i.sender_says))[:60],
                json.dumps(i.we_hold)[:60],
            )
            for i in found
        ]
        widths = [max(len(str(row[c])) for row in rows) for c in range(len(COLUMNS))]
        for number, row in enumerate(rows):
            cells = (str(value).ljust(width) for value, width in zip(row, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())
            if number == 0:
                self.stdout.write("  ".join("-" * w for w in widths))


def _report(run: Any, found: list[RepairItem]) -> dict[str, Any]:
    return {
        "run": run.pk,
        "source": run.source,
        "window": [run.window_start.isoformat(), run.window_end.isoformat()],
        "outcome": run.outcome,
        "error": run.error,
        "sender_events": run.sender_records,
        "counts": run.counts,
        "items": [
            {name: getattr(item, name) for name in COLUMNS} | {"id": item.pk} for item in found
        ],
    }


def _moment(value: str | None, option: str) -> Any:
    if not value:
        return None
    parsed = parse_datetime(value)
    if parsed is None or timezone.is_naive(parsed):
        raise CommandError(f"{option} {value!r} is not an ISO 8601 datetime with a time zone.")
    return parsed
