"""What every view of the portal's JSON API shares: its policies, set here rather than
taken from the host's ``REST_FRAMEWORK`` defaults (a host's default authentication,
permission, throttling, parser or renderer never reaches the portal), its headers
(guard.portal_headers), and one shape for every refusal:

- 400 ``{"detail": why, "problems": {field: why}}``: a body or a query that cannot be
  read, and the services' refusals (EndpointRefused, RecoveryRefused, ValueError);
- 401 without a session, 403 with an ended one or without the capability, 404 for what
  the tenant's scope does not hold (another tenant's id too), 429 with ``Retry-After``
  over ``PORTAL_ACTIONS_PER_MINUTE``: ``{"detail": why}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ParseError, Throttled, ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import CursorPagination, PageNumberPagination
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView, set_rollback
from rest_framework.views import exception_handler as drf_exception_handler

from ...core import storable
from ...outbound.endpoints import EndpointRefused
from ..access import Portal, TooManyActions
from ..guard import (
    PortalAuthentication,
    PortalCapability,
    in_request_language,
    portal_headers,
)

PAGE_SIZE = 50
SURROGATES = re.compile("[\ud800-\udfff]")
# the key a refusal of the whole body (not one field) is reported under
BODY = "body"


class PortalJSONParser(JSONParser):
    """JSON, strictly (no NaN nor Infinity, whatever the host's ``STRICT_JSON``); a body
    nested too deep for Python's parser is a 400 like any unreadable body."""

    strict = True

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deep") from None


class PortalPages(PageNumberPagination):
    page_size = PAGE_SIZE
    page_size_query_param = None


class PortalCursor(CursorPagination):
    """Newest first, 50 a page, ``?cursor=`` from the page's ``next``/``previous``."""

    page_size = PAGE_SIZE
    ordering = "-id"
    page_size_query_param = None


class PortalAPIView(APIView):
    """A view of the portal's API: the portal's session (``PortalAuthentication``: bearer
    or cookie with CSRF), the view's ``capability`` for an unsafe method and
    ``read_capability`` for a safe one (``PortalCapability``; actions.py checks again),
    no throttle (the audit's rate limit is the portal's), JSON in and out."""

    authentication_classes = [PortalAuthentication]
    permission_classes = [PortalCapability]
    throttle_classes: list[Any] = []
    parser_classes = [PortalJSONParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = DefaultContentNegotiation
    versioning_class = None
    metadata_class = None
    capability: str | None = None
    read_capability: str | None = None

    @property
    def portal(self) -> Portal:
        """The request's session (PortalCapability let it in)."""
        found = self.request.auth
        assert isinstance(found, Portal)
        return found

    def get_exception_handler(self) -> Any:
        return portal_exception_handler

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # in the request's language, as the pages are
        return in_request_language(super().dispatch)(request, *args, **kwargs)

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        response = super().finalize_response(request, response, *args, **kwargs)
        portal_headers(response)
        return response


def portal_exception_handler(exc: Exception, context: Mapping[str, Any]) -> Response | None:
    """DRF's own handler (never the host's ``EXCEPTION_HANDLER``), after the portal's
    errors are said as DRF's: too many actions a 429 with ``Retry-After``, a service's
    refusal a 400 with its reasons; every 400 as ``{"detail", "problems"}``."""
    if isinstance(exc, TooManyActions):
        exc = Throttled(wait=exc.retry_after, detail="Too many changes at once.")
    elif isinstance(exc, EndpointRefused):
        return refused(str(exc), exc.problems)
    elif isinstance(exc, ValueError):  # RecoveryRefused, PortalRefused, a service's
        return refused(str(exc) or "this cannot be done", {})
    response = drf_exception_handler(exc, dict(context))
    if response is not None and isinstance(exc, ValidationError | ParseError):
        problems = flattened(exc.detail)
        detail = "; ".join(f"{name}: {why}" for name, why in problems.items())
        return refused(detail or "the request cannot be read", problems)
    if response is not None and response.status_code == 400:
        response.data = {**response.data, "problems": {}}
    return response


def refused(detail: str, problems: dict[str, str]) -> Response:
    """A 400. Its words may quote the request, which may hold what is not text (a lone
    surrogate): each such character is said as U+FFFD, or the answer could not be sent."""
    set_rollback()
    said = {_text(name): _text(why) for name, why in problems.items()}
    return Response({"detail": _text(detail), "problems": said}, status=400)


def _text(value: str) -> str:
    return SURROGATES.sub("\ufffd", value)


def flattened(detail: Any, prefix: str = "") -> dict[str, str]:
    """A DRF error detail (nested dicts and lists of messages) as field -> why, nested
    fields' names joined with dots (``event_types.0``)."""
    if isinstance(detail, Mapping):
        found: dict[str, str] = {}
        for name, inner in detail.items():
            key = BODY if name == api_settings.NON_FIELD_ERRORS_KEY else str(name)
            found.update(flattened(inner, f"{prefix}.{key}" if prefix else key))
        return found
    if isinstance(detail, list) and any(isinstance(d, Mapping | list) for d in detail):
        found = {}
        for index, inner in enumerate(detail):
            found.update(flattened(inner, f"{prefix}.{index}" if prefix else str(index)))
        return found
    messages = detail if isinstance(detail, list) else [detail]
    return {prefix or BODY: " ".join(str(m) for m in messages if m)}


# --- fields that PostgreSQL can store -------------------------------------------------


class Text(serializers.CharField):
    """A CharField whose value PostgreSQL can store (no lone surrogate; DRF refuses NUL)."""

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        problem = storable.json_problem(value)
        if problem:
            raise ValidationError(problem)
        return value


class Json(serializers.JSONField):
    """Any JSON value PostgreSQL can store in a ``jsonb`` column."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        problem = storable.json_problem(value)
        if problem:
            raise ValidationError(problem)
        return value


# --- the OpenAPI document ---------------------------------------------------------------


class PortalProblemSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="Why, in words.")
    problems = serializers.DictField(
        child=serializers.CharField(),
        help_text="Each field that cannot be, and why (`body`: the whole request).",
    )


class PortalDetailSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="Why, in words.")


REFUSALS = {
    400: OpenApiResponse(PortalProblemSerializer, "The request cannot be done, and why."),
    401: OpenApiResponse(PortalDetailSerializer, "No portal session."),
    403: OpenApiResponse(PortalDetailSerializer, "The session has ended, or lacks the capability."),
    404: OpenApiResponse(PortalDetailSerializer, "Not found, or not the tenant's."),
    429: OpenApiResponse(
        PortalDetailSerializer,
        "Over the session's actions a minute: try again after `Retry-After` seconds.",
    ),
}


def operation(
    operation_id: str,
    capability: str | None,
    text: str,
    *,
    responses: dict[int, Any],
    refused: tuple[int, ...] = (),
    session: bool = True,
    **options: Any,
) -> Any:
    """A portal operation's ``extend_schema``: its id (``portal_…``), the ``portal`` tag,
    its description ending with what it needs (a session, and the capability, also said
    as ``x-portal-capability``), its answers and its refusals (with a ``session``, 401
    and 403 too)."""
    if not session:
        said = f"{text}\n\nNo session needed."
    elif capability is None:
        said = f"{text}\n\nAny open portal session may."
    else:
        said = f"{text}\n\nNeeds the capability `{capability}`."
    codes = {*refused, *((401, 403) if session else ())}
    answers = {**{code: REFUSALS[code] for code in codes}, **responses}
    return extend_schema(
        operation_id=operation_id,
        tags=["portal"],
        description=said,
        responses=dict(sorted(answers.items())),
        extensions={"x-portal-capability": capability},
        **options,
    )


class PortalBearerScheme(OpenApiAuthenticationExtension):
    """How the document names the portal's session: ``Authorization: Bearer KEY`` (the
    key ``POST …/api/session/`` answers). The portal's own pages' scripts send its
    cookie instead, with a CSRF token."""

    target_class = "webhook_receiver.portal.guard.PortalAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A portal session's key, from POST api/session/ (a link's token "
            "exchanged) or the host's own page.",
        }
