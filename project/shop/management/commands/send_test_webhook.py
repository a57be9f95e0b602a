"""Send a correctly signed test event to a running endpoint."""

from __future__ import annotations

import json
import os
import shlex
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from project.devserver import address_file, reachable
from webhook_receiver import schemes
from webhook_receiver.conf import get_source


def default_url(slug: str) -> str:
    """Where the local server listens: the address `make run` wrote under var/ while it
    runs (whatever its port), else HOST and PORT from the environment (the demo's
    settings load .env into it), else 127.0.0.1:8000."""
    written = address_file()
    if written.exists():
        return f"{written.read_text().strip()}/webhooks/{slug}/"
    host = reachable(os.environ.get("HOST") or "127.0.0.1")
    port = os.environ.get("PORT") or "8000"
    return f"http://{host}:{port}/webhooks/{slug}/"


class Command(BaseCommand):
    help = (
        "Sign a test event with the source's first configured secret that can sign (a "
        "whpk_ public key cannot: give --secret then) and POST it: "
        '{"type": TYPE, "timestamp": now, "data": {"order_id", "version", and for '
        'inventory.* types "lines": [{"sku", "quantity"}]}}, the body shape of the demo '
        "shop's handlers. Repeat with the same --event-id to see the duplicate answer."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--source", default="shop", help="a slug of WEBHOOK_RECEIVER['SOURCES']; default shop"
        )
        parser.add_argument(
            "--url",
            help="default: where `make run` serves while it runs (it writes the address to "
            "var/devserver-address), else http://$HOST:$PORT/webhooks/<source>/ with HOST "
            "and PORT from the environment, then .env, else 127.0.0.1 and 8000",
        )
        parser.add_argument(
            "--type",
            default="inventory.reserved",
            help="the event type; default inventory.reserved. The demo shop handles "
            "inventory.reserved, inventory.released, order.paid, order.cancelled and "
            "order.fulfilled; a type without a handler is recorded as ignored",
        )
        parser.add_argument(
            "--secret",
            help="sign with this secret instead (a whsk_ signing key, say, for a source "
            "configured with its whpk_ public key)",
        )
        parser.add_argument("--event-id", help="message id; default: a new random one")
        parser.add_argument("--order-id", default="ord_1042", help="data.order_id")
        parser.add_argument(
            "--order-version", type=int, default=1, dest="order_version", help="data.version"
        )
        parser.add_argument("--sku", default="SKU-RED-M", help="the line's SKU (inventory.*)")
        parser.add_argument(
            "--quantity", type=int, default=1, help="the line's quantity (inventory.*)"
        )
        parser.add_argument(
            "--print-curl", action="store_true", help="print a curl command instead of sending"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        source = get_source(options["source"])
        if source is None:
            raise CommandError(f"No source {options['source']!r} in WEBHOOK_RECEIVER['SOURCES'].")
        url = options["url"] or default_url(source.slug)
        event_id = options["event_id"] or f"msg_{uuid.uuid4().hex}"
        now = int(time.time())
        data: dict[str, Any] = {
            "order_id": options["order_id"],
            "version": options["order_version"],
        }
        if options["type"].startswith("inventory."):
            data["lines"] = [{"sku": options["sku"], "quantity": options["quantity"]}]
        payload: dict[str, Any] = {"type": options["type"], "timestamp": now, "data": data}
        if source.scheme == "stripe":
            payload["id"] = event_id
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = self._signed(source, options["secret"], body, event_id, now)
        headers["Content-Type"] = "application/json"
        if source.scheme == "github":  # GitHub names the event in a header, not the body
            headers["X-GitHub-Event"] = options["type"]

        if options["print_curl"]:
            parts = ["curl", "-sS", "-X", "POST", url]
            for name, value in headers.items():
                parts += ["-H", f"{name}: {value}"]
            parts += ["--data-binary", body.decode()]
            self.stdout.write(shlex.join(parts))
            return

        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, answer = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, answer = exc.code, exc.read()
        except urllib.error.URLError as exc:
            raise CommandError(
                f"Could not reach {url}: {exc.reason}. Is the server running (make run), "
                "on this host and port (--url, or HOST and PORT)?"
            ) from exc
        self.stdout.write(f"POST {url}  event id {event_id}")
        self.stdout.write(f"{status} {answer.decode(errors='replace')}")

    @staticmethod
    def _signed(
        source: Any, given: str | None, body: bytes, event_id: str, now: int
    ) -> dict[str, str]:
        """The headers by ``given``, else by the first of the source's secrets that signs:
        a Standard Webhooks public key (whpk_) verifies and cannot (ValueError)."""
        for secret in [given] if given else source.secrets:
            try:
                return schemes.sign(
                    scheme=source.scheme,
                    secret=secret,
                    body=body,
                    message_id=event_id,
                    timestamp=now,
                )
            except ValueError:
                if given:
                    raise CommandError(f"--secret cannot sign for {source.scheme!r}.") from None
        raise CommandError(
            "None of the source's secrets can sign: public keys (whpk_) only verify. Give "
            "the sender's signing key with --secret whsk_…."
        )
