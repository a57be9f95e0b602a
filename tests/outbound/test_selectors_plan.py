"""The destinations' figures (selectors.destinations_with_health) read each open message a
few times, however long a destination's backlog: checked in PostgreSQL's own account of
the plan it ran (EXPLAIN ANALYZE), on statistics taken before the backlog came, as
autovacuum leaves them while a merchant is down and its messages pile up."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.utils import timezone

from tests.support.outbox import destination
from webhook_receiver.core.encryption import with_stored_secrets
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound.selectors import destinations_with_health

pytestmark = [
    pytest.mark.postgres_only("PostgreSQL's plan and its statistics"),
    pytest.mark.django_db,
]

BACKLOG = 1200  # half of them without an ordering key, half sharing 300 keys
HISTORY = 200  # delivered before the statistics


def rows_read(plan: dict) -> int:
    """Rows every node of the plan produced or filtered out, over all its loops."""
    loops = plan.get("Actual Loops", 1)
    own = loops * (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0))
    return own + sum(rows_read(child) for child in plan.get("Plans", ()))


def messages(merchant, keys: list[tuple[str, str]], *, status: str, at, **more) -> None:
    """The destination's messages (key, ordering key), all in ``status``, made and due
    ``at``."""
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            destination=merchant,
            key=key,
            event_type="order.paid",
            payload={},
            ordering_key=ordering_key,
            status=status,
            next_attempt_at=at,
            created_at=at,
            **more,
        )
        for key, ordering_key in keys
    )


@pytest.mark.parametrize("history", [0, HISTORY], ids=["never analysed", "a delivered history"])
def test_a_backlog_that_came_after_the_statistics_is_read_a_few_times_not_once_per_message(
    history,
):
    # given: a destination's statistics taken while it had nothing open: none at all,
    # or over its delivered history (distinct ordering keys)...
    merchant = destination("down")
    earlier = timezone.now()
    messages(
        merchant,
        [(f"delivered-{n}", f"order-{n}") for n in range(history)],
        status="delivered",
        at=earlier,
        delivered_at=earlier,
    )
    with connection.cursor() as cursor:
        if history:
            cursor.execute("ANALYZE webhook_receiver_outboxmessage")
        else:  # ANALYZE of an empty table would keep what an earlier test left
            cursor.execute(
                "DELETE FROM pg_statistic"
                " WHERE starelid = 'webhook_receiver_outboxmessage'::regclass"
            )
    # ...then its backlog: pending and due, keyless and keyed alike
    now = timezone.now()
    keyed = [(f"m{n}", f"order-{n % 300}" if n % 2 else "") for n in range(BACKLOG)]
    messages(merchant, keyed, status="pending", at=now)

    # when
    query = destinations_with_health(with_stored_secrets(WebhookDestination.objects.all()))
    explained = json.loads(query.explain(format="json", analyze=True))
    healthy = query.get()

    # then: every figure right, and a few reads of each open message in all (once per
    # message for each older message was 70 s for 20,000)
    assert (healthy.backlog, healthy.held_back) == (BACKLOG, 0)
    assert healthy.oldest_eligible_at == now
    assert rows_read(explained[0]["Plan"]) < 20 * BACKLOG, json.dumps(explained, indent=1)
