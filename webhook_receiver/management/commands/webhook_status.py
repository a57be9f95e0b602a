"""Is anything wrong? Per source (and per outbox destination, when there are any), what
the admin's overview shows, for a terminal or a monitoring check.

Exit codes, as monitoring plugins (Nagios, Icinga, Sensu) read them: 0 everything is
ok, 1 something needs attention, 2 an alert is open (Celery's broker not answering and
beat not seen are alerts too), 3 a part of the status could not be read (a lock, a
database error, no answer within STATUS_TIMEOUT_SECONDS) and nothing read is an alert.
Each part is read on its own bound (watch/readings.py): what could be read is shown,
what could not is named.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from ...core.states import Reason, State
from ...presentation import display
from ...presentation.display import duration_text
from ...watch.status import Status, status_read
from ...watch.statuses import AUDIT, FAILED, RECEIPTS, RUNS, DestinationStatus, SourceStatus

# a figure that could not be read
UNREAD = "?"
COLUMNS = (
    "SOURCE",
    "STATE",
    "LAST ACCEPTED",
    "LAST HOUR ok/refused",
    "RETRYING",
    "DEAD",
    "OLDEST RETRY",
    "SILENCE ALERT",
    "RECONCILIATION",
)
DESTINATION_COLUMNS = (
    "DESTINATION",
    "STATE",
    "BACKLOG",
    "OLDEST DUE",
    "FAILED",
    "BREAKER",
    "LAST SUCCESS",
)
MAX_REASON_CHARS = 160


class Command(BaseCommand):
    help = (
        "Show each webhook source's state: the last accepted event, requests in the last "
        "hour, retrying and dead events, an open silence alert, the last reconciliation, "
        "and why a source is not ok; then each outbox destination's backlog, failed "
        "messages and breaker; Celery's broker and beat's heartbeat before them. Each part "
        "is read within STATUS_TIMEOUT_SECONDS; what is not is named. Exits 0 when all "
        "are ok, 1 when something needs attention, 2 when an alert is open (the broker "
        "unreachable, beat not seen), 3 when a part could not be read."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="print one JSON object (its shape is in docs/watching.md) instead of a table",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        status = status_read(now=timezone.now())
        verdict = status.verdict
        code = verdict.exit_code
        if options["json"]:
            self.stdout.write(json.dumps(status.as_dict(), indent=2))
        else:
            self._report(status)
            if status.destinations:
                self._destinations(status.destinations)
        if status.unread:
            self.stderr.write(
                "webhook_status: not read: " + "; ".join(u.text for u in status.unread)
            )
        if code:
            raise SystemExit(code)

    # --- the table ----------------------------------------------------------------------

    def _report(self, status: Status) -> None:
        verdict = status.verdict
        self.stdout.write(f"Webhooks at {timezone.localtime(status.now):%Y-%m-%d %H:%M:%S %Z}")
        state = verdict.state if verdict.complete else max(verdict.state, State.ATTENTION)
        self.stdout.write(
            self._styled(state, f"{verdict.label.upper()}: {display.visible(verdict.text)}")
        )
        for reason in status.system:
            self.stdout.write(
                f"  {self._styled(reason.state, reason.state.name.ljust(9))}  "
                f"{_shorten(reason.text)}"
            )
        self.stdout.write("")
        self._table(COLUMNS, [(s.state, _row(s)) for s in status.sources])
        self._reasons([(s.source, s.state, s.reasons) for s in status.sources])

    def _destinations(self, destinations: Sequence[DestinationStatus]) -> None:
        self.stdout.write("")
        self._table(DESTINATION_COLUMNS, [(d.state, _destination_row(d)) for d in destinations])
        self._reasons([(d.name, d.state, d.reasons) for d in destinations])

    def _table(self, columns: Sequence[str], rows: Sequence[tuple[State, Sequence[str]]]) -> None:
        """The columns, then a row each, its second cell (the state) coloured. A name may
        be a peer's (a source seen in the records): shown through display.visible."""
        rows = [(state, [display.visible(v) for v in row]) for state, row in rows]
        widths = [
            max(len(r[i]) for r in (columns, *(r for _, r in rows))) for i in range(len(columns))
        ]
        self.stdout.write(_line(columns, widths))
        self.stdout.write("  ".join("-" * w for w in widths))
        for state, row in rows:
            # pad first, colour after: escape codes would count as width
            cells = [v.ljust(w) for v, w in zip(row, widths, strict=True)]
            cells[1] = self._styled(state, cells[1])
            self.stdout.write("  ".join(cells).rstrip())

    def _reasons(self, named: Sequence[tuple[str, State, Sequence[Reason]]]) -> None:
        """Why each one that is not ok is not, a line a reason."""
        for name, state, reasons in named:
            if not reasons:
                continue
            self.stdout.write("")
            self.stdout.write(self._styled(state, f"{display.visible(name)}: {state.name}"))
            for reason in reasons:
                text = _shorten(reason.text)
                self.stdout.write(
                    f"  {self._styled(reason.state, reason.state.name.ljust(9))}  {text}"
                )

    def _styled(self, state: State, text: str) -> str:
        style = {
            State.OK: self.style.SUCCESS,
            State.ATTENTION: self.style.WARNING,
            State.ALERT: self.style.ERROR,
        }[state]
        return style(text)


def _row(s: SourceStatus) -> tuple[str, ...]:
    age = s.last_accepted_age
    alert = s.silence_alert
    row = (
        s.source if s.configured else f"{s.source} (not configured)",
        s.state.name,
        "never" if age is None else f"{duration_text(age)} ago",
        f"{s.accepted_total} / {s.rejected_total}",
        str(s.retrying),
        str(s.dead),
        "-" if s.oldest_retry_age is None else duration_text(s.oldest_retry_age),
        "-" if alert is None else f"open {duration_text(s.now - alert.opened_at)}",
        _reconciliation(s),
    )
    # the cells of each unread part: "?", not an empty figure that reads as "none"
    cells = {RECEIPTS: (2,), AUDIT: (3,), FAILED: (4, 5, 6), RUNS: (8,)}
    blank = {i for part in s.unread for i in cells.get(part, ())}
    return tuple(UNREAD if i in blank else cell for i, cell in enumerate(row))


def _destination_row(d: DestinationStatus) -> tuple[str, ...]:
    age = d.oldest_eligible_age
    breaker = d.breaker.state
    if d.breaker.until is not None:
        breaker += f" {duration_text(d.breaker.until - d.now)}"
    success = d.last_success_at
    return (
        d.name
        if d.enabled
        else f"{d.name} (disabled by the relay)"
        if d.disabled_by_relay
        else f"{d.name} (disabled)",
        d.state.name,
        str(d.backlog),
        "-" if age is None else duration_text(age),
        str(d.failed),
        breaker,
        "never" if success is None else f"{duration_text(d.now - success)} ago",
    )


def _reconciliation(s: SourceStatus) -> str:
    if s.last_run is None:
        text = "-"
    else:
        text = f"{s.last_run.outcome} {duration_text(s.now - s.last_run.started_at)} ago"
    if s.open_repair_total:
        text += f", {s.open_repair_total} open"
    return text


def _line(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()


def _shorten(text: str) -> str:
    """One line, its invisible characters (a sender's error text may hold them) shown as
    escapes, shortened."""
    text = display.visible(" ".join(text.split()))
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"
