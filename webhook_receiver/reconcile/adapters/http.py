"""The ``http`` adapter: the contract documented for senders.

    GET <URL>?created_gte=<ISO 8601>&created_lt=<ISO 8601>[&cursor=<c>]
    Authorization: Bearer <TOKEN>

    200 {"data": [{"id", "type", "created_at", "data": {...}}, ...],
         "next_cursor": "<string>" | null}

Options: ``URL``, ``TOKEN``; ``CONNECT_TIMEOUT`` (5 s) and ``READ_TIMEOUT`` (20 s) per
network operation; ``REQUEST_TIMEOUT`` (30 s) for one request, from connect to the
answer's last byte; ``TOTAL_TIMEOUT`` (600 s) for the whole listing, every page, retry
and wait; ``MAX_PAGE_BYTES`` (10 MiB), the largest answer read; ``RETRIES`` (3) for a
5xx, a 429 or a connection error, waiting as Retry-After says (capped at
``MAX_RETRY_WAIT``, 30 s) or 1, 2, 4 s; ``MAX_PAGES`` (1000). A slow, dripping, flooding
or broken sender fails the run within those bounds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from django.utils import timezone

from ...network import peer_http
from ...network.egress import EgressRefused, configured_guard, configured_proxy
from ...network.egress_tunnel import EgressProxyRefused
from . import SenderEvent, SenderUnavailable, parse_event

# the start of a refusal's body kept in the run's error
ERROR_EXCERPT_CHARS = 200


@dataclass(frozen=True)
class _Bounds:
    request_seconds: float
    total_seconds: float
    max_bytes: int
    retries: int
    max_retry_wait: float
    # monotonic time by which the whole listing is over
    ends_at: float

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> _Bounds:
        total = float(options.get("TOTAL_TIMEOUT", 600))
        return cls(
            request_seconds=float(options.get("REQUEST_TIMEOUT", 30)),
            total_seconds=total,
            max_bytes=int(options.get("MAX_PAGE_BYTES", 10 * 1024 * 1024)),
            retries=int(options.get("RETRIES", 3)),
            max_retry_wait=float(options.get("MAX_RETRY_WAIT", 30)),
            ends_at=time.monotonic() + total,
        )

    def left(self) -> float:
        return self.ends_at - time.monotonic()


def list_events(
    *, options: Mapping[str, Any], since: datetime, until: datetime
) -> Iterator[list[SenderEvent]]:
    bounds = _Bounds.of(options)
    timeout = httpx.Timeout(
        float(options.get("READ_TIMEOUT", 20)), connect=float(options.get("CONNECT_TIMEOUT", 5))
    )
    headers = {"Accept": "application/json"}
    if options.get("TOKEN"):
        headers["Authorization"] = f"Bearer {options['TOKEN']}"
    params = {"created_gte": since.isoformat(), "created_lt": until.isoformat()}
    max_pages = int(options.get("MAX_PAGES", 1000))
    guard, proxy = configured_guard(), configured_proxy()
    with peer_http.client(timeout=timeout, headers=headers, guard=guard, proxy=proxy) as client:
        for _ in range(max_pages):
            body = _get(client, options["URL"], params, bounds)
            records, cursor = body.get("data"), body.get("next_cursor")
            if not isinstance(records, list) or not (cursor is None or isinstance(cursor, str)):
                raise SenderUnavailable("the answer is not {data: [...], next_cursor: ...}")
            yield [parse_event(record) for record in records]
            if not cursor:
                return
            params = {**params, "cursor": cursor}
    raise SenderUnavailable(f"the sender's list runs past MAX_PAGES ({max_pages} pages)")


def _get(client: httpx.Client, url: str, params: dict[str, str], bounds: _Bounds) -> dict:
    """One page: the answer's JSON object, after retries of what may pass."""
    problem = "no request sent"
    for attempt in range(bounds.retries + 1):
        left = bounds.left()
        if left <= 0:
            raise SenderUnavailable(
                f"{problem}; the listing ran past TOTAL_TIMEOUT ({bounds.total_seconds:g} s)"
            )
        try:
            with (
                peer_http.deadline(min(bounds.request_seconds, left)),
                client.stream("GET", url, params=params) as response,
            ):
                status = response.status_code
                if status == 200:
                    data = peer_http.body_whole(response, max_bytes=bounds.max_bytes)
                else:
                    data = peer_http.body_start(response, max_bytes=ERROR_EXCERPT_CHARS * 4)
                charset = peer_http.charset_of(response)
                retry_after = response.headers.get("Retry-After")
        except (EgressRefused, EgressProxyRefused) as exc:  # no retry changes either
            raise SenderUnavailable(str(exc)) from exc
        except peer_http.TooLarge as exc:  # no retry: it would be as large again
            raise SenderUnavailable(
                f"the answer is larger than MAX_PAGE_BYTES ({bounds.max_bytes} bytes): {exc}"
            ) from exc
        except httpx.LocalProtocolError as exc:  # a request we cannot even send: no retry
            raise SenderUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:  # refused, reset, timed out
            problem = f"{type(exc).__name__}: {exc}"
            wait = 2.0**attempt
        else:
            if status == 200:
                return _page(data)
            problem = f"HTTP {status}"
            if status != 429 and status < 500:  # 401, 404: no retry
                text = peer_http.text_of(data, charset)[:ERROR_EXCERPT_CHARS]
                raise SenderUnavailable(f"{problem}: {text}")
            seconds = peer_http.parse_retry_after(
                retry_after, now=timezone.now(), cap=bounds.max_retry_wait
            )
            wait = seconds or 2.0**attempt
        if attempt < bounds.retries:
            wait = min(wait, bounds.max_retry_wait)
            if wait >= bounds.left():
                raise SenderUnavailable(
                    f"{problem}; no time left to retry within TOTAL_TIMEOUT "
                    f"({bounds.total_seconds:g} s)"
                )
            time.sleep(wait)
    raise SenderUnavailable(f"{problem}, after {bounds.retries + 1} attempts")


def _page(data: bytes) -> dict:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep
        raise SenderUnavailable(f"the answer is not JSON: {type(exc).__name__}: {exc}") from exc
    if not isinstance(body, dict):
        raise SenderUnavailable("the answer is not a JSON object")
    return body
