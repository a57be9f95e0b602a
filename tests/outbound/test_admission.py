"""Outbox admission: a message exists if and only if its transaction commits, and there
is one per (destination, logical key) forever; the five-minute window only saves work."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection, transaction
from django.test import TestCase
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tests.support.http import post
from tests.support.outbox import listening
from tests.support.signing import event_body, standard_headers
from tests.support.threads import run_together
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook, message_key
from webhook_receiver.outbound.admission import METADATA_MAX_BYTES

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_window():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def merchant() -> WebhookDestination:
    return WebhookDestination.objects.create(
        name="merchant",
        url="http://127.0.0.1:9/hooks",
        secrets=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
        event_types=["order.paid", "order.cancelled"],
    )


def admit(destination, key="order:ord_1:paid:v3", **kwargs):
    """Admit in a transaction of its own, and run what it does once committed (the
    test itself runs inside a transaction that never commits)."""
    payload = {"type": "order.paid", "data": {"order_id": "ord_1"}}
    with TestCase.captureOnCommitCallbacks(execute=True), transaction.atomic():
        return enqueue_webhook(destination, "order.paid", key, payload, **kwargs)


def test_the_logical_key_names_the_order_the_event_and_its_version():
    assert message_key("order", "ord_1042", "paid", 3) == "order:ord_1042:paid:v3"


def test_a_duplicate_admission_creates_no_second_message(merchant):
    first = admit(merchant, ordering_key="order:ord_1", origin=("shop", "msg_1"))
    second = admit("merchant")  # by name, as a host's checkout code may call it

    assert first.created and not second.created
    message = OutboxMessage.objects.get()
    assert (message.key, message.ordering_key, message.status) == (
        "order:ord_1:paid:v3",
        "order:ord_1",
        "pending",
    )
    assert (message.origin_source, message.origin_event_key) == ("shop", "msg_1")


def test_within_the_window_a_duplicate_is_answered_without_a_statement(merchant):
    admit(merchant)

    with CaptureQueriesContext(connection) as queries:
        again = enqueue_webhook(merchant, "order.paid", "order:ord_1:paid:v3", {})

    assert again.coalesced and not again.created
    assert len(queries) == 0


def test_after_the_window_a_re_admission_still_creates_nothing(merchant):
    # given: an admission, and then the window has expired (the cache forgot it)
    admit(merchant)
    cache.clear()

    # when
    again = admit(merchant)

    # then: the constraint, not the window, is the identity
    assert not again.created and not again.coalesced
    assert OutboxMessage.objects.count() == 1


def test_an_admission_that_rolled_back_leaves_nothing_and_blocks_nothing(merchant):
    # given: the caller's transaction fails after admitting
    with pytest.raises(RuntimeError), transaction.atomic():
        assert enqueue_webhook(merchant, "order.paid", "order:ord_1:paid:v3", {}).created
        raise RuntimeError("the checkout failed after admitting")
    assert not OutboxMessage.objects.exists()

    # when: the same logical delivery is admitted again
    later = admit(merchant)

    # then
    assert later.created
    assert OutboxMessage.objects.count() == 1


def test_another_destination_or_key_is_another_message(merchant):
    other = WebhookDestination.objects.create(name="warehouse", url="http://127.0.0.1:9/")
    admit(merchant)
    assert admit(other).created
    assert admit(merchant, key="order:ord_1:paid:v4").created
    assert OutboxMessage.objects.count() == 3


# --- metadata: beside the message, outside its identity ---------------------------------

MODEL_METADATA = {"prompt_version": "v3", "tokens": {"prompt": 640, "completion": 172}}


def test_the_metadata_is_stored_beside_the_message(merchant):
    assert admit(merchant, metadata=MODEL_METADATA).created

    message = OutboxMessage.objects.get()
    assert message.metadata == MODEL_METADATA
    assert message.payload == {"type": "order.paid", "data": {"order_id": "ord_1"}}


def test_without_metadata_an_empty_object_is_stored(merchant):
    admit(merchant)

    assert OutboxMessage.objects.get().metadata == {}


@pytest.mark.parametrize("window", ["open", "expired"])
def test_other_metadata_under_the_same_key_is_a_duplicate_that_changes_nothing(merchant, window):
    # given: a message admitted with the metadata of the prompt's version 3
    admit(merchant, metadata=MODEL_METADATA)
    if window == "expired":
        cache.clear()  # the table, not the window, answers

    # when: the same key, made again with another prompt
    again = admit(merchant, metadata={"prompt_version": "v4", "tokens": 901})

    # then: the key is the identity; the first message's metadata stays
    assert not again.created
    assert OutboxMessage.objects.get().metadata == MODEL_METADATA


def nested(levels: int) -> list:
    """A list ``levels`` deep."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


INVALID_METADATA = [
    (["v3", 812], "metadata must be a JSON object (a dict with str keys), not list"),
    ("v3", "metadata must be a JSON object (a dict with str keys), not str"),
    ({1: "v3"}, "a key must be text, not int (1)"),
    ({"tokens": {2: 812}}, "a key must be text, not int (2)"),
    ({"at": object()}, "metadata must be JSON a column stores as it is"),
    ({"at": object()}, "not a JSON value: object"),
    ({"tags": {"a", "b"}}, "not a JSON value: set"),
    ({"score": float("nan")}, "a number out of range (NaN or infinity)"),
    ({"prompt": "a\x00b"}, "a NUL character cannot be stored"),
    ({"prompt": "\ud800"}, "a lone surrogate is not text"),
    ({"deep": nested(40)}, "nested deeper than 32 levels"),
    ({"prompt": "x" * 4096}, "metadata is 4109 bytes as JSON, over the limit of 4096"),
]


@pytest.mark.parametrize(("metadata", "says"), INVALID_METADATA)
def test_invalid_metadata_is_refused_before_any_statement(merchant, metadata, says):
    # when: admitted in the test's transaction, which goes on (nothing rolls back)
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError) as refused:
        enqueue_webhook(merchant, "order.paid", "order:ord_1:paid:v3", {}, metadata=metadata)

    # then: it says what is wrong, and nothing was written
    assert says in str(refused.value)
    assert len(queries) == 0
    assert not OutboxMessage.objects.exists()


def test_metadata_of_exactly_the_limit_is_admitted(merchant):
    # {"prompt":"…"} is 13 bytes around the text; "é" is two bytes in UTF-8
    fits = {"prompt": "é" * 2000 + "x" * (METADATA_MAX_BYTES - 13 - 4000)}
    over = {"prompt": fits["prompt"] + "x"}

    assert admit(merchant, metadata=fits).created
    with pytest.raises(ValueError, match="4097 bytes as JSON, over the limit of 4096"):
        admit(merchant, key="order:ord_1:paid:v4", metadata=over)
    assert OutboxMessage.objects.get().metadata == fits


@pytest.mark.postgres_only("two transactions admitting one key at the same moment")
@pytest.mark.django_db(transaction=True)
def test_concurrent_admissions_of_one_key_create_one_message(merchant):
    start = threading.Barrier(4)
    created = []

    def admit_at_once():
        try:
            start.wait()
            with transaction.atomic():
                outcome = enqueue_webhook(merchant, "order.paid", "order:ord_9:paid:v1", {})
            created.append(outcome.created)
        finally:
            connection.close()

    run_together([threading.Thread(target=admit_at_once) for _ in range(4)])

    assert sorted(created) == [False, False, False, True]
    assert OutboxMessage.objects.count() == 1


# --- the demo shop forwards order moves ------------------------------------------------


def paid(order_id: str, version: int) -> bytes:
    return event_body("order.paid", order_id=order_id, version=version)


def test_an_order_move_is_forwarded_to_each_subscribed_destination(client, merchant):
    # given: one destination subscribed to order.paid, one to something else
    WebhookDestination.objects.create(
        name="warehouse", url="http://127.0.0.1:9/", event_types=["inventory.reserved"]
    )
    body = paid("ord_7", 3)

    # when: delivered twice (a redelivery)
    for _ in range(2):
        assert post(client, "shop", body, standard_headers(body, msg_id="msg_7")).status_code == 200

    # then: one message, to the subscriber only, keyed by the order's version
    message = OutboxMessage.objects.get()
    assert message.destination == merchant
    assert message.key == "order:ord_7:paid:v3"
    assert message.ordering_key == "order:ord_7"
    assert message.payload == {
        "type": "order.paid",
        "data": {"order_id": "ord_7", "status": "paid", "version": 3},
    }
    assert (message.origin_source, message.origin_event_key) == ("shop", "msg_7")


def test_a_stale_order_event_forwards_nothing(client, merchant):
    newer, older = paid("ord_8", 5), paid("ord_8", 4)
    post(client, "shop", newer, standard_headers(newer, msg_id="msg_new"))

    response = post(client, "shop", older, standard_headers(older, msg_id="msg_old"))

    assert response.json()["status"] == "stale"
    assert list(OutboxMessage.objects.values_list("key", flat=True)) == ["order:ord_8:paid:v5"]


def test_a_disabled_destination_is_sent_nothing(client, merchant):
    merchant.enabled = False
    merchant.save()
    body = paid("ord_9", 1)

    post(client, "shop", body, standard_headers(body, msg_id="msg_9"))

    assert not OutboxMessage.objects.exists()


def test_the_trace_of_an_order_event_lists_the_messages_it_enqueued(client, merchant):
    from webhook_receiver.watch.trace import event_trace

    body = paid("ord_t", 2)
    post(client, "shop", body, standard_headers(body, msg_id="msg_t"))

    trace = event_trace(source="shop", event_key="msg_t")

    (section,) = trace.outbox
    assert section.title == "to merchant"
    assert [row[:4] for row in section.rows] == [
        ("order:ord_t:paid:v2", "order.paid", "pending", "0")
    ]


@pytest.mark.postgres_only("LISTEN/NOTIFY")
@pytest.mark.django_db(transaction=True)
def test_an_admission_wakes_the_relays_when_it_commits_once_a_destination(merchant):
    with listening() as heard:
        # when: a transaction admits three messages to one destination and rolls back
        with pytest.raises(RuntimeError), transaction.atomic():
            for n in range(3):
                enqueue_webhook(merchant, "order.paid", f"order:ord_r{n}:paid:v1", {})
            raise RuntimeError("the business transaction failed")
        # then: nothing is heard
        assert heard() == []

        # when: the same commits, and then a duplicate is admitted
        with transaction.atomic():
            for n in range(3):
                enqueue_webhook(merchant, "order.paid", f"order:ord_c{n}:paid:v1", {})
        first = heard()
        with transaction.atomic():
            enqueue_webhook(merchant, "order.paid", "order:ord_c0:paid:v1", {})

        # then: one wake-up for the destination at the commit (PostgreSQL folds a
        # transaction's like notifications into one), none for a message not created
        assert first == [merchant.pk]
        assert heard() == []


@pytest.mark.postgres_only("LISTEN/NOTIFY")
@pytest.mark.django_db(transaction=True)
def test_an_admission_to_a_paused_destination_wakes_no_relay(merchant):
    WebhookDestination.objects.filter(pk=merchant.pk).update(
        paused_until=timezone.now() + timedelta(minutes=1)
    )
    with listening() as heard:
        with transaction.atomic():
            enqueue_webhook(merchant, "order.paid", "order:ord_p:paid:v1", {})

        # the poll after the pause finds it: a round before would claim nothing
        assert heard() == []
    assert OutboxMessage.objects.filter(key="order:ord_p:paid:v1").exists()
