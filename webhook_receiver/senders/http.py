"""The ``http`` adapter: the contract documented for senders.

    GET <URL>?created_gte=<ISO 8601>&created_lt=<ISO 8601>[&cursor=<c>]
    Authorization: Bearer <TOKEN>

    200 {"data": [{"id", "type", "created_at", "data": {...}}, ...],
         "next_cursor": "<string>" | null}

Options: ``URL``, ``TOKEN``; ``CONNECT_TIMEOUT`` (5 s) and ``READ_TIMEOUT`` (20 s) per
request; ``RETRIES`` (3) for a 5xx, a 429 or a connection error, waiting as Retry-After
says (capped at ``MAX_RETRY_WAIT``, 30 s) or 1, 2, 4 s; ``MAX_PAGES`` (1000). A slow or
broken sender fails the run within those bounds; it never holds a worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

import httpx

from . import SenderEvent, SenderUnavailable, parse_event


def list_events(
    *, options: Mapping[str, Any], since: datetime, until: datetime
) -> Iterator[list[SenderEvent]]:
    timeout = httpx.Timeout(
        float(options.get("READ_TIMEOUT", 20)), connect=float(options.get("CONNECT_TIMEOUT", 5))
    )
    headers = {"Accept": "application/json"}
    if options.get("TOKEN"):
        headers["Authorization"] = f"Bearer {options['TOKEN']}"
    params = {"created_gte": since.isoformat(), "created_lt": until.isoformat()}
    max_pages = int(options.get("MAX_PAGES", 1000))
    with httpx.Client(timeout=timeout, headers=headers, follow_redirects=False) as client:
        for _ in range(max_pages):
            body = _get(client, options, params)
            records, cursor = body.get("data"), body.get("next_cursor")
            if not isinstance(records, list) or not (cursor is None or isinstance(cursor, str)):
                raise SenderUnavailable("the answer is not {data: [...], next_cursor: ...}")
            yield [parse_event(record) for record in records]
            if not cursor:
                return
            params = {**params, "cursor": cursor}
    raise SenderUnavailable(f"the sender's list runs past MAX_PAGES ({max_pages} pages)")


def _get(client: httpx.Client, options: Mapping[str, Any], params: dict[str, str]) -> dict:
    retries = int(options.get("RETRIES", 3))
    for attempt in range(retries + 1):
        try:
            response = client.get(options["URL"], params=params)
        except httpx.LocalProtocolError as exc:  # a request we cannot even send: no retry
            raise SenderUnavailable(f"{type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:  # refused, reset, timed out
            problem = f"{type(exc).__name__}: {exc}"
            wait = 2.0**attempt
        else:
            if response.status_code == 200:
                try:
                    body = response.json()
                except ValueError as exc:
                    raise SenderUnavailable(f"the answer is not JSON: {exc}") from exc
                if not isinstance(body, dict):
                    raise SenderUnavailable("the answer is not a JSON object")
                return body
            problem = f"HTTP {response.status_code}"
            if response.status_code != 429 and response.status_code < 500:
                raise SenderUnavailable(f"{problem}: {response.text[:200]}")  # 401, 404: no retry
            wait = _retry_after(response) or 2.0**attempt
        if attempt < retries:
            time.sleep(min(wait, float(options.get("MAX_RETRY_WAIT", 30))))
    raise SenderUnavailable(f"{problem}, after {retries + 1} attempts")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else None
