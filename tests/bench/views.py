"""The two floors the full path is measured against.

Both carry the real view's class attributes and decorators, so DRF and the project's
middleware cost the same on all three endpoints; only the work inside ``post`` differs.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, transaction
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webhook_receiver import schemes
from webhook_receiver.exceptions import RejectedRequest

from .common import (
    FLOOR_LEDGER_TABLE,
    FLOOR_RECEIPT_TABLE,
    SHOP_SECRET,
    SOURCE,
    TOLERANCE_SECONDS,
)

# The claim and the ledger lines in ONE statement, in autocommit: a data-modifying
# CTE is atomic by itself, so a new event costs one round trip and a duplicate one
# INSERT … ON CONFLICT DO NOTHING and nothing else (the ledger's insert selects no row).
CLAIM_AND_APPLY_SQL = f"""
    WITH claim AS (
        INSERT INTO {FLOOR_RECEIPT_TABLE} (source, event_key, received_at)
        VALUES (%s, %s, %s)
        ON CONFLICT (source, event_key) DO NOTHING
        RETURNING id
    ), lines AS (
        INSERT INTO {FLOOR_LEDGER_TABLE} (order_id, sku, delta, event_key, created_at)
        SELECT line.* FROM (VALUES {{rows}})
            AS line (order_id, sku, delta, event_key, created_at)
        WHERE EXISTS (SELECT 1 FROM claim)
    )
    SELECT count(*) FROM claim
"""
LEDGER_ROW = "(%s, %s, %s::integer, %s, %s::timestamptz)"


@method_decorator(transaction.non_atomic_requests, name="dispatch")
@method_decorator(csrf_exempt, name="dispatch")
class _FloorView(APIView):
    # Same as webhook_receiver.inbound.views.WebhookView.
    authentication_classes = ()
    permission_classes = ()
    parser_classes = ()
    throttle_classes = ()
    renderer_classes = (JSONRenderer,)


class BareView(_FloorView):
    """The ceiling: the server, middleware and DRF, and no work at all."""

    def post(self, request: Request) -> Response:
        return Response({"status": "ok"})


class ClaimFloorView(_FloorView):
    """The least a correct receiver can do: verify, then claim and apply atomically
    with one statement in autocommit (CLAIM_AND_APPLY_SQL): a duplicate costs one
    INSERT … ON CONFLICT DO NOTHING round trip and nothing else."""

    def post(self, request: Request) -> Response:
        body = request.body
        try:
            message = schemes.verify(
                scheme="standard",
                secrets=(SHOP_SECRET,),
                headers=request.headers,
                body=body,
                tolerance_seconds=TOLERANCE_SECONDS,
            )
        except RejectedRequest as exc:
            return Response({"error": exc.code}, status=exc.status_code)
        payload = json.loads(body)
        claimed = _claim_and_apply(str(message.message_id), payload["data"])
        return Response({"status": "applied" if claimed else "duplicate"})


def _claim_and_apply(event_key: str, data: dict[str, Any]) -> bool:
    now = timezone.now()
    lines = data["lines"]
    values: list[Any] = [SOURCE, event_key, now]
    for line in lines:
        values += [data["order_id"], line["sku"], -line["quantity"], event_key, now]
    sql = CLAIM_AND_APPLY_SQL.format(rows=", ".join([LEDGER_ROW] * len(lines)))
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        return cursor.fetchone()[0] == 1
