"""Changing source records: add one, add or remove a secret (a rotation), enable or
disable. The admin and ``manage.py webhook_source`` both come here.

Each change runs in a transaction of its own, on the row locked (two rotations at once
keep both their secrets), and clears this process's snapshot; every other process sees
the change within SOURCE_RECORDS_TTL_SECONDS.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from ..conf import app_settings
from ..core.encryption import (
    SecretsUnreadable,
    secrets_decrypt,
    secrets_encrypt,
    with_stored_secrets,
)
from ..core.fingerprints import secret_fingerprint
from ..schemes import get_scheme
from ..schemes.base import weak_secret_problem
from .lookup import records
from .models import WebhookSource
from .records import record_problem


class SourceRefused(ValueError):
    """A change the rules refuse; the message says why, and never holds a secret."""


def slug_problem(slug: str) -> str | None:
    """Why no record may take ``slug``: the settings define it (settings first)."""
    if slug in app_settings().sources:
        return (
            f"{slug!r} is defined in WEBHOOK_RECEIVER['SOURCES']: the settings' source "
            "answers it, and a record could never be used. Choose another slug, or change "
            "the settings."
        )
    return None


def secrets_problem(scheme: str, secrets: Iterable[str]) -> str | None:
    """Why these secrets cannot verify ``scheme``'s requests, naming a secret by its
    position, never by its value: not of the scheme's form, or too short a key where the
    scheme's senders generate their secrets (``weak_secret_problem``)."""
    checked = get_scheme(scheme)
    for position, secret in enumerate(secrets, 1):
        problem = checked.secret_problem(secret)
        if not problem and checked.sender_generates_secrets:
            problem = weak_secret_problem(checked, secret)
        if problem:
            return f"secret #{position} {problem}"
    return None


def secrets_weak(scheme: str, secrets: Iterable[str]) -> str | None:
    """For a scheme whose secrets a person types (GitHub): a warning naming the first
    secret too short a key by its position, or None. Saved all the same: the sender
    already has it."""
    checked = get_scheme(scheme)
    for position, secret in enumerate(secrets, 1):
        weak = weak_secret_problem(checked, secret)
        if weak:
            return (
                f"secret #{position} {weak}. It is kept (the sender has it); generate a "
                f"longer one, give it to the sender, and add it here"
            )
    return None


def source_add(*, slug: str, scheme: str, secrets: list[str], **options: Any) -> WebhookSource:
    """A new enabled record; every value checked as the settings' would be."""
    source = WebhookSource(slug=slug, scheme=scheme, secrets=secrets, **options)
    _check(source)
    secrets_encrypt(secrets)  # with no SECRET_ENCRYPTION_KEYS, say so before writing
    with transaction.atomic():
        source.save()
    records.clear()
    return source


def source_secret_add(slug: str, secret: str) -> tuple[WebhookSource, bool]:
    """Add ``secret`` after the source's others (every one verifies). Returns the source,
    and False when it had that secret already."""
    with transaction.atomic():
        source = _locked(slug, secrets=True)
        if secret in source.secrets:
            return source, False
        problem = secrets_problem(source.scheme, [secret])
        if problem:
            raise SourceRefused(f"{slug}: the new {problem.removeprefix('secret #1 ')}.")
        source.secrets = [*source.secrets, secret]
        source.save(update_fields=["secrets", "updated_at"])
    records.clear()
    return source, True


def source_secret_remove(slug: str, fingerprint: str) -> WebhookSource:
    """Remove the secret whose fingerprint starts with ``fingerprint`` (at least 6 of its
    characters); never the last one."""
    fingerprint = fingerprint.strip().lower()
    with transaction.atomic():
        source = _locked(slug, secrets=True)
        matches = [s for s in source.secrets if secret_fingerprint(s).startswith(fingerprint)]
        if len(fingerprint) < 6 or len(matches) != 1:
            known = ", ".join(secret_fingerprint(s) for s in source.secrets)
            raise SourceRefused(
                f"{slug}: no single secret has the fingerprint {fingerprint!r} (give at least "
                f"6 characters of one of: {known})."
            )
        if len(source.secrets) == 1:
            raise SourceRefused(
                f"{slug}: that is its only secret; add the new one first (a source with no "
                "secret could verify nothing), or disable the source."
            )
        source.secrets = [s for s in source.secrets if s != matches[0]]
        source.save(update_fields=["secrets", "updated_at"])
    records.clear()
    return source


def source_set_enabled(slug: str, enabled: bool) -> tuple[WebhookSource, bool]:
    """Enable or disable; returns the source and whether anything changed."""
    with transaction.atomic():
        source = _locked(slug)
        if source.enabled == enabled:
            return source, False
        source.enabled = enabled
        source.save(update_fields=["enabled", "updated_at"])
    records.clear()
    return source, True


def sources_reencrypt() -> tuple[int, list[str]]:
    """Encrypt every record's secrets again under the first SECRET_ENCRYPTION_KEYS key
    (the step of a key rotation that ``webhook_destination reencrypt`` runs), one short
    transaction per record. Returns how many it rewrote, and the records no key reads
    (named "source <slug>"), left as they were."""
    done, not_read = 0, []
    for pk, slug in WebhookSource.objects.order_by("pk").values_list("pk", "slug"):
        try:
            with transaction.atomic():
                source = WebhookSource.objects.select_for_update().only("id", "secrets").get(pk=pk)
                source.save(update_fields=["secrets"])  # read by any key, written by the first
        except SecretsUnreadable:
            not_read.append(f"source {slug}")
            continue
        done += 1
    return done, not_read


def _locked(slug: str, *, secrets: bool = False) -> WebhookSource:
    """The record, its row locked; its secrets read only when asked (``secrets``): a
    record no key reads can still be enabled or disabled, and is refused a rotation."""
    try:
        source = with_stored_secrets(WebhookSource.objects.select_for_update()).get(slug=slug)
    except WebhookSource.DoesNotExist:
        raise SourceRefused(f"no source record {slug!r} (add it first).") from None
    if secrets:
        try:
            source.secrets = secrets_decrypt(source.stored_secrets or [])
        except SecretsUnreadable as exc:
            raise SourceRefused(
                f"{slug}: its {exc.state}. Put back the key they were encrypted with, or "
                "give it new secrets in the admin (they replace them)."
            ) from None
    return source


def secret_count(source: WebhookSource) -> int:
    """How many secrets the record has: as set, or as stored when they were not read."""
    if "secrets" not in source.get_deferred_fields():
        return len(source.secrets)
    return len(getattr(source, "stored_secrets", None) or [])


def _check(source: WebhookSource) -> None:
    problem = slug_problem(source.slug)
    if WebhookSource.objects.filter(slug=source.slug).exists():
        problem = f"a source record {source.slug!r} exists already."
    if problem is None and not source.secrets:
        problem = "a source needs at least one secret: it verifies every request with them."
    problem = problem or secrets_problem(source.scheme, source.secrets)
    problem = problem or record_problem(source)
    if problem:
        raise SourceRefused(f"{source.slug}: {problem}")
