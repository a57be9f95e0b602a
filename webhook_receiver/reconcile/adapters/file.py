"""The ``file`` adapter: a JSON-lines export, one record of the http contract per line.

Options: ``PATH``, the file; ``PAGE_SIZE`` (default 1000). For senders with no API (an
export dropped somewhere by a job) and for tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from . import SenderEvent, SenderUnavailable, parse_event


def list_events(
    *, options: Mapping[str, Any], since: datetime, until: datetime
) -> Iterator[list[SenderEvent]]:
    page_size = int(options.get("PAGE_SIZE", 1000))
    page: list[SenderEvent] = []
    try:
        with open(options["PATH"], "rb") as export:
            for number, line in enumerate(export, start=1):
                if not line.strip():
                    continue
                try:
                    event = parse_event(json.loads(line))
                except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, too deep
                    raise SenderUnavailable(f"line {number} is not JSON: {exc}") from exc
                if since <= event.created_at < until:
                    page.append(event)
                if len(page) >= page_size:
                    yield page
                    page = []
    except OSError as exc:
        raise SenderUnavailable(f"cannot read {options.get('PATH')!r}: {exc}") from exc
    if page:
        yield page
