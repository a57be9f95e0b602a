"""Sources kept as records, without a deploy: list them, add one, rotate a secret in and
out, enable or disable one. Every change is live in every process within
SOURCE_RECORDS_TTL_SECONDS (no restart).

    manage.py webhook_source list
    manage.py webhook_source add acme --scheme standard --secret whsec_...
    manage.py webhook_source add-secret acme --secret whsec_...      (rotation: 1. the new one)
    manage.py webhook_source list acme        (which secret verified requests, and when)
    manage.py webhook_source remove-secret acme 3f9a1c2b              (2. the old, unused one)
    manage.py webhook_source disable acme     (answered 404, as an unknown slug; audited)
    manage.py webhook_source enable acme

Secrets are shown by fingerprint only (the first characters of their SHA-256), as the
audit records and the admin name them.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ...conf import app_settings
from ...core.encryption import secrets_decrypt, secrets_unreadable, with_stored_secrets
from ...core.fingerprints import secret_fingerprint
from ...presentation.display import duration_text
from ...schemes import SCHEMES
from ...sources.models import WebhookSource
from ...sources.operations import (
    SourceRefused,
    secret_count,
    secrets_weak,
    source_add,
    source_secret_add,
    source_secret_remove,
    source_set_enabled,
)
from ...watch.secrets import secrets_last_verified

ACTIONS = ["list", "add", "add-secret", "remove-secret", "enable", "disable"]


class Command(BaseCommand):
    help = (
        "Sources kept as records: list, add, add-secret / remove-secret (a rotation), "
        "enable, disable. Live in every process within SOURCE_RECORDS_TTL_SECONDS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS)
        parser.add_argument("slug", nargs="?", help="the source's slug (list: optional)")
        parser.add_argument(
            "fingerprint", nargs="?", help="remove-secret: the secret's fingerprint (6+ chars)"
        )
        parser.add_argument("--scheme", choices=list(SCHEMES), default="standard")
        parser.add_argument(
            "--event-key",
            choices=["delivery_id", "signed_body"],
            help="what keys its events (add): the delivery id, or the signed body's SHA-256; "
            "by default the scheme's choice (GitHub: the signed body)",
        )
        parser.add_argument("--secret", action="append", help="a signing secret; add: repeatable")
        parser.add_argument("--tolerance", type=int, help="seconds a timestamp may be off")
        parser.add_argument("--max-body-bytes", type=int)
        parser.add_argument(
            "--silence-after", type=int, help="seconds without an event before an alert; 0: never"
        )

    def handle(self, *, action: str, slug: str | None, **options: Any) -> None:
        if action != "list" and not slug:
            raise CommandError(f"{action} needs the source's slug.")
        try:
            self._act(action, slug or "", options)
        except (SourceRefused, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from exc

    def _act(self, action: str, slug: str, options: dict[str, Any]) -> None:
        ttl = f"live within {app_settings().source_records_ttl:g} s in every process"
        if action == "list":
            self._list(slug)
        elif action == "add":
            secrets = options["secret"] or []
            extra = {
                key: options[option]
                for option, key in (
                    ("tolerance", "tolerance_seconds"),
                    ("max_body_bytes", "max_body_bytes"),
                    ("silence_after", "silence_after_seconds"),
                    ("event_key", "event_key"),
                )
                if options[option] is not None
            }
            source = source_add(slug=slug, scheme=options["scheme"], secrets=secrets, **extra)
            self.stdout.write(f"added {slug}: {self._describe(source)}; {ttl}")
            self._warn_weak(source)
        elif action == "add-secret":
            if not options["secret"] or len(options["secret"]) != 1:
                raise CommandError("add-secret takes one --secret.")
            source, added = source_secret_add(slug, options["secret"][0])
            fingerprint = secret_fingerprint(options["secret"][0])
            if added:
                self.stdout.write(
                    f"added secret {fingerprint} to {slug}: {self._describe(source)}; {ttl}. "
                    "Remove the old one once `webhook_source list "
                    f"{slug}` shows it has stopped verifying requests."
                )
                self._warn_weak(source)
            else:
                self.stdout.write(f"unchanged {slug}: it has secret {fingerprint} already")
        elif action == "remove-secret":
            if not options["fingerprint"]:
                raise CommandError("remove-secret needs the secret's fingerprint (see list).")
            source = source_secret_remove(slug, options["fingerprint"])
            self.stdout.write(f"removed a secret from {slug}: {self._describe(source)}; {ttl}")
        else:
            enabled = action == "enable"
            source, changed = source_set_enabled(slug, enabled)
            lead = f"{action}d {slug}" if changed else f"unchanged {slug}, already {action}d"
            line = f"{lead}: {self._describe(source)}"
            if changed:
                line += f"; {ttl}"
            if not enabled:
                line += ". Its requests are answered 404, as an unknown slug's, each audited"
            self.stdout.write(line)

    def _list(self, slug: str) -> None:
        sources = with_stored_secrets(WebhookSource.objects.all())
        if slug:
            sources = sources.filter(slug=slug)
            if not sources.exists():
                raise CommandError(f"no source record {slug!r}.")
        shadowed = app_settings().sources
        rows = list(sources)
        if not rows:
            self.stdout.write("no source records (the settings' sources: manage.py check)")
        for source in rows:
            self.stdout.write(f"{source.slug}: {self._describe(source)}")
            if source.slug in shadowed:
                self.stdout.write(
                    "  NOT USED: WEBHOOK_RECEIVER['SOURCES'] defines this slug (check W005)"
                )
            unreadable = secrets_unreadable(source)
            if unreadable is not None:
                self.stdout.write(
                    f"  SECRETS UNREADABLE ({unreadable.state}): its requests are answered "
                    "503. Put back the key they were encrypted with, or give it new "
                    "secrets in the admin (they replace them)"
                )
                continue
            secrets = secrets_decrypt(source.stored_secrets or [])
            now = timezone.now()
            last = secrets_last_verified(source.slug, secrets)
            for secret in secrets:
                fingerprint = secret_fingerprint(secret)
                at = last.get(fingerprint)
                when = "verified no request in the audit records kept"
                if at is not None:
                    ago, moment = duration_text(now - at), at.astimezone(UTC)
                    when = f"last verified a request {ago} ago ({moment:%Y-%m-%d %H:%M} UTC)"
                self.stdout.write(f"  secret {fingerprint}: {when}")

    def _warn_weak(self, source: WebhookSource) -> None:
        weak = secrets_weak(source.scheme, source.secrets)
        if weak:
            self.stderr.write(f"warning: {source.slug}: {weak}.")

    @staticmethod
    def _describe(s: WebhookSource) -> str:
        state = "enabled" if s.enabled else "DISABLED"
        silence = f"silence after {s.silence_after_seconds}s" if s.silence_after_seconds else ""
        parts = [
            state,
            s.scheme,
            f"{secret_count(s)} secret(s)",
            f"tolerance {s.tolerance_seconds}s",
        ]
        parts += [f"max body {s.max_body_bytes} B"] + ([silence] if silence else [])
        return ", ".join(parts)
