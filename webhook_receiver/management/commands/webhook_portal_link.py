"""A link into the merchant portal for a tenant (docs/sending.md#the-merchant-portal), or
the end of its sessions.

    manage.py webhook_portal_link acme                          (read-only, for an hour)
    manage.py webhook_portal_link acme --capability recover --capability manage_endpoints
    manage.py webhook_portal_link acme --expires-in 1d --base-url https://shop.example/webhooks-portal/
    manage.py webhook_portal_link acme --revoke                 (every open session of acme)
    manage.py webhook_portal_link --revoke-session 12

The link opens the portal once, before it expires (an hour by default, 7 days at most),
for a session of ``PORTAL_SESSION_MINUTES``. Its token is in the fragment (after ``#``):
no server log or Referer header sees it. Give it to the tenant's owner only.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...portal.access import (
    DEFAULT_LINK_LIFETIME,
    PortalRefused,
    portal_link,
    portal_revoke,
)
from ...portal.models import Capability
from ..spans import SPAN_EXAMPLES, parse_span

BY = "manage.py webhook_portal_link"


class Command(BaseCommand):
    help = "Make a one-use link into the merchant portal for a tenant, or revoke portal sessions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", nargs="?", help="the tenant's key (a destination's tenant)")
        parser.add_argument(
            "--capability",
            action="append",
            default=[],
            choices=Capability.values,
            help="what it may do besides reading (repeat for several): "
            + "; ".join(f"{c.value}: {c.label}" for c in Capability),
        )
        parser.add_argument(
            "--expires-in",
            default="1h",
            help=f"how long the link may be used ({SPAN_EXAMPLES}; default 1h, at most 7d)",
        )
        parser.add_argument(
            "--base-url",
            help="the portal's address (default: the PORTAL_URL setting, else the path alone)",
        )
        parser.add_argument(
            "--revoke", action="store_true", help="end every open session of the tenant"
        )
        parser.add_argument(
            "--revoke-session", type=int, metavar="ID", help="end one session (its id)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = options["tenant"]
        if options["revoke_session"] is not None:
            ended = portal_revoke([options["revoke_session"]], tenant=tenant, by=BY)
            self.stdout.write(f"{ended} session ended" if ended else "no such open session")
            return
        if not tenant or not tenant.strip():
            raise CommandError("name the tenant: manage.py webhook_portal_link TENANT")
        if options["revoke"]:
            ended = portal_revoke(tenant=tenant, by=BY)
            self.stdout.write(f"{ended} open session(s) of {tenant} ended")
            return
        try:
            lifetime = parse_span(options["expires_in"])
        except OverflowError:
            lifetime = None
        if lifetime is None:
            raise CommandError(
                f"--expires-in {options['expires_in']!r} is not a span ({SPAN_EXAMPLES})"
            )
        try:
            link = portal_link(
                tenant,
                options["capability"],
                lifetime or DEFAULT_LINK_LIFETIME,
                by=BY,
                base_url=options["base_url"],
            )
        except PortalRefused as refused:
            raise CommandError(str(refused)) from None
        granted = ", ".join(link.record.capabilities) or "read-only"
        self.stderr.write(
            f"portal link for {tenant} ({granted}), usable once until "
            f"{link.record.expires_at.isoformat(timespec='seconds')}:"
        )
        self.stdout.write(link.url)
