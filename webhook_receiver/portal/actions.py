"""What a portal session reads and does, said once for its pages and its JSON API: each
function takes the session (a Portal), reaches only its tenant's records (its scope),
checks the capability an action needs, and records the action (access.portal_action:
the audit, and the rate limit that reads it) in the action's own transaction.

Errors, for both callers to answer alike: ``Http404`` when the scope holds no such
record (another tenant's id included), ``PermissionDenied`` without the capability,
``access.TooManyActions`` over the rate limit, and the services' own refusals
(``EndpointRefused``, ``RecoveryRefused``, ``ValueError``) with their reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TypeVar

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from ..outbound import endpoints as endpoint_services
from ..outbound import operations, recovery
from ..outbound.admission import Admission
from ..outbound.endpoints import EndpointFields
from ..outbound.models import (
    MessageStatus,
    OutboxMessage,
    RecoveryJob,
    WebhookDestination,
)
from ..outbound.recovery import Criteria, Plan
from ..outbound.selectors import destinations_with_health
from ..schemes.standard_keys import public_keys_of
from .access import Portal, capability_missing_text, portal_action, portal_revoke
from .models import Capability, PortalAction

T = TypeVar("T")

# a message's page shows its newest attempts
ATTEMPTS_SHOWN = 100


def who(portal: Portal) -> str:
    """How the outbox's records and log lines name a portal session's actions."""
    return f"portal session {portal.session.pk} of {portal.tenant}"


def _found(lookup: Callable[[], T]) -> T:
    try:
        return lookup()
    except ObjectDoesNotExist:
        raise Http404("not found") from None


def _needs(portal: Portal, capability: Capability) -> None:
    if not portal.may(capability):
        raise PermissionDenied(capability_missing_text(capability))


# --- reading ---------------------------------------------------------------------------


def endpoints(portal: Portal) -> QuerySet[WebhookDestination]:
    """The tenant's endpoints, each with its health figures (selectors.Health)."""
    return destinations_with_health(
        portal.scope.destinations().defer("secrets", "retiring_secrets")
    )


def endpoint(portal: Portal, pk: int) -> WebhookDestination:
    return _found(lambda: endpoints(portal).get(pk=pk))


def public_keys(portal: Portal, pk: int) -> tuple[list[str], int]:
    """The endpoint's ``v1a`` public keys (``whpk_``) and how many secrets sign for it
    now; never a secret."""
    _needs(portal, Capability.VIEW_SECRET)
    found = _found(lambda: portal.scope.destinations().get(pk=pk))
    signing = found.signing_with(timezone.now().timestamp())
    return public_keys_of(signing), len(signing)


def messages(
    portal: Portal,
    *,
    endpoint: int | None = None,
    event_type: str = "",
    status: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[OutboxMessage]:
    """The tenant's messages, newest first, narrowed by endpoint (Http404 when it is not
    the tenant's), type, state and admission time."""
    found = (
        portal.scope.messages()
        .select_related("destination")
        .defer("destination__secrets", "destination__retiring_secrets")
    )
    if endpoint is not None:
        # another tenant's endpoint is not found, as its page is not
        _found(lambda: portal.scope.destinations().only("id").get(pk=endpoint))
        found = found.filter(destination_id=endpoint)
    if event_type:
        found = found.filter(event_type=event_type)
    if status:
        if status not in MessageStatus.values:
            raise ValueError(f"{status!r} is not a message state")
        found = found.filter(status=status)
    if since is not None:
        found = found.filter(created_at__gte=since)
    if until is not None:
        found = found.filter(created_at__lt=until)
    return found.order_by("-id")


def message(portal: Portal, pk: int) -> OutboxMessage:
    """One message with its newest attempts, newest first (``message.shown_attempts``, at
    most ATTEMPTS_SHOWN) and how many it has in all (``message.attempt_count``)."""
    found = _found(lambda: messages(portal).get(pk=pk))
    attempts = portal.scope.attempts().filter(message_id=found.pk)
    shown = list(attempts.order_by("-number", "-id")[:ATTEMPTS_SHOWN])
    found.shown_attempts = shown  # type: ignore[attr-defined]
    found.attempt_count = (  # type: ignore[attr-defined]
        attempts.count() if len(shown) == ATTEMPTS_SHOWN else len(shown)
    )
    return found


def message_of_key(portal: Portal, endpoint: int, key: str) -> OutboxMessage | None:
    """The endpoint's message of ``key`` (a test event's: its admission says the key);
    None when there is none or it is not the tenant's."""
    return messages(portal, endpoint=endpoint).filter(key=key).first()


def endpoint_choices(portal: Portal) -> list[tuple[int, str]]:
    """(id, name) of each of the tenant's endpoints, by name, for a filter's list (no
    health figures: those are a subquery each)."""
    return list(portal.scope.destinations().order_by("name").values_list("pk", "name"))


def may_read_answers(portal: Portal) -> bool:
    """An answer's text (what a merchant's server said) is shown to a session that may
    manage endpoints, as the admin shows it to staff who may change a destination
    (admin/answers.py); others see its status and size."""
    return portal.may(Capability.MANAGE_ENDPOINTS)


def recovery_jobs(portal: Portal, *, endpoint: str | None = None) -> list[RecoveryJob]:
    return recovery.recovery_jobs_shown(scope=portal.scope, destination_name=endpoint)


def recovery_job(portal: Portal, pk: int) -> RecoveryJob:
    return _found(
        lambda: recovery.with_sent_counts(
            portal.scope.recovery_jobs()
            .select_related("destination")
            .defer("destination__secrets", "destination__retiring_secrets")
        ).get(pk=pk)
    )


# --- acting ----------------------------------------------------------------------------


def _act(
    portal: Portal,
    capability: Capability,
    action: str,
    target: str,
    do: Callable[[PortalAction], T],
    detail: dict[str, object] | None = None,
) -> T:
    """Do one of the session's actions: its capability checked, then ``do`` in one
    transaction with its audit record (access.portal_action: the rate limit first). A
    refused one (not found, or a service's refusal) is recorded as refused, in a
    transaction of its own, then raised: refusals count against the limit too, so a
    session probing ids or posting bad forms is slowed like one that acts."""
    _needs(portal, capability)
    try:
        with transaction.atomic():
            record = portal_action(portal, action, target, detail)
            return _found(lambda: do(record))
    except (Http404, ValueError) as refused:
        why = str(refused)[:200] or type(refused).__name__
        with transaction.atomic():
            portal_action(portal, action, target, {**(detail or {}), "refused": why})
        raise


def endpoint_create(portal: Portal, fields: EndpointFields) -> tuple[WebhookDestination, str]:
    """A new endpoint and its secret (shown once)."""

    def create(record: PortalAction) -> tuple[WebhookDestination, str]:
        made, secret = endpoint_services.endpoint_create(
            scope=portal.scope, fields=fields, by=who(portal)
        )
        record.target = f"endpoint {made.pk}"
        record.save(update_fields=["target"])
        return made, secret

    detail: dict[str, object] = {"url": fields.url}
    return _act(portal, Capability.MANAGE_ENDPOINTS, "endpoint.add", "", create, detail)


def endpoint_update(portal: Portal, pk: int, fields: EndpointFields) -> WebhookDestination:
    return _act(
        portal,
        Capability.MANAGE_ENDPOINTS,
        "endpoint.change",
        f"endpoint {pk}",
        lambda _: endpoint_services.endpoint_update(
            scope=portal.scope, destination=pk, fields=fields, by=who(portal)
        ),
    )


def endpoint_enable(portal: Portal, pk: int, *, enabled: bool) -> bool:
    """Enable or disable an endpoint; False when it already was."""
    change = operations.destination_enable if enabled else operations.destination_disable
    changed = _act(
        portal,
        Capability.MANAGE_ENDPOINTS,
        "endpoint.enable" if enabled else "endpoint.disable",
        f"endpoint {pk}",
        lambda _: change(scope=portal.scope, destination=pk, by=who(portal)),
    )
    # enabling answers how many messages it holds (None: it was enabled), disabling a flag
    return changed is not None and changed is not False


def secret_rotate(portal: Portal, pk: int, overlap: timedelta) -> str:
    """The endpoint's new secret (shown once); its old ones sign for ``overlap`` more."""
    return _act(
        portal,
        Capability.MANAGE_SECRET,
        "secret.rotate",
        f"endpoint {pk}",
        lambda _: endpoint_services.secret_rotate(
            scope=portal.scope, destination=pk, overlap=overlap, by=who(portal)
        ),
        {"overlap_s": overlap.total_seconds()},
    )


def send_test_event(portal: Portal, pk: int, event_type: str) -> Admission:
    return _act(
        portal,
        Capability.RECOVER,
        "endpoint.test",
        f"endpoint {pk}",
        lambda _: endpoint_services.send_test_event(
            scope=portal.scope, destination=pk, event_type=event_type, by=who(portal)
        ),
        {"event_type": event_type},
    )


def recovery_plan(portal: Portal, pk: int, criteria: Criteria, rate: float | None = None) -> Plan:
    """What a job would send: it writes nothing but its audit record, and counts against
    the rate limit (a plan's count may read much of the outbox)."""
    return _act(
        portal,
        Capability.RECOVER,
        "recovery.plan",
        f"endpoint {pk}",
        lambda _: recovery.recovery_plan(
            scope=portal.scope, destination=pk, criteria=criteria, rate=rate
        ),
        {"kind": criteria.kind},
    )


def recovery_start(
    portal: Portal, pk: int, criteria: Criteria, rate: float | None = None
) -> RecoveryJob:
    return _act(
        portal,
        Capability.RECOVER,
        "recovery.start",
        f"endpoint {pk}",
        lambda _: recovery.recovery_start(
            scope=portal.scope, destination=pk, criteria=criteria, rate=rate, by=who(portal)
        ),
        {"kind": criteria.kind},
    )


def recovery_cancel(portal: Portal, pk: int) -> bool:
    return _act(
        portal,
        Capability.RECOVER,
        "recovery.cancel",
        f"recovery job {pk}",
        lambda _: recovery.recovery_cancel(scope=portal.scope, job=pk, by=who(portal)),
    )


def messages_retry(portal: Portal, ids: Iterable[int]) -> list[int]:
    """Retry the given failed or pending messages now (a bulk action): Http404 when one of
    them is not the tenant's, and then none is retried."""
    wanted = sorted(set(ids))

    def retry(record: PortalAction) -> list[int]:
        if portal.scope.messages().filter(pk__in=wanted).count() != len(wanted):
            raise Http404("not found")
        return operations.message_retry_now(scope=portal.scope, message_ids=wanted, by=who(portal))

    target = f"{len(wanted)} message(s)"
    return _act(portal, Capability.RECOVER, "messages.retry", target, retry, {"ids": wanted[:100]})


def sign_out(portal: Portal) -> None:
    """End the session, its last action recorded."""
    with transaction.atomic():
        portal_action(portal, "session.sign_out", f"session {portal.session.pk}", limited=False)
        portal_revoke([portal.session.pk], by=f"{who(portal)} (signed out)")
