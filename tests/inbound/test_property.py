"""Invariant: any permutation of an event stream, with any duplicates, ends in exactly
the ledger sums and order states of that stream delivered once, in order."""

from __future__ import annotations

from collections import defaultdict

import pytest
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from project.shop.models import InventoryLedgerEntry, OrderState
from webhook_receiver.handlers import WebhookEvent
from webhook_receiver.inbound.audit import AuditDraft
from webhook_receiver.inbound.claim import event_claim_and_apply
from webhook_receiver.models import RequestAudit, WebhookReceipt

ORDERS = ["ord_a", "ord_b", "ord_c"]
SKUS = ["SKU-1", "SKU-2", "SKU-3"]
KINDS = [
    "inventory.reserved",
    "inventory.released",
    "order.paid",
    "order.cancelled",
    "order.fulfilled",
    "customer.updated",  # no handler: ignored
]

line = st.fixed_dictionaries({"sku": st.sampled_from(SKUS), "quantity": st.integers(1, 5)})
step = st.tuples(
    st.sampled_from(KINDS), st.sampled_from(ORDERS), st.lists(line, min_size=1, max_size=3)
)


@st.composite
def streams(draw) -> list[WebhookEvent]:
    """An in-order stream: each order's versions increase as its events appear."""
    versions: dict[str, int] = defaultdict(int)
    events = []
    for position, (kind, order_id, lines) in enumerate(
        draw(st.lists(step, min_size=1, max_size=25))
    ):
        versions[order_id] += 1
        data = {"order_id": order_id, "version": versions[order_id]}
        if kind.startswith("inventory."):
            data["lines"] = lines
        events.append(
            WebhookEvent(
                source="shop",
                event_key=f"evt_{position}",
                event_type=kind,
                payload={"type": kind, "data": data},
            )
        )
    return events


@st.composite
def deliveries(draw) -> tuple[list[WebhookEvent], list[WebhookEvent]]:
    stream = draw(streams())
    duplicates = draw(st.lists(st.sampled_from(stream), max_size=len(stream) * 2))
    delivered = draw(st.permutations(stream + duplicates))
    return stream, delivered


def _deliver_and_snapshot(events: list[WebhookEvent]) -> tuple[dict, dict, int, int, int]:
    """Deliver through the service (each with its audit record, as a request would),
    read the end state, then roll it all back."""
    with transaction.atomic():
        for event in events:
            audit = AuditDraft(source=event.source, received_at=timezone.now())
            audit.event_key = audit.message_id = event.event_key
            event_claim_and_apply(event=event, body=b"{}", headers={}, audit=audit)
        ledger = {
            (row["order_id"], row["sku"]): row["total"]
            for row in InventoryLedgerEntry.objects.values("order_id", "sku").annotate(
                total=Sum("delta")
            )
        }
        orders = {o.order_id: (o.status, o.version) for o in OrderState.objects.all()}
        counts = (WebhookReceipt.objects.count(), InventoryLedgerEntry.objects.count())
        duplicates = RequestAudit.objects.filter(result="duplicate").count()
        assert RequestAudit.objects.count() == len(events)  # one record per delivery
        transaction.set_rollback(True)
    return ledger, orders, *counts, duplicates


def ledger_oracle(stream: list[WebhookEvent]) -> dict[tuple[str, str], int]:
    """Per (order, SKU), the sum of every inventory event's signed quantities."""
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for event in stream:
        sign = {"inventory.reserved": -1, "inventory.released": +1}.get(event.event_type)
        if sign is None:
            continue
        data = event.payload["data"]
        for line in data["lines"]:
            totals[(data["order_id"], line["sku"])] += sign * line["quantity"]
    return dict(totals)


def order_state_oracle(stream: list[WebhookEvent]) -> dict[str, tuple[str, int]]:
    """Per order, the status and version of its last transition in the stream (the
    stream's versions increase, so the last is the highest)."""
    states = {}
    for event in stream:
        if event.event_type.startswith("order."):
            data = event.payload["data"]
            states[data["order_id"]] = (event.event_type.removeprefix("order."), data["version"])
    return states


@pytest.mark.django_db
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=deliveries())
def test_any_permutation_with_duplicates_converges_on_the_in_order_result(case):
    stream, delivered = case

    expected = _deliver_and_snapshot(stream)
    actual = _deliver_and_snapshot(delivered)

    assert actual[:4] == expected[:4]
    ledger, orders, receipts, _, duplicates = actual
    assert duplicates == len(delivered) - len(stream)
    assert receipts == len(stream)
    # and both equal what the stream itself says, computed without the code under test
    assert ledger == ledger_oracle(stream)
    assert orders == order_state_oracle(stream)
    assert connection.in_atomic_block  # the test's own transaction is still open
