"""The merchant portal's keys (docs/sending.md#the-merchant-portal), a part of
``AppSettings``: declared here, read like every other key (``app_settings().portal_url``)."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import key
from .readers import at_least_one, origin_list, text_or_none


@dataclass(frozen=True)
class PortalKeys:
    portal_url: str | None = key(
        "PORTAL_URL",
        None,
        text_or_none,
        "the portal's address as a merchant reaches it (`https://shop.example/webhooks-portal/`"
        ", where the host mounts `webhook_receiver.portal.urls`): the start of the links "
        "`portal_link` and `manage.py webhook_portal_link` make; `None`: the link is the "
        "path alone ([the portal](sending.md#the-merchant-portal))",
    )
    portal_session_minutes: int = key(
        "PORTAL_SESSION_MINUTES",
        60,
        at_least_one(int, " of minutes"),
        "how long a portal session lasts once a link is exchanged for it (or the host's own "
        "page opens it); revoked sooner from the admin or with `webhook_portal_link "
        "--revoke`",
    )
    portal_actions_per_minute: int = key(
        "PORTAL_ACTIONS_PER_MINUTE",
        30,
        at_least_one(int),
        "actions (anything that changes something) one portal session may take in a "
        "minute; beyond, it is answered 429 until the minute has passed",
    )
    portal_frame_ancestors: tuple[str, ...] = key(
        "PORTAL_FRAME_ANCESTORS",
        [],
        origin_list,
        "the origins (`https://admin.shop.example`) whose pages may show the portal in an "
        "iframe: its pages alone answer `Content-Security-Policy: frame-ancestors` with "
        "them; empty: the portal is framed by nothing (X-Frame-Options as the host sets it)",
    )
