"""Add, update or disable an outbox destination: idempotent, for deploy scripts.

    manage.py webhook_destination add merchant-7 --url https://merchant.example/hooks \\
        --secret whsec_... --rate 10/s --concurrency 4 --events order.paid,order.cancelled
    manage.py webhook_destination add merchant-8 --url https://… --signing-key
    manage.py webhook_destination update merchant-7 --rate 5/s
    manage.py webhook_destination disable merchant-7
    manage.py webhook_destination enable merchant-7      (or: update merchant-7 --enable)
    manage.py webhook_destination reencrypt

Disabling holds the destination's messages; enabling it again (one the relay disabled
after a 410 Gone or a long failing span too) sends them, in their order
(operations.destination_enable). ``reencrypt`` encrypts every destination's secrets
again under the first key of SECRET_ENCRYPTION_KEYS, the step of a key rotation
between adding the new key (first) and removing the old one (docs/sending.md).

``--signing-key`` generates an Ed25519 signing key (``whsk_``, signature ``v1a``) and
prints its public key (``whpk_``) for the merchant; the signing key is never printed.
``add`` generates one only when the destination has none (so a deploy script may repeat
it); ``update`` always adds a new one beside the current secrets, the start of a rotation.
``--secret`` replaces the secrets with those given (``whsec_`` secrets or ``whsk_`` keys).
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...core.encryption import SecretsUnreadable, secrets_encrypt
from ...network.egress import UrlRefused, check_url
from ...outbound.catalog import subscription_problems
from ...outbound.filters import filter_problem
from ...outbound.models import WebhookDestination
from ...outbound.operations import (
    destination_disable,
    destination_enable,
    destinations_reencrypt,
)
from ...outbound.signing_secrets import destination_secret_problem
from ...outbound.tenancy import EVERY_TENANT
from ...presentation.display import url_masked
from ...schemes.standard_keys import (
    is_signing_key,
    new_signing_key,
    public_key_of,
    public_keys_of,
)
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


def _filter(text: str) -> Any:
    """--filter's JSON, checked; "" clears it."""
    if not text.strip():
        return None
    try:
        spec = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--filter: not JSON ({exc})") from None
    problem = filter_problem(spec)
    if problem is not None:
        raise CommandError(f"--filter: {problem}")
    return spec


class Command(BaseCommand):
    help = (
        "Add, update or disable a destination of the outbox (idempotent); reencrypt every "
        "destination's secrets under the first of SECRET_ENCRYPTION_KEYS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["add", "update", "disable", "enable", "reencrypt"])
        parser.add_argument(
            "name", nargs="?", help="the destination's name (a slug); reencrypt takes none"
        )
        parser.add_argument("--url")
        parser.add_argument(
            "--tenant", help="whose it is: the host's key for the merchant account ('': none)"
        )
        parser.add_argument(
            "--secret",
            action="append",
            help="a Standard Webhooks secret (whsec_...) or Ed25519 signing key (whsk_...); "
            "replaces the current ones; repeat during a rotation",
        )
        parser.add_argument(
            "--signing-key",
            action="store_true",
            help="generate an Ed25519 signing key (signature v1a) and print its public key: "
            "on add when the destination has none, on update always (a rotation)",
        )
        parser.add_argument(
            "--events",
            help="comma-separated event types it is sent, and groups (order.*: each declared "
            "type of the group but the opt-in ones)",
        )
        parser.add_argument(
            "--filter",
            help='which of those events it is sent, in JSON: \'{"data.status": "paid"}\'; '
            '"": every one (docs/sending.md#filters)',
        )
        parser.add_argument("--rate", help="requests per interval: 10/s, 600/m, 5/2s")
        parser.add_argument("--burst", type=int, help="starts allowed at once (default: the rate)")
        parser.add_argument("--concurrency", type=int, help="requests in flight at most")
        parser.add_argument("--timeout", type=float, help="seconds per request")
        parser.add_argument("--max-attempts", type=int)
        parser.add_argument("--backoff-base", type=float, help="seconds")
        parser.add_argument("--backoff-cap", type=float, help="seconds")
        switch = parser.add_mutually_exclusive_group()
        switch.add_argument(
            "--enable",
            action="store_true",
            help="enable it: its held messages are sent, in their order",
        )
        switch.add_argument(
            "--disable", action="store_true", help="disable it: its messages are held"
        )

    def handle(self, *, action: str, name: str | None, **options: Any) -> None:
        try:
            self._act(action, name, options)
        except SecretsUnreadable as exc:  # no key, or not the one: the message says which
            raise CommandError(str(exc)) from exc

    def _act(self, action: str, name: str | None, options: dict[str, Any]) -> None:
        if action == "reencrypt":
            if name:
                raise CommandError("reencrypt takes no name: it rewrites every destination.")
            count, not_read = destinations_reencrypt()
            sources, sources_not_read = sources_reencrypt()  # the same keys encrypt them
            not_read += sources_not_read
            done = (
                f"re-encrypted the secrets of {count} destination(s) and {sources} source "
                "record(s) under the first key of SECRET_ENCRYPTION_KEYS"
            )
            if not_read:
                raise CommandError(
                    f"{done}; no key decrypts the secrets of {', '.join(not_read)}: put "
                    "back the key they were encrypted with, or set new secrets "
                    "(update NAME --secret ...), then run reencrypt again before removing "
                    "an old key."
                )
            self.stdout.write(f"{done}; the others may be removed now")
            return
        if not name:
            raise CommandError(f"{action} needs the destination's name.")
        fields = self._fields(options)
        # its secrets read apart: one no key decrypts can still be given new ones
        existing = WebhookDestination.objects.filter(name=name).defer("secrets").first()
        generated = None
        if options["signing_key"]:
            readable = existing is not None and _secrets_unreadable(existing) is None
            current = fields.get("secrets", existing.secrets if existing and readable else [])
            if action == "update" or not any(is_signing_key(s) for s in current):
                generated = new_signing_key()
                fields["secrets"] = [generated, *current]
                secrets_encrypt(fields["secrets"])  # as saving will: with no key, say so now
        self._add_or_change(action, name, fields, existing, options)
        if generated is not None:
            self.stdout.write(
                f"new signing key for {name}; give the merchant its public key, to verify "
                f"v1a signatures with: {public_key_of(generated)}"
            )

    def _add_or_change(
        self,
        action: str,
        name: str,
        fields: dict[str, Any],
        existing: WebhookDestination | None,
        options: dict[str, Any],
    ) -> None:
        if action == "add" and existing is None:
            missing = [
                flag
                for flag, key in (("--url", "url"), ("--secret or --signing-key", "secrets"))
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
        unreadable = _secrets_unreadable(existing)
        changed = {
            k: v
            for k, v in fields.items()
            if (k == "secrets" and unreadable) or getattr(existing, k) != v
        }
        for key, value in changed.items():
            setattr(existing, key, value)
        if changed:
            self._save(existing)
        switched = self._switch(existing, action, options)
        existing.refresh_from_db()
        if changed:
            self.stdout.write(
                f"updated {name} ({', '.join(sorted(changed))}): {self._describe(existing)}"
            )
        if switched:
            self.stdout.write(f"{switched}: {self._describe(existing)}")
        elif not changed:
            self.stdout.write(f"unchanged {name}: {self._describe(existing)}")

    def _switch(self, dest: WebhookDestination, action: str, options: dict[str, Any]) -> str:
        """Enable or disable it (the operations the admin uses); what it did ("": nothing)."""
        by = "manage.py webhook_destination"
        if action == "enable" or options.get("enable"):
            held = destination_enable(scope=EVERY_TENANT, destination=dest, by=by)
            if held is None:
                return ""
            return f"enabled {dest.name} ({held} held message(s) to send, in their order)"
        disabling = action == "disable" or options.get("disable")
        if disabling and destination_disable(scope=EVERY_TENANT, destination=dest, by=by):
            return f"disabled {dest.name} (its messages are held until it is enabled)"
        return ""

    def _fields(self, options: dict[str, Any]) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        if options["url"]:
            try:
                warning = check_url(options["url"])
            except UrlRefused as exc:
                raise CommandError(f"--url: {exc}") from None
            if warning:  # saved all the same: the guard checks it again before each send
                self.stderr.write(self.style.WARNING(f"warning: --url: {warning}"))
            fields["url"] = options["url"]
        if options["secret"]:
            for n, secret in enumerate(options["secret"], 1):
                problem = destination_secret_problem(secret)
                if problem:  # said of the flag, never showing the secret
                    raise CommandError(f"--secret #{n} {problem}.")
            fields["secrets"] = list(options["secret"])
            secrets_encrypt(fields["secrets"])  # as saving will: with no key set, say so now
        if options["tenant"] is not None:
            fields["tenant"] = options["tenant"].strip()
        if options["events"] is not None:
            events = [e.strip() for e in options["events"].split(",") if e.strip()]
            problems = subscription_problems(events)
            if problems:
                raise CommandError(f"--events: {'; '.join(problems)}")
            fields["event_types"] = events
        if options["filter"] is not None:
            fields["filter"] = _filter(options["filter"])
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
        # secrets left unread (none of the keys decrypts them) are neither checked nor
        # written: save() writes the fields it loaded
        unread = ["secrets"] if "secrets" in destination.get_deferred_fields() else []
        try:
            destination.full_clean(exclude=["tokens", "tokens_at", *unread])
        except ValidationError as exc:
            problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            raise CommandError(problems) from exc
        destination.save()

    @staticmethod
    def _describe(d: WebhookDestination) -> str:
        state = "enabled" if d.enabled else "DISABLED"
        if d.disabled_by_relay:
            state = f"DISABLED by the relay ({d.disabled_reason})"
        events = ",".join(d.event_types) or "no events"
        unreadable = _secrets_unreadable(d)
        if unreadable:
            secrets = unreadable.state
        else:
            public = "".join(f", public key {key}" for key in public_keys_of(d.secrets))
            secrets = f"{len(d.secrets)} secret(s){public}"
        owner = f"tenant {d.tenant}, " if d.tenant else ""
        kept = f", filter {json.dumps(d.filter, ensure_ascii=False)}" if d.filter else ""
        return (
            f"{owner}{state}, {url_masked(d.url)}, {events}{kept}, "
            f"{d.rate_count}/{d.rate_seconds:g}s burst {d.burst}, "
            f"{d.max_in_flight} in flight, {secrets}"
        )


def _secrets_unreadable(d: WebhookDestination) -> SecretsUnreadable | None:
    """Why the destination's secrets cannot be read (they stay unloaded), or None."""
    try:
        d.secrets  # noqa: B018 (loads a deferred field, which decrypts it)
    except SecretsUnreadable as exc:
        return exc
    return None
