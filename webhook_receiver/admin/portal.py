"""The merchant portal as staff see it: the links made, the sessions open (revoked here,
behind ``revoke_portalsession``), and what each session did (the audit). Read-only: a
link or a session is made by the host (``portal_link``, ``webhook_portal_link``); no page
shows a token or a session key, which are stored as hashes only."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..portal.access import portal_revoke
from ..portal.models import PortalAction, PortalLink, PortalSession
from .base import ReadOnlyAdmin, custom_permission
from .cells import full_time


def _capabilities(record: PortalLink | PortalSession) -> str:
    return ", ".join(record.capabilities) or gettext("read-only")


@admin.register(PortalLink)
class PortalLinkAdmin(ReadOnlyAdmin):
    list_display = ("number", "tenant", "capabilities_shown", "created_by", "made", "state")
    list_filter = ("tenant",)
    search_fields = ("tenant", "created_by")
    fields = ("tenant", "capabilities_shown", "created_by", "made", "expires_at", "used_at")

    @admin.display(description=_("link"), ordering="id")
    def number(self, link: PortalLink) -> str:
        return f"#{link.pk}"

    @admin.display(description=_("capabilities"))
    def capabilities_shown(self, link: PortalLink) -> str:
        return _capabilities(link)

    @admin.display(description=_("made"), ordering="created_at")
    def made(self, link: PortalLink) -> str:
        return full_time(link.created_at)

    @admin.display(description=_("state"))
    def state(self, link: PortalLink) -> str:
        if link.used_at is not None:
            return gettext("used %(when)s") % {"when": full_time(link.used_at)}
        if link.expires_at <= timezone.now():
            return gettext("expired unused")
        return gettext("usable until %(when)s") % {"when": full_time(link.expires_at)}


@admin.register(PortalSession)
class PortalSessionAdmin(ReadOnlyAdmin):
    list_display = ("number", "tenant", "capabilities_shown", "opened_by", "opened", "state")
    list_filter = ("tenant",)
    search_fields = ("tenant", "opened_by")
    fields = ("tenant", "capabilities_shown", "opened_by", "opened", "expires_at", "state",
              "revoked_by")  # fmt: skip
    actions = ["revoke_selected"]

    has_revoke_permission = custom_permission("revoke")

    @admin.display(description=_("session"), ordering="id")
    def number(self, session: PortalSession) -> str:
        return f"#{session.pk}"

    @admin.display(description=_("capabilities"))
    def capabilities_shown(self, session: PortalSession) -> str:
        return _capabilities(session)

    @admin.display(description=_("opened"), ordering="created_at")
    def opened(self, session: PortalSession) -> str:
        return full_time(session.created_at)

    @admin.display(description=_("state"))
    def state(self, session: PortalSession) -> str:
        if session.revoked_at is not None:
            return gettext("revoked %(when)s") % {"when": full_time(session.revoked_at)}
        if session.expires_at <= timezone.now():
            return gettext("ended %(when)s") % {"when": full_time(session.expires_at)}
        return gettext("open until %(when)s") % {"when": full_time(session.expires_at)}

    @admin.action(description=_("Revoke the selected sessions"), permissions=["revoke"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[PortalSession]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        ended = portal_revoke(ids, by=request.user.get_username())
        self.message_user(
            request,
            ngettext(
                "%(n)d open session revoked: its next request is refused.",
                "%(n)d open sessions revoked: their next requests are refused.",
                ended,
            )
            % {"n": ended},
            messages.SUCCESS,
        )


@admin.register(PortalAction)
class PortalActionAdmin(ReadOnlyAdmin):
    list_display = ("when", "tenant", "session", "action", "target")
    list_filter = ("action", "tenant")
    search_fields = ("tenant", "target")
    list_select_related = ("session",)
    fields = ("when", "tenant", "session", "action", "target", "detail")

    @admin.display(description=_("when"), ordering="at")
    def when(self, action: PortalAction) -> str:
        return full_time(action.at)
