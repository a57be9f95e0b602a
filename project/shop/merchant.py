"""A demo stand-in for a merchant's server: the other end of the shop's outgoing webhooks.

``make run`` registers it as the outbox destination ``demo-merchant`` (``manage.py
demo_setup``), so that a test event sent to the shop comes back out through the relay
to ``POST /demo-merchant/``. It does what a merchant's endpoint should: it verifies the
Standard Webhooks signature over the raw body (DEMO_MERCHANT_SECRET), with a timestamp
tolerance, and answers 401 when that fails. Otherwise it answers 200, except for a
share of requests (DEMO_MERCHANT_FAILURE_RATE) where it answers 500, so that the relay's
retries show. It keeps nothing: a real merchant also deduplicates on ``webhook-id``.
"""

from __future__ import annotations

import logging
import random

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from webhook_receiver import schemes
from webhook_receiver.exceptions import RejectedRequest

logger = logging.getLogger(__name__)

# The shop's messages are small; no merchant should read an unbounded body.
MAX_BODY_BYTES = 256 * 1024
# Standard Webhooks' recommended window: an older (or later) signature is refused,
# so that a captured request cannot be replayed later.
TOLERANCE_SECONDS = 5 * 60


@csrf_exempt  # a server-to-server POST, authenticated by its signature, not a cookie
@require_POST
def demo_merchant(request: HttpRequest) -> HttpResponse:
    body = request.read(MAX_BODY_BYTES + 1)  # one byte more tells a body that is too large
    if len(body) > MAX_BODY_BYTES:
        return JsonResponse({"error": "payload_too_large"}, status=413)
    secret = settings.DEMO_MERCHANT_SECRET
    # unset, or .env.example's placeholder: nothing verifies (rather than a 500)
    usable = secret and schemes.get_scheme("standard").secret_problem(secret) is None
    secrets = [secret] if usable else []
    try:
        # the app's StandardWebhooks scheme (schemes/standard.py), and the tolerance
        message = schemes.verify(
            scheme="standard",
            secrets=secrets,
            headers=request.headers,
            body=body,
            tolerance_seconds=TOLERANCE_SECONDS,
        )
    except RejectedRequest as exc:  # missing, malformed, wrong or stale: all one answer
        logger.warning("demo merchant: refused a webhook (%s)", exc.code)
        return JsonResponse({"error": exc.code}, status=401)
    if random.random() < settings.DEMO_MERCHANT_FAILURE_RATE:  # chance, not security
        logger.info("demo merchant: %s answered 500 on purpose", message.message_id)
        return JsonResponse({"error": "simulated failure"}, status=500)
    logger.info("demo merchant: received %s", message.message_id)
    return JsonResponse({"received": message.message_id})
