"""What the end-of-run checks read of the database: the run's merchant's messages only.
A neighbour destination is sent the same order moves under the same keys; its messages,
pending or failed, must neither stand in for the merchant's nor hold up the drain."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from tests.chaos.checks import database_state, settled
from tests.support.outbox import destination, message
from webhook_receiver.models import MessageStatus

pytestmark = [
    pytest.mark.postgres_only("the checks read PostgreSQL with plain SQL"),
    pytest.mark.django_db(transaction=True),  # read from a connection of their own
]

ADMITTED = datetime(2025, 1, 2, 3, 4, 5, 250000, tzinfo=UTC)


def _dsn() -> str:
    db = connection.settings_dict
    return (
        f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} "
        f"user={db['USER']} dbname={db['NAME']}"
    )


def test_the_state_holds_the_merchants_messages_and_counts_the_neighbours_apart():
    merchant = destination("merchant")
    noisy = destination("neighbour-0")
    key = "order:ord-1:paid:v2"
    message(merchant, key, MessageStatus.DELIVERED, origin_event_key="msg_1",
            created_at=ADMITTED)  # fmt: skip
    message(noisy, key, origin_event_key="msg_1")
    message(noisy, "order:ord-2:paid:v2", MessageStatus.FAILED, origin_event_key="msg_2")

    state = database_state(_dsn())

    assert state["outbox"] == {key: ("delivered", "msg_1", "", 0)}
    assert state["admitted"] == {key: ADMITTED.timestamp()}
    assert state["neighbours"] == {"neighbour-0": {"pending": 1, "failed": 1}}


def test_a_disabled_neighbours_pending_messages_hold_up_no_drain():
    merchant = destination("merchant")
    noisy = destination("neighbour-0")
    message(merchant, "order:ord-1:paid:v2", MessageStatus.DELIVERED)
    message(noisy, "order:ord-1:paid:v2")
    assert settled(_dsn()) == (0, 1)

    noisy.enabled = False
    noisy.save()

    assert settled(_dsn()) == (0, 0)
