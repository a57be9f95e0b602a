"""From verified bytes to a ``WebhookEvent``: parsing and the event key."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from django.utils.module_loading import import_string

from .. import schemes
from ..conf.sources import SourceConfig
from ..core import storable
from ..exceptions import InvalidPayload
from .handlers import WebhookEvent


def parse_event(
    source: SourceConfig,
    message: schemes.VerifiedMessage,
    headers: Mapping[str, str],
    body: bytes,
) -> WebhookEvent:
    """Parse a verified body into a ``WebhookEvent``; raise ``InvalidPayload`` if unusable."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        # also a number of more than 4300 digits (ValueError) and nesting deeper than
        # the interpreter's recursion limit: the same bytes fail the same way every time
        raise InvalidPayload(f"The body is not usable JSON: {type(exc).__name__}") from exc
    if not isinstance(payload, dict):
        raise InvalidPayload("The body must be a JSON object.")
    scheme = schemes.get_scheme(source.scheme)
    event_type = scheme.event_type(payload=payload, headers=headers)
    if not isinstance(event_type, str) or not event_type:
        raise InvalidPayload("The event has no type (a non-empty string).")
    key = _event_key(source, scheme, message, payload)
    return WebhookEvent(
        source=source.slug,
        event_key=key,
        event_type=storable.text(event_type, 255),
        payload=payload,
        message_id=message.message_id,
        signature_timestamp=message.timestamp,
    )


def _event_key(
    source: SourceConfig,
    scheme: schemes.Scheme,
    message: schemes.VerifiedMessage,
    payload: dict[str, Any],
) -> str:
    if source.event_key:
        derive: Callable[..., Any] = import_string(source.event_key)
        try:
            key = derive(payload=payload, message=message)
        except Exception as exc:  # the same bytes would fail the same way: permanent
            raise InvalidPayload(
                f"EVENT_KEY function {source.event_key} raised {type(exc).__name__}: {exc}"
            ) from exc
    else:
        key = scheme.default_key(payload=payload, message=message)
    if not isinstance(key, str) or not key:
        raise InvalidPayload("No event key (a non-empty string) could be derived.")
    return storable.key(key)
