"""The API's recovery: plan one (writes nothing), start, read and cancel jobs."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response

from ...outbound.models import RecoveryJob
from .. import actions
from ..models import Capability
from .base import PortalAPIView, operation
from .serializers import (
    PortalCriteriaSerializer,
    PortalJobFilterSerializer,
    PortalJobSerializer,
    PortalJobStartSerializer,
    PortalJobSwitchSerializer,
    PortalPlanSerializer,
)

RECOVER = Capability.RECOVER.value
CRITERIA = (
    "`kind` is `recover` (failed messages, sent again under their keys), `missing` (what "
    "the tenant's other endpoints were sent and this one never was) or `replay` "
    "(delivered messages); they are chosen by admission time (`since`, within the "
    "endpoint's replay horizon; `until`), event types, answer classes and an ordering key "
    "prefix, and sent at `rate` a second, below the endpoint's own (none: half of it)."
)


def job_shown(view: PortalAPIView, pk: int) -> dict[str, Any]:
    return dict(PortalJobSerializer(actions.recovery_job(view.portal, pk)).data)


class RecoveryPlanView(PortalAPIView):
    capability = RECOVER

    @operation(
        "portal_recovery_plan",
        RECOVER,
        "What a recovery job of the endpoint would send: how many messages, the first few, "
        "how long at its rate, and what to know first. Writes nothing. " + CRITERIA,
        request=PortalCriteriaSerializer,
        responses={200: PortalPlanSerializer},
        refused=(400, 404),
    )
    def post(self, request: Request, pk: int) -> Response:
        body = PortalCriteriaSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        plan = actions.recovery_plan(self.portal, pk, body.criteria(), body.validated_data["rate"])
        shown = {
            "endpoint_name": plan.destination,
            "count": plan.count,
            "sample": [
                {"key": key, "event_type": event_type, "created_at": created_at}
                for key, event_type, created_at in plan.sample
            ],
            "matched_types": plan.matched_types,
            "rate": plan.rate,
            "duration_seconds": plan.duration.total_seconds(),
            "warnings": plan.warnings,
        }
        return Response(PortalPlanSerializer(shown).data)


class JobsView(PortalAPIView):
    capability = RECOVER

    @operation(
        "portal_recovery_jobs",
        None,
        "The tenant's last 20 recovery jobs (of one endpoint with `?endpoint=`), newest "
        "first, each with its progress and its messages counted by their status now.",
        parameters=[PortalJobFilterSerializer],
        responses={200: PortalJobSerializer(many=True)},
        refused=(400, 404),
    )
    def get(self, request: Request) -> Response:
        query = PortalJobFilterSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        endpoint = query.validated_data.get("endpoint")
        name = None if endpoint is None else actions.endpoint(self.portal, endpoint).name
        jobs: list[RecoveryJob] = actions.recovery_jobs(self.portal, endpoint=name)
        return Response(PortalJobSerializer(jobs, many=True).data)

    @operation(
        "portal_recovery_job_start",
        RECOVER,
        "Start a recovery job of an endpoint: planned as the recovery plan is, then run by "
        "the relay, one job an endpoint at a time. " + CRITERIA,
        request=PortalJobStartSerializer,
        responses={201: PortalJobSerializer},
        refused=(400, 404, 429),
    )
    def post(self, request: Request) -> Response:
        body = PortalJobStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = actions.recovery_start(
            self.portal,
            body.validated_data["endpoint"],
            body.criteria(),
            body.validated_data["rate"],
        )
        return Response(job_shown(self, job.pk), status=201)


class JobView(PortalAPIView):
    @operation(
        "portal_recovery_job",
        None,
        "One recovery job: what it asked, how far it has gone, and its messages counted by "
        "their status now.",
        responses={200: PortalJobSerializer},
        refused=(404,),
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(job_shown(self, pk))


class JobCancelView(PortalAPIView):
    capability = RECOVER

    @operation(
        "portal_recovery_job_cancel",
        RECOVER,
        "Stop a running job: it releases nothing more (what it released is still sent). "
        "`changed` is false when it was not running.",
        request=None,
        responses={200: PortalJobSwitchSerializer},
        refused=(404, 429),
    )
    def post(self, request: Request, pk: int) -> Response:
        changed = actions.recovery_cancel(self.portal, pk)
        return Response({"changed": changed, "job": job_shown(self, pk)})
