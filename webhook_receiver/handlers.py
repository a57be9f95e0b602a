"""The receive side's public face: what a host imports to register its handlers.

    from webhook_receiver.handlers import HandlerResult, WebhookEvent, webhook_handler

The registry itself lives in ``inbound/handlers.py``, which says how handlers are
registered, chosen and validated.
"""

from __future__ import annotations

from .inbound.handlers import (
    Handler,
    HandlerResult,
    Result,
    WebhookEvent,
    get_handler,
    registered,
    subject_of,
    unregister,
    validated_by,
    webhook_handler,
)

__all__ = [
    "Handler",
    "HandlerResult",
    "Result",
    "WebhookEvent",
    "get_handler",
    "registered",
    "subject_of",
    "unregister",
    "validated_by",
    "webhook_handler",
]
