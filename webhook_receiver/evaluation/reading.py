"""Typed reads of a scenario file's values: every error names the file and the place,
and says what to write instead."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h|d)")


class ScenarioError(ValueError):
    """A scenario file that cannot be run, and why (one line a person can act on)."""


class Reader:
    """Typed reads of a scenario's values; every error names the file and the place."""

    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, at: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{self.where}: {at + ': ' if at else ''}{problem}")

    def mapping(self, value: Any, at: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(at, f"expected a mapping of keys to values, got {_kind(value)}")
        return value

    def listing(self, value: Any, at: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(at, f"expected a list, got {_kind(value)}")
        return value

    def known(self, value: dict[str, Any], at: str, allowed: set[str]) -> None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.error(
                at,
                f"unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})",
            )

    def text(self, value: Any, at: str, *, empty: bool = False) -> str:
        if not isinstance(value, str) or (not value and not empty):
            raise self.error(at, f"expected text, got {_kind(value)}")
        return value

    def slug(self, value: Any, at: str) -> str:
        text = self.text(value, at)
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,60}", text):
            raise self.error(at, f"{text!r}: letters, digits, '-' and '_' only (at most 60)")
        return text

    def boolean(self, value: Any, at: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(at, f"expected true or false, got {_kind(value)}")
        return value

    def integer(self, value: Any, at: str, *, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(at, f"expected a whole number of at least {minimum}, got {value!r}")
        return value

    def share(self, value: Any, at: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise self.error(at, f"expected a share between 0 and 1, got {value!r}")
        return float(value)

    def duration(self, value: Any, at: str, *, positive: bool = False) -> float:
        seconds = _seconds(value)
        if seconds is None or (positive and seconds <= 0):
            raise self.error(
                at, f"{value!r} is not a duration: write seconds (90) or text (90s, 5m, 1h30m)"
            )
        return seconds

    def rate(self, value: Any, at: str) -> tuple[int, float]:
        count, _, per = str(value).partition("/")
        seconds = _seconds(f"1{per}" if per.isalpha() else per) if per else None
        if not count.strip().isdigit() or int(count) < 1 or not seconds or seconds <= 0:
            raise self.error(at, f"{value!r} is not a rate: write count/duration (5/s, 300/1m)")
        return int(count), seconds

    def moment(self, value: Any, at: str) -> datetime:
        try:
            moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise self.error(at, f"{value!r}: write an ISO 8601 time with its offset (…Z)")
        return moment.astimezone(UTC)


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or _DURATION.sub("", text).strip():
        return None
    seconds = sum(float(n) * _UNITS[unit] for n, unit in parts)
    return seconds if math.isfinite(seconds) else None


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:80]
