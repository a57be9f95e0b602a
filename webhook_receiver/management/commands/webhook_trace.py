"""Print the whole story of one event key: manage.py webhook_trace KEY [--source SLUG].

Every value a peer sent is printed through display.visible: a control character or a
bidirectional override in a stored value is printed as its escape, never sent to the
terminal (where it could move the cursor or reorder the line)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ...conf import app_settings
from ...presentation import display
from ...watch.trace import (
    EffectSection,
    EventTrace,
    OutboxSection,
    event_key_sources,
    event_trace,
)

MAX_CELL_CHARS = 100


class Command(BaseCommand):
    help = (
        "Trace one event key from raw request to committed side effect: every delivery, the "
        "receipt, the host's effects, the failed-event attempts, repair items. Without "
        "--source, every source that holds the key. Exits 1 when nothing holds it."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("key", help="the event key (as in the admin and the logs)")
        parser.add_argument("--source", metavar="SLUG", help="only this source")

    def handle(self, *args: Any, **options: Any) -> None:
        key = options["key"]
        sources = [options["source"]] if options["source"] else event_key_sources(event_key=key)
        traces = [event_trace(source=source, event_key=key) for source in sources]
        found = [trace for trace in traces if trace.found]
        if not found:
            where = f"source {options['source']!r}" if options["source"] else "any source"
            message = f"Nothing in {where} holds the event key {display.visible(key)!r}."
            elsewhere = event_key_sources(event_key=key) if options["source"] else []
            if elsewhere:
                message += f" Sources that do: {', '.join(elsewhere)}."
            raise CommandError(message)
        now = timezone.now()
        for n, trace in enumerate(found):
            if n:
                self.stdout.write("")
            self._trace(trace, now)

    def _trace(self, trace: EventTrace, now: datetime) -> None:
        title = f"{trace.source} · {trace.event_key}"
        if trace.event_type:
            title += f" · {trace.event_type}"
        self.stdout.write(self.style.MIGRATE_HEADING(display.visible(title)))
        self.stdout.write(display.visible(trace.summary))

        self._heading("Deliveries (oldest first)")
        self._table(
            ("received (UTC)", "age", "verification", "result", "http", "remote", "body"),
            [
                (
                    _when(d.received_at),
                    _ago(d.received_at, now),
                    d.verification,
                    d.result or "-",
                    str(d.response_status),
                    d.remote_addr or "-",
                    f"{d.body_size if d.body_size is not None else '?'} B "
                    f"sha256 {d.body_sha256[:12] or '-'}",
                )
                for d in trace.deliveries
            ],
            empty="none (no audit record carries this key, or it was purged)",
        )

        self._heading("Receipt")
        receipt = trace.receipt
        if receipt is None:
            self.stdout.write("  none: this key's effect has not committed")
        else:
            self._facts(
                [
                    ("status", receipt.status),
                    (
                        "received",
                        f"{_when(receipt.received_at)} UTC ({_ago(receipt.received_at, now)})",
                    ),
                    ("event type", receipt.event_type or "-"),
                    ("subject", receipt.subject or "-"),
                    ("outcome", display.json_text(receipt.outcome, indent=None)),
                ]
            )

        self._heading("Effects")
        if trace.effects_error:
            self.stdout.write(self.style.ERROR(f"  {_cell(trace.effects_error, None)}"))
        elif not app_settings().trace_effects:
            self.stdout.write("  not shown: no WEBHOOK_RECEIVER['TRACE_EFFECTS'] hook")
        for section in trace.effects:
            self._section(section)

        self._heading("Failed event")
        failed = trace.failed
        if failed is None:
            self.stdout.write("  none: no attempt at this key failed")
        else:
            status = failed.status + (f" ({failed.resolution})" if failed.resolution else "")
            facts = [
                ("status", status),
                ("attempts", str(failed.attempts)),
                (
                    "first",
                    f"{_when(failed.first_attempt_at)} UTC ({_ago(failed.first_attempt_at, now)})",
                ),
                (
                    "last",
                    f"{_when(failed.last_attempt_at)} UTC ({_ago(failed.last_attempt_at, now)})",
                ),
            ]
            if failed.next_attempt_at:
                moment = failed.next_attempt_at
                facts.append(("next", f"{_when(moment)} UTC ({_ago(moment, now)})"))
            if failed.discarded_by:
                facts.append(("discarded", f"by {failed.discarded_by}: {failed.discard_reason}"))
            self._facts(facts)
            self.stdout.write("")
            self._table(
                ("#", "at (UTC)", "trigger", "kind", "exception", "message"),
                [
                    (
                        str(a.attempt if a.attempt is not None else "?"),
                        _when(a.at) if a.at else "-",
                        a.trigger,
                        a.kind,
                        a.exception,
                        a.message,
                    )
                    for a in failed.history
                ],
                empty="no attempts recorded",
                # an invalid payload's errors, a field a line, under its attempt
                notes=[[f"{path}: {words}" for path, words in a.fields] for a in failed.history],
            )

        self._heading("Repair items")
        self._table(
            ("kind", "status", "occurred (UTC)", "found (UTC)", "resolution"),
            [
                (
                    r.kind,
                    r.status,
                    _when(r.occurred_at),
                    _when(r.created_at),
                    f"by {r.resolved_by}: {r.resolution_note}" if r.resolved_by else "-",
                )
                for r in trace.repairs
            ],
            empty="none",
        )

        self._heading("Outbox")
        if not trace.outbox:
            self.stdout.write("  no outbox messages")
        for section in trace.outbox:
            self._section(section)

    def _heading(self, text: str) -> None:
        self.stdout.write("")
        self.stdout.write(self.style.HTTP_INFO(text))

    def _section(self, section: EffectSection) -> None:
        self.stdout.write(f"  {_cell(section.title, None)}")
        # an outbox message's metadata, whole, on a line under its row
        metadata = section.metadata if isinstance(section, OutboxSection) else ()
        notes = [f"metadata: {m}" if m else "" for m in metadata]
        self._table(section.columns, section.rows, empty="none", indent="    ", notes=notes)
        if section.note:
            self.stdout.write(f"    {_cell(section.note, None)}")

    def _facts(self, facts: Sequence[tuple[str, str]]) -> None:
        width = max(len(name) for name, _ in facts)
        for name, value in facts:
            self.stdout.write(f"  {name.ljust(width)}  {_cell(value)}")

    def _table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        empty: str,
        indent: str = "  ",
        notes: Sequence[str | Sequence[str]] = (),
    ) -> None:
        """``rows`` in aligned columns under ``columns``; a row's note (if any) on a line
        of its own under it, whole."""
        if not rows:
            self.stdout.write(f"{indent}{empty}")
            return
        cells = [list(columns), *([_cell(value) for value in row] for row in rows)]
        widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(columns))]
        for n, row in enumerate(cells):
            line = "  ".join(value.ljust(width) for value, width in zip(row, widths, strict=False))
            self.stdout.write(f"{indent}{line}".rstrip())
            if n == 0:
                self.stdout.write(indent + "  ".join("-" * width for width in widths))
            elif n <= len(notes) and notes[n - 1]:
                note = notes[n - 1]
                for text in [note] if isinstance(note, str) else note:  # a line each
                    self.stdout.write(f"{indent}  {_cell(text, None)}")


def _ago(moment: datetime, now: datetime) -> str:
    return display.ago_text(now - moment)


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _cell(value: Any, limit: int | None = MAX_CELL_CHARS) -> str:
    """One line per row whatever a stored value holds, its invisible characters shown as
    escapes; long values shortened to ``limit``."""
    text = display.visible(" ".join(str(value).split()))
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"
