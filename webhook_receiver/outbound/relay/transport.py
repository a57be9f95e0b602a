"""Sending: one signed request per claimed message, concurrently, with no transaction
open, each over by the destination's timeout from connect to the last byte kept."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
from django.utils import timezone

from ...core import storable, tracing
from ...core.peer_http import body_start, charset_of, text_of
from ...core.peer_http import client as peer_client
from ...core.peer_http import deadline as request_deadline
from ...schemes.standard import StandardWebhooks
from ..models import WebhookDestination
from .claim import CLAIM_BATCH
from .messages import Claimed, Sent

EXCERPT_CHARS = 500


# bytes of an answer's body read for its excerpt
EXCERPT_BYTES = EXCERPT_CHARS * 4


_clients: dict[tuple[int, str, float], httpx.Client] = {}


_clients_lock = threading.Lock()


# the evaluation harness's network (webhook_eval), in place of the sockets; None: real
_simulated: httpx.BaseTransport | None = None


def _client(dest: WebhookDestination) -> httpx.Client:
    """One client per destination and process: its connections are reused."""
    ident = (dest.pk, dest.url, dest.timeout_seconds)
    with _clients_lock:
        client = _clients.get(ident)
        if client is None:
            limits = httpx.Limits(max_connections=max(1, dest.max_in_flight))
            if _simulated is not None:
                client = httpx.Client(transport=_simulated, timeout=dest.timeout_seconds)
            else:
                client = peer_client(timeout=dest.timeout_seconds, limits=limits)
            _clients[ident] = client
        return client


@contextmanager
def simulated_network(transport: httpx.BaseTransport) -> Iterator[None]:
    """Every request the relay sends in this block goes to ``transport`` (an
    ``httpx.MockTransport``) instead of a socket: the evaluation harness's merchants.
    Everything above the client (signing, the deadline, what an answer means) is
    unchanged."""
    global _simulated
    with _clients_lock:
        _clients.clear()
        _simulated = transport
    try:
        yield
    finally:
        with _clients_lock:
            _clients.clear()
            _simulated = None


def signed_request(
    dest: WebhookDestination, message: Claimed, timestamp: int
) -> tuple[bytes, dict]:
    """The body and headers of one attempt: the stable key as ``webhook-id`` and
    ``Idempotency-Key``, and a Standard Webhooks signature by each of the destination's
    secrets (space-separated, so a rotation verifies with either)."""
    body = json.dumps(message.payload, separators=(",", ":"), ensure_ascii=False).encode()
    scheme = StandardWebhooks()
    signatures = [
        scheme.sign(secret=secret, body=body, message_id=message.key, timestamp=timestamp)
        for secret in dest.secrets
    ]
    headers = {
        "content-type": "application/json",
        # the excerpt is the answer's first bytes as sent: nothing to inflate
        "accept-encoding": "identity",
        "user-agent": "webhook-receiver-relay",
        "idempotency-key": message.key,
        "webhook-id": message.key,
        "webhook-timestamp": str(timestamp),
    }
    if signatures:
        headers["webhook-signature"] = " ".join(s["webhook-signature"] for s in signatures)
    return body, headers


_pools: dict[int, ThreadPoolExecutor] = {}


def _executor(destination_id: int) -> ThreadPoolExecutor:
    """Sending threads per destination and process, made on first use (after a Celery
    worker has forked, so that no thread crosses a fork): one destination's requests
    that hang never hold a thread another destination's round needs."""
    with _clients_lock:
        pool = _pools.get(destination_id)
        if pool is None:
            pool = ThreadPoolExecutor(
                max_workers=CLAIM_BATCH, thread_name_prefix=f"relay-send-{destination_id}"
            )
            _pools[destination_id] = pool
        return pool


def relay_send(dest: WebhookDestination, claimed: list[Claimed]) -> list[Sent]:
    """Send each claimed message once, concurrently; never raises for a message."""
    if not claimed:
        return []
    context = tracing.current_context()  # the round's span, for the sending threads
    if len(claimed) == 1:
        return [_send_one(dest, claimed[0], context)]
    return list(_executor(dest.pk).map(lambda m: _send_one(dest, m, context), claimed))


def _send_one(dest: WebhookDestination, message: Claimed, context: object = None) -> Sent:
    """One delivery in a ``webhook.deliver`` span (with OpenTelemetry): a child of the
    span that admitted the message, else of the round's."""
    with tracing.span(
        "webhook.deliver",
        kind=tracing.CLIENT,
        traceparent=message.traceparent,
        context=context,
        destination=dest.name,
        message_key=message.key,
        attempt=message.attempt,
    ) as span:
        sent = _request(dest, message)
        error = sent.error.split(":", 1)[0] if sent.error else None  # the class, no more
        tracing.annotate(span, status_code=sent.status_code, error=error)
        return sent


def _request(dest: WebhookDestination, message: Claimed) -> Sent:
    """One request, over by the destination's timeout from connect to the last byte of
    the excerpt, whatever the destination does (a status line, headers or a body that
    trickle): its lease, timeout + LEASE_MARGIN, always outlives it. What is kept of the
    answer is made storable here."""
    # the start is the claim's (its token spent), whatever the thread, the client's
    # construction or the machine's load made of the moments between
    started_at = message.claimed_at or timezone.now()
    began = time.monotonic()
    body, headers = signed_request(dest, message, int(time.time()))
    tracing.inject(headers)  # the delivery's span goes on at the merchant's end
    try:
        client = _client(dest)
        with (
            request_deadline(dest.timeout_seconds),
            client.stream("POST", dest.url, content=body, headers=headers) as response,
        ):
            # the status line decides the verdict; the body is only for an operator
            data = body_start(response, max_bytes=EXCERPT_BYTES)
            status_code = response.status_code
            retry_after = response.headers.get("retry-after")
            charset = charset_of(response)
    except Exception as exc:  # no answer: refused, reset, timed out, or a URL httpx refuses
        return Sent(
            message=message,
            started_at=started_at,
            duration_ms=_ms_since(began),
            error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS),
        )
    return Sent(
        message=message,
        started_at=started_at,
        duration_ms=_ms_since(began),
        status_code=status_code,
        excerpt=storable.text(text_of(data, charset), EXCERPT_CHARS),
        retry_after=retry_after,
    )


def _ms_since(began: float) -> int:
    return round((time.monotonic() - began) * 1000)
