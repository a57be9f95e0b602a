"""A source's settings: ``WEBHOOK_RECEIVER["SOURCES"][slug]``, read and checked into a
``SourceConfig`` (its scheme and secrets, its limits, its reconciliation, when silence
is expected of it). Every key has a documented default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

from ..schemes import get_scheme

SOURCE_DEFAULTS: dict[str, Any] = {
    # a name in schemes.SCHEMES (standard, stripe, github), or the dotted path of a
    # schemes.Scheme subclass
    "SCHEME": "standard",
    "SECRETS": [],
    "TOLERANCE_SECONDS": 300,
    "MAX_BODY_BYTES": 1024 * 1024,
    # None: the scheme's default key (its message id; Stripe: the body's id); else the
    # dotted path of fn(*, payload, message) -> str, called with the parsed body and
    # the VerifiedMessage
    "EVENT_KEY": None,
    # reconciliation against the sender's record of truth; None: off for this source
    "RECONCILE": None,
    # no accepted event for this long opens a silence alert; None or 0: never
    "SILENCE_AFTER_SECONDS": 1200,
    # when silence is unexpected: {"DAYS": "mon-fri", "START": "08:00", "END": "20:00",
    # "TIME_ZONE": "Europe/Berlin"}; None: always. Outside them no alert opens.
    "ACTIVE_HOURS": None,
}


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


RECONCILE_DEFAULTS: dict[str, Any] = {
    # "http", "file", or the dotted path of an adapter (webhook_receiver.reconcile.adapters)
    "ADAPTER": "http",
    "OPTIONS": {},
    # a run covers [now - LOOKBACK, now - GRACE): events still in flight are left out
    "LOOKBACK_SECONDS": 7200,
    "GRACE_SECONDS": 600,
    # the sender's side is read this much wider on both ends, so that an event at the
    # window's edge is never reported as unexpected
    "MARGIN_SECONDS": 300,
}


@dataclass(frozen=True)
class ReconcileConfig:
    adapter: str
    options: Mapping[str, Any]
    lookback: timedelta
    grace: timedelta
    margin: timedelta

    def __repr__(self) -> str:  # options hold credentials: never in tracebacks or logs
        return f"ReconcileConfig(adapter={self.adapter!r}, options=<{len(self.options)} hidden>)"


@dataclass(frozen=True)
class ActiveHours:
    """The hours in which a source is expected to send: days of the week (Monday is 0)
    and a daily span in a time zone. A span whose end is before its start runs past
    midnight (22:00-06:00)."""

    days: frozenset[int]
    start: time
    end: time
    tz: ZoneInfo

    def contains(self, moment: datetime) -> bool:
        local = moment.astimezone(self.tz)
        clock = local.time().replace(tzinfo=None)
        if self.start <= self.end:
            return local.weekday() in self.days and self.start <= clock < self.end
        # past midnight: the span belongs to the day it started on
        if clock >= self.start:
            return local.weekday() in self.days
        return clock < self.end and (local.weekday() - 1) % 7 in self.days

    def __str__(self) -> str:
        days = ",".join(WEEKDAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.tz.key}"


@dataclass(frozen=True)
class SourceConfig:
    slug: str
    scheme: str
    secrets: tuple[str, ...]
    tolerance_seconds: int
    max_body_bytes: int
    event_key: str | None
    reconcile: ReconcileConfig | None = None
    silence_after: timedelta | None = timedelta(seconds=1200)
    active_hours: ActiveHours | None = None

    def __repr__(self) -> str:  # never show secrets in tracebacks or logs
        return (
            f"SourceConfig(slug={self.slug!r}, scheme={self.scheme!r}, "
            f"secrets=<{len(self.secrets)} hidden>)"
        )


def _secrets(slug: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    secrets = tuple(s.strip() for s in value if s and s.strip())
    if not secrets:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}]['SECRETS'] is empty: "
            "set at least one signing secret (several allow rotation)."
        )
    return secrets


def source_config(slug: str, options: Mapping[str, Any]) -> SourceConfig:
    unknown = set(options) - set(SOURCE_DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}] has unknown keys: {sorted(unknown)}"
        )
    merged = {**SOURCE_DEFAULTS, **options}
    try:
        get_scheme(merged["SCHEME"])
    except LookupError as exc:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}]['SCHEME']: {exc}."
        ) from exc
    return SourceConfig(
        slug=slug,
        scheme=merged["SCHEME"],
        secrets=_secrets(slug, merged["SECRETS"]),
        tolerance_seconds=int(merged["TOLERANCE_SECONDS"]),
        max_body_bytes=int(merged["MAX_BODY_BYTES"]),
        event_key=merged["EVENT_KEY"],
        reconcile=_reconcile(slug, merged["RECONCILE"]),
        silence_after=_silence_after(slug, merged["SILENCE_AFTER_SECONDS"]),
        active_hours=_active_hours(slug, merged["ACTIVE_HOURS"]),
    )


def _silence_after(slug: str, value: Any) -> timedelta | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}]['SILENCE_AFTER_SECONDS'] must be whole "
            f"seconds (None or 0: no silence alerts), not {value!r}."
        )
    return timedelta(seconds=value)


def _active_hours(slug: str, options: Mapping[str, Any] | None) -> ActiveHours | None:
    if not options:
        return None
    where = f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}]['ACTIVE_HOURS']"
    unknown = set(options) - {"DAYS", "START", "END", "TIME_ZONE"}
    if unknown:
        raise ImproperlyConfigured(f"{where} has unknown keys: {sorted(unknown)}")
    try:
        days = _weekdays(options.get("DAYS", "mon-sun"))
        start = time.fromisoformat(options.get("START", "00:00"))
        end = time.fromisoformat(options.get("END", "00:00"))
        tz = ZoneInfo(options.get("TIME_ZONE", "UTC"))
    except (ValueError, TypeError, KeyError, ZoneInfoNotFoundError) as exc:
        raise ImproperlyConfigured(
            f"{where}: DAYS like 'mon-fri' or 'mon,wed,sat', START and END like '08:00', "
            f"TIME_ZONE a name like 'Europe/Berlin' ({exc})."
        ) from exc
    return ActiveHours(days=days, start=start, end=end, tz=tz)


def _weekdays(value: str) -> frozenset[int]:
    """'mon-fri' or 'mon,wed,sat' (or a list of such names) as weekday numbers."""
    parts = value.split(",") if isinstance(value, str) else list(value)
    days: set[int] = set()
    for part in (p.strip().lower() for p in parts):
        first, _, last = part.partition("-")
        a, b = WEEKDAYS.index(first[:3]), WEEKDAYS.index((last or first)[:3])
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(days)


def _reconcile(slug: str, options: Mapping[str, Any] | None) -> ReconcileConfig | None:
    if not options:
        return None
    unknown = set(options) - set(RECONCILE_DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}]['RECONCILE'] has unknown keys: "
            f"{sorted(unknown)}"
        )
    merged = {**RECONCILE_DEFAULTS, **options}
    seconds = {key: merged[key] for key in ("LOOKBACK_SECONDS", "GRACE_SECONDS", "MARGIN_SECONDS")}
    if any(not isinstance(v, int) or v < 0 for v in seconds.values()) or (
        seconds["GRACE_SECONDS"] >= seconds["LOOKBACK_SECONDS"]
    ):
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['SOURCES'][{slug!r}]['RECONCILE']: LOOKBACK_SECONDS, "
            "GRACE_SECONDS and MARGIN_SECONDS are whole seconds, and GRACE_SECONDS is shorter "
            "than LOOKBACK_SECONDS."
        )
    return ReconcileConfig(
        adapter=merged["ADAPTER"],
        options=dict(merged["OPTIONS"]),
        lookback=timedelta(seconds=seconds["LOOKBACK_SECONDS"]),
        grace=timedelta(seconds=seconds["GRACE_SECONDS"]),
        margin=timedelta(seconds=seconds["MARGIN_SECONDS"]),
    )
