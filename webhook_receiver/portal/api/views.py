"""The API's way in and out (a link's token for a session, ending it) and the event
catalog. The endpoints' views are in endpoints.py, the messages' in messages.py, the
recovery's in recovery.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import OpenApiResponse
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from ...outbound.endpoints import offered_catalog
from .. import actions
from ..access import PortalRefused, portal_exchange
from ..guard import COOKIE
from .base import PortalAPIView, PortalDetailSerializer, PortalProblemSerializer, operation
from .serializers import (
    PortalCatalogSerializer,
    PortalExchangeSerializer,
    PortalSessionSerializer,
)

# a token as access.portal_link makes it is 43 characters; anything much longer is not one
TOKEN_MAX_CHARS = 100


class SessionView(PortalAPIView):
    """``POST``: a link's token for a session, once (no session needed, and no CSRF
    check: the token is the credential). ``DELETE``: end the request's session."""

    def _opening(self) -> bool:
        request: HttpRequest | None = getattr(self, "request", None)
        return request is not None and request.method == "POST"

    def get_authenticators(self) -> list[Any]:
        return [] if self._opening() else super().get_authenticators()

    def get_permissions(self) -> Sequence[Any]:
        return [AllowAny()] if self._opening() else super().get_permissions()

    @operation(
        "portal_session_open",
        None,
        "Exchange a link's token (the part of its address after `#`) for a session, "
        "once: a used, expired or unknown token is refused (403), the three alike. The "
        "answer's `session` is the key to send as `Authorization: Bearer KEY`.",
        request=PortalExchangeSerializer,
        responses={
            201: PortalSessionSerializer,
            400: OpenApiResponse(PortalProblemSerializer, "No token."),
            403: OpenApiResponse(PortalDetailSerializer, "Used, expired or unknown."),
        },
        auth=[],
        session=False,
    )
    def post(self, request: Request) -> Response:
        body = PortalExchangeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            session, key = portal_exchange(body.validated_data["token"][:TOKEN_MAX_CHARS])
        except PortalRefused as refused:
            raise PermissionDenied(str(refused)) from None
        opened = {
            "session": key,
            "expires_at": session.expires_at,
            "tenant": session.tenant,
            "capabilities": session.capabilities,
        }
        return Response(PortalSessionSerializer(opened).data, status=201)

    @operation(
        "portal_session_end",
        None,
        "End this session: its key opens nothing more.",
        responses={204: None},
    )
    def delete(self, request: Request) -> Response:
        actions.sign_out(self.portal)
        response = Response(status=204)
        response.delete_cookie(COOKIE, path=reverse("webhook_portal:enter"))
        return response


class CatalogView(PortalAPIView):
    """The event types the host sends, and where their schemas are."""

    @operation(
        "portal_catalog",
        None,
        "The event types an endpoint may subscribe to: each one's name, group, version, "
        "description, whether it is deprecated or opt-in (subscribed to by name only), an "
        "example of its data, and its schema's place in the OpenAPI document.",
        responses={200: PortalCatalogSerializer},
    )
    def get(self, request: Request) -> Response:
        document = catalog_address(request)
        types = [
            {
                "name": entry.name,
                "group": entry.group,
                "version": entry.version,
                "description": entry.description,
                "deprecated": entry.deprecated,
                "opt_in": entry.opt_in,
                "example": None if entry.example is None else dict(entry.example),
                "schema": f"{document}#/webhooks/{entry.name}" if document else None,
            }
            for entry in offered_catalog()
        ]
        shown = {"document": document, "event_types": types}
        return Response(PortalCatalogSerializer(shown).data)


def catalog_address(request: Request) -> str | None:
    """The OpenAPI document's absolute address, where the host serves it (None: not)."""
    try:
        return request.build_absolute_uri(reverse("webhook_catalog"))
    except NoReverseMatch:
        return None
