"""Endpoints as their owner manages them (the portal): add one, change it, rotate its
secret with an overlap, send it a test event from the catalog's example.

The admin and ``manage.py webhook_destination`` write destinations their own way, with
the same checks: the egress guard on the URL (network/egress.check_url), the catalog on the
subscriptions, filters.filter_problem on the filter. Each service takes a ``scope``
(tenancy.py): another tenant's id is not found. A new endpoint's name is made here (the
tenant and a random suffix): a name a merchant typed could collide with another tenant's
and so tell it that one exists.
"""

from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from ..network.egress import UrlRefused, check_url
from .admission import Admission, enqueue_webhook
from .catalog import EventType, catalog, subscription_problems
from .filters import filter_problem
from .models import WebhookDestination
from .signing_secrets import new_destination_secret
from .tenancy import Scope

logger = logging.getLogger(__name__)

# the longest a rotation's outgoing secret keeps signing beside the new one
LONGEST_OVERLAP = timedelta(days=7)
URL_MAX_CHARS = 2000
DESCRIPTION_MAX_CHARS = 200


# the app's own notices (notices.py, watch/notifiers.py) go to OPS_DESTINATION alone
APP_EVENTS = __package__.partition(".")[0] + "."


def offered_catalog() -> list[EventType]:
    """The catalog as an endpoint's owner sees it and subscribes from it: the host's
    event types, without the app's own notices (never sent to a subscriber)."""
    return [e for e in catalog() if not e.declared_by.startswith(APP_EVENTS)]


def offered_type(name: str) -> EventType | None:
    return next((e for e in offered_catalog() if e.name == name), None)


class EndpointRefused(ValueError):
    """What cannot be saved, by field (``problems``: field -> why)."""

    def __init__(self, problems: dict[str, str]) -> None:
        super().__init__("; ".join(f"{name}: {why}" for name, why in problems.items()))
        self.problems = problems


@dataclass(frozen=True)
class EndpointFields:
    """What an owner sets on an endpoint."""

    url: str
    event_types: list[str]
    filter: dict[str, Any] | None = None
    description: str = ""


def endpoint_checked(
    url: str, event_types: Iterable[str], filter: Any = None, description: str = ""
) -> tuple[EndpointFields, str]:
    """The fields, checked as saving them needs, and the URL's warning ("" or why its
    name does not resolve now). EndpointRefused with every field's problem."""
    problems: dict[str, str] = {}
    url = (url or "").strip()
    warning = ""
    if not url:
        problems["url"] = "a URL is needed"
    elif len(url) > URL_MAX_CHARS:
        problems["url"] = f"at most {URL_MAX_CHARS} characters"
    else:
        try:
            warning = check_url(url)
        except UrlRefused as exc:
            problems["url"] = str(exc)
    types = list(dict.fromkeys(t.strip() for t in event_types if t and t.strip()))
    # an owner subscribes to what the catalog offers, whatever CATALOG_CHECK lets staff do
    found = subscription_problems(types) or [
        f"{name!r} is not in the event catalog"
        for name in types
        if "*" not in name and offered_type(name) is None
    ]
    if found:
        problems["event_types"] = "; ".join(found)
    if filter in ("", {}, []):
        filter = None
    if filter is not None:
        why = filter_problem(filter)
        if why is not None:
            problems["filter"] = why
    if len(description) > DESCRIPTION_MAX_CHARS:
        problems["description"] = f"at most {DESCRIPTION_MAX_CHARS} characters"
    if problems:
        raise EndpointRefused(problems)
    return EndpointFields(url, types, filter, description.strip()), warning


def endpoint_create(
    *, scope: Scope, fields: EndpointFields, by: str
) -> tuple[WebhookDestination, str]:
    """A new endpoint of the scope's tenant, and its secret: shown to its owner once, here,
    and never again (it is stored encrypted)."""
    tenant = scope.tenant or ""
    secret = new_destination_secret()
    stem = slugify(tenant)[:80] or "endpoint"
    destination = WebhookDestination.objects.create(
        name=f"{stem}-{secrets.token_hex(4)}",
        tenant=tenant,
        url=fields.url,
        description=fields.description,
        event_types=fields.event_types,
        filter=fields.filter,
        secrets=[secret],
    )
    logger.info(
        "outbox: %s added destination %s (%s)",
        by,
        destination.name,
        scope,
        extra={"by": by, "destination_id": destination.pk},
    )
    return destination, secret


def endpoint_update(
    *, scope: Scope, destination: WebhookDestination | int, fields: EndpointFields, by: str
) -> WebhookDestination:
    """Change an endpoint's URL, subscriptions, filter and description.
    WebhookDestination.DoesNotExist when the scope holds no such destination."""
    destination_id = destination if isinstance(destination, int) else destination.pk
    with transaction.atomic():
        found = scope.destinations().select_for_update().defer("secrets").get(pk=destination_id)
        found.url, found.event_types, found.filter = fields.url, fields.event_types, fields.filter
        found.description = fields.description
        found.save(update_fields=["url", "event_types", "filter", "description", "updated_at"])
    logger.info(
        "outbox: %s changed destination %s",
        by,
        found.name,
        extra={"by": by, "destination_id": found.pk},
    )
    return found


def secret_rotate(
    *,
    scope: Scope,
    destination: WebhookDestination | int,
    overlap: timedelta,
    by: str,
    now: datetime | None = None,
) -> str:
    """Give an endpoint a new secret (of the kind its newest one is) and return it, to be
    shown once. Its secrets until now keep signing beside the new one for ``overlap``
    (at most LONGEST_OVERLAP; nothing: they stop at once), so that its owner can switch
    its verification without refusing a request. ValueError for an overlap out of range;
    WebhookDestination.DoesNotExist when the scope holds no such destination."""
    if not timedelta(0) <= overlap <= LONGEST_OVERLAP:
        raise ValueError(f"an overlap is between 0 and {LONGEST_OVERLAP.days} days")
    now = now or timezone.now()
    destination_id = destination if isinstance(destination, int) else destination.pk
    with transaction.atomic():
        found = scope.destinations().select_for_update().get(pk=destination_id)
        current = found.signing_with(now.timestamp())
        secret = new_destination_secret(like=found.secrets[0] if found.secrets else "")
        found.secrets = [secret]
        found.retiring_secrets = current if overlap else []
        found.retiring_until = now + overlap if overlap else None
        found.save(update_fields=["secrets", "retiring_secrets", "retiring_until", "updated_at"])
    logger.info(
        "outbox: %s rotated the secret of destination %s (the old ones sign until %s)",
        by,
        found.name,
        (now + overlap).isoformat(timespec="seconds") if overlap else "now",
        extra={"by": by, "destination_id": found.pk},
    )
    return secret


def send_test_event(
    *, scope: Scope, destination: WebhookDestination | int, event_type: str, by: str
) -> Admission:
    """Admit one test message of ``event_type`` for an endpoint, its data the catalog's
    example, its key ``test:`` and a random id (never a live event's), its metadata
    saying who sent it. It goes as admission sends anything: through the endpoint's
    filter, in its limits. ValueError when the type is not in the catalog or has no
    example; WebhookDestination.DoesNotExist when the scope holds no such destination."""
    entry = offered_type(event_type)
    if entry is None or entry.example is None:
        raise ValueError(f"{event_type!r} is not an event type of the catalog with an example")
    destination_id = destination if isinstance(destination, int) else destination.pk
    payload = {
        "type": entry.name,
        "timestamp": timezone.now().isoformat(timespec="seconds"),
        "data": dict(entry.example),
    }
    with transaction.atomic():
        found = scope.destinations().defer("secrets").get(pk=destination_id)
        admitted = enqueue_webhook(
            found, entry.name, f"test:{uuid.uuid4().hex}", payload, metadata={"test_by": by}
        )
    logger.info(
        "outbox: %s sent a test %s to destination %s (%s)",
        by,
        entry.name,
        found.name,
        admitted.key,
        extra={"by": by, "destination_id": found.pk},
    )
    return admitted
