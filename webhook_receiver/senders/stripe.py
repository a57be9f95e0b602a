"""The ``stripe`` adapter: Stripe's Events list, through the official SDK.

Options: ``API_KEY`` (a restricted key that may read events is enough); ``API_BASE``
(default Stripe's own; tests point it at a local server); ``TIMEOUT`` (20 s per request);
``MAX_NETWORK_RETRIES`` (2, the SDK's own retries, which honour Stripe's headers).
Events are listed with ``created[gte]``/``created[lt]`` and the SDK's auto-pagination.
Stripe keeps 30 days of events: a window older than that lists nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import stripe

from . import SenderEvent, SenderUnavailable

PAGE = 100  # Stripe's largest page


def list_events(
    *, options: Mapping[str, Any], since: datetime, until: datetime
) -> Iterator[list[SenderEvent]]:
    client = stripe.StripeClient(
        options.get("API_KEY", ""),
        base_addresses={"api": options["API_BASE"]} if options.get("API_BASE") else None,
        max_network_retries=int(options.get("MAX_NETWORK_RETRIES", 2)),
        http_client=stripe.HTTPXClient(
            timeout=float(options.get("TIMEOUT", 20)), allow_sync_methods=True
        ),
    )
    params = {
        "created": {"gte": int(since.timestamp()), "lt": int(until.timestamp())},
        "limit": PAGE,
    }
    page: list[SenderEvent] = []
    try:
        for event in client.v1.events.list(params=params).auto_paging_iter():
            page.append(_sender_event(event.to_dict()))
            if len(page) >= PAGE:
                yield page
                page = []
    except stripe.StripeError as exc:
        raise SenderUnavailable(f"Stripe: {type(exc).__name__}: {exc.user_message or exc}") from exc
    if page:
        yield page


def _sender_event(event: dict[str, Any]) -> SenderEvent:
    try:
        created_at = datetime.fromtimestamp(int(event["created"]), UTC)
        data = event.get("data", {}).get("object", {})
        return SenderEvent(
            id=str(event["id"]),
            type=str(event["type"]),
            created_at=created_at,
            data=data if isinstance(data, dict) else {},
            payload=event,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SenderUnavailable(f"Stripe sent an event without id, type or created: {exc}") from exc
