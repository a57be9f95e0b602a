"""Point the demo's outbox at its demo merchant (project/shop/merchant.py): `make run`
runs this at every start, so that the shop's events leave through the relay at once.

    manage.py demo_setup [--host 127.0.0.1] [--port 8000]

Idempotent: it creates or updates the destination ``demo-merchant`` (tenant ``demo``)
at ``http://HOST:PORT/demo-merchant/``, signing with DEMO_MERCHANT_SECRET, subscribed to
what the shop sends; with no usable secret it says so and does nothing.

The egress guard refuses loopback unless WEBHOOK_EGRESS_ALLOWED_NETWORKS allows it:
`make run`'s relay is started by project/devserver.py, which allows loopback unless the
environment or .env names that setting. Production's default allows nothing, so there
the relay refuses this destination at every send, whatever is saved here.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management.base import BaseCommand, CommandParser

from project.devserver import reachable
from webhook_receiver.models import WebhookDestination
from webhook_receiver.schemes import get_scheme

NAME = "demo-merchant"
TENANT = "demo"
# what the shop sends (project/shop/events.py): its orders' moves
EVENTS = ["order.*"]
# a destination's secret signs; below this much key material the app refuses it
SECRET_MIN_BYTES = 24


def secret_problem(secret: str) -> str | None:
    """Why DEMO_MERCHANT_SECRET cannot be the shared secret of the destination and the
    merchant, or None (the merchant verifies ``v1`` signatures: a ``whsec_`` secret)."""
    if not secret:
        return "is not set"
    scheme = get_scheme("standard")
    if not secret.startswith("whsec_") or scheme.secret_problem(secret) is not None:
        return "is not 'whsec_' + base64"
    if scheme.secret_bytes(secret) < SECRET_MIN_BYTES:
        return f"holds less than {SECRET_MIN_BYTES} bytes of key material"
    return None


def on_loopback(host: str) -> bool:
    """Whether ``host`` (as reachable() gives it) is a loopback address: what devserver
    lets `make run`'s relay reach."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name
        return host == "localhost"


class Command(BaseCommand):
    help = "Create or update the outbox destination demo-merchant, for `make run` (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="where `make run` serves")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *, host: str, port: int, **options: Any) -> None:
        secret = getattr(settings, "DEMO_MERCHANT_SECRET", "")
        problem = secret_problem(secret)
        if problem:  # the demo's receiving half works without it: say so, fail nothing
            self.stdout.write(
                f"demo_setup: DEMO_MERCHANT_SECRET {problem}: no demo merchant destination "
                "(a new .env has one; to an older one add whsec_ + base64 of 32 random bytes)."
            )
            return
        address = reachable(host)  # a server on every address is reached on loopback
        url = f"http://{address}:{port}/demo-merchant/"
        fields: dict[str, Any] = {
            "url": url,
            "tenant": TENANT,
            "secrets": [secret],
            "event_types": EVENTS,
        }
        existing = WebhookDestination.objects.filter(name=NAME).defer("secrets").first()
        if existing is None:
            destination = WebhookDestination(name=NAME, **fields)
            done = "created"
        else:
            destination = existing
            changed = [key for key, value in fields.items() if _differs(existing, key, value)]
            for key in changed:
                setattr(destination, key, fields[key])
            done = f"updated ({', '.join(changed)})" if changed else "unchanged"
        if done != "unchanged":
            try:
                destination.full_clean(exclude=["tokens", "tokens_at"])
                destination.save()
            except (ValidationError, ImproperlyConfigured) as exc:  # no key to encrypt with
                self.stdout.write(f"demo_setup: {NAME} not saved: {exc}")
                return
        note = (
            ""
            if on_loopback(address)
            else f" Not loopback: make run's relay sends there only if "
            f"WEBHOOK_EGRESS_ALLOWED_NETWORKS allows {address}."
        )
        self.stdout.write(
            f"demo_setup: {done} destination {NAME} (tenant {TENANT}): {url}, "
            f"{', '.join(EVENTS)}, signed with DEMO_MERCHANT_SECRET.{note}"
        )


def _differs(destination: WebhookDestination, field: str, value: Any) -> bool:
    """Whether the field holds something else. Secrets that no key decrypts (the app's
    SecretsUnreadable: a .env written afresh, with a new key) are replaced too."""
    try:
        return bool(getattr(destination, field) != value)
    except ImproperlyConfigured:
        return True
