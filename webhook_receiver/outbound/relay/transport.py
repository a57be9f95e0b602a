"""Sending: one signed request per claimed message, with no transaction open, each over
by the destination's timeout from connect to the last byte kept.

``deliver`` makes one attempt and says what came of it (``Sent``), whatever the peer
did: it signs the request, sends it through a ``Transport`` and keeps what may be
stored of the answer. The relay's transport is ``PeerTransport`` (session.py: aiohttp,
the egress guard and proxy, one deadline a request); the evaluation harness gives its
own, whose merchants answer in simulated time. Every request goes through ``deliver``
either way.

A request that got no answer is named in one vocabulary, whatever the library raised
(``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``RemoteProtocolError``,
``ProxyError``, …), so that an attempt's error reads the same to an operator whatever
sent it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from django.utils import timezone

from ...core import storable, tracing
from ...network.egress import (
    EgressRefused,
)
from ...network.egress_tunnel import (
    EgressProxyRefused,
)
from ...network.peer_http import text_of
from ...schemes.standard import StandardWebhooks
from ..models import WebhookDestination
from .messages import EGRESS_GUARD, EGRESS_PROXY, EXCERPT_CHARS, Claimed, Sent

USER_AGENT = "webhook-receiver-relay"


@dataclass(frozen=True)
class Answer:
    """What is kept of an answer: its status, Retry-After, the charset it names and the
    first EXCERPT_BYTES of its body, as sent."""

    status: int
    retry_after: str | None = None
    charset: str | None = None
    body: bytes = b""


class NoAnswer(Exception):
    """A request that got no answer: ``kind`` names it (ConnectError, ReadTimeout, …)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class Transport(Protocol):
    """Where requests go: the relay's ``PeerTransport``, or a harness's network."""

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, timeout: float
    ) -> Answer:
        """One POST, over by ``timeout`` seconds from its start to the last byte kept.
        Raises EgressRefused or EgressProxyRefused when no request may be made, and
        NoAnswer when one was made and no answer came."""

    async def close(self) -> None:
        """Its connections closed."""


# --- signing and one delivery ------------------------------------------------------------


def signed_request(
    dest: WebhookDestination, message: Claimed, timestamp: int
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one attempt: the stable key as ``webhook-id`` and
    ``Idempotency-Key``, and a Standard Webhooks signature by each of the destination's
    secrets, ``v1`` by a ``whsec_`` secret and ``v1a`` by a ``whsk_`` signing key
    (space-separated, so a rotation verifies with either)."""
    body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode()
    scheme = StandardWebhooks()
    signatures = [
        scheme.sign(secret=secret, body=body, message_id=message.key, timestamp=timestamp)
        for secret in dest.signing_with(timestamp)
    ]
    headers = {
        "content-type": "application/json",
        # the excerpt is the answer's first bytes as sent: nothing to inflate
        "accept-encoding": "identity",
        "user-agent": USER_AGENT,
        "idempotency-key": message.key,
        "webhook-id": message.key,
        "webhook-timestamp": str(timestamp),
    }
    if signatures:
        headers["webhook-signature"] = " ".join(s["webhook-signature"] for s in signatures)
    return body, headers


async def deliver(
    transport: Transport,
    dest: WebhookDestination,
    message: Claimed,
    started_at: datetime | None = None,
) -> Sent:
    """One delivery, in a ``webhook.deliver`` span (with OpenTelemetry): a child of the
    span that admitted the message. ``started_at`` is the attempt's start as recorded:
    by default the moment its claim spent the token (``claimed_at``), whatever the
    loop's load made of the moments between. Never raises for the message."""
    with tracing.span(
        "webhook.deliver",
        kind=tracing.CLIENT,
        traceparent=message.traceparent,
        destination=dest.name,
        message_key=message.key,
        attempt=message.attempt,
    ) as span:
        at = started_at or message.claimed_at or timezone.now()
        sent = await _attempt(transport, dest, message, at)
        error = sent.error.split(":", 1)[0] if sent.error else None  # the class, no more
        tracing.annotate(span, status_code=sent.status_code, error=error)
        return sent


async def _attempt(
    transport: Transport, dest: WebhookDestination, message: Claimed, started_at: datetime
) -> Sent:
    # the loop's clock: the monotonic clock, or a harness's simulated one
    clock = asyncio.get_running_loop().time
    began = clock()
    body, headers = signed_request(dest, message, int(time.time()))
    tracing.inject(headers)  # the delivery's span goes on at the merchant's end

    def sent(**fields: Any) -> Sent:
        duration = round((clock() - began) * 1000)
        return Sent(message=message, started_at=started_at, duration_ms=duration, **fields)

    try:
        answer = await transport.post(dest.url, body, headers, timeout=dest.timeout_seconds)
    except (EgressRefused, EgressProxyRefused) as exc:  # no retry changes either
        return sent(
            error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS),
            refused_by=EGRESS_GUARD if isinstance(exc, EgressRefused) else EGRESS_PROXY,
        )
    except NoAnswer as exc:
        return sent(error=storable.text(f"{exc.kind}: {exc}", EXCERPT_CHARS))
    except Exception as exc:  # a transport's own failure: no answer all the same
        return sent(error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS))
    return sent(
        status_code=answer.status,
        excerpt=storable.text(text_of(answer.body, answer.charset), EXCERPT_CHARS),
        retry_after=answer.retry_after,
    )
