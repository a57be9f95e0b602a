"""How a slug finds its source: the settings first, then the records.

A slug of ``WEBHOOK_RECEIVER["SOURCES"]`` is answered from the settings, with no query,
and no record can shadow it. Any other slug is answered from a snapshot of every enabled
record, read in one query and kept per process for SOURCE_RECORDS_TTL_SECONDS: a record
source costs at most one query a TTL, and so does a slug that is no source at all (the
snapshot knows it is missing), however many different ones a flood makes up. A change in
the admin is seen by every process within the TTL, without a restart.

A record whose secrets cannot be decrypted (DESTINATION_SECRET_KEYS lost its key) fails
the snapshot: every slug outside the settings is then answered 503, for a TTL at a time
(the sender retries), never accepted on guesswork, and the settings' sources go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import app_settings
from ..conf.sources import SourceConfig
from ..core import logs
from .models import WebhookSource
from .records import record_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """The enabled records as sources, as read at ``read_at`` (the cache's clock), or the
    error that reading them raised."""

    read_at: float
    sources: Mapping[str, SourceConfig] = field(default_factory=dict)
    error: Exception | None = None


class RecordCache:
    """The per-process snapshot of the records. ``clock`` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._snapshot: Snapshot | None = None

    def clear(self) -> None:
        """Forget the snapshot: the next lookup reads the records again."""
        self._snapshot = None

    def current(self) -> Mapping[str, SourceConfig]:
        """The enabled records, read again once the snapshot is older than the TTL."""
        now = self.clock()
        snapshot = self._snapshot
        if snapshot is None or now - snapshot.read_at >= app_settings().source_records_ttl:
            snapshot = self._snapshot = _read(now)
        if snapshot.error is not None:
            raise snapshot.error
        return snapshot.sources

    def known(self, slug: str) -> bool:
        """Whether the last snapshot had ``slug``, without reading anything (for labels
        and tallies, after the request's lookup has read it)."""
        snapshot = self._snapshot
        return snapshot is not None and slug in snapshot.sources


records = RecordCache()


def _read(now: float) -> Snapshot:
    settings_slugs = app_settings().sources
    sources: dict[str, SourceConfig] = {}
    try:
        rows = list(WebhookSource.objects.filter(enabled=True))
    except ImproperlyConfigured as exc:  # SecretsUnreadable: no key, or not the one
        logs.log_failure(logger, "webhook source records unreadable", exc)
        return Snapshot(read_at=now, error=exc)
    for record in rows:
        if record.slug in settings_slugs:
            continue  # the settings' own (check W005 names the record)
        try:
            sources[record.slug] = record_config(record)
        except (ImproperlyConfigured, ValueError) as exc:
            # the admin and the command refuse such values: a row written otherwise
            logs.log_failure(logger, "webhook source record unusable", exc, source=record.slug)
    return Snapshot(read_at=now, sources=sources)


def source_lookup(slug: str) -> SourceConfig | None:
    """The source at ``slug``: the settings' (no query), else an enabled record's (at
    most one query a TTL), else None (an unknown or disabled slug)."""
    configured = app_settings().sources.get(slug)
    if configured is not None:
        return configured
    return records.current().get(slug)


def source_known(slug: str) -> bool:
    """Whether ``slug`` is a source, by the settings or the last snapshot: no query."""
    return slug in app_settings().sources or records.known(slug)


def sources_all() -> dict[str, SourceConfig]:
    """Every source: the settings' in their order, then the enabled records by slug (for
    the watch: silence, status, metrics). Records that cannot be read now (logged where
    read) leave the settings' alone, rather than fail every watch of them too."""
    configured = app_settings().sources
    try:
        found = records.current()
    except ImproperlyConfigured:
        return dict(configured)
    return {**configured, **dict(sorted(found.items()))}


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "WEBHOOK_RECEIVER":
        records.clear()
