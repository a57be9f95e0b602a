"""The event catalog: the types of event this host sends its merchants, and what each
one's ``data`` carries. It mirrors the receive side's ``@webhook_handler``:

    from rest_framework import serializers
    from webhook_receiver.outbound import webhook_event

    @webhook_event("order.paid", example={"order_id": "ord-1", "status": "paid", "version": 3})
    class OrderPaid(serializers.Serializer):
        order_id = serializers.CharField()
        status = serializers.CharField()
        version = serializers.IntegerField()

A message's body is the Standard Webhooks envelope, ``{"type": …, "timestamp": …,
"data": …}`` (the timestamp optional); the serializer describes ``data``. Names are
dot-separated and hierarchical (``order.paid``: the group ``order``). An event type may
be ``deprecated`` (still sent, marked so in the document) and ``opt_in`` (a wildcard
subscription never reaches it: a merchant asks for it by name).

``enqueue_webhook`` checks every message against the catalog (``admission_problem``);
what happens to one outside it is ``CATALOG_CHECK``'s (``"refuse"``, ``"record"`` or
``"off"``: docs/sending.md). catalog_document.py makes the catalog an OpenAPI 3.1
document (``GET`` the view a host mounts, or ``manage.py webhook_catalog``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from django.conf import settings
from rest_framework import serializers

from ..conf import app_settings
from ..exceptions import serializer_errors_text
from .metrics import uncatalogued_count

logger = logging.getLogger(__name__)

__all__ = ["EventRefused", "EventType", "catalog", "event_type", "webhook_event"]

# the types whose first message outside the catalog this process logged (at most this
# many: a type is the host's word, but a host may forward a peer's)
LOGGED_TYPES_MAX = 100

S = TypeVar("S", bound=type[serializers.BaseSerializer])

# dot-separated, each part lower-case letters, digits and underscores (Standard
# Webhooks' hierarchical names: "order.paid", "invoice.payment_failed")
NAME = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)*")


class EventRefused(ValueError):
    """A message outside the event catalog, refused before anything is written
    (``CATALOG_CHECK = "refuse"``): its type is not declared, or its body is not the
    declared envelope, or its ``data`` does not validate."""


@dataclass(frozen=True)
class EventType:
    """One type of event this host sends: what its ``data`` carries (``serializer``),
    an example of that data, and how merchants may subscribe to it."""

    name: str
    serializer: type[serializers.BaseSerializer]
    version: int = 1
    description: str = ""
    example: Mapping[str, Any] | None = field(default=None, hash=False)
    deprecated: bool = False
    opt_in: bool = False

    @property
    def group(self) -> str:
        """The name's prefix before its last dot (``order`` for ``order.paid``)."""
        return self.name.rpartition(".")[0] or self.name

    @property
    def declared_by(self) -> str:
        return f"{self.serializer.__module__}.{self.serializer.__qualname__}"


_catalog: dict[str, EventType] = {}
# event type -> every serializer declared for it, when more than one (check E012)
_conflicts: dict[str, list[str]] = {}
# how many declarations the catalog has seen: what a cache of its document is keyed on
_revision = [0]


@overload
def webhook_event(
    name: str,
    *,
    serializer: None = None,
    version: int = 1,
    description: str = "",
    example: Mapping[str, Any] | None = None,
    deprecated: bool = False,
    opt_in: bool = False,
) -> Callable[[S], S]: ...


@overload
def webhook_event(
    name: str,
    *,
    serializer: type[serializers.BaseSerializer],
    version: int = 1,
    description: str = "",
    example: Mapping[str, Any] | None = None,
    deprecated: bool = False,
    opt_in: bool = False,
) -> EventType: ...


def webhook_event(
    name: str,
    *,
    serializer: type[serializers.BaseSerializer] | None = None,
    version: int = 1,
    description: str = "",
    example: Mapping[str, Any] | None = None,
    deprecated: bool = False,
    opt_in: bool = False,
) -> Callable[[S], S] | EventType:
    """Declare the event type ``name``: as a decorator of the serializer of its
    ``data``, or with ``serializer=`` for one declared elsewhere (then it returns the
    ``EventType``). ``description`` defaults to the serializer's docstring. A name that
    is not dot-separated lower-case words raises ValueError at once; a second, different
    declaration of a name is a start-up error (E012), and so is an example its serializer
    does not accept (E013)."""
    if not NAME.fullmatch(name):
        raise ValueError(
            f"event type {name!r}: a name is dot-separated lower-case words, digits and "
            "underscores (order.paid)"
        )
    if version < 1:
        raise ValueError(f"event type {name!r}: version {version} (from 1)")

    def declare(declared: S) -> S:
        entry = EventType(
            name=name,
            serializer=declared,
            version=version,
            description=description or _docstring(declared),
            example=example,
            deprecated=deprecated,
            opt_in=opt_in,
        )
        _revision[0] += 1
        taken = _catalog.setdefault(name, entry)
        # the same declaration again (its module imported twice) is no conflict
        if taken != entry:
            _conflicts.setdefault(name, [taken.declared_by]).append(entry.declared_by)
        return declared

    if serializer is None:
        return declare
    declare(serializer)
    return _catalog[name]


def _docstring(declared: type) -> str:
    text = declared.__doc__ or ""
    inherited = any(text == base.__doc__ for base in declared.__mro__[1:])
    return "" if inherited else " ".join(text.split())


def catalog() -> list[EventType]:
    """Every declared event type, by name."""
    return [_catalog[name] for name in sorted(_catalog)]


def undeclare(name: str) -> None:
    """Forget the event type ``name`` and its conflicts (tests)."""
    _catalog.pop(name, None)
    _conflicts.pop(name, None)
    _logged.discard(name)
    _revision[0] += 1


def revision() -> int:
    """Changes whenever an event type is declared."""
    return _revision[0]


def event_type(name: str) -> EventType | None:
    return _catalog.get(name)


def conflicts() -> dict[str, list[str]]:
    """Event types declared more than once, differently: name -> the serializers."""
    return {name: list(found) for name, found in _conflicts.items()}


def example_problem(entry: EventType) -> str | None:
    """Why the entry's example is not data its serializer accepts, or None."""
    if entry.example is None:
        return None
    return _data_problem(entry, entry.example)


def catalog_check() -> str:
    """``CATALOG_CHECK`` as it applies: ``"refuse"``, ``"record"`` or ``"off"``."""
    configured = app_settings().catalog_check
    if configured is not None:
        return configured
    return "refuse" if settings.DEBUG else "record"


_logged: set[str] = set()


def admission_checked(destination: str, name: str, payload: Any) -> None:
    """The catalog's word on a message about to be admitted (``CATALOG_CHECK``): with
    ``"refuse"``, EventRefused if it is outside the catalog; with ``"record"``, it is
    counted, and the first of its type logged in this process."""
    check = catalog_check()
    if check == "off":
        return
    problem = admission_problem(name, payload)
    if problem is None:
        return
    if check == "refuse":
        raise EventRefused(problem)
    uncatalogued_count(destination, "undeclared" if name not in _catalog else "invalid")
    if name not in _logged and len(_logged) < LOGGED_TYPES_MAX:
        _logged.add(name)
        logger.warning(
            "outbox: a message outside the event catalog admitted as given: %s (later ones "
            "of this type are counted, not logged: webhook_receiver_outbox_uncatalogued_total)",
            problem,
        )


# --- subscriptions ---------------------------------------------------------------------


def subscribed(subscriptions: Iterable[str], name: str) -> bool:
    """Whether a destination's subscriptions reach the event type ``name``: by its name,
    or by a ``group.*`` pattern when the type is declared and not opt-in (a wildcard
    never reaches a type nobody declared, nor one declared to be asked for by name)."""
    subscriptions = list(subscriptions)
    if name in subscriptions:
        return True
    entry = _catalog.get(name)
    if entry is None or entry.opt_in:
        return False
    return any(in_group(s, name) for s in subscriptions)


def in_group(pattern: str, name: str) -> bool:
    """Whether ``pattern`` is a ``group.*`` pattern that ``name`` falls under."""
    return pattern.endswith(".*") and name.startswith(pattern[:-1])


def subscription_problem(subscription: str) -> str | None:
    """Why ``subscription`` (an event type's name, or ``group.*``) cannot be saved on a
    destination, or None. A pattern must reach a declared type that is not opt-in; a
    name must be declared when ``CATALOG_CHECK`` is ``"refuse"`` (otherwise it may
    name a type the catalog does not know yet)."""
    if "*" in subscription:
        prefix = subscription.removesuffix(".*")
        if "*" in prefix or not NAME.fullmatch(prefix):
            return f"{subscription!r}: a pattern is a group followed by .* (order.*)"
        if not any(e.name.startswith(prefix + ".") and not e.opt_in for e in catalog()):
            return (
                f"{subscription} matches no declared event type (an opt-in type is "
                "subscribed to by its name)"
            )
        return None
    if not NAME.fullmatch(subscription):
        return f"{subscription!r} is not an event type: dot-separated lower-case words"
    if catalog_check() == "refuse" and subscription not in _catalog:
        return f"{subscription!r} is not in the event catalog"
    return None


def subscription_problems(subscriptions: Iterable[str]) -> list[str]:
    """Why each of ``subscriptions`` cannot be saved (subscription_problem); [] when
    they all can."""
    return [p for p in map(subscription_problem, subscriptions) if p is not None]


def admission_problem(name: str, payload: Any) -> str | None:
    """Why a message of type ``name`` with body ``payload`` is outside the catalog, or
    None: the type is not declared, the body is not the envelope (``type`` the same
    name, ``data`` an object), or its data does not validate."""
    entry = _catalog.get(name)
    if entry is None:
        return f"{name!r} is not in the event catalog"
    if not isinstance(payload, Mapping):
        return f"{name}: the body is not a JSON object"
    if payload.get("type") != name:
        return f"{name}: the body's type is {payload.get('type')!r}"
    if "data" not in payload:
        return f"{name}: the body has no data"
    return _data_problem(entry, payload["data"])


def _data_problem(entry: EventType, data: Any) -> str | None:
    checked = entry.serializer(data=data)
    if checked.is_valid():
        return None
    return (
        f"{entry.name}: data does not match {entry.serializer.__name__}: "
        f"{serializer_errors_text(checked.errors)}"
    )
