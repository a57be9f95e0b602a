"""The HTTP interface: a status map around ``webhook_receive``."""

from __future__ import annotations

import logging
from typing import IO

from django.contrib.auth.decorators import login_not_required
from django.db import transaction
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..core import logs, outages
from ..exceptions import NotStored, RejectedRequest
from . import metrics
from .audit import request_client_address
from .models import Result
from .receive import webhook_receive

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
    # Senders only POST. Anything else is refused with 405 before any work (and without
    # an audit record): no DRF metadata for OPTIONS, no database.
    http_method_names = ["post"]

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        if isinstance(exc, MethodNotAllowed):
            # not a delivery: no line of Django's per request either (a flood of GETs
            # would be a line each); the server's access log has them
            logs.mark_logged(response)
        return response

    def post(self, request: Request, source: str) -> Response:
        stream, length = _body(request)
        try:
            # times the call and counts how it ended, refusals and failures included
            with metrics.receive_observed(source) as observed:
                result = webhook_receive(
                    source_slug=source,
                    stream=stream,
                    content_length=length,
                    headers=request.headers,
                    # REMOTE_ADDR, or the client's through TRUSTED_PROXIES
                    remote_addr=request_client_address(request.META),
                )
                observed.result = result.status
        except RejectedRequest as exc:
            body = {"error": exc.code}
            if exc.show_detail:
                body["detail"] = str(exc)
            # the service logged it (within the audit bound): Django's bare line would
            # log every refusal of a flood again
            return logs.mark_logged(Response(body, status=exc.status_code))
        except NotStored:  # logged where it happened
            return _retry_later()
        except Exception as exc:
            # A fault outside the service's own handling (a stream that broke while being
            # read, say): nothing was stored, so the sender must keep the event and retry.
            outages.connection_discard_if_broken(exc)
            logs.log_failure(logger, "webhook request failed; the sender will retry", exc)
            return _retry_later()
        if result.status in (Result.DEFERRED, Result.DEAD_LETTERED):
            return Response({"status": result.status, "event_key": result.event_key}, status=202)
        if result.status == Result.DUPLICATE:
            duplicate = {
                "status": Result.DUPLICATE.value,
                "event_key": result.event_key,
                "original": result.outcome,
            }
            return Response(duplicate, status=200)
        return Response(dict(result.outcome), status=200)


def _retry_later() -> Response:
    # every 503 here was logged where it happened, with its event's key: once is enough
    response = Response(
        {"error": NotStored.code, "detail": "Retry later."},
        status=503,
        headers={"Retry-After": RETRY_AFTER_SECONDS},
    )
    return logs.mark_logged(response)


def _body(request: Request) -> tuple[IO[bytes] | None, int | None]:
    """The body's stream and its announced length.

    A chunked body has no Content-Length. When the server has de-chunked it and marks
    the input's end (``wsgi.input_terminated``, as gunicorn does), it is read from the
    WSGI input to its end, the size limit enforced while reading. Without that mark
    there is no safe end to read to, and the body counts as empty.
    """
    length = _content_length(request)
    if length is None and request.META.get("wsgi.input_terminated"):
        return request.META["wsgi.input"], None
    return request.stream, length


def _content_length(request: Request) -> int | None:
    raw = request.META.get("CONTENT_LENGTH") or ""
    if not raw.isascii() or not raw.isdigit():
        return None
    # more digits than any body can have: over every limit, and kept away from int()
    return int(raw) if len(raw) <= 18 else 10**18
