"""The way in and out: the entry page that posts a link's token (read from the URL's
fragment by its script), the exchange that opens a session, signing out, and the view a
host mounts behind its own login (``host_portal``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST, require_safe

from .. import actions
from ..access import PortalRefused, portal_exchange, portal_of, portal_session_open
from ..guard import (
    COOKIE,
    PortalRequest,
    in_request_language,
    portal_headers,
    portal_page,
    refusal,
    session_key_of,
    set_session_cookie,
)
from ..models import PortalSession

# a token as portal_link makes it (43 characters); anything much longer is not one
TOKEN_MAX_CHARS = 100


@require_safe
@in_request_language
def enter(request: HttpRequest) -> HttpResponse:
    """A link's landing page: its script posts the fragment's token to ``exchange`` and
    clears it from the address bar; a request that has a session goes to its endpoints."""
    key, _cookie = session_key_of(request)
    if portal_of(key) is not None:
        return portal_headers(HttpResponseRedirect(reverse("webhook_portal:endpoints")))
    return portal_headers(render(request, "webhook_receiver/portal/enter.html"))


@require_POST
@in_request_language
def exchange(request: HttpRequest) -> HttpResponse:
    """A link's token for a session (CSRF-checked like any form post): the cookie is set
    and the browser goes to the endpoints; a used, expired or unknown token is 403."""
    token = request.POST.get("token", "")[:TOKEN_MAX_CHARS]
    try:
        session, key = portal_exchange(token)
    except PortalRefused as refused:
        return portal_headers(refusal(request, str(refused)))
    return _opened(request, session, key)


def _opened(request: HttpRequest, session: PortalSession, key: str) -> HttpResponse:
    response = HttpResponseRedirect(reverse("webhook_portal:endpoints"))
    lifetime = int((session.expires_at - session.created_at).total_seconds())
    set_session_cookie(response, request, key, max_age=lifetime)
    return portal_headers(response)


@require_POST
@portal_page()
def sign_out(request: PortalRequest) -> HttpResponse:
    actions.sign_out(request.portal)
    response = render(
        request,
        "webhook_receiver/portal/refused.html",
        {"reason": _("You have signed out of the portal.")},
    )
    response.delete_cookie(COOKIE, path=reverse("webhook_portal:enter"))
    return response


@dataclass(frozen=True)
class Grant:
    """Whose portal a host's signed-in user opens, and what it may do there."""

    tenant: str
    capabilities: Iterable[str] = field(default=())
    # the host's words for who opened it, kept on the session ("user alice")
    by: str = ""


def host_portal(
    grant_of: Callable[[HttpRequest], Grant | None],
) -> Callable[[HttpRequest], HttpResponse]:
    """A view that opens the portal from the host's own pages: mount it behind the host's
    login, with a function that maps its user to a tenant (None: no portal for them, 403)::

        path("account/webhooks/", login_required(host_portal(merchant_grant)))

    A GET opens a session for the user's tenant (a new one each time) and goes to its
    endpoints."""

    @require_safe
    @in_request_language
    def view(request: HttpRequest) -> HttpResponse:
        grant = grant_of(request)
        if grant is None:
            return portal_headers(
                refusal(request, _("There is no webhook portal for your account."))
            )
        session, key = portal_session_open(
            grant.tenant, grant.capabilities, by=grant.by or "the host's page"
        )
        return _opened(request, session, key)

    return view
