"""The API's messages: list them (newest first, filtered), read one with its attempts,
retry some at once."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response

from .. import actions
from ..models import Capability
from .base import PortalAPIView, PortalCursor, operation
from .serializers import (
    PortalMessageDetailSerializer,
    PortalMessageFilterSerializer,
    PortalMessageSerializer,
    PortalRetriedSerializer,
    PortalRetrySerializer,
)


class MessagesView(PortalAPIView):
    pagination_class = PortalCursor

    @operation(
        "portal_messages",
        None,
        "The tenant's messages, newest first, 50 a page (follow `next`), narrowed by "
        "endpoint (another's is 404), event type, status, and admission time (`since` "
        "inclusive, `until` exclusive, ISO 8601). An answer's text is given to a session "
        "that may manage endpoints; others get its size.",
        parameters=[PortalMessageFilterSerializer],
        responses={200: PortalMessageSerializer(many=True)},
        refused=(400,),
    )
    def get(self, request: Request) -> Response:
        query = PortalMessageFilterSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        if "endpoint" in query.validated_data:  # one of the tenant's, or 404 as the pages
            actions.endpoint(self.portal, query.validated_data["endpoint"])
        found = actions.messages(self.portal, **query.validated_data)
        pages = PortalCursor()
        page = pages.paginate_queryset(found, request, view=self)
        context = {"readable": actions.may_read_answers(self.portal)}
        shown = PortalMessageSerializer(page, many=True, context=context).data
        return pages.get_paginated_response(shown)


class MessageView(PortalAPIView):
    @operation(
        "portal_message",
        None,
        "One message, its body and its newest attempts (100 at most). An answer's text is "
        "given to a session that may manage endpoints; others get its size.",
        responses={200: PortalMessageDetailSerializer},
        refused=(404,),
    )
    def get(self, request: Request, pk: int) -> Response:
        found = actions.message(self.portal, pk)
        context = {"readable": actions.may_read_answers(self.portal)}
        return Response(PortalMessageDetailSerializer(found, context=context).data)


class MessagesRetryView(PortalAPIView):
    capability = Capability.RECOVER.value

    @operation(
        "portal_messages_retry",
        Capability.RECOVER.value,
        "Retry messages now: each failed or pending one becomes pending, due now, with its "
        "whole retry budget again. Every id must be the tenant's: if one is not (or does not "
        "exist), none is retried (404).",
        request=PortalRetrySerializer,
        responses={200: PortalRetriedSerializer},
        refused=(400, 404, 429),
    )
    def post(self, request: Request) -> Response:
        body = PortalRetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        retried = actions.messages_retry(self.portal, body.validated_data["ids"])
        return Response(PortalRetriedSerializer({"retried": retried}).data)
