"""A source's settings: ``WEBHOOK_RECEIVER["SOURCES"][slug]``, read and checked into a
``SourceConfig`` (its scheme and secrets, its limits, its reconciliation, when silence
is expected of it). Each key is declared once, below (conf/keys.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

from ..schemes import SCHEMES, get_scheme
from .keys import SETTING, Reader, key, key_name, read_keys, reader
from .readers import comma_separated, dotted_path, plain_dict, whole_seconds

# the key of WEBHOOK_RECEIVER that holds the sources (declared in conf/__init__.py)
SOURCES_KEY = "SOURCES"

# a source's keys no longer read: key -> what replaces it (a source naming one is refused)
REMOVED_SOURCE_KEYS: dict[str, str] = {}

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@reader("days of the week")
def _weekdays(value: Any, where: str) -> frozenset[int]:
    """'mon-fri' or 'mon,wed,sat' (or a list of such names) as weekday numbers."""
    days: set[int] = set()
    try:
        for part in (str(p).strip().lower() for p in comma_separated(value)):
            first, _, last = part.partition("-")
            a, b = WEEKDAYS.index(first[:3]), WEEKDAYS.index((last or first)[:3])
            days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    except (ValueError, TypeError):
        days = set()
    if not days:
        raise ImproperlyConfigured(
            f"{where} must be days like 'mon-fri' or 'mon,wed,sat', not {value!r}."
        )
    return frozenset(days)


@reader("a time of day, `HH:MM`")
def _clock(value: Any, where: str) -> time:
    try:
        return time.fromisoformat(value)
    except (ValueError, TypeError):
        raise ImproperlyConfigured(f"{where} must be a time like '08:00', not {value!r}.") from None


@reader("a time zone's name")
def _time_zone(value: Any, where: str) -> ZoneInfo:
    try:
        return ZoneInfo(value)
    except (ValueError, TypeError, ZoneInfoNotFoundError):
        raise ImproperlyConfigured(
            f"{where} must be a time zone's name like 'Europe/Berlin', not {value!r}."
        ) from None


@dataclass(frozen=True)
class ActiveHours:
    """The hours in which a source is expected to send: days of the week (Monday is 0)
    and a daily span in a time zone. A span whose end is before its start runs past
    midnight (22:00-06:00); one whose end is its start is the whole day (the default,
    00:00-00:00: only DAYS given means those days, all day)."""

    days: frozenset[int] = key(
        "DAYS",
        "mon-sun",
        _weekdays,
        "the days: a range (`mon-fri`), a list (`mon,wed,sat`), or both",
    )
    start: time = key("START", "00:00", _clock, "when the daily span starts")
    end: time = key(
        "END",
        "00:00",
        _clock,
        "when it ends; before `START`, the span runs past midnight (`22:00` to `06:00`); "
        "equal to it, the whole day",
    )
    tz: ZoneInfo = key("TIME_ZONE", "UTC", _time_zone, "the zone of `START` and `END`")

    def contains(self, moment: datetime) -> bool:
        local = moment.astimezone(self.tz)
        clock = local.time().replace(tzinfo=None)
        if self.start == self.end:  # the whole day
            return local.weekday() in self.days
        if self.start < self.end:
            return local.weekday() in self.days and self.start <= clock < self.end
        # past midnight: the span belongs to the day it started on
        if clock >= self.start:
            return local.weekday() in self.days
        return clock < self.end and (local.weekday() - 1) % 7 in self.days

    def __str__(self) -> str:
        days = ",".join(WEEKDAYS[d] for d in sorted(self.days))
        return f"{days} {self.start:%H:%M}-{self.end:%H:%M} {self.tz.key}"


@dataclass(frozen=True)
class ReconcileConfig:
    adapter: str = key(
        "ADAPTER",
        "http",
        Reader("`http`, `stripe`, `file`, or a dotted path", lambda value, where: value),
        "what lists the sender's events: a built-in adapter or the dotted path of your own "
        "(`webhook_receiver.reconcile.adapters`; imported by check `E004`); see "
        "[Reconciliation](watching.md#reconciliation)",
    )
    options: Mapping[str, Any] = key(
        "OPTIONS", {}, plain_dict, "the adapter's options (its URL, its credentials…)"
    )
    lookback: timedelta = key(
        "LOOKBACK_SECONDS",
        7200,
        whole_seconds,
        "a run covers the events of [now − `LOOKBACK_SECONDS`, now − `GRACE_SECONDS`)",
    )
    grace: timedelta = key(
        "GRACE_SECONDS",
        600,
        whole_seconds,
        "events younger than this are still in flight, and left out; shorter than "
        "`LOOKBACK_SECONDS`",
    )
    margin: timedelta = key(
        "MARGIN_SECONDS",
        300,
        whole_seconds,
        "the sender's side is read this much wider on both ends, so that an event at the "
        "window's edge is never reported as unexpected",
    )

    def __repr__(self) -> str:  # options hold credentials: never in tracebacks or logs
        return f"ReconcileConfig(adapter={self.adapter!r}, options=<{len(self.options)} hidden>)"


@reader(f"{', '.join(f'`{name}`' for name in SCHEMES)}, or a dotted path")
def _scheme(value: Any, where: str) -> str:
    try:
        get_scheme(value)
    except LookupError as exc:
        raise ImproperlyConfigured(f"{where}: {exc}.") from exc
    return str(value)


@reader("a list, or a comma-separated string")
def _secrets(value: Any, where: str) -> tuple[str, ...]:
    secrets = tuple(s.strip() for s in comma_separated(value) if s and s.strip())
    if not secrets:
        raise ImproperlyConfigured(
            f"{where} is empty: set at least one signing secret (several allow rotation)."
        )
    return secrets


# checked to be positive by the system checks (E003), as a source record is too
_whole_number = Reader("a whole number", lambda value, where: int(value))


@reader("the keys of `RECONCILE` (below), or `None`")
def _reconcile(value: Any, where: str) -> ReconcileConfig | None:
    if not value:
        return None
    config = ReconcileConfig(**read_keys(ReconcileConfig, value, where))
    if config.grace >= config.lookback:
        grace, lookback = (key_name(ReconcileConfig, a) for a in ("grace", "lookback"))
        raise ImproperlyConfigured(f"{where}: {grace} must be shorter than {lookback}.")
    return config


@reader("whole seconds; `None` or `0`: never")
def _silence_after(value: Any, where: str) -> timedelta | None:
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(
            f"{where} must be whole seconds (None or 0: no silence alerts), not {value!r}."
        )
    return timedelta(seconds=value)


@reader("the keys of `ACTIVE_HOURS` (below), or `None`")
def _active_hours(value: Any, where: str) -> ActiveHours | None:
    return ActiveHours(**read_keys(ActiveHours, value, where)) if value else None


@dataclass(frozen=True)
class SourceConfig:
    slug: str
    scheme: str = key(
        "SCHEME",
        "standard",
        _scheme,
        "`standard` (Standard Webhooks), `stripe` or `github`, or the dotted path of your own "
        "`Scheme` subclass (see [Signature schemes](receiving.md#signature-schemes))",
    )
    secrets: tuple[str, ...] = key(
        "SECRETS",
        [],
        _secrets,
        "the signing secrets; any of them verifies, so a new one can be added before the "
        "old one is removed. A `standard` source may list a "
        "sender's Ed25519 public keys (`whpk_…`, signature `v1a`) beside or instead of "
        "`whsec_` secrets; never a `whsk_` signing key (system check "
        "`webhook_receiver.E002`); see [Standard Webhooks "
        "v1a](receiving.md#standard-webhooks-v1a-ed25519-public-keys). One with less than "
        "24 bytes of key material (`standard`: the bytes that `whsec_`'s base64 decodes "
        "to; `stripe`, `github`: the secret's own UTF-8 bytes) is warning `W003`",
        shown_default="required",
        secret=True,
    )
    tolerance_seconds: int = key(
        "TOLERANCE_SECONDS",
        300,
        _whole_number,
        "maximum distance between the signature timestamp and now, both directions; "
        "positive (`E003`)",
    )
    max_body_bytes: int = key(
        "MAX_BODY_BYTES",
        1024 * 1024,
        _whole_number,
        "larger bodies are refused from `Content-Length` and again while reading; "
        "positive (`E003`)",
        shown_default="`1048576` (1 MiB)",
    )
    reconcile: ReconcileConfig | None = key(
        "RECONCILE",
        None,
        _reconcile,
        "reconciliation against the sender's list of events; `None`: off for this source. "
        "See [Reconciliation](watching.md#reconciliation)",
    )
    silence_after: timedelta | None = key(
        "SILENCE_AFTER_SECONDS",
        1200,
        _silence_after,
        "no accepted event for this long opens a silence alert",
    )
    active_hours: ActiveHours | None = key(
        "ACTIVE_HOURS",
        None,
        _active_hours,
        'when silence is unexpected, e.g. `{"DAYS": "mon-fri", "START": "08:00", '
        '"END": "20:00", "TIME_ZONE": "Europe/Berlin"}`; `None`: always. Outside them no '
        "alert opens",
    )
    event_key: str | None = key(
        "EVENT_KEY",
        None,
        dotted_path,
        "`None`: the scheme's default key (the message id; Stripe: the body's `id`). "
        "Otherwise a dotted path to `fn(*, payload, message) -> str`, called with the "
        "verified, parsed body and the `VerifiedMessage`. For GitHub sources, "
        "`webhook_receiver.schemes.github.signed_body_key` keys by the signed body "
        "([receiving.md](receiving.md#signature-schemes))",
    )

    def __repr__(self) -> str:  # never show secrets in tracebacks or logs
        return (
            f"SourceConfig(slug={self.slug!r}, scheme={self.scheme!r}, "
            f"secrets=<{len(self.secrets)} hidden>)"
        )


def source_where(slug: str) -> str:
    """How messages name a source's settings: ``WEBHOOK_RECEIVER['SOURCES']['shop']``."""
    return f"{SETTING}[{SOURCES_KEY!r}][{slug!r}]"


def source_config(slug: str, options: Mapping[str, Any]) -> SourceConfig:
    """A source's options (of the settings, or of a record) read and checked."""
    values = read_keys(SourceConfig, options, source_where(slug), REMOVED_SOURCE_KEYS)
    return SourceConfig(slug=slug, **values)


def receipts_outlast_reconciliation(
    retention: timedelta, retention_key: str, sources: Mapping[str, SourceConfig]
) -> None:
    """Reconciliation looks for a receipt of every event its sender lists in its window:
    a receipt purged inside that window would be reported missing, and repaired (the
    event applied a second time). ImproperlyConfigured when a source's window reaches
    ``retention`` (the key ``retention_key``)."""
    for slug, source in sources.items():
        if source.reconcile is None:
            continue
        reach = source.reconcile.lookback + source.reconcile.margin
        if reach >= retention:
            window = " + ".join(key_name(ReconcileConfig, a) for a in ("lookback", "margin"))
            raise ImproperlyConfigured(
                f"{SETTING}[{retention_key!r}] ({retention.days}) must be longer than the "
                f"reconciliation window of source {slug!r} ({window} = "
                f"{int(reach.total_seconds())} s): receipts purged inside it would be "
                "reported missing and applied again."
            )
