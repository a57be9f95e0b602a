"""The HTTP interface: a status map around ``webhook_receive``."""

from __future__ import annotations

import logging

from django.contrib.auth.decorators import login_not_required
from django.db import InterfaceError, OperationalError, transaction
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .exceptions import RejectedRequest
from .models import Result
from .services.inbound import webhook_receive

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "30"


# Not atomic even under ATOMIC_REQUESTS: the service owns its transactions, and the
# audit record of a failed event must survive the rollback of that event's work.
@method_decorator(transaction.non_atomic_requests, name="dispatch")
@method_decorator(csrf_exempt, name="dispatch")
# Senders never log in: exempt from a host's LoginRequiredMiddleware (Django 5.1+).
@method_decorator(login_not_required, name="dispatch")
class WebhookView(APIView):
    # The request is authenticated by its signature alone; the host's DRF defaults
    # must not parse, authenticate, throttle or render it differently.
    authentication_classes = ()
    permission_classes = ()
    parser_classes = ()
    throttle_classes = ()
    renderer_classes = (JSONRenderer,)

    def post(self, request: Request, source: str) -> Response:
        try:
            result = webhook_receive(
                source_slug=source,
                stream=request.stream,
                content_length=_content_length(request),
                headers=request.headers,
                remote_addr=request.META.get("REMOTE_ADDR"),
            )
        except RejectedRequest as exc:
            body = {"error": exc.code}
            if exc.show_detail:
                body["detail"] = str(exc)
            return Response(body, status=exc.status_code)
        except (OperationalError, InterfaceError) as exc:
            logger.warning("database unavailable; the sender will retry: %s", type(exc).__name__)
            return _retry_later()
        except Exception:
            # Reached only when a verified event could not even be captured as failed:
            # nothing was stored, so the sender must keep it and retry.
            logger.exception("webhook neither applied nor captured; the sender will retry")
            return _retry_later()
        if result.status in (Result.DEFERRED, Result.DEAD_LETTERED):
            return Response({"status": result.status, "event_key": result.event_key}, status=202)
        if result.status == Result.DUPLICATE:
            body = {
                "status": Result.DUPLICATE.value,
                "event_key": result.event_key,
                "original": result.outcome,
            }
            return Response(body, status=200)
        return Response(dict(result.outcome), status=200)


def _retry_later() -> Response:
    return Response(
        {"error": "temporarily_unavailable", "detail": "Retry later."},
        status=503,
        headers={"Retry-After": RETRY_AFTER_SECONDS},
    )


def _content_length(request: Request) -> int | None:
    try:
        length = int(request.META["CONTENT_LENGTH"])
    except (KeyError, ValueError):
        return None
    return length if length >= 0 else None
