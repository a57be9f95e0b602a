"""The API's endpoints: list, add, read, change, disable and enable them, read their public
keys, rotate their secret, send them a test event. Each a thin view over actions.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response

from ...outbound.endpoints import endpoint_checked
from .. import actions
from ..models import Capability
from .base import PortalAPIView, PortalPages, operation
from .serializers import (
    PortalAdmissionSerializer,
    PortalEndpointChangedSerializer,
    PortalEndpointCreatedSerializer,
    PortalEndpointInSerializer,
    PortalEndpointSerializer,
    PortalEndpointSwitchSerializer,
    PortalPublicKeysSerializer,
    PortalRotatedSerializer,
    PortalRotateSerializer,
    PortalTestSerializer,
)

MANAGE = Capability.MANAGE_ENDPOINTS.value


def shown(view: PortalAPIView, pk: int) -> dict[str, Any]:
    """An endpoint of the tenant's as the API shows it, its health figures read now."""
    return dict(PortalEndpointSerializer(actions.endpoint(view.portal, pk)).data)


class EndpointsView(PortalAPIView):
    capability = MANAGE
    pagination_class = PortalPages

    @operation(
        "portal_endpoints",
        None,
        "The tenant's endpoints, 50 a page, each with its health figures.",
        responses={200: PortalEndpointSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        pages = PortalPages()
        page = pages.paginate_queryset(actions.endpoints(self.portal), request, view=self)
        return pages.get_paginated_response(PortalEndpointSerializer(page, many=True).data)

    @operation(
        "portal_endpoint_add",
        MANAGE,
        "Add an endpoint. The answer carries its signing `secret`: the only time it is "
        "ever given. `warning` says when the URL's name does not resolve now (it is saved, "
        "and checked again before each send).",
        request=PortalEndpointInSerializer,
        responses={201: PortalEndpointCreatedSerializer},
        refused=(400, 429),
    )
    def post(self, request: Request) -> Response:
        body = PortalEndpointInSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields, warning = endpoint_checked(**body.validated_data)
        made, secret = actions.endpoint_create(self.portal, fields)
        return Response({**shown(self, made.pk), "warning": warning, "secret": secret}, 201)


class EndpointView(PortalAPIView):
    capability = MANAGE

    @operation(
        "portal_endpoint",
        None,
        "One endpoint, with its health figures.",
        responses={200: PortalEndpointSerializer},
        refused=(404,),
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(shown(self, pk))

    @operation(
        "portal_endpoint_change",
        MANAGE,
        "Change an endpoint's URL, description, subscriptions or filter: the fields given, "
        "the others kept, all checked as when it was added.",
        request=PortalEndpointInSerializer(partial=True),
        responses={200: PortalEndpointChangedSerializer},
        refused=(400, 404, 429),
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = PortalEndpointInSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        given = body.validated_data
        current = actions.endpoint(self.portal, pk)
        fields, warning = endpoint_checked(
            url=given.get("url", current.url),
            event_types=given.get("event_types", current.event_types or []),
            filter=given.get("filter", current.filter),
            description=given.get("description", current.description),
        )
        actions.endpoint_update(self.portal, pk, fields)
        return Response({**shown(self, pk), "warning": warning})


class EndpointSwitchView(PortalAPIView):
    capability = MANAGE
    enabled = True

    def post(self, request: Request, pk: int) -> Response:
        changed = actions.endpoint_enable(self.portal, pk, enabled=self.enabled)
        return Response({"changed": changed, "endpoint": shown(self, pk)})


class EndpointDisableView(EndpointSwitchView):
    enabled = False

    @operation(
        "portal_endpoint_disable",
        MANAGE,
        "Disable an endpoint: nothing more is sent to it; its messages wait, pending, "
        "until it is enabled again.",
        request=None,
        responses={200: PortalEndpointSwitchSerializer},
        refused=(404, 429),
    )
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class EndpointEnableView(EndpointSwitchView):
    enabled = True

    @operation(
        "portal_endpoint_enable",
        MANAGE,
        "Enable an endpoint: what waited is sent, in order.",
        request=None,
        responses={200: PortalEndpointSwitchSerializer},
        refused=(404, 429),
    )
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class SecretView(PortalAPIView):
    read_capability = Capability.VIEW_SECRET.value

    @operation(
        "portal_endpoint_keys",
        Capability.VIEW_SECRET.value,
        "How many secrets sign the endpoint's requests now, and the public keys of its "
        "signing keys (`v1a`, `whpk_…`). Never a secret: a secret is given once, when the "
        "endpoint is added or its secret rotated.",
        responses={200: PortalPublicKeysSerializer},
        refused=(404,),
    )
    def get(self, request: Request, pk: int) -> Response:
        keys, signing = actions.public_keys(self.portal, pk)
        return Response(PortalPublicKeysSerializer({"signing": signing, "public_keys": keys}).data)


class SecretRotateView(PortalAPIView):
    capability = Capability.MANAGE_SECRET.value

    @operation(
        "portal_endpoint_secret_rotate",
        Capability.MANAGE_SECRET.value,
        "Give the endpoint a new secret, answered once. Its old secrets keep signing beside "
        "it for `overlap_seconds` (up to 7 days), so that the receiving end can switch "
        "without refusing a request.",
        request=PortalRotateSerializer,
        responses={200: PortalRotatedSerializer},
        refused=(400, 404, 429),
    )
    def post(self, request: Request, pk: int) -> Response:
        body = PortalRotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        overlap = timedelta(seconds=body.validated_data["overlap_seconds"])
        secret = actions.secret_rotate(self.portal, pk, overlap)
        until = actions.endpoint(self.portal, pk).retiring_until
        rotated = {"secret": secret, "old_secrets_sign_until": until}
        return Response(PortalRotatedSerializer(rotated).data)


class EndpointTestView(PortalAPIView):
    capability = Capability.RECOVER.value

    @operation(
        "portal_endpoint_test",
        Capability.RECOVER.value,
        "Send the endpoint a test event: the catalog's example of `event_type`, under a "
        "`test:` key, through its filter and limits like any message.",
        request=PortalTestSerializer,
        responses={201: PortalAdmissionSerializer},
        refused=(400, 404, 429),
    )
    def post(self, request: Request, pk: int) -> Response:
        body = PortalTestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        admitted = actions.send_test_event(self.portal, pk, body.validated_data["event_type"])
        return Response(PortalAdmissionSerializer(admitted).data, status=201)
