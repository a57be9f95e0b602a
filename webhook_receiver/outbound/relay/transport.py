"""Sending: one signed request per claimed message, with no transaction open, each over
by the destination's timeout from connect to the last byte kept.

A run's requests in flight are its ``Window``: started as they are claimed, their answers
collected as they come, so that a slow answer holds its own slot and nothing else (the
run records the answers that came and claims their replacements meanwhile).
``ThreadWindow`` sends on threads kept per destination; the evaluation harness gives its
own window, whose merchants answer in simulated time, and every request goes through
``deliver`` either way (signing, the deadline, what is kept of the answer).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Protocol

import httpx
from django.utils import timezone

from ...conf.egress_proxy import EgressProxy
from ...core import storable, tracing
from ...core.egress import EgressGuard, EgressRefused, configured_guard, configured_proxy
from ...core.egress_tunnel import EgressProxyRefused
from ...core.peer_http import body_start, charset_of, text_of
from ...core.peer_http import client as peer_client
from ...core.peer_http import deadline as request_deadline
from ...schemes.standard import StandardWebhooks
from ..models import WebhookDestination
from .messages import EGRESS_GUARD, EGRESS_PROXY, Claimed, Sent

EXCERPT_CHARS = 500
# bytes of an answer's body read for its excerpt
EXCERPT_BYTES = EXCERPT_CHARS * 4


class Window(Protocol):
    """A run's requests in flight."""

    def start(self, dest: WebhookDestination, claimed: list[Claimed]) -> None:
        """Send each claimed message once (never raises for a message)."""

    def collect(self) -> list[Sent]:
        """The answers that have come, waiting for the first if none has: [] only when
        nothing is in flight. Each request ends by its deadline, so this wait does too."""

    def __len__(self) -> int:
        """Requests in flight, their answers not collected."""


_lock = threading.Lock()
_clients: dict[tuple[int, str, float, EgressGuard, EgressProxy | None], httpx.Client] = {}
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _client(dest: WebhookDestination) -> httpx.Client:
    """One client per destination and process: its connections are reused, each only to
    an address the egress guard allows, or through the egress proxy if there is one."""
    guard, proxy = configured_guard(), configured_proxy()
    ident = (dest.pk, dest.url, dest.timeout_seconds, guard, proxy)
    with _lock:
        client = _clients.get(ident)
        if client is None:
            limits = httpx.Limits(max_connections=max(1, dest.max_in_flight))
            client = peer_client(
                timeout=dest.timeout_seconds, limits=limits, guard=guard, proxy=proxy
            )
            _clients[ident] = client
        return client


def _executor(dest: WebhookDestination) -> ThreadPoolExecutor:
    """Sending threads per destination and process, as many as its requests in flight
    may be, made on first use (after a Celery worker has forked, so that no thread
    crosses a fork): one destination's requests that hang never hold a thread another
    destination's run needs."""
    ident = (dest.pk, max(1, dest.max_in_flight))
    with _lock:
        pool = _pools.get(ident)
        if pool is None:
            pool = ThreadPoolExecutor(ident[1], thread_name_prefix=f"relay-send-{dest.pk}")
            _pools[ident] = pool
        return pool


class ThreadWindow:
    """Requests sent on the destination's sending threads. A request started when none
    is in flight is sent on the run's own thread: the common case at a shop's traffic,
    one message a round, costs no hand-over."""

    def __init__(self) -> None:
        self._pending: set[Future[Sent]] = set()
        self._done: list[Sent] = []

    def start(self, dest: WebhookDestination, claimed: list[Claimed]) -> None:
        if not claimed:
            return
        context = tracing.current_context()  # the run's span, for the sending threads
        if len(claimed) == 1 and not self._pending and not self._done:
            self._done.append(deliver(_client(dest), dest, claimed[0], context))
            return
        pool, client = _executor(dest), _client(dest)
        for message in claimed:
            self._pending.add(pool.submit(deliver, client, dest, message, context))

    def collect(self) -> list[Sent]:
        if self._pending and not self._done:
            wait(self._pending, return_when=FIRST_COMPLETED)
        finished = [f for f in self._pending if f.done()]
        self._pending.difference_update(finished)
        answers, self._done = self._done + [f.result() for f in finished], []
        # oldest first, as they were claimed
        return sorted(answers, key=lambda sent: sent.message.id)

    def __len__(self) -> int:
        return len(self._pending) + len(self._done)


def relay_send(dest: WebhookDestination, claimed: Iterable[Claimed]) -> list[Sent]:
    """Send each claimed message once, concurrently, and wait for every answer; never
    raises for a message."""
    window = ThreadWindow()
    window.start(dest, list(claimed))
    answers: list[Sent] = []
    while len(window):
        answers += window.collect()
    return sorted(answers, key=lambda sent: sent.message.id)


def signed_request(
    dest: WebhookDestination, message: Claimed, timestamp: int
) -> tuple[bytes, dict]:
    """The body and headers of one attempt: the stable key as ``webhook-id`` and
    ``Idempotency-Key``, and a Standard Webhooks signature by each of the destination's
    secrets, ``v1`` by a ``whsec_`` secret and ``v1a`` by a ``whsk_`` signing key
    (space-separated, so a rotation verifies with either)."""
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


def deliver(
    client: httpx.Client,
    dest: WebhookDestination,
    message: Claimed,
    context: object = None,
    started_at: datetime | None = None,
) -> Sent:
    """One delivery, by ``client``, in a ``webhook.deliver`` span (with OpenTelemetry): a
    child of the span that admitted the message, else of the run's. ``started_at`` is
    the attempt's start as recorded: by default the moment its claim spent the token
    (``claimed_at``), whatever the threads, the client's construction or the machine's
    load made of the moments between."""
    with tracing.span(
        "webhook.deliver",
        kind=tracing.CLIENT,
        traceparent=message.traceparent,
        context=context,
        destination=dest.name,
        message_key=message.key,
        attempt=message.attempt,
    ) as span:
        sent = _request(client, dest, message, started_at or message.claimed_at or timezone.now())
        error = sent.error.split(":", 1)[0] if sent.error else None  # the class, no more
        tracing.annotate(span, status_code=sent.status_code, error=error)
        return sent


def _request(
    client: httpx.Client, dest: WebhookDestination, message: Claimed, started_at: datetime
) -> Sent:
    """One request, over by the destination's timeout from connect to the last byte of
    the excerpt, whatever the destination does (a status line, headers or a body that
    trickle): its lease, timeout + lease_margin(), always outlives it. What is kept of the
    answer is made storable here."""
    began = time.monotonic()
    body, headers = signed_request(dest, message, int(time.time()))
    tracing.inject(headers)  # the delivery's span goes on at the merchant's end
    try:
        with (
            request_deadline(dest.timeout_seconds),
            client.stream("POST", dest.url, content=body, headers=headers) as response,
        ):
            # the status line decides the verdict; the body is only for an operator
            data = body_start(response, max_bytes=EXCERPT_BYTES)
            status_code = response.status_code
            retry_after = response.headers.get("retry-after")
            charset = charset_of(response)
    except (EgressRefused, EgressProxyRefused) as exc:  # no retry changes either
        return Sent(
            message=message,
            started_at=started_at,
            duration_ms=_ms_since(began),
            error=storable.text(f"{type(exc).__name__}: {exc}", EXCERPT_CHARS),
            refused_by=EGRESS_GUARD if isinstance(exc, EgressRefused) else EGRESS_PROXY,
        )
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
