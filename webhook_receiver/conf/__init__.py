"""The one reader of the ``WEBHOOK_RECEIVER`` setting (a source's own keys: sources.py).

Each key is declared once, as a field of ``AppSettings`` (conf/keys.py says how): its
name, default, what it accepts and what it means. Settings are read lazily and cached;
the cache is cleared on ``setting_changed`` so ``override_settings`` works in tests.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..schemes import SCHEMES, get_scheme
from .egress_proxy import EgressProxy
from .keys import SETTING, key, key_name, read_keys, reader
from .portal import PortalKeys
from .readers import (
    NEW_KEY_HINT,
    TrustedProxies,
    at_least_one,
    days,
    dotted_path,
    failing_span,
    fernet_keys,
    flag,
    fraction,
    header_names,
    milliseconds,
    more_than_zero,
    name_list,
    network_list,
    one_of,
    parse_networks,
    plain_dict,
    proxy_url,
    seconds,
    text_or_none,
    trusted_proxies,
)
from .sources import SOURCES_KEY, SourceConfig, receipts_outlast_reconciliation, source_config

# what callers import from here besides the settings: conf/readers.py defines them
__all__ = [
    "NEW_KEY_HINT",
    "AppSettings",
    "TrustedProxies",
    "app_settings",
    "get_source",
    "parse_networks",
]

# keys no longer read: key -> what replaces it. A host still setting one is refused at
# start-up (E001) with that text, rather than have it silently ignored.
REMOVED_KEYS: dict[str, str] = {
    "DUPLICATE_CHECK": (
        "nothing: a delivery starts with the claim, which answers a duplicate too "
        "(removed in 0.2; delete the key)"
    ),
    # it encrypts source records' secrets too, not only destinations'
    "DESTINATION_SECRET_KEYS": (
        "renamed SECRET_ENCRYPTION_KEYS in 0.2: rename the key; its value is unchanged"
    ),
}


@reader("slug → the keys of a source (below)")
def _sources(value: Any, where: str) -> dict[str, SourceConfig]:
    return {slug: source_config(slug, options) for slug, options in dict(value).items()}


@dataclass(frozen=True)
class _Keys:
    """The keys of every room but the portal's (conf/portal.py)."""

    sources: Mapping[str, SourceConfig] = key(
        SOURCES_KEY,
        {},
        _sources,
        "the sources the settings define, by slug; each one's endpoint is `/webhooks/<slug>/`",
    )
    source_records_ttl: float = key(
        "SOURCE_RECORDS_TTL_SECONDS",
        5,
        at_least_one(float, " of seconds"),
        "how old a process's snapshot of the sources kept as records may get "
        "([receiving.md](receiving.md#sources-kept-as-records)): a change in the admin or "
        "with `manage.py webhook_source` is live within it, without a restart; a record "
        "source costs one query per this long and process, and so does any number of slugs "
        "that are no source",
    )
    handlers: Mapping[str, str] = key(
        "HANDLERS",
        {},
        plain_dict,
        "event type → dotted path of a handler; wins over handlers registered in code (and "
        "settles an E005 conflict)",
    )
    audit_retention: timedelta = key(
        "AUDIT_RETENTION_DAYS",
        30,
        at_least_one(days, " of days"),
        "audit records (and rejection tallies) older than this are deleted by the purge task",
    )
    rejected_audit_per_minute: int = key(
        "REJECTED_AUDIT_PER_MINUTE",
        10,
        at_least_one(int),
        "refused requests per source and reason whose audit record is written, each minute; "
        "beyond, they are counted exactly in that minute's rejection tally, so a flood cannot "
        "fill the disk ([docs/security.md](security.md#a-flood-of-refused-requests))",
    )
    trusted_proxies: TrustedProxies | None = key(
        "TRUSTED_PROXIES",
        None,
        trusted_proxies,
        "the proxies in front of the app through which the client's address is read from "
        '`X-Forwarded-For`: their addresses and networks (`["127.0.0.1/32"]` behind '
        "deploy/nginx.conf on the same host: preferred, it believes no one else) or their "
        "number (`1`: believes whichever peer connects, safe only where nothing else can "
        "reach the app); `None`: the header is ignored and `REMOTE_ADDR` is recorded "
        "([docs/security.md](security.md#the-clients-address))",
    )
    receipt_retention: timedelta = key(
        "RECEIPT_RETENTION_DAYS",
        35,
        at_least_one(days, " of days"),
        "receipts older than this are deleted by the purge task. A receipt is the memory of "
        "a key: a redelivery of a key whose receipt is gone is applied again. Keep it longer "
        "than any sender redelivers (Stripe resends events for up to 30 days, Svix retries "
        "for about 28 hours) and than every source's reconciliation window (checked at "
        "start-up, `webhook_receiver.E001`); see [README, "
        "Retention](operations.md#retention-at-a-month-of-peak)",
    )
    purge_batch_size: int = key(
        "PURGE_BATCH_SIZE",
        1000,
        at_least_one(int),
        "rows deleted per statement by the purge tasks",
    )
    lock_timeout_ms: int = key(
        "LOCK_TIMEOUT_MS",
        2000,
        milliseconds,
        "PostgreSQL: for every statement of a delivery, from its first (the read or the "
        "claim) to the last of the claim's transaction (a handler's statements included), "
        "and for the capture of a failure, the longest wait for a lock. Past it, the "
        "delivery fails as transient and is captured (`202 deferred`): a locked table, the "
        "receipts table included, never holds a sender or a worker. Set with the first "
        "statement, in its round trip, and local to the transaction "
        "([receiving.md](receiving.md#lock-and-statement-timeouts-sent-with-the-first-statement)). "
        "The same bound holds a refusal's record and each of the outbox relay's transactions",
    )
    statement_timeout_ms: int = key(
        "STATEMENT_TIMEOUT_MS",
        5000,
        milliseconds,
        "PostgreSQL: the longest statement, over the same span and with the same outcome as "
        "`LOCK_TIMEOUT_MS`: a slow statement never holds a sender or a worker",
    )
    admission_lock_timeout_ms: int = key(
        "ADMISSION_LOCK_TIMEOUT_MS",
        200,
        milliseconds,
        "PostgreSQL: the outbox admission's insert waits at most this long for a lock on the "
        "outbox table (it never waits in normal work); past it the order event is deferred, "
        "rather than hold a web worker for `LOCK_TIMEOUT_MS` "
        "([docs/sending.md](sending.md#admission-when-the-cache-or-the-outbox-table-is-not-there))",
    )
    redacted_headers: frozenset[str] = key(
        "REDACTED_HEADERS",
        [
            "Authorization",
            "Proxy-Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "X-Auth-Token",
            "X-Csrftoken",
        ],
        header_names,
        "headers never stored on a receipt or failed event (case-insensitive)",
    )
    keep_signature_headers: bool = key(
        "KEEP_SIGNATURE_HEADERS",
        False,
        flag,
        "`False`: each scheme's signature headers (`webhook-signature`, `svix-signature`, "
        "`stripe-signature`, `x-hub-signature-256`, `x-hub-signature`) are stored as "
        "`[redacted]`: a signature without a timestamp (GitHub's) lets whoever reads it "
        "resubmit the delivery. `True` keeps them. The admin shows them redacted either way; "
        "`manage.py webhook_redact_headers` redacts rows stored before "
        "([docs/security.md](security.md#what-an-operator-sees))",
    )
    retry_max_attempts: int = key(
        "RETRY_MAX_ATTEMPTS",
        8,
        at_least_one(int),
        "attempts per failed event, the first delivery included, before it is `dead` (see "
        "[Failures, retries and replay](receiving.md#failures-retries-and-replay))",
    )
    retry_base_delay: float = key(
        "RETRY_BASE_DELAY_SECONDS",
        60,
        at_least_one(float, " of seconds"),
        "ceiling of the first retry's random wait; doubles with each attempt",
    )
    retry_max_delay: float = key(
        "RETRY_MAX_DELAY_SECONDS",
        3600,
        at_least_one(float, " of seconds"),
        "cap on that ceiling",
    )
    sweep_batch_size: int = key(
        "SWEEP_BATCH_SIZE",
        50,
        at_least_one(int),
        "events retried per sweep task run, in one transaction (cut short after half a "
        "second); concurrent sweepers share a backlog batch by batch",
    )
    failed_event_retention: timedelta = key(
        "FAILED_EVENT_RETENTION_DAYS",
        30,
        at_least_one(days, " of days"),
        "age after which resolved and discarded failed events are deleted (dead ones never)",
    )
    state_comparison: str | None = key(
        "STATE_COMPARISON",
        None,
        dotted_path,
        "dotted path of the host's business-state comparison for reconciliation (see "
        "[Reconciliation](watching.md#reconciliation))",
    )
    reconcile_run_timeout: timedelta = key(
        "RECONCILE_RUN_TIMEOUT_SECONDS",
        3600,
        at_least_one(seconds, " of seconds"),
        "a reconciliation run still running this long after its start was abandoned (a "
        "killed worker); the next start closes it as failed",
    )
    notifiers: tuple[str, ...] = key(
        "NOTIFIERS",
        ["log", "signal"],
        name_list,
        "who hears of a silence alert opening and resolving: `log`, `mail_admins`, `signal`, "
        "`outbox`, or dotted paths of `Notifier` subclasses "
        "([watching.md](watching.md#silence-alerts))",
    )
    metrics_token: str | None = key(
        "METRICS_TOKEN",
        None,
        text_or_none,
        "the bearer token `/metrics/` requires; `None`: metrics are off (404). Shorter than "
        "24 characters: warning `W004`",
        secret=True,
    )
    trace_effects: str | None = key(
        "TRACE_EFFECTS",
        None,
        dotted_path,
        "dotted path of the host's `fn(*, source, event_key) -> list[EffectSection]`, the "
        "effects the trace page shows ([watching.md](watching.md#one-events-story))",
    )
    heartbeat_max_age: timedelta = key(
        "HEARTBEAT_MAX_AGE_SECONDS",
        180,
        at_least_one(seconds, " of seconds"),
        "The most a heartbeat may age: `/health/`, `webhook_status` and the overview report "
        "beat down at two heartbeat intervals (from the beat schedule, 60 s on the demo's), "
        "at most this, or at this when the schedule gives no interval",
    )
    status_timeout_seconds: float = key(
        "STATUS_TIMEOUT_SECONDS",
        3,
        at_least_one(float, " of seconds"),
        "the bound of each reading of `webhook_status`, the overview and `/health/` (a table "
        "locked by another session, a statement, the heartbeat, the broker): no statement "
        "waits for a lock or runs longer, and none starts after it; what was not read within "
        'it is named ("receipts: locked, not read within 3 s"; exit 3, 503), never OK',
    )
    relay_database_connections: int = key(
        "RELAY_DATABASE_CONNECTIONS",
        2,
        at_least_one(int),
        "database connections a relay process (`manage.py webhook_relay`) holds for its "
        "rounds, its poll and its heartbeat, whatever the number of destinations; with "
        "`RELAY_LISTEN` on PostgreSQL, one more listens for admissions "
        "([docs/sending.md](sending.md#the-relay-one-process-one-loop))",
    )
    relay_poll_seconds: float = key(
        "RELAY_POLL_SECONDS",
        1.0,
        more_than_zero(float, " of seconds"),
        "how often a relay process looks for destinations with a message due: what no "
        "notification reaches (SQLite, PgBouncer in transaction mode, a retry whose backoff "
        "ended, a lease that ran out) waits at most this long; one short statement a poll",
    )
    relay_listen: bool = key(
        "RELAY_LISTEN",
        True,
        flag,
        "on PostgreSQL, whether a relay process listens for admissions (`LISTEN`; each "
        "admission notifies on commit), so that a message is sent within milliseconds "
        "rather than at the next poll. Behind PgBouncer in transaction mode a notification "
        "reaches no one: set it false there, or give the relay a `DATABASE_URL` straight "
        "to PostgreSQL (it holds a few connections whatever the load)",
    )
    relay_max_requests: int = key(
        "RELAY_MAX_REQUESTS",
        1000,
        at_least_one(int),
        "requests a relay process has in flight at most, over all destinations (each a "
        "socket; each destination also keeps to its own `max_in_flight`): a destination "
        "that wants more waits for one to end, before it claims",
    )
    catalog_check: str | None = key(
        "CATALOG_CHECK",
        None,
        one_of("refuse", "record", "off"),
        "what `enqueue_webhook` does with a message outside the event catalog (its type "
        'not declared, or its body not the envelope its serializer accepts): `"refuse"` '
        'raises `EventRefused` before anything is written; `"record"` admits it, counts '
        'it and logs the first of its type; `"off"` checks nothing. `None`: `"refuse"` '
        'with `DEBUG`, else `"record"` ([sending.md](sending.md#the-event-catalog))',
    )
    catalog_info: Mapping[str, Any] = key(
        "CATALOG_INFO",
        {"title": "Webhooks", "version": "1"},
        plain_dict,
        "the event catalog's OpenAPI document's `info`: its `title`, `version` and `description`",
    )
    outbox_retention: timedelta = key(
        "OUTBOX_RETENTION_DAYS",
        30,
        at_least_one(days, " of days"),
        "delivered and discarded outbox messages are deleted after this, never before their "
        "destination's `replay_horizon_days`",
    )
    ops_destination: str | None = key(
        "OPS_DESTINATION",
        None,
        text_or_none,
        "the name of a destination that receives operational notices (terminal deliveries; "
        "destinations failing and disabled; silence alerts with the `outbox` notifier)",
    )
    # None: a failing destination is never disabled for it
    disable_after_failing: timedelta | None = key(
        "DISABLE_AFTER_FAILING_DAYS",
        5,
        failing_span,
        "how long (fractions of a day allowed) a destination's answers may fail with no "
        "success before the relay disables it and holds its messages until it is enabled "
        "again; `0`: never (a 410 Gone disables it at once whatever this is). "
        "[docs/sending.md](sending.md#endpoints-that-retire-themselves)",
    )
    disable_warning_fraction: float = key(
        "DISABLE_WARNING_FRACTION",
        0.5,
        fraction,
        "the share of that span after which an `outbox.destination_failing` notice and a log "
        "line warn of it, once",
    )
    secret_encryption_keys: tuple[str, ...] = key(
        "SECRET_ENCRYPTION_KEYS",
        [],
        fernet_keys,
        "Fernet keys that encrypt stored secrets at rest (destinations' signing secrets and "
        "source records' secrets): the first encrypts, every one decrypts; required once a "
        "destination or a source record has secrets. Rotate: put a new key first, run "
        "`manage.py webhook_destination reencrypt` (it rewrites both), remove the old one "
        "([docs/sending.md](sending.md#secrets-at-rest-and-rotating-their-key))",
        secret=True,
    )
    egress_allowed_networks: tuple[IPv4Network | IPv6Network, ...] = key(
        "EGRESS_ALLOWED_NETWORKS",
        [],
        network_list,
        "networks that the relay and the `http` reconciliation adapter may reach although "
        "the egress guard refuses them: loopback, private (RFC 1918, ULA), link-local with "
        "the cloud metadata address, unspecified, multicast, reserved, 100.64/10, NAT64, and "
        "the IPv6 forms that embed such an IPv4 address. Checked at connect time on the "
        "resolved address; a refused delivery fails for good, with the rule in its error, "
        "and does not count against the breaker (`webhook_receiver/network/egress.py`). A "
        "destination's URL is checked against the same rules when it is saved "
        "([docs/sending.md](sending.md#the-url-checked-when-it-is-saved-shown-masked))",
    )
    egress_proxy: EgressProxy | None = key(
        "EGRESS_PROXY",
        None,
        proxy_url,
        "an HTTP proxy (the port required; `http://` only: TLS to an https destination is "
        "made inside the tunnel) that every request to a typed address (the relay, the "
        "`http` and `stripe` reconciliation adapters) goes through, as a CONNECT tunnel opened "
        "within the request's deadline. The proxy resolves and filters the destination's "
        "name; the egress guard then checks IP literals only, and the proxy's own address "
        "not at all. Its 403 or 407 is `EgressProxyRefused`, terminal like a guard refusal "
        "(no breaker count), with the proxy's reason; a 502, 504, malformed answer, or "
        "silent or dropped proxy is retried like a network error. The credentials go only "
        "into `Proxy-Authorization`: messages, reprs and logs show `http://***@host:port`. "
        "A malformed value is `ImproperlyConfigured`, without the URL "
        "([docs/security.md](security.md#requests-to-addresses-someone-typed))",
    )


@dataclass(frozen=True)
class AppSettings(PortalKeys, _Keys):
    """``WEBHOOK_RECEIVER``, read: one field per key, declared where it is read."""

    @functools.cached_property
    def signature_headers(self) -> frozenset[str]:
        """The signature headers of every built-in scheme and every configured source's."""
        schemes = [*SCHEMES.values(), *(get_scheme(s.scheme) for s in self.sources.values())]
        return frozenset(h.lower() for s in schemes for h in s.signature_headers)


@functools.cache
def app_settings() -> AppSettings:
    config = AppSettings(
        **read_keys(AppSettings, getattr(settings, SETTING, {}), SETTING, REMOVED_KEYS)
    )
    receipts_outlast_reconciliation(
        config.receipt_retention, key_name(AppSettings, "receipt_retention"), config.sources
    )
    return config


def get_source(slug: str) -> SourceConfig | None:
    """A source of the settings only; ``sources.lookup.source_lookup`` finds records too."""
    return app_settings().sources.get(slug)


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING:
        app_settings.cache_clear()
