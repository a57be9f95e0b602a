"""Each defect ``python -m tests.chaos --plant NAME`` puts in the run's processes does what
it says, shown here in the test process (pytest's monkeypatch undoes it); that the checks
catch the state it leaves is ``test_planted_defects.py``'s part."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from project.shop import handlers
from project.shop.models import InventoryLedgerEntry
from tests.chaos.checks import AUDIT, HOSTILE, INBOUND_ONCE, OUTBOUND_ONCE, STATE
from tests.chaos.plants import LOST_ONE_IN, PLANTS
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.outbound import queries
from webhook_receiver.outbound.models import MessageStatus, WebhookDestination
from webhook_receiver.outbound.relay import round as relay_round
from webhook_receiver.outbound.relay.messages import Claimed, Sent


def test_each_plant_names_a_check_of_the_run() -> None:
    assert {plant.caught_by for plant in PLANTS.values()} <= {
        INBOUND_ONCE, HOSTILE, STATE, OUTBOUND_ONCE, AUDIT,
    }  # fmt: skip


@pytest.mark.django_db
def test_double_effect_applies_a_duplicate_again(client, monkeypatch) -> None:
    body = reserved("ord_twice", ("SKU-T", 2))
    headers = standard_headers(body, msg_id="msg_twice")
    post(client, "shop", body, headers)
    post(client, "shop", body, headers)
    assert InventoryLedgerEntry.objects.filter(event_key="msg_twice").count() == 1

    PLANTS["double-effect"].apply(monkeypatch.setattr)
    answer = post(client, "shop", body, headers)

    assert answer.status_code == 200
    assert InventoryLedgerEntry.objects.filter(event_key="msg_twice").count() == 2


def test_delivered_without_effect_counts_a_500_as_delivered(monkeypatch) -> None:
    now = datetime.now(UTC)
    message = Claimed(1, "order:ord_1:paid:v2", "order.paid", {}, 1, 0, now)
    dest = WebhookDestination(name="merchant", max_attempts=60)
    answered_500 = Sent(message, now, 5, status_code=500)
    answered_429 = Sent(message, now, 5, status_code=429, retry_after="1")
    assert relay_round.decide(dest, answered_500, now).status == MessageStatus.PENDING

    PLANTS["delivered-without-effect"].apply(monkeypatch.setattr)

    assert relay_round.decide(dest, answered_500, now).status == MessageStatus.DELIVERED
    assert relay_round.decide(dest, answered_429, now).status == MessageStatus.PENDING


def test_out_of_order_drops_the_ordering_key_from_the_claim(monkeypatch) -> None:
    assert "ordering_key" in queries.ELIGIBLE_IDS

    PLANTS["out-of-order"].apply(monkeypatch.setattr)

    assert "ordering_key" not in queries.ELIGIBLE_IDS
    assert "ORDER BY m.id" in queries.ELIGIBLE_IDS
    # the round's statement is made from it each time
    assert "ordering_key = m.ordering_key" not in queries.round_statement()


def test_lost_message_admits_all_but_about_one_move_in_twenty(monkeypatch) -> None:
    admitted: list[str] = []

    def admit(destination: str, event_type: str, key: str, payload: dict, **kwargs) -> None:
        admitted.append(key)

    monkeypatch.setattr(handlers, "enqueue_webhook", admit)
    keys = [f"order:ord-{n}:paid:v2" for n in range(2000)]

    PLANTS["lost-message"].apply(monkeypatch.setattr)
    for key in keys:
        handlers.enqueue_webhook("merchant", "order.paid", key, {}, ordering_key="order:x")

    lost = len(keys) - len(admitted)
    assert set(admitted) < set(keys)
    assert len(keys) / LOST_ONE_IN / 2 < lost < len(keys) / LOST_ONE_IN * 2
