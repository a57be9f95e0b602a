"""Event type -> effect registry.

A handler is a function ``handler(event: WebhookEvent) -> HandlerResult | None``. It runs
inside the claim transaction, after the receipt row has claimed the event key, so every
database write it makes commits or rolls back together with that claim. Returning
``None`` means "applied". Raise ``PermanentError`` for an event that can never be
applied as it is, and ``TransientError`` for one that may succeed later.

Register a handler in code, with a DRF serializer for the event's ``data``::

    from rest_framework import serializers
    from webhook_receiver.handlers import webhook_handler

    class InvoicePaid(serializers.Serializer):
        invoice_id = serializers.CharField(max_length=100)
        amount = serializers.IntegerField(min_value=0)

    @webhook_handler("invoice.paid", serializer=InvoicePaid)
    def invoice_paid(event, data): ...  # data: the serializer's validated_data

Data the serializer refuses (or a ``serializers.ValidationError`` the handler raises)
is an ``InvalidPayload``: a permanent failure, dead-lettered at once, whose error lists
every field with its errors as DRF words them. Without a serializer the handler is
``handler(event)`` and validates ``event.data`` itself.

or in settings, which wins over code: ``WEBHOOK_RECEIVER["HANDLERS"] = {"invoice.paid":
"shop.webhooks.invoice_paid"}``. Event types without a handler are recorded as ``ignored``.

One handler per event type: registering a second function for a type already taken is
reported by the system check ``webhook_receiver.E005`` (``manage.py check``, ``migrate``
and ``runserver`` refuse to go on) instead of silently replacing the first. The app
itself registers none; its host owns every event type.

``registered()`` lists the handlers registered in code; ``unregister(event_type)``
forgets one (a test that registers a handler of its own, then leaves no trace).

Hosts import all of this from ``webhook_receiver.handlers``, its public face.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string
from rest_framework import serializers

from ..conf import app_settings
from ..exceptions import InvalidPayload
from .models import RECEIPT_RESULTS, Result

__all__ = [
    "Handler",
    "HandlerResult",
    "Result",
    "WebhookEvent",
    "bound_to",
    "get_handler",
    "handler_sources",
    "registered",
    "subject_of",
    "unregister",
    "validated_by",
    "webhook_handler",
]


@dataclass(frozen=True)
class WebhookEvent:
    source: str
    event_key: str
    event_type: str
    payload: Mapping[str, Any]  # the whole verified, parsed body
    message_id: str | None = None
    signature_timestamp: int | None = None

    @property
    def data(self) -> Any:
        return self.payload.get("data")

    @property
    def subject(self) -> str:
        """The business object the event concerns, stored on its receipt and searchable
        in the admin (``subject_of``); a handler's result may name another."""
        return subject_of(self.data)


# Where an event's data names its subject, by convention: the first of these fields
# that holds a string or a number. A handler's result names another where they do not.
SUBJECT_FIELDS = ("order_id", "id")


def subject_of(data: Any) -> str:
    """The subject an event's ``data`` names (SUBJECT_FIELDS), or ""."""
    if isinstance(data, dict):
        for name in SUBJECT_FIELDS:
            value = data.get(name)
            if isinstance(value, str | int) and not isinstance(value, bool):
                return str(value)
    return ""


@dataclass(frozen=True)
class HandlerResult:
    status: Result = Result.APPLIED  # applied, stale or ignored (RECEIPT_RESULTS)
    subject: str = ""  # overrides the event's own subject on the receipt when set
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in RECEIPT_RESULTS:
            allowed = ", ".join(RECEIPT_RESULTS)
            raise ValueError(f"A handler's result is one of {allowed}, not {str(self.status)!r}.")


Handler = Callable[[WebhookEvent], "HandlerResult | None"]

_registry: dict[str, Handler] = {}
# event type -> the dotted names of every function registered for it, when more than one
_conflicts: dict[str, list[str]] = {}


def webhook_handler(
    event_type: str,
    *,
    serializer: type[serializers.BaseSerializer] | None = None,
    sources: Iterable[str] | None = None,
) -> Callable[[Callable[..., HandlerResult | None]], Handler]:
    """Register the decorated function as the handler of ``event_type``; with a
    ``serializer``, it is called ``func(event, validated_data)`` (``validated_by``);
    with ``sources``, it serves those sources' events only (``bound_to``)."""

    def register(func: Callable[..., HandlerResult | None]) -> Handler:
        handler = func if serializer is None else validated_by(serializer)(func)
        if sources is not None:
            handler = bound_to(*sources)(handler)
        taken = _registry.setdefault(event_type, handler)
        # the same function again (its module imported twice) is no conflict
        if _dotted_name(taken) != _dotted_name(handler):
            _conflicts.setdefault(event_type, [_dotted_name(taken)]).append(_dotted_name(handler))
        return handler

    return register


def bound_to(*sources: str) -> Callable[[Handler], Handler]:
    """Bind a handler to the sources it is meant for: an event of its type from any
    other source finds no handler and is recorded as ignored. An event's type is the
    sender's word, and not always signed (GitHub's ``X-GitHub-Event`` header): a source
    must not reach a payment handler by naming its type. For a function named in the
    HANDLERS setting too (``@bound_to("shop")`` on it)."""

    def bind(handler: Handler) -> Handler:
        handler.sources = frozenset(sources)  # type: ignore[attr-defined]
        return handler

    return bind


def handler_sources(handler: Handler) -> frozenset[str] | None:
    """The sources ``handler`` is bound to, or None: every source."""
    return getattr(handler, "sources", None)


def validated_by(
    serializer: type[serializers.BaseSerializer],
) -> Callable[[Callable[[WebhookEvent, Any], HandlerResult | None]], Handler]:
    """Make ``func(event, data)`` a handler whose ``data`` is ``event.data`` as
    ``serializer`` validated it. The result is a plain handler: it can also be named in
    the HANDLERS setting."""

    def wrap(func: Callable[[WebhookEvent, Any], HandlerResult | None]) -> Handler:
        @functools.wraps(func)
        def handler(event: WebhookEvent) -> HandlerResult | None:
            checked = serializer(data=event.data)
            if not checked.is_valid():
                raise InvalidPayload.from_serializer_errors(checked.errors)
            try:
                return func(event, checked.validated_data)
            except serializers.ValidationError as exc:
                raise InvalidPayload.from_serializer_errors(exc.detail) from exc

        handler.serializer = serializer  # type: ignore[attr-defined]
        return handler

    return wrap


def _dotted_name(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def registration_conflicts() -> dict[str, list[str]]:
    """Event types registered in code by more than one function (see E005)."""
    return {event_type: list(names) for event_type, names in _conflicts.items()}


def registered() -> dict[str, Handler]:
    """The handlers registered in code, by event type (a copy: registering goes through
    ``webhook_handler``). The HANDLERS setting is not in it."""
    return dict(_registry)


def unregister(event_type: str) -> None:
    """Forget what was registered in code for ``event_type``, its conflicts (E005)
    included: for a test that registers a handler of its own. No error when there was
    none."""
    _registry.pop(event_type, None)
    _conflicts.pop(event_type, None)


@functools.lru_cache(maxsize=256)
def _import_handler(path: str) -> Handler:
    return import_string(path)


def get_handler(event_type: str, source: str | None = None) -> Handler | None:
    """The handler of ``event_type`` (the HANDLERS setting first), or None; with
    ``source``, None also when the handler is bound to other sources."""
    path = app_settings().handlers.get(event_type)
    handler = _import_handler(path) if path is not None else _registry.get(event_type)
    if handler is None or source is None:
        return handler
    bound = getattr(handler, "sources", None)  # handler_sources, inline: every delivery
    return handler if bound is None or source in bound else None
