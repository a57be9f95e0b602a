"""The read-only admin: lists, filters, search and the receipt detail page.

The records are created by the receive service itself, as deliveries would create them.
"""

from __future__ import annotations

import html
import io
import json
from datetime import UTC, datetime

import pytest
from django.contrib.admin import site
from django.contrib.auth.models import Permission
from django.db import connection
from django.urls import reverse

from project.shop.models import InventoryLedgerEntry, OrderState
from tests.support.admin import filter_case_id
from tests.support.signing import (
    event_body,
    github_headers,
    reserved,
    standard_headers,
    stripe_headers,
)
from webhook_receiver.exceptions import InvalidSignature
from webhook_receiver.inbound.receive import webhook_receive
from webhook_receiver.models import FailedEvent, RequestAudit, WebhookReceipt

pytestmark = pytest.mark.django_db

MODELS = {
    "webhookreceipt": WebhookReceipt,
    "requestaudit": RequestAudit,
    "inventoryledgerentry": InventoryLedgerEntry,
    "orderstate": OrderState,
}
LONG_AGO = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)


def on_long_ago_day(field: str) -> dict[str, str]:
    """The query of a DateFieldListFilter for the calendar day of LONG_AGO."""
    return {
        f"{field}__gte": "2020-01-01 00:00:00+00:00",
        f"{field}__lt": "2020-01-02 00:00:00+00:00",
    }


def admin_url(model: str, view: str, *args) -> str:
    return reverse(f"admin:{MODELS[model]._meta.app_label}_{model}_{view}", args=args)


def changelist(model: str) -> str:
    return admin_url(model, "changelist")


def deliver(source: str, body: bytes, headers: dict[str, str]):
    return webhook_receive(
        source_slug=source,
        stream=io.BytesIO(body),
        content_length=len(body),
        headers={"Content-Type": "application/json", **headers},
        remote_addr="192.0.2.10",
    )


def rows(response) -> set:
    assert response.status_code == 200
    return set(response.context["cl"].result_list)


def keys(response) -> set[str]:
    return {obj.event_key for obj in rows(response)}


@pytest.fixture
def deliveries():
    """A small history: applied, stale, ignored, duplicate and refused deliveries."""
    reserved_a = reserved("ord_A", ("SKU-1", 2), ("SKU-2", 1))
    deliver("shop", reserved_a, standard_headers(reserved_a, msg_id="msg_reserved_a"))
    # a redelivery: a duplicate, audited but not applied again
    deliver("shop", reserved_a, standard_headers(reserved_a, msg_id="msg_reserved_a"))
    released_a = event_body(
        "inventory.released", order_id="ord_A", version=2, lines=[{"sku": "SKU-1", "quantity": 2}]
    )
    deliver("shop", released_a, standard_headers(released_a, msg_id="msg_released_a"))
    paid_b = event_body("order.paid", order_id="ord_B", version=1)
    deliver("shop", paid_b, standard_headers(paid_b, msg_id="msg_paid_b"))
    # the same version again under another id: stale
    deliver("shop", paid_b, standard_headers(paid_b, msg_id="msg_paid_b_again"))
    cancelled_c = event_body("order.cancelled", order_id="ord_C", version=1)
    deliver("shop", cancelled_c, standard_headers(cancelled_c, msg_id="msg_cancelled_c"))
    push = json.dumps({"ref": "refs/heads/main"}).encode()
    deliver("github", push, github_headers(push, delivery="gh-delivery-1"))
    stripe_event = json.dumps(
        {
            "id": "evt_stripe_d",
            "type": "inventory.reserved",
            "data": {"order_id": "ord_D", "version": 1, "lines": [{"sku": "SKU-3", "quantity": 1}]},
        }
    ).encode()
    deliver("stripe", stripe_event, stripe_headers(stripe_event))
    forged = reserved("ord_X", ("SKU-9", 1))
    with pytest.raises(InvalidSignature):
        deliver("shop", forged, standard_headers(forged, secret="whsec_" + "QUJD" * 8))

    # one record of each kind dates from long ago
    WebhookReceipt.objects.filter(event_key="msg_cancelled_c").update(received_at=LONG_AGO)
    RequestAudit.objects.filter(event_key="msg_cancelled_c").update(received_at=LONG_AGO)
    InventoryLedgerEntry.objects.filter(reason="released").update(created_at=LONG_AGO)
    OrderState.objects.filter(order_id="ord_C").update(updated_at=LONG_AGO)


# --- changelists -------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_changelist_loads_and_shows_every_row(admin_client, deliveries, model):
    response = admin_client.get(changelist(model))

    assert set(rows(response)) == set(MODELS[model].objects.all())
    assert len(rows(response)) > 0


def test_the_fixture_made_the_expected_records(deliveries):
    assert WebhookReceipt.objects.count() == 7
    assert RequestAudit.objects.count() == 9
    assert InventoryLedgerEntry.objects.count() == 4
    assert OrderState.objects.count() == 2


def test_receipt_changelist_shows_columns(admin_client, deliveries):
    content = admin_client.get(changelist("webhookreceipt")).content.decode()

    for text in ("msg_reserved_a", "evt_stripe_d", "gh-delivery-1", "ord_B", "order.paid"):
        assert text in content


# --- filters -----------------------------------------------------------------------------

RECEIPT_FILTERS = [
    ({"source": "github"}, {"gh-delivery-1"}),
    ({"source": "stripe"}, {"evt_stripe_d"}),
    ({"status__exact": "stale"}, {"msg_paid_b_again"}),
    ({"status__exact": "ignored"}, {"gh-delivery-1"}),
    (
        {"status__exact": "applied"},
        {"msg_reserved_a", "msg_released_a", "msg_paid_b", "msg_cancelled_c", "evt_stripe_d"},
    ),
    ({"event_type": "order.paid"}, {"msg_paid_b", "msg_paid_b_again"}),
    ({"event_type": "push"}, {"gh-delivery-1"}),
    (
        on_long_ago_day("received_at"),
        {"msg_cancelled_c"},
    ),
    ({"received_at__year": "2020"}, {"msg_cancelled_c"}),  # the date hierarchy
]


@pytest.mark.parametrize(("query", "expected"), RECEIPT_FILTERS, ids=filter_case_id)
def test_receipt_filters(admin_client, deliveries, query, expected):
    assert keys(admin_client.get(changelist("webhookreceipt"), query)) == expected


AUDIT_FILTERS = [
    ({"source": "github"}, {"gh-delivery-1"}),
    ({"verification__exact": "invalid_signature"}, {""}),
    ({"response_status": "401"}, {""}),
    ({"result": "duplicate"}, {"msg_reserved_a"}),
    ({"result": "stale"}, {"msg_paid_b_again"}),
    (
        on_long_ago_day("received_at"),
        {"msg_cancelled_c"},
    ),
]


@pytest.mark.parametrize(("query", "expected"), AUDIT_FILTERS, ids=filter_case_id)
def test_audit_filters(admin_client, deliveries, query, expected):
    assert keys(admin_client.get(changelist("requestaudit"), query)) == expected


def test_audit_filter_on_verified_requests(admin_client, deliveries):
    found = rows(admin_client.get(changelist("requestaudit"), {"verification__exact": "verified"}))

    assert len(found) == 8
    assert {audit.response_status for audit in found} == {200}


def test_ledger_filters(admin_client, deliveries):
    released = rows(admin_client.get(changelist("inventoryledgerentry"), {"reason": "released"}))
    reserved_rows = rows(
        admin_client.get(changelist("inventoryledgerentry"), {"reason": "reserved"})
    )
    long_ago = rows(
        admin_client.get(
            changelist("inventoryledgerentry"),
            on_long_ago_day("created_at"),
        )
    )

    assert {(e.order_id, e.sku, e.delta) for e in released} == {("ord_A", "SKU-1", 2)}
    assert {(e.order_id, e.sku, e.delta) for e in reserved_rows} == {
        ("ord_A", "SKU-1", -2),
        ("ord_A", "SKU-2", -1),
        ("ord_D", "SKU-3", -1),
    }
    assert long_ago == released


def test_order_state_filters(admin_client, deliveries):
    cancelled = rows(admin_client.get(changelist("orderstate"), {"status__exact": "cancelled"}))
    paid = rows(admin_client.get(changelist("orderstate"), {"status__exact": "paid"}))
    long_ago = rows(
        admin_client.get(
            changelist("orderstate"),
            on_long_ago_day("updated_at"),
        )
    )

    assert {o.order_id for o in cancelled} == {"ord_C"}
    assert {o.order_id for o in paid} == {"ord_B"}
    assert long_ago == cancelled


@pytest.mark.parametrize("model", MODELS)
def test_every_choice_of_every_filter_loads(admin_client, deliveries, model):
    # given: the filters as the changelist offers them, links included
    response = admin_client.get(changelist(model))
    specs = response.context["cl"].filter_specs
    assert len(specs) == len(response.context["cl"].model_admin.list_filter)

    # when / then: following each link answers the list, not the "?e=1" error redirect
    for spec in specs:
        for choice in spec.choices(response.context["cl"]):
            followed = admin_client.get(changelist(model) + choice["query_string"])
            assert followed.status_code == 200, (spec.title, choice)
            assert rows(followed) <= set(MODELS[model].objects.all())


def test_past_7_days_filter_leaves_out_the_old_receipt(admin_client, deliveries):
    response = admin_client.get(changelist("webhookreceipt"))
    date_filter = next(s for s in response.context["cl"].filter_specs if s.title == "received at")
    past_week = next(
        c for c in date_filter.choices(response.context["cl"]) if c["display"] == "Past 7 days"
    )

    found = keys(admin_client.get(changelist("webhookreceipt") + past_week["query_string"]))

    assert "msg_cancelled_c" not in found
    assert found == set(
        WebhookReceipt.objects.exclude(event_key="msg_cancelled_c").values_list(
            "event_key", flat=True
        )
    )


# --- search ------------------------------------------------------------------------------


def test_search_receipts_by_event_key(admin_client, deliveries):
    assert keys(admin_client.get(changelist("webhookreceipt"), {"q": "evt_stripe_d"})) == {
        "evt_stripe_d"
    }


def test_search_receipts_by_order_id(admin_client, deliveries):
    # the order id is the receipt's subject
    assert keys(admin_client.get(changelist("webhookreceipt"), {"q": "ord_B"})) == {
        "msg_paid_b",
        "msg_paid_b_again",
    }


def test_search_is_exact_not_partial(admin_client, deliveries):
    assert keys(admin_client.get(changelist("webhookreceipt"), {"q": "msg_paid"})) == set()


def test_search_audit_by_event_key(admin_client, deliveries):
    found = rows(admin_client.get(changelist("requestaudit"), {"q": "msg_reserved_a"}))

    assert sorted(a.result for a in found) == ["applied", "duplicate"]


def test_search_ledger_by_order_id_and_event_key(admin_client, deliveries):
    by_order = rows(admin_client.get(changelist("inventoryledgerentry"), {"q": "ord_A"}))
    by_key = rows(admin_client.get(changelist("inventoryledgerentry"), {"q": "evt_stripe_d"}))

    assert {(e.sku, e.delta) for e in by_order} == {("SKU-1", -2), ("SKU-2", -1), ("SKU-1", 2)}
    assert {(e.order_id, e.sku) for e in by_key} == {("ord_D", "SKU-3")}


def test_search_order_state_by_order_id(admin_client, deliveries):
    found = rows(admin_client.get(changelist("orderstate"), {"q": "ord_C"}))

    assert {(o.order_id, o.status, o.version) for o in found} == {("ord_C", "cancelled", 1)}


@pytest.mark.postgres_only("the plans checked are those of PostgreSQL's planner")
@pytest.mark.parametrize(
    "model", [WebhookReceipt, RequestAudit, InventoryLedgerEntry, OrderState, FailedEvent]
)
def test_every_search_field_can_use_an_index(rf, admin_user, model):
    # Exact lookups on indexed columns: with sequential scans priced out, the planner
    # finds an index for every field the search ORs together. (A case-insensitive
    # "=field" search wraps the column in UPPER(), which no plain index serves.)
    model_admin = site.get_model_admin(model)
    request = rf.get("/", {"q": "msg_x"})
    request.user = admin_user
    found, _ = model_admin.get_search_results(request, model.objects.all(), "msg_x")

    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = found.order_by().explain()

    # an index condition per field, no scan that filters rows one by one
    assert "Index Cond" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "Filter" not in plan, plan


# --- the receipt detail page -------------------------------------------------------------


def test_receipt_detail_shows_pretty_body_and_headers(admin_client, deliveries):
    # given
    receipt = WebhookReceipt.objects.get(event_key="msg_reserved_a")
    raw = bytes(receipt.body)

    # when
    response = admin_client.get(
        reverse("admin:webhook_receiver_webhookreceipt_change", args=[receipt.pk])
    )

    # then: 200, read-only, body pretty-printed with sorted keys, headers one per line
    assert response.status_code == 200
    content = response.content.decode()
    pretty_body = json.dumps(json.loads(raw), indent=2, sort_keys=True)
    assert '\n  "data": {\n' in pretty_body  # really indented, not the raw one-liner
    assert html.escape(pretty_body) in content
    pretty_headers = "\n".join(f"{k}: {v}" for k, v in sorted(receipt.headers.items()))
    assert "webhook-id: msg_reserved_a" in pretty_headers
    assert "Content-Type: application/json" in pretty_headers
    assert html.escape(pretty_headers) in content
    assert html.escape(json.dumps(receipt.outcome, indent=2, sort_keys=True)) in content
    assert 'name="_save"' not in content  # nothing to save


# --- nothing can be added, changed or deleted -------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_add_is_forbidden(admin_client, model):
    response = admin_client.get(admin_url(model, "add"))

    assert response.status_code == 403


@pytest.mark.parametrize("model", MODELS)
def test_delete_and_change_are_forbidden(admin_client, deliveries, model):
    # given
    obj = MODELS[model].objects.order_by("pk").first()
    delete_url = admin_url(model, "delete", obj.pk)
    change_url = admin_url(model, "change", obj.pk)

    # when / then
    assert admin_client.get(delete_url).status_code == 403
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert admin_client.post(change_url, {}).status_code == 403
    assert MODELS[model].objects.filter(pk=obj.pk).exists()


@pytest.mark.parametrize("model", MODELS)
def test_no_bulk_delete_action_is_offered(admin_client, deliveries, model):
    # given
    response = admin_client.get(changelist(model))
    assert response.context["action_form"] is None
    count = MODELS[model].objects.count()

    # when: the bulk delete is posted anyway
    admin_client.post(
        changelist(model),
        {
            "action": "delete_selected",
            "_selected_action": list(MODELS[model].objects.values_list("pk", flat=True)),
            "post": "yes",
        },
    )

    # then
    assert MODELS[model].objects.count() == count


# --- staff users -------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_staff_without_view_permission_gets_403(client, staff_user, deliveries, model):
    client.force_login(staff_user())

    assert client.get(changelist(model)).status_code == 403


def test_staff_with_view_permission_sees_only_that_model(client, staff_user, deliveries):
    # given
    client.force_login(staff_user("view_webhookreceipt"))

    # when / then
    assert rows(client.get(changelist("webhookreceipt"))) == set(WebhookReceipt.objects.all())
    assert client.get(changelist("requestaudit")).status_code == 403
    assert client.get(reverse("admin:webhook_receiver_webhookreceipt_add")).status_code == 403


def test_staff_with_every_permission_still_cannot_add_or_delete(client, staff_user, deliveries):
    # given: even the add/change/delete permissions granted explicitly
    every = Permission.objects.filter(content_type__app_label="webhook_receiver")
    client.force_login(staff_user(*every.values_list("codename", flat=True)))
    receipt = WebhookReceipt.objects.order_by("pk").first()

    # then
    assert client.get(reverse("admin:webhook_receiver_webhookreceipt_add")).status_code == 403
    delete_url = reverse("admin:webhook_receiver_webhookreceipt_delete", args=[receipt.pk])
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    assert WebhookReceipt.objects.filter(pk=receipt.pk).exists()


def test_anonymous_user_is_sent_to_the_login_page(client, deliveries):
    response = client.get(changelist("webhookreceipt"))

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
