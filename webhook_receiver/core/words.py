"""How the app words durations, counts and moments, the same on every page, command,
notice and machine-readable report. A counted noun goes through Django's ``ngettext``
where it is written, as the admin's do."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from django.utils import timezone


def duration_text(delta: timedelta) -> str:
    """A duration as a person reads it at a glance: "45 s", "20 min", "2 h 05 min",
    "3 d 4 h"."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def top_counts(counts: Mapping[str, int], shown: int = 3) -> str:
    """'invalid_signature: 10, timestamp_out_of_tolerance: 2', largest first."""
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{code}: {n}" for code, n in ordered[:shown])
    return text + (", …" if len(ordered) > shown else "")


def local_time(moment: datetime | None, empty: str = "never") -> str:
    """A moment to the second in the current time zone, named: "2026-12-02 14:05:09 UTC"."""
    if moment is None:
        return empty
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


def iso(moment: datetime | None) -> str | None:
    """A moment for a machine (ISO 8601), or None."""
    return None if moment is None else moment.isoformat()


def seconds(delta: timedelta | None) -> float | None:
    """A duration for a machine, in seconds to the millisecond, or None."""
    return None if delta is None else round(delta.total_seconds(), 3)
