"""Who may open the portal, and as which tenant: links, sessions, revocation, and the
audit that each action leaves (which the rate limit reads).

A host makes a link with ``portal_link(tenant, capabilities, expires_in)``: the token is
in the URL's fragment, which a browser never sends, so it reaches no server log and no
Referer header; the portal's entry page posts it (``portal_exchange``) for a session of
its own, once. A host's own page may open a session for its signed-in user directly
(``portal_session_open``, views.host_portal). Only the SHA-256 of a token or a session
key is stored. A session ends at its expiry or when revoked, alone or with every session
of its tenant.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from ..conf import app_settings
from ..core.retention import delete_in_batches
from ..outbound.tenancy import Scope, tenant_scope
from .models import Capability, PortalAction, PortalLink, PortalSession

logger = logging.getLogger(__name__)

DEFAULT_LINK_LIFETIME = timedelta(hours=1)
LONGEST_LINK_LIFETIME = timedelta(days=7)
ACTION_WINDOW = timedelta(minutes=1)


class PortalRefused(ValueError):
    """A link or session request the portal does not make: the reason is in the text."""


class TooManyActions(Exception):
    """The session took its ``PORTAL_ACTIONS_PER_MINUTE`` in the last minute."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many actions: try again in {retry_after} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Link:
    """A link made for a tenant: its address (with the token in its fragment) and row."""

    url: str
    record: PortalLink


@dataclass(frozen=True)
class Portal:
    """An open session, as a request sees it: whose, and what it may do."""

    session: PortalSession

    @property
    def tenant(self) -> str:
        return self.session.tenant

    @property
    def scope(self) -> Scope:
        return tenant_scope(self.session.tenant)

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(self.session.capabilities)

    def may(self, capability: str | None) -> bool:
        return capability is None or capability in self.capabilities


def capability_missing_text(capability: str | None) -> str:
    """What a session without ``capability`` is told."""
    label = Capability(capability).label if capability else ""
    return _("This session may not do that: it needs the capability to %(what)s.") % {"what": label}


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def capabilities_checked(capabilities: Iterable[str]) -> list[str]:
    """The capabilities asked for, known ones only, in the catalog's order; PortalRefused
    names an unknown one."""
    asked = set(capabilities)
    unknown = sorted(asked - set(Capability.values))
    if unknown:
        known = ", ".join(Capability.values)
        raise PortalRefused(f"unknown capability {', '.join(unknown)} (known: {known})")
    return [c for c in Capability.values if c in asked]


def portal_link(
    tenant: str,
    capabilities: Iterable[str] = (),
    expires_in: timedelta = DEFAULT_LINK_LIFETIME,
    *,
    by: str = "",
    base_url: str | None = None,
) -> Link:
    """A one-use link into the portal for ``tenant``, read-only unless ``capabilities``
    say more, usable for ``expires_in`` (one hour by default, seven days at most). Its
    address starts with ``base_url`` or the ``PORTAL_URL`` setting (the path alone
    without either)."""
    tenant_scope(tenant)  # ValueError for an empty key
    granted = capabilities_checked(capabilities)
    if not timedelta(0) < expires_in <= LONGEST_LINK_LIFETIME:
        raise PortalRefused("a link lasts more than nothing and at most 7 days")
    token = secrets.token_urlsafe(32)
    record = PortalLink.objects.create(
        token_hash=token_hash(token),
        tenant=tenant,
        capabilities=granted,
        created_by=by[:150],
        expires_at=timezone.now() + expires_in,
    )
    logger.info(
        "portal link %s made for tenant %s by %s: %s, until %s",
        record.pk,
        tenant,
        by or "the host",
        ", ".join(granted) or "read-only",
        record.expires_at.isoformat(timespec="seconds"),
    )
    start = base_url or app_settings().portal_url or reverse("webhook_portal:enter")
    return Link(url=f"{start}#{token}", record=record)


def portal_exchange(token: str) -> tuple[PortalSession, str]:
    """The session a link's token opens, and its key (for the cookie or a bearer
    header), once: the link is marked used in the same statement that finds it, so two
    requests with one token open one session. PortalRefused when the token is unknown,
    used or expired (one answer for the three: a guess learns nothing)."""
    now = timezone.now()
    with transaction.atomic():
        link = (
            PortalLink.objects.select_for_update()
            .filter(token_hash=token_hash(token), used_at__isnull=True, expires_at__gt=now)
            .first()
        )
        if link is None:
            raise PortalRefused(_("this link has been used or has expired: ask for a new one"))
        link.used_at = now
        link.save(update_fields=["used_at"])
        session, key = _session_create(link.tenant, link.capabilities, f"link {link.pk}", link)
    logger.info(
        "portal session %s opened for tenant %s by link %s", session.pk, link.tenant, link.pk
    )
    return session, key


def portal_session_open(
    tenant: str, capabilities: Iterable[str] = (), *, by: str
) -> tuple[PortalSession, str]:
    """A session for ``tenant`` opened by the host itself (its page, behind its login:
    views.host_portal), and its key. ``by`` says who, in the host's words."""
    tenant_scope(tenant)  # ValueError for an empty key
    session, key = _session_create(tenant, capabilities_checked(capabilities), by)
    logger.info("portal session %s opened for tenant %s by %s", session.pk, tenant, by)
    return session, key


def _session_create(
    tenant: str, capabilities: list[str], by: str, link: PortalLink | None = None
) -> tuple[PortalSession, str]:
    key = secrets.token_urlsafe(32)
    lifetime = timedelta(minutes=app_settings().portal_session_minutes)
    session = PortalSession.objects.create(
        key_hash=token_hash(key),
        tenant=tenant,
        capabilities=capabilities,
        link=link,
        opened_by=by[:150],
        expires_at=timezone.now() + lifetime,
    )
    return session, key


def portal_of(key: str | None) -> Portal | None:
    """The open session a key names: not expired, not revoked; None otherwise."""
    if not key:
        return None
    session = PortalSession.objects.filter(
        key_hash=token_hash(key), revoked_at__isnull=True, expires_at__gt=timezone.now()
    ).first()
    return None if session is None else Portal(session)


def portal_revoke(session_ids: Iterable[int] = (), *, tenant: str | None = None, by: str) -> int:
    """End the given sessions, or with ``tenant`` every open session of that tenant (both:
    those of the given ones that are the tenant's). Returns how many were open."""
    sessions = PortalSession.objects.filter(revoked_at__isnull=True)
    ids = list(session_ids)
    if ids:
        sessions = sessions.filter(pk__in=ids)
    if tenant is not None:
        sessions = sessions.filter(tenant=tenant)
    elif not ids:
        return 0
    ended = sessions.update(revoked_at=timezone.now(), revoked_by=by[:150])
    logger.info(
        "portal: %d session(s) revoked by %s (%s)",
        ended,
        by,
        f"tenant {tenant}" if tenant is not None else f"ids {ids}",
    )
    return ended


def portal_action(
    portal: Portal,
    action: str,
    target: str = "",
    detail: dict[str, object] | None = None,
    *,
    limited: bool = True,
) -> PortalAction:
    """Record that ``portal``'s session is taking ``action`` on ``target``, inside the
    caller's transaction (so an action that fails leaves no record), after its rate
    limit: TooManyActions when the session took ``PORTAL_ACTIONS_PER_MINUTE`` in the last
    minute (unless not ``limited``: signing out always may). The session's row is locked
    so that concurrent actions count one by one."""
    now = timezone.now()
    session = PortalSession.objects.select_for_update().get(pk=portal.session.pk)
    limit = app_settings().portal_actions_per_minute
    recent = list(
        PortalAction.objects.filter(session=session, at__gt=now - ACTION_WINDOW)
        .order_by("-at")
        .values_list("at", flat=True)[:limit]
    )
    if limited and len(recent) >= limit:
        oldest = recent[-1]
        wait = max(1, int((oldest + ACTION_WINDOW - now).total_seconds()) + 1)
        logger.warning(
            "portal session %s of tenant %s: %s refused, over %d actions a minute",
            session.pk,
            session.tenant,
            action,
            limit,
        )
        raise TooManyActions(wait)
    record = PortalAction.objects.create(
        session=session,
        tenant=session.tenant,
        action=action,
        target=target[:200],
        detail=detail or {},
        at=now,
    )
    # said once it happened: an action whose transaction rolls back leaves no line either
    transaction.on_commit(
        lambda: logger.info(
            "portal session %s of tenant %s: %s %s", session.pk, session.tenant, action, target
        )
    )
    return record


def purge_portal_records(*, now: datetime | None = None, max_batches: int = 1000) -> int:
    """Delete the portal's audit, and links and sessions that ended, older than
    ``AUDIT_RETENTION_DAYS`` (with the other audit records: tasks.purge_audit_records_task),
    in bounded batches; return how many rows went."""
    config = app_settings()
    cutoff = (now or timezone.now()) - config.audit_retention
    return sum(
        delete_in_batches(rows, batch_size=config.purge_batch_size, max_batches=max_batches)
        for rows in (
            PortalAction.objects.filter(at__lt=cutoff),
            PortalSession.objects.filter(expires_at__lt=cutoff),
            PortalLink.objects.filter(expires_at__lt=cutoff),
        )
    )
