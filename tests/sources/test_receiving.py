"""A request to a source kept as a record: verified with the record's secrets, answered
like a settings source, its secret named by fingerprint on the audit record (never the
secret), a disabled record answered exactly as an unknown slug, the settings first, and
changes live within the TTL without a restart."""

from __future__ import annotations

import pytest
from django.core import checks
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.settings import SHOP_SECRET
from tests.sources.conftest import ACME_NEW_SECRET, ACME_SECRET
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.conf import app_settings
from webhook_receiver.core.fingerprints import secret_fingerprint
from webhook_receiver.models import RejectionTally, RequestAudit, WebhookReceipt, WebhookSource
from webhook_receiver.sources.lookup import records, source_lookup
from webhook_receiver.sources.operations import (
    source_secret_add,
    source_secret_remove,
    source_set_enabled,
)

pytestmark = pytest.mark.django_db

SOURCES_TABLE = WebhookSource._meta.db_table


def signed(secret: str, order: str = "ord_1") -> tuple[bytes, dict[str, str]]:
    body = reserved(order, ("SKU-A", 1))
    return body, standard_headers(body, secret=secret)


def audit_of(response_key: str) -> RequestAudit:
    return RequestAudit.objects.get(event_key=response_key)


def reads_of_sources(captured: CaptureQueriesContext) -> int:
    return sum(SOURCES_TABLE in q["sql"] for q in captured.captured_queries)


def test_a_record_source_is_verified_with_its_secret_and_applied(client, acme):
    body, headers = signed(ACME_SECRET)

    response = post(client, "acme", body, headers)

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "applied"
    receipt = WebhookReceipt.objects.get()
    assert receipt.source == "acme"
    # the audit record names the secret by fingerprint
    assert audit_of(receipt.event_key).secret_fingerprint == secret_fingerprint(ACME_SECRET)


def test_the_audit_and_the_table_never_hold_the_secret(client, acme):
    body, headers = signed(ACME_SECRET)
    post(client, "acme", body, headers)

    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM webhook_receiver_requestaudit")
        audit_rows = cursor.fetchall()
        cursor.execute(f"SELECT secrets FROM {SOURCES_TABLE}")
        stored = cursor.fetchall()
    everything = repr(audit_rows) + repr(stored)
    assert audit_rows
    assert ACME_SECRET not in everything
    assert ACME_SECRET.removeprefix("whsec_") not in everything
    # at rest, the secret column holds Fernet tokens
    assert "gAAAAA" in repr(stored)


def test_a_settings_source_records_which_of_its_secrets_verified(client):
    body, headers = signed(SHOP_SECRET)

    response = post(client, "shop", body, headers)

    assert response.status_code == 200
    audit = audit_of(response.json()["event_key"])
    assert audit.secret_fingerprint == secret_fingerprint(SHOP_SECRET)
    assert SHOP_SECRET not in repr(RequestAudit.objects.values().get())


def test_a_refused_request_names_no_secret(client, acme):
    body, headers = signed("whsec_" + "c29tZW9uZSBlbHNlJ3Mgc2VjcmV0")

    response = post(client, "acme", body, headers)

    assert response.status_code == 401
    assert RequestAudit.objects.get().secret_fingerprint is None


# --- disabled == unknown -------------------------------------------------------------------


def test_a_disabled_source_answers_exactly_as_an_unknown_slug_and_is_audited(client, acme):
    body, headers = signed(ACME_SECRET)
    unknown = post(client, "never-defined", body, headers)

    source_set_enabled("acme", False)
    disabled = post(client, "acme", body, headers)

    assert disabled.status_code == unknown.status_code == 404
    assert disabled.content == unknown.content
    assert sorted(disabled.headers.items()) == sorted(unknown.headers.items())
    audit = RequestAudit.objects.get(source="acme")
    assert (audit.verification, audit.result, audit.response_status) == (
        "unknown_source",
        "unknown_source",
        404,
    )
    # counted with every slug that is no source, as an unknown one is
    assert set(RejectionTally.objects.values_list("source", "requests")) == {("", 2)}
    assert not WebhookReceipt.objects.exists()


# --- settings first --------------------------------------------------------------------------


def test_a_record_never_shadows_a_settings_source(client):
    # given: a record of the settings' slug, written behind the admin's back
    WebhookSource.objects.create(slug="shop", scheme="standard", secrets=[ACME_SECRET])
    body, headers = signed(ACME_SECRET)

    # when: a request signed with the record's secret
    response = post(client, "shop", body, headers)

    # then: the settings' secrets verify it, and refuse it; check W005 names the record
    assert response.status_code == 401
    assert source_lookup("shop").secrets != (ACME_SECRET,)
    warnings = [m for m in checks.run_checks(databases=["default"]) if m.id.endswith("W005")]
    assert len(warnings) == 1 and "'shop'" in warnings[0].msg


def test_without_a_shadowing_record_there_is_no_w005(acme):
    assert not [m for m in checks.run_checks(databases=["default"]) if m.id.endswith("W005")]


# --- the TTL: live without a restart -----------------------------------------------------------


def test_another_process_change_is_live_within_the_ttl(client, acme, clock):
    body, headers = signed(ACME_SECRET)
    assert post(client, "acme", body, headers).status_code == 200

    # when: another process disables it (this process's snapshot is not told)
    WebhookSource.objects.filter(slug="acme").update(enabled=False)

    # then: within the TTL this process still has the snapshot; past it, the change
    body, headers = signed(ACME_SECRET, "ord_2")
    clock.advance(4.9)
    assert post(client, "acme", body, headers).status_code == 200
    clock.advance(0.2)
    body, headers = signed(ACME_SECRET, "ord_3")
    assert post(client, "acme", body, headers).status_code == 404


def test_a_new_record_is_found_past_the_ttl_of_a_negative_answer(client, clock, db):
    body, headers = signed(ACME_SECRET)
    assert post(client, "acme", body, headers).status_code == 404
    WebhookSource.objects.create(slug="acme", scheme="standard", secrets=[ACME_SECRET])

    assert post(client, "acme", body, headers).status_code == 404  # the cached "no"
    clock.advance(5)
    assert post(client, "acme", body, headers).status_code == 200


# --- rotation ------------------------------------------------------------------------------------


def test_a_rotation_names_the_secret_each_request_was_verified_with(client, acme):
    old_body, old_headers = signed(ACME_SECRET, "ord_old")
    source_secret_add("acme", ACME_NEW_SECRET)
    new_body, new_headers = signed(ACME_NEW_SECRET, "ord_new")

    old = post(client, "acme", old_body, old_headers)
    new = post(client, "acme", new_body, new_headers)

    assert old.status_code == new.status_code == 200
    assert audit_of(old.json()["event_key"]).secret_fingerprint == secret_fingerprint(ACME_SECRET)
    new_fingerprint = audit_of(new.json()["event_key"]).secret_fingerprint
    assert new_fingerprint == secret_fingerprint(ACME_NEW_SECRET)

    # when: the old one is removed, it verifies nothing any more
    source_secret_remove("acme", secret_fingerprint(ACME_SECRET)[:8])
    body, headers = signed(ACME_SECRET, "ord_after")
    assert post(client, "acme", body, headers).status_code == 401


# --- queries on the hot path -------------------------------------------------------------------


def _queries_of(client, slug: str, secret: str, order: str) -> CaptureQueriesContext:
    body, headers = signed(secret, order)
    with CaptureQueriesContext(connection) as captured:
        response = post(client, slug, body, headers)
    assert response.status_code == 200, response.content
    return captured


def test_a_settings_source_reads_no_record_even_when_records_exist(client, acme):
    captured = _queries_of(client, "shop", SHOP_SECRET, "ord_1")

    assert reads_of_sources(captured) == 0


def test_a_record_source_costs_one_query_a_ttl(client, acme, clock):
    settings_source = len(_queries_of(client, "shop", SHOP_SECRET, "ord_1"))

    first = _queries_of(client, "acme", ACME_SECRET, "ord_2")
    within = _queries_of(client, "acme", ACME_SECRET, "ord_3")
    clock.advance(5)
    after = _queries_of(client, "acme", ACME_SECRET, "ord_4")

    assert (reads_of_sources(first), len(first)) == (1, settings_source + 1)
    assert (reads_of_sources(within), len(within)) == (0, settings_source)
    assert (reads_of_sources(after), len(after)) == (1, settings_source + 1)


def test_a_flood_of_unknown_slugs_reads_the_records_once(client, clock, db):
    body, headers = signed(ACME_SECRET)
    with CaptureQueriesContext(connection) as captured:
        for n in range(40):
            assert post(client, f"made-up-{n}", body, headers).status_code == 404

    assert reads_of_sources(captured) == 1


@hypothesis_settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(slugs=st.lists(st.text(min_size=1, max_size=120), min_size=1, max_size=20))
def test_any_slugs_read_the_records_at_most_once_a_ttl(acme, slugs):
    records.clear()
    with CaptureQueriesContext(connection) as captured:
        found = [source_lookup(slug) for slug in slugs]

    assert reads_of_sources(captured) <= 1
    sources = {"acme", *app_settings().sources}
    assert [config is not None for config in found] == [slug in sources for slug in slugs]
