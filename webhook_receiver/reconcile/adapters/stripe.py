"""The ``stripe`` adapter: Stripe's Events list, through the official SDK.

Options: ``API_KEY`` (a restricted key that may read events is enough); ``API_BASE``
(default Stripe's own; tests point it at a local server); ``TIMEOUT`` (20 s: one
request, from connect to the answer's last byte); ``TOTAL_TIMEOUT`` (600 s: the whole
listing, the SDK's retries and their waits included); ``MAX_PAGE_BYTES`` (10 MiB, the
largest answer read); ``MAX_NETWORK_RETRIES`` (2, the SDK's own retries, which honour
Stripe's headers and wait at most 5 s each). Events are listed with
``created[gte]``/``created[lt]`` and the SDK's auto-pagination. Stripe keeps 30 days of
events: a window older than that lists nothing.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx
import stripe

from ...network import peer_http
from ...network.egress import EgressRefused, configured_guard, configured_proxy
from ...network.egress_tunnel import EgressProxyRefused
from . import SenderEvent, SenderUnavailable

PAGE = 100  # Stripe's largest page


class BoundedHTTPClient(stripe.HTTPClient):
    """The SDK's requests through ``peer_http``: each over by its deadline whatever the
    server does, no answer read past ``max_bytes``, and none started once the listing's
    ``total_seconds`` are spent. Errors reach the SDK as its own APIConnectionError, so
    that its retry policy applies."""

    name = "webhook-receiver"

    def __init__(self, *, timeout: float, total_seconds: float, max_bytes: int) -> None:
        super().__init__()
        self._timeout = timeout
        self._total_seconds = total_seconds
        self._ends_at = time.monotonic() + total_seconds
        self._max_bytes = max_bytes
        verify = ssl.create_default_context(cafile=stripe.ca_bundle_path)
        # the egress guard as for any address someone typed (API_BASE is an option),
        # and through the egress proxy if there is one
        self._client = peer_http.client(
            timeout=timeout, verify=verify, guard=configured_guard(), proxy=configured_proxy()
        )

    # the body as bytes, as Stripe's own requests client returns it (HTTPClient says str)
    def request(  # type: ignore[override]
        self,
        method: str,
        url: str,
        headers: Mapping[str, str] | None,
        post_data: Any = None,
        *,
        _usage: list[str] | None = None,
    ) -> tuple[bytes, int, Mapping[str, str]]:
        left = self._ends_at - time.monotonic()
        if left <= 0:
            raise stripe.APIConnectionError(
                f"the listing ran past TOTAL_TIMEOUT ({self._total_seconds:g} s)",
                should_retry=False,
            )
        try:
            with (
                peer_http.deadline(min(self._timeout, left)),
                self._client.stream(method, url, headers=headers, content=post_data) as response,
            ):
                content = peer_http.body_whole(response, max_bytes=self._max_bytes)
        except peer_http.TooLarge as exc:
            raise stripe.APIConnectionError(
                f"the answer is larger than MAX_PAGE_BYTES ({self._max_bytes} bytes): {exc}",
                should_retry=False,
            ) from exc
        except (EgressRefused, EgressProxyRefused) as exc:  # no retry changes their rules
            raise stripe.APIConnectionError(str(exc), should_retry=False) from exc
        except httpx.HTTPError as exc:
            raise stripe.APIConnectionError(
                f"{type(exc).__name__}: {exc}", should_retry=True
            ) from exc
        return content, response.status_code, response.headers

    def close(self) -> None:
        self._client.close()


def list_events(
    *, options: Mapping[str, Any], since: datetime, until: datetime
) -> Iterator[list[SenderEvent]]:
    http_client = BoundedHTTPClient(
        timeout=float(options.get("TIMEOUT", 20)),
        total_seconds=float(options.get("TOTAL_TIMEOUT", 600)),
        max_bytes=int(options.get("MAX_PAGE_BYTES", 10 * 1024 * 1024)),
    )
    client = stripe.StripeClient(
        options.get("API_KEY", ""),
        base_addresses={"api": options["API_BASE"]} if options.get("API_BASE") else None,
        max_network_retries=int(options.get("MAX_NETWORK_RETRIES", 2)),
        http_client=http_client,
    )
    gte, lt = int(since.timestamp()), int(until.timestamp())
    page: list[SenderEvent] = []
    try:
        listing = client.v1.events.list(params={"created": {"gte": gte, "lt": lt}, "limit": PAGE})
        for event in listing.auto_paging_iter():
            page.append(sender_event(event.to_dict()))
            if len(page) >= PAGE:
                yield page
                page = []
    except stripe.StripeError as exc:
        raise SenderUnavailable(f"Stripe: {type(exc).__name__}: {exc.user_message or exc}") from exc
    finally:
        http_client.close()
    if page:
        yield page


def sender_event(event: Any) -> SenderEvent:
    """One of Stripe's events, in the http contract's terms; ``SenderUnavailable`` for
    one without an id, a type and a creation time a datetime can hold."""
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
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, OSError) as exc:
        raise SenderUnavailable(f"Stripe sent an event without id, type or created: {exc}") from exc
