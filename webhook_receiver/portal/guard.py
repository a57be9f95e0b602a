"""How a request reaches the portal: its session (the cookie, or ``Authorization:
Bearer`` for the JSON API), what it may do, and the headers every portal answer carries.

Pages are wrapped by ``portal_page``; the API's views use ``PortalAuthentication`` and
``PortalCapability``. Both answer a missing or ended session with 403 and a missing
capability with 403 naming it; another tenant's id is 404 (the scope finds nothing), the
same answer as an id that does not exist.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils import translation
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from rest_framework.authentication import BaseAuthentication, CSRFCheck
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ..conf import app_settings
from .access import Portal, TooManyActions, capability_missing_text, portal_of
from .models import Capability

COOKIE = "webhook_portal"
# a page's answer, or the API's (DRF's Response)
Answer = TypeVar("Answer", bound=HttpResponseBase)
SESSION_ENDED = gettext_lazy(
    "Your portal session has ended or was never opened. Ask for a new link."
)


class PortalRequest(HttpRequest):
    """A request ``portal_page`` let in: its session is ``portal``."""

    portal: Portal


BEARER = "bearer "


def session_key_of(request: HttpRequest) -> tuple[str | None, bool]:
    """The session key the request carries, and whether it came in the cookie (which
    CSRF must then guard) rather than a bearer header."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header[: len(BEARER)].lower() == BEARER:
        return header[len(BEARER) :].strip(), False
    return request.COOKIES.get(COOKIE), True


def set_session_cookie(
    response: HttpResponse, request: HttpRequest, key: str, max_age: int
) -> None:
    """The portal's own cookie: HttpOnly, Secure over HTTPS, SameSite as the host's session
    cookie (``SESSION_COOKIE_SAMESITE``: ``"None"`` to use the portal in another site's
    iframe, docs/sending.md#the-merchant-portal), for the portal's path only."""
    response.set_cookie(
        COOKIE,
        key,
        max_age=max_age,
        path=reverse("webhook_portal:enter"),
        secure=request.is_secure(),
        httponly=True,
        samesite=settings.SESSION_COOKIE_SAMESITE or "Lax",
    )


def portal_headers(response: HttpResponse) -> HttpResponse:
    """What every portal answer carries: never cached, no Referer to another site, and
    framed only by the origins ``PORTAL_FRAME_ANCESTORS`` lists (these views alone)."""
    add_never_cache_headers(response)
    # same-origin, not no-referrer: with no-referrer a browser posts every form with
    # "Origin: null", which Django's CSRF check refuses. No other site is sent a Referer
    # either way, and a link's token is in the fragment, which no Referer carries.
    response["Referrer-Policy"] = "same-origin"
    ancestors = app_settings().portal_frame_ancestors
    response["Content-Security-Policy"] = "frame-ancestors " + (
        " ".join(("'self'", *ancestors)) if ancestors else "'none'"
    )
    if ancestors:
        # the CSP above says who may frame it; X-Frame-Options has no way to list origins
        response.xframe_options_exempt = True
    return response


def in_request_language(view: Callable[..., Answer]) -> Callable[..., Answer]:
    """The view's answer in the request's language (its Accept-Language or language
    cookie among the host's LANGUAGES, as LocaleMiddleware would choose), whether or not
    the host translates its other pages: the portal needs no middleware, and the host's
    hot paths none of its own."""

    @functools.wraps(view)
    def answered(request: HttpRequest, *args: Any, **kwargs: Any) -> Answer:
        language = translation.get_language_from_request(request)
        with translation.override(language):
            response = view(request, *args, **kwargs)
        response.headers.setdefault("Content-Language", language)
        patch_vary_headers(response, ("Accept-Language", "Cookie"))
        return response

    return answered


def portal_page(
    capability: Capability | None = None,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """A portal page, in the request's language: its open session as ``request.portal``
    (a Portal), 403 without one or without ``capability``."""

    def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @functools.wraps(view)
        @in_request_language
        def page(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            key, _cookie = session_key_of(request)
            portal = portal_of(key)
            if portal is None:
                response = refusal(request, str(SESSION_ENDED))
            else:
                # set before a refusal too: its page shows the session's navigation
                request.portal = portal  # type: ignore[attr-defined]
                if portal.may(capability):
                    response = _answered(view, request, *args, **kwargs)
                else:
                    response = refusal(request, capability_missing_text(capability))
            return portal_headers(response)

        return page

    return wrap


def _answered(
    view: Callable[..., HttpResponse], request: HttpRequest, *args: Any, **kwargs: Any
) -> HttpResponse:
    """The view's answer, or the portal's page for what actions.py raises: not found
    (another tenant's id too), not allowed, too many actions."""
    try:
        return view(request, *args, **kwargs)
    except Http404:
        return refusal(request, _("There is nothing here, or it is not yours."), status=404)
    except DjangoPermissionDenied as denied:
        return refusal(request, str(denied) or _("This session may not do that."))
    except TooManyActions as busy:
        response = refusal(
            request,
            _("Too many changes at once: try again in %(s)d s.") % {"s": busy.retry_after},
            status=429,
        )
        response["Retry-After"] = str(busy.retry_after)
        return response


def refusal(request: HttpRequest, reason: str, status: int = 403) -> HttpResponse:
    return render(
        request, "webhook_receiver/portal/refused.html", {"reason": reason}, status=status
    )


class PortalAuthentication(BaseAuthentication):
    """The API's: a session key as ``Authorization: Bearer KEY`` (a host's server), or the
    portal's cookie (its pages' scripts), then with Django's CSRF check as DRF's
    SessionAuthentication does. ``request.auth`` is the Portal."""

    def authenticate(self, request: Request) -> tuple[Any, Portal] | None:
        key, from_cookie = session_key_of(request._request)
        if not key:
            return None
        portal = portal_of(key)
        if portal is None:
            raise PermissionDenied(_("Your portal session has ended. Ask for a new link."))
        if from_cookie:
            self._enforce_csrf(request)
        return (None, portal)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="webhook portal"'

    def _enforce_csrf(self, request: Request) -> None:
        check = CSRFCheck(lambda req: HttpResponse())
        check.process_request(request._request)
        reason = check.process_view(request._request, lambda req: HttpResponse(), (), {})
        if reason:
            raise PermissionDenied(f"CSRF failed: {reason}")


class PortalCapability(BasePermission):
    """An open portal session, with the view's ``capability`` (None: reading) for an
    unsafe method, or ``read_capability`` for a safe one when the view sets it."""

    message = _("This needs an open portal session.")

    def has_permission(self, request: Request, view: Any) -> bool:
        portal = request.auth
        if not isinstance(portal, Portal):
            return False
        safe = request.method in ("GET", "HEAD", "OPTIONS")
        needed = getattr(view, "read_capability" if safe else "capability", None)
        if not portal.may(needed):
            self.message = capability_missing_text(needed)
            return False
        return True
