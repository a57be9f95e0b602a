"""How a slug finds its source: the settings first, then the records.

A slug of ``WEBHOOK_RECEIVER["SOURCES"]`` is answered from the settings, with no query,
and no record can shadow it. Any other slug is answered from a snapshot of every enabled
record, read in one query and kept per process for SOURCE_RECORDS_TTL_SECONDS: a record
source costs at most one query a TTL, and so does a slug that is no source at all (the
snapshot knows it is missing), however many different ones a flood makes up. A change in
the admin is seen by every process within the TTL, without a restart.

A record whose secrets cannot be decrypted (SECRET_ENCRYPTION_KEYS lost its key, or a
key is malformed) is that record's problem alone: its slug is answered 503 (the sender
retries), never accepted on guesswork, with one log line a request; every other source
goes on, and an unknown slug is still a 404. The snapshot reads the column as stored and
decrypts each record apart, so one unreadable row cannot fail the others.
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
from ..core.encryption import SecretsUnreadable, secrets_decrypt, with_stored_secrets
from ..exceptions import NotStored
from .models import WebhookSource
from .records import record_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    """The enabled records as sources, as read at ``read_at`` (the cache's clock), and
    those whose secrets cannot be read, with why."""

    read_at: float
    sources: Mapping[str, SourceConfig] = field(default_factory=dict)
    unreadable: Mapping[str, SecretsUnreadable] = field(default_factory=dict)


class SourceUnreadable(NotStored):
    """A record source whose secrets cannot be read: a request to it cannot be
    verified, so nothing is stored and the sender retries (503). ``state`` says why in a
    few words (``SecretsUnreadable.state``)."""

    def __init__(self, slug: str, problem: SecretsUnreadable) -> None:
        super().__init__(f"the source record {slug!r}: {problem.state}")
        self.slug = slug
        self.state = problem.state


class RecordCache:
    """The per-process snapshot of the records. ``clock`` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._snapshot: Snapshot | None = None

    def clear(self) -> None:
        """Forget the snapshot: the next lookup reads the records again."""
        self._snapshot = None

    def snapshot(self) -> Snapshot:
        """The enabled records, read again once the snapshot is older than the TTL."""
        now = self.clock()
        snapshot = self._snapshot
        if snapshot is None or now - snapshot.read_at >= app_settings().source_records_ttl:
            snapshot = self._snapshot = _read(now)
        return snapshot

    def current(self) -> Mapping[str, SourceConfig]:
        """The enabled records that can serve as sources."""
        return self.snapshot().sources

    def known(self, slug: str) -> bool:
        """Whether the last snapshot had ``slug``, without reading anything (for labels
        and tallies, after the request's lookup has read it)."""
        snapshot = self._snapshot
        return snapshot is not None and (slug in snapshot.sources or slug in snapshot.unreadable)


records = RecordCache()


def _read(now: float) -> Snapshot:
    settings_slugs = app_settings().sources
    sources: dict[str, SourceConfig] = {}
    unreadable: dict[str, SecretsUnreadable] = {}
    # the secrets as stored, decrypted record by record below
    for record in with_stored_secrets(WebhookSource.objects.filter(enabled=True)):
        if record.slug in settings_slugs:
            continue  # the settings' own (check W005 names the record)
        try:
            record.secrets = secrets_decrypt(record.stored_secrets or [])
        except SecretsUnreadable as exc:  # no key, not the one, or a malformed one
            unreadable[record.slug] = exc
            continue
        try:
            sources[record.slug] = record_config(record)
        except (ImproperlyConfigured, ValueError) as exc:
            # the admin and the command refuse such values: a row written otherwise
            logs.log_failure(logger, "webhook source record unusable", exc, source=record.slug)
    return Snapshot(read_at=now, sources=sources, unreadable=unreadable)


def source_lookup(slug: str) -> SourceConfig | None:
    """The source at ``slug``: the settings' (no query), else an enabled record's (at
    most one query a TTL), else None (an unknown or disabled slug). Raises
    ``SourceUnreadable`` for an enabled record whose secrets cannot be read."""
    configured = app_settings().sources.get(slug)
    if configured is not None:
        return configured
    snapshot = records.snapshot()
    problem = snapshot.unreadable.get(slug)
    if problem is not None:
        raise SourceUnreadable(slug, problem) from problem
    return snapshot.sources.get(slug)


def source_known(slug: str) -> bool:
    """Whether ``slug`` is a source, by the settings or the last snapshot: no query."""
    return slug in app_settings().sources or records.known(slug)


def sources_all() -> dict[str, SourceConfig]:
    """Every source: the settings' in their order, then the enabled records by slug (for
    the watch: silence, status, metrics). A record whose secrets cannot be read is not
    among them (``sources_unreadable`` names it)."""
    found = records.current()
    return {**app_settings().sources, **dict(sorted(found.items()))}


def sources_unreadable() -> dict[str, SecretsUnreadable]:
    """The enabled records whose secrets cannot be read, by slug, with why."""
    return dict(sorted(records.snapshot().unreadable.items()))


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "WEBHOOK_RECEIVER":
        records.clear()
