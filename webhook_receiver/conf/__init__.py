"""The one reader of the ``WEBHOOK_RECEIVER`` setting (a source's own keys: sources.py).

Settings are read lazily and cached; the cache is cleared on ``setting_changed`` so
``override_settings`` works in tests. Everything here has a documented default.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from typing import Any

from cryptography.fernet import Fernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..schemes import SCHEMES, get_scheme
from .egress_proxy import EgressProxy, parse_egress_proxy
from .sources import SourceConfig, source_config

DUPLICATE_CHECKS = ("adaptive", "read_first", "claim_first")

DEFAULTS: dict[str, Any] = {
    # slug -> source options (see SOURCE_DEFAULTS)
    "SOURCES": {},
    # sources kept as records (the admin's webhook sources, manage.py webhook_source) are
    # read again by each process at most this often: a change is live within it, and a
    # slug that is no source costs one query per this long, however many a flood makes up
    "SOURCE_RECORDS_TTL_SECONDS": 5,
    # event type -> dotted path of a handler; overrides handlers registered in code
    "HANDLERS": {},
    # audit records (and the tallies of refused requests) older than this are deleted by
    # the purge task
    "AUDIT_RETENTION_DAYS": 30,
    # refused requests per source and reason whose audit record is written in full, each
    # minute; beyond it they are only counted, in that minute's RejectionTally (exactly)
    "REJECTED_AUDIT_PER_MINUTE": 10,
    # the proxies in front of the app, through which X-Forwarded-For is read for the
    # client's address: how many there are (nginx alone: 1), or their addresses and
    # networks ("10.0.0.0/8"); None: the header is ignored, and REMOTE_ADDR is the client
    "TRUSTED_PROXIES": None,
    # receipts older than this are deleted by the purge task. A receipt is the memory of
    # a key: a redelivery of a key whose receipt is gone is applied again, so this must
    # outlast every sender's redeliveries. 35 days: Stripe retries for 3 days and keeps
    # 30 days of events to resend, Svix retries for about 28 hours, Standard Webhooks'
    # example schedule spans about 75 hours. It must also outlast every source's
    # reconciliation window (RECONCILE LOOKBACK_SECONDS + MARGIN_SECONDS).
    "RECEIPT_RETENTION_DAYS": 35,
    # rows deleted per statement by the purge tasks
    "PURGE_BATCH_SIZE": 1000,
    # attempts per failed event, the first delivery included, before it is dead
    "RETRY_MAX_ATTEMPTS": 8,
    # retry n waits a random time in [0, min(RETRY_MAX_DELAY, RETRY_BASE_DELAY * 2**(n-1))]
    "RETRY_BASE_DELAY_SECONDS": 60,
    "RETRY_MAX_DELAY_SECONDS": 3600,
    # failed events retried per sweep task run, in one transaction (cut short after half
    # a second); concurrent sweepers share a backlog batch by batch
    "SWEEP_BATCH_SIZE": 50,
    # resolved and discarded failed events older than this are deleted; dead ones never
    "FAILED_EVENT_RETENTION_DAYS": 30,
    # which statement a delivery starts with: "read_first" (look up the stored outcome;
    # a duplicate costs one statement, a new event one more), "claim_first" (the claim
    # answers duplicates too; a new event costs no read, a duplicate a transaction), or
    # "adaptive": per process and source, read first while most recent deliveries were
    # duplicates, claim first otherwise. All three are equally correct.
    "DUPLICATE_CHECK": "adaptive",
    # PostgreSQL: for a delivery's statements, from its first to the last of the claim's
    # transaction (a handler's included), the longest wait for a lock and the longest
    # statement; 0 means no limit. Past either, the delivery fails as transient and is
    # captured (202 deferred), so that senders get an answer well within their own
    # timeout (10 s for GitHub) and workers stay free. The same bounds hold a refusal's
    # record, a failure's capture, and each of the outbox relay's transactions.
    "LOCK_TIMEOUT_MS": 2000,
    "STATEMENT_TIMEOUT_MS": 5000,
    # PostgreSQL: the outbox admission's insert waits at most this long for a lock on the
    # outbox table (it never waits in normal work): an event whose effect admits a message
    # to a locked outbox is deferred fast rather than hold a web worker for
    # LOCK_TIMEOUT_MS; 0: no limit
    "ADMISSION_LOCK_TIMEOUT_MS": 200,
    # reconciliation: the host's view of its business state, the dotted path of a
    # webhook_receiver.reconcile.states.StateComparison subclass, which reads the state
    # a sender's events set and compares it with the host's (None: no state is compared)
    "STATE_COMPARISON": None,
    # a run still "running" after this long was abandoned (a killed worker): the next
    # start closes it as failed
    "RECONCILE_RUN_TIMEOUT_SECONDS": 3600,
    # who hears of a silence alert opening and resolving: "log" (ERROR), "mail_admins",
    # "signal" (silence_alert_opened / silence_alert_resolved), "outbox" (a webhook to
    # OPS_DESTINATION), or dotted paths of
    # webhook_receiver.watch.notifiers.Notifier subclasses
    "NOTIFIERS": ["log", "signal"],
    # GET /metrics/ answers only with "Authorization: Bearer <token>"; None: off (404)
    "METRICS_TOKEN": None,
    # the host's hook for the trace page: fn(*, source, event_key) -> list of
    # webhook_receiver.watch.trace.EffectSection (None: no effects are shown)
    "TRACE_EFFECTS": None,
    # /health/ fails when beat's heartbeat task has not run for this long
    "HEARTBEAT_MAX_AGE_SECONDS": 180,
    # webhook_status and /health/: no statement of theirs waits for a lock or runs longer,
    # and none starts after this long; past it they answer "database not answering"
    # (exit 3; 503), never OK
    "STATUS_TIMEOUT_SECONDS": 3,
    # delivered and discarded outbox messages older than this are deleted, never sooner
    # than their destination's replay_horizon_days; terminal ones wait for an operator
    "OUTBOX_RETENTION_DAYS": 30,
    # the name of a WebhookDestination that receives operational notices (terminal
    # deliveries; silence alerts with the "outbox" notifier); None: none are sent
    "OPS_DESTINATION": None,
    # a destination whose answers have failed, with no success, for this many days is
    # disabled by the relay (its messages held until an operator enables it); a notice
    # goes to OPS_DESTINATION at DISABLE_WARNING_FRACTION of the span, and one when it is
    # disabled. 0: never. (An answer of 410 Gone disables it at once, whatever this is.)
    "DISABLE_AFTER_FAILING_DAYS": 5,
    "DISABLE_WARNING_FRACTION": 0.5,
    # request headers never stored on a receipt (compared case-insensitively)
    "REDACTED_HEADERS": [
        "Authorization",
        "Proxy-Authorization",
        "Cookie",
        "Set-Cookie",
        "X-Api-Key",
        "X-Auth-Token",
        "X-Csrftoken",
    ],
    # each scheme's signature headers (webhook-signature, stripe-signature,
    # x-hub-signature-256, …) are stored redacted: what a record needs is that the
    # signature verified, and a signature without a timestamp (GitHub's) lets whoever
    # reads it resubmit the delivery. True keeps them, for a host that must show a sender
    # the signature it received. The admin shows them redacted either way.
    "KEEP_SIGNATURE_HEADERS": False,
    # Fernet keys (a list, or a comma-separated string) that encrypt outbox
    # destinations' signing secrets at rest: the first encrypts, every one decrypts.
    # Required once a destination has secrets; rotate by putting a new key first,
    # running manage.py webhook_destination reencrypt, then removing the old one.
    "DESTINATION_SECRET_KEYS": [],
    # networks (CIDRs: a list, or a comma-separated string) that a request to an address
    # someone typed (a destination, the http reconciliation adapter) may reach although
    # the egress guard refuses them: loopback, private, link-local, … (core/egress.py).
    # Empty: none. A development merchant on loopback: ["127.0.0.0/8", "::1/128"].
    "EGRESS_ALLOWED_NETWORKS": [],
    # an HTTP proxy (http://[user:password@]host:port) that those requests go through,
    # each as a CONNECT tunnel: the proxy resolves and filters the destination's name
    # (conf/egress_proxy.py, core/peer_http.py). None: they connect directly.
    "EGRESS_PROXY": None,
}

POSITIVE_KEYS = (
    "SOURCE_RECORDS_TTL_SECONDS",
    "REJECTED_AUDIT_PER_MINUTE",
    "HEARTBEAT_MAX_AGE_SECONDS",
    "STATUS_TIMEOUT_SECONDS",
    "OUTBOX_RETENTION_DAYS",
    "RECONCILE_RUN_TIMEOUT_SECONDS",
    "AUDIT_RETENTION_DAYS",
    "RECEIPT_RETENTION_DAYS",
    "PURGE_BATCH_SIZE",
    "RETRY_MAX_ATTEMPTS",
    "RETRY_BASE_DELAY_SECONDS",
    "RETRY_MAX_DELAY_SECONDS",
    "SWEEP_BATCH_SIZE",
    "FAILED_EVENT_RETENTION_DAYS",
)


@dataclass(frozen=True)
class TrustedProxies:
    """The proxies in front of the app: the nearest ``count`` hops, or the hops whose
    address is in ``networks`` (exactly one of the two is set)."""

    count: int = 0
    networks: tuple[IPv4Network | IPv6Network, ...] = ()

    def trusts(self, hop: int, address: str | None) -> bool:
        """Whether the ``hop``-th nearest peer (0: REMOTE_ADDR), at ``address`` (None: not
        known, as on a Unix socket), is one of them, so that the address it appended to
        X-Forwarded-For can be believed. A count trusts by position alone."""
        if self.count:
            return hop < self.count
        if address is None:
            return False
        ip = ip_address(address)
        return any(ip in network for network in self.networks)


@dataclass(frozen=True)
class AppSettings:
    sources: Mapping[str, SourceConfig]
    source_records_ttl: float
    handlers: Mapping[str, str]
    audit_retention: timedelta
    rejected_audit_per_minute: int
    trusted_proxies: TrustedProxies | None
    receipt_retention: timedelta
    purge_batch_size: int
    redacted_headers: frozenset[str]
    # the signature headers of every built-in scheme and every configured source's scheme
    signature_headers: frozenset[str]
    keep_signature_headers: bool
    destination_secret_keys: tuple[str, ...]
    retry_max_attempts: int
    retry_base_delay: float
    retry_max_delay: float
    sweep_batch_size: int
    failed_event_retention: timedelta
    duplicate_check: str
    lock_timeout_ms: int
    statement_timeout_ms: int
    admission_lock_timeout_ms: int
    state_comparison: str | None
    reconcile_run_timeout: timedelta
    notifiers: tuple[str, ...]
    metrics_token: str | None
    trace_effects: str | None
    heartbeat_max_age: timedelta
    status_timeout_seconds: float
    outbox_retention: timedelta
    ops_destination: str | None
    # None: a failing destination is never disabled for it
    disable_after_failing: timedelta | None
    disable_warning_fraction: float
    egress_allowed_networks: tuple[IPv4Network | IPv6Network, ...]
    egress_proxy: EgressProxy | None


@functools.cache
def app_settings() -> AppSettings:
    user = getattr(settings, "WEBHOOK_RECEIVER", {})
    unknown = set(user) - set(DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(f"WEBHOOK_RECEIVER has unknown keys: {sorted(unknown)}")
    merged = {**DEFAULTS, **user}
    for key in POSITIVE_KEYS:
        try:
            fits = float(merged[key]) >= 1
        except (TypeError, ValueError):
            fits = False
        if not fits:
            raise ImproperlyConfigured(
                f"WEBHOOK_RECEIVER[{key!r}] must be a number of at least 1, not {merged[key]!r}."
            )
    if merged["DUPLICATE_CHECK"] not in DUPLICATE_CHECKS:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER['DUPLICATE_CHECK'] must be one of {', '.join(DUPLICATE_CHECKS)}, "
            f"not {merged['DUPLICATE_CHECK']!r}."
        )
    sources = {slug: source_config(slug, opts) for slug, opts in merged["SOURCES"].items()}
    receipt_retention = timedelta(days=merged["RECEIPT_RETENTION_DAYS"])
    _check_receipts_outlast_reconciliation(sources, receipt_retention)
    schemes = [*SCHEMES.values(), *(get_scheme(s.scheme) for s in sources.values())]
    return AppSettings(
        sources=sources,
        source_records_ttl=float(merged["SOURCE_RECORDS_TTL_SECONDS"]),
        handlers=dict(merged["HANDLERS"]),
        audit_retention=timedelta(days=merged["AUDIT_RETENTION_DAYS"]),
        rejected_audit_per_minute=int(merged["REJECTED_AUDIT_PER_MINUTE"]),
        trusted_proxies=_trusted_proxies(merged["TRUSTED_PROXIES"]),
        receipt_retention=receipt_retention,
        purge_batch_size=int(merged["PURGE_BATCH_SIZE"]),
        redacted_headers=frozenset(h.lower() for h in merged["REDACTED_HEADERS"]),
        signature_headers=frozenset(h.lower() for s in schemes for h in s.signature_headers),
        keep_signature_headers=bool(merged["KEEP_SIGNATURE_HEADERS"]),
        destination_secret_keys=_fernet_keys(merged["DESTINATION_SECRET_KEYS"]),
        retry_max_attempts=int(merged["RETRY_MAX_ATTEMPTS"]),
        retry_base_delay=float(merged["RETRY_BASE_DELAY_SECONDS"]),
        retry_max_delay=float(merged["RETRY_MAX_DELAY_SECONDS"]),
        sweep_batch_size=int(merged["SWEEP_BATCH_SIZE"]),
        failed_event_retention=timedelta(days=merged["FAILED_EVENT_RETENTION_DAYS"]),
        duplicate_check=merged["DUPLICATE_CHECK"],
        lock_timeout_ms=_milliseconds(merged, "LOCK_TIMEOUT_MS"),
        statement_timeout_ms=_milliseconds(merged, "STATEMENT_TIMEOUT_MS"),
        admission_lock_timeout_ms=_milliseconds(merged, "ADMISSION_LOCK_TIMEOUT_MS"),
        state_comparison=merged["STATE_COMPARISON"],
        reconcile_run_timeout=timedelta(seconds=merged["RECONCILE_RUN_TIMEOUT_SECONDS"]),
        notifiers=tuple(merged["NOTIFIERS"]),
        metrics_token=merged["METRICS_TOKEN"] or None,
        trace_effects=merged["TRACE_EFFECTS"],
        heartbeat_max_age=timedelta(seconds=merged["HEARTBEAT_MAX_AGE_SECONDS"]),
        status_timeout_seconds=float(merged["STATUS_TIMEOUT_SECONDS"]),
        outbox_retention=timedelta(days=merged["OUTBOX_RETENTION_DAYS"]),
        ops_destination=merged["OPS_DESTINATION"] or None,
        disable_after_failing=_failing_span(merged["DISABLE_AFTER_FAILING_DAYS"]),
        disable_warning_fraction=_fraction(merged, "DISABLE_WARNING_FRACTION"),
        egress_allowed_networks=_egress_allowed(merged["EGRESS_ALLOWED_NETWORKS"]),
        egress_proxy=parse_egress_proxy(merged["EGRESS_PROXY"]),
    )


def _failing_span(days: Any) -> timedelta | None:
    try:
        value = float(days)
    except (TypeError, ValueError):
        value = -1.0
    if not value >= 0 or isinstance(days, bool):
        raise ImproperlyConfigured(
            "WEBHOOK_RECEIVER['DISABLE_AFTER_FAILING_DAYS'] must be a number of days, at "
            f"least 0 (0: never), not {days!r}."
        )
    return timedelta(days=value) if value else None


def _fraction(merged: Mapping[str, Any], key: str) -> float:
    try:
        value = float(merged[key])
    except (TypeError, ValueError):
        value = -1.0
    if not 0 < value < 1 or isinstance(merged[key], bool):
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER[{key!r}] must be a fraction between 0 and 1, not {merged[key]!r}."
        )
    return value


def _check_receipts_outlast_reconciliation(
    sources: Mapping[str, SourceConfig], retention: timedelta
) -> None:
    """Reconciliation looks for a receipt of every event its sender lists in its window:
    a receipt purged inside that window would be reported missing, and repaired (the
    event applied a second time)."""
    for slug, source in sources.items():
        if source.reconcile is None:
            continue
        reach = source.reconcile.lookback + source.reconcile.margin
        if reach >= retention:
            raise ImproperlyConfigured(
                f"WEBHOOK_RECEIVER['RECEIPT_RETENTION_DAYS'] ({retention.days}) must be "
                f"longer than the reconciliation window of source {slug!r} "
                f"(LOOKBACK_SECONDS + MARGIN_SECONDS = {int(reach.total_seconds())} s): "
                "receipts purged inside it would be reported missing and applied again."
            )


NEW_KEY_HINT = (
    'Generate a key with: python -c "from cryptography.fernet import Fernet; '
    'print(Fernet.generate_key().decode())"'
)


def parse_networks(value: str | Iterable[Any]) -> tuple[IPv4Network | IPv6Network, ...]:
    """Networks from CIDRs (a comma-separated string, as an environment variable gives
    them, or a list); a bare address is a network of one. A malformed one raises
    ValueError naming it."""
    items = value.split(",") if isinstance(value, str) else list(value)
    networks = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a network (CIDR, such as 10.0.0.0/8)") from None
    return tuple(networks)


def _egress_allowed(value: Any) -> tuple[IPv4Network | IPv6Network, ...]:
    try:
        return parse_networks(value or ())
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"WEBHOOK_RECEIVER['EGRESS_ALLOWED_NETWORKS']: {exc}") from exc


def _fernet_keys(value: Any) -> tuple[str, ...]:
    """DESTINATION_SECRET_KEYS: a list, or a comma-separated string (an environment
    variable), of Fernet keys, each checked; a problem names its position, never the
    key."""
    if isinstance(value, str):
        value = value.split(",")
    keys = tuple(k.strip() for k in value or () if isinstance(k, str) and k.strip())
    for position, key in enumerate(keys, 1):
        try:
            Fernet(key)
        except (ValueError, TypeError) as exc:
            raise ImproperlyConfigured(
                f"WEBHOOK_RECEIVER['DESTINATION_SECRET_KEYS']: key #{position} is not a "
                f"Fernet key (32 bytes in url-safe base64). {NEW_KEY_HINT}"
            ) from exc
    return keys


def _trusted_proxies(value: Any) -> TrustedProxies | None:
    """None, 0 or "": none. A whole number (or its digits, as an environment variable
    gives them): that many proxies. Otherwise addresses and networks, as a list or one
    comma-separated string."""
    where = "WEBHOOK_RECEIVER['TRUSTED_PROXIES']"
    if value is None or value == 0 or value == "":
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ImproperlyConfigured(f"{where} must not be negative, not {value!r}.")
        return TrustedProxies(count=value) if value else None
    try:
        networks = parse_networks(value)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"{where}: the number of proxies in front of the app (1 for nginx alone), or "
            f"their addresses and networks, like ['127.0.0.1', '10.0.0.0/8'] ({exc})."
        ) from exc
    return TrustedProxies(networks=networks) if networks else None


def _milliseconds(merged: Mapping[str, Any], key: str) -> int:
    value = merged[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(
            f"WEBHOOK_RECEIVER[{key!r}] must be a whole number of milliseconds, 0 for no limit."
        )
    return value


def get_source(slug: str) -> SourceConfig | None:
    """A source of the settings only; ``sources.lookup.source_lookup`` finds records too."""
    return app_settings().sources.get(slug)


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "WEBHOOK_RECEIVER":
        app_settings.cache_clear()
