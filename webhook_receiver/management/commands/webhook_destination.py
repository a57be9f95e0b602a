"""Add, update or disable an outbox destination: idempotent, for deploy scripts.

    manage.py webhook_destination add merchant-7 --url https://merchant.example/hooks \\
        --secret whsec_... --rate 10/s --concurrency 4 --events order.paid,order.cancelled
    manage.py webhook_destination update merchant-7 --rate 5/s
    manage.py webhook_destination disable merchant-7
    manage.py webhook_destination reencrypt

``reencrypt`` encrypts every destination's secrets again under the first key of
DESTINATION_SECRET_KEYS, the step of a key rotation between adding the new key (first)
and removing the old one (docs/outbox.md).
"""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...outbound.encryption import SecretsUnreadable, secrets_encrypt
from ...outbound.models import WebhookDestination
from ...outbound.operations import destinations_reencrypt
from ...schemes.standard import secret_key
from ...sources.operations import sources_reencrypt

RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*(s|sec|second|m|min|minute|h|hour)\s*$")
UNIT_SECONDS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60}
UNIT_SECONDS |= {"h": 3600, "hour": 3600}


def parse_rate(text: str) -> tuple[int, float]:
    """'10/s', '600/m', '5/2s' -> (requests, seconds)."""
    match = RATE.match(text)
    if not match or int(match[1]) < 1:
        raise CommandError(
            f"--rate {text!r}: give requests per interval, like 10/s, 600/m or 5/2s."
        )
    seconds = float(match[2] or 1) * UNIT_SECONDS[match[3]]
    if seconds <= 0:
        raise CommandError(f"--rate {text!r}: the interval must be longer than zero.")
    return int(match[1]), seconds


class Command(BaseCommand):
    help = (
        "Add, update or disable a destination of the outbox (idempotent); reencrypt every "
        "destination's secrets under the first of DESTINATION_SECRET_KEYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["add", "update", "disable", "enable", "reencrypt"])
        parser.add_argument(
            "name", nargs="?", help="the destination's name (a slug); reencrypt takes none"
        )
        parser.add_argument("--url")
        parser.add_argument(
            "--secret",
            action="append",
            help="a Standard Webhooks secret (whsec_...); repeat during a rotation",
        )
        parser.add_argument("--events", help="comma-separated event types it is sent")
        parser.add_argument("--rate", help="requests per interval: 10/s, 600/m, 5/2s")
        parser.add_argument("--burst", type=int, help="starts allowed at once (default: the rate)")
        parser.add_argument("--concurrency", type=int, help="requests in flight at most")
        parser.add_argument("--timeout", type=float, help="seconds per request")
        parser.add_argument("--max-attempts", type=int)
        parser.add_argument("--backoff-base", type=float, help="seconds")
        parser.add_argument("--backoff-cap", type=float, help="seconds")

    def handle(self, *, action: str, name: str | None, **options: Any) -> None:
        try:
            self._act(action, name, options)
        except SecretsUnreadable as exc:  # no key, or not the one: the message says which
            raise CommandError(str(exc)) from exc

    def _act(self, action: str, name: str | None, options: dict[str, Any]) -> None:
        if action == "reencrypt":
            if name:
                raise CommandError("reencrypt takes no name: it rewrites every destination.")
            count = destinations_reencrypt()
            sources = sources_reencrypt()  # the source records' secrets share the keys
            self.stdout.write(
                f"re-encrypted the secrets of {count} destination(s) and {sources} source "
                "record(s) under the first key of DESTINATION_SECRET_KEYS; the others may be "
                "removed now"
            )
            return
        if not name:
            raise CommandError(f"{action} needs the destination's name.")
        fields = self._fields(options)
        existing = WebhookDestination.objects.filter(name=name).first()
        if action == "add" and existing is None:
            missing = [
                flag
                for flag, key in (("--url", "url"), ("--secret", "secrets"))
                if key not in fields
            ]
            if missing:
                raise CommandError(
                    f"add {name}: {' and '.join(missing)} required for a new destination."
                )
            destination = WebhookDestination(name=name, **fields)
            self._save(destination)
            self.stdout.write(f"added {name}: {self._describe(destination)}")
            return
        if existing is None:
            raise CommandError(f"no destination named {name!r} (add it first).")
        if action == "disable":
            fields["enabled"] = False
        elif action == "enable":
            fields["enabled"] = True
        changed = {k: v for k, v in fields.items() if getattr(existing, k) != v}
        for key, value in changed.items():
            setattr(existing, key, value)
        if changed:
            self._save(existing)
            self.stdout.write(
                f"updated {name} ({', '.join(sorted(changed))}): {self._describe(existing)}"
            )
        else:
            self.stdout.write(f"unchanged {name}: {self._describe(existing)}")

    def _fields(self, options: dict[str, Any]) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if options["url"]:
            fields["url"] = options["url"]
        if options["secret"]:
            for secret in options["secret"]:
                try:
                    secret_key(secret)
                except ValueError as exc:
                    raise CommandError(
                        "--secret: a Standard Webhooks secret is 'whsec_' + base64."
                    ) from exc
            fields["secrets"] = list(options["secret"])
            secrets_encrypt(fields["secrets"])  # as saving will: with no key set, say so now
        if options["events"] is not None:
            fields["event_types"] = [e.strip() for e in options["events"].split(",") if e.strip()]
        if options["rate"]:
            fields["rate_count"], fields["rate_seconds"] = parse_rate(options["rate"])
            fields.setdefault("burst", fields["rate_count"])
        for option, key in (
            ("burst", "burst"),
            ("concurrency", "max_in_flight"),
            ("timeout", "timeout_seconds"),
            ("max_attempts", "max_attempts"),
            ("backoff_base", "backoff_base_seconds"),
            ("backoff_cap", "backoff_cap_seconds"),
        ):
            if options[option] is not None:
                if options[option] <= 0:
                    raise CommandError(f"--{option.replace('_', '-')} must be above zero.")
                fields[key] = options[option]
        return fields

    def _save(self, destination: WebhookDestination) -> None:
        try:
            destination.full_clean(exclude=["tokens", "tokens_at"])
        except ValidationError as exc:
            problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            raise CommandError(problems) from exc
        destination.save()

    @staticmethod
    def _describe(d: WebhookDestination) -> str:
        state = "enabled" if d.enabled else "DISABLED"
        events = ",".join(d.event_types) or "no events"
        return (
            f"{state}, {d.url}, {events}, {d.rate_count}/{d.rate_seconds:g}s burst {d.burst}, "
            f"{d.max_in_flight} in flight, {len(d.secrets)} secret(s)"
        )
