"""A destination's open messages at one moment, read as the harness reads them (not
through the relay's own query): what the relay could send now, and what is held back
behind a terminal message of its ordering key, waiting for an operator."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..outbound.models import OutboxMessage, WebhookDestination


class Backlog:
    """A destination's open messages at one moment, read as the harness reads them (not
    through the relay's own query): the ones the relay could send now (``eligible``:
    due, or leased past their lease, with no older open message of their ordering key),
    and the ones held back behind a terminal message of their ordering key, which wait
    for an operator rather than the relay."""

    def __init__(self, dest: WebhookDestination, moment: datetime) -> None:
        rows = (
            OutboxMessage.objects.filter(
                destination=dest, status__in=["pending", "sending", "failed"]
            )
            .order_by("id")
            .values_list(
                "key", "ordering_key", "status", "next_attempt_at", "lease_until", "created_at"
            )
        )
        self.open = 0
        self.eligible_age = 0.0
        # (held message's key, the terminal message's key, since when it holds it)
        self.held: list[tuple[str, str, datetime]] = []
        first_open: dict[str, tuple[str, str, datetime]] = {}  # ordering key -> its oldest
        for key, ordering_key, status, next_at, lease_until, created in rows:
            blocker = first_open.get(ordering_key) if ordering_key else None
            if ordering_key and blocker is None:
                first_open[ordering_key] = (key, status, next_at)
            if status == "failed":
                continue
            self.open += 1
            if blocker is not None:
                if blocker[1] == "failed":
                    # a failed message's next_attempt_at is when it failed
                    self.held.append((key, blocker[0], blocker[2]))
                continue
            # pending and due, or sending with a lease that ran out
            due_at = next_at if status == "pending" else lease_until
            due = due_at is not None and due_at <= moment
            if due and not self.eligible_age:
                self.eligible_age = (moment - created).total_seconds()
        self.held_age = max(
            ((moment - since).total_seconds() for *_, since in self.held), default=0.0
        )
        self.moment = moment

    def held_behind(self) -> list[dict[str, Any]]:
        """Per terminal message that holds others back: how many, and since when."""
        behind: dict[str, dict[str, Any]] = {}
        for _key, blocker, since in self.held:
            entry = behind.setdefault(blocker, {"behind": blocker, "held": 0, "held_for_s": 0.0})
            entry["held"] += 1
            entry["held_for_s"] = round((self.moment - since).total_seconds(), 6)
        return sorted(behind.values(), key=lambda e: (-e["held_for_s"], e["behind"]))
