"""The claim's statements: the commit they relax, the tables they name, the sizes they take."""

from __future__ import annotations

import json
import re

import pytest
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from project.shop.models import InventoryLedgerEntry
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.handlers import HandlerResult, WebhookEvent
from webhook_receiver.inbound import queries
from webhook_receiver.inbound.audit import AuditDraft
from webhook_receiver.inbound.claim import event_claim_and_apply

SYNC = "test.sync"
seen_in_handler: list[str] = []


def records_synchronous_commit(event: WebhookEvent) -> HandlerResult:
    """Reads the claim transaction's synchronous_commit from inside it, as an effect would."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('synchronous_commit')")
        seen_in_handler.append(cursor.fetchone()[0])
    return HandlerResult()


@pytest.fixture
def sync_handler(settings):
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "HANDLERS": {SYNC: "tests.inbound.test_claim_sql.records_synchronous_commit"},
    }
    seen_in_handler.clear()
    yield seen_in_handler
    seen_in_handler.clear()


def deliver(key: str, *, audited: bool) -> str:
    event = WebhookEvent(source="shop", event_key=key, event_type=SYNC, payload={"type": SYNC})
    audit = None
    if audited:  # as a request would: its audit record written by the same statements
        audit = AuditDraft(source="shop", received_at=timezone.now(), event_key=key)
    return event_claim_and_apply(event=event, body=b"{}", headers={}, audit=audit).status


@pytest.fixture
def commits(monkeypatch) -> list[str]:
    """synchronous_commit as each commit of the test's connection found it, read in the
    committing transaction just before its COMMIT."""
    seen: list[str] = []
    wrapper = connections[DEFAULT_DB_ALIAS]
    commit = wrapper._commit

    def probed_commit() -> None:
        with wrapper.connection.cursor() as cursor:  # the driver's own: not a query we count
            cursor.execute("SELECT current_setting('synchronous_commit')")
            seen.append(cursor.fetchone()[0])
        commit()

    monkeypatch.setattr(wrapper, "_commit", probed_commit)
    return seen


@pytest.mark.postgres_only("synchronous_commit is a PostgreSQL setting")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("audited", [True, False], ids=["request", "retry or replay"])
def test_every_claim_commits_durably_a_duplicates_too(sync_handler, commits, audited):
    # given: a key applied, then its duplicate answered, in transactions of their own
    assert deliver("sync_1", audited=audited) == "applied"
    assert deliver("sync_1", audited=audited) == "duplicate"

    # when: new events follow, each probing its claim transaction from its handler
    for n in range(2, 6):
        assert deliver(f"sync_{n}", audited=audited) == "applied"

    # then: every commit waits for its WAL flush, the duplicate's (its audit record) too
    assert commits == ["on"] * 6
    assert sync_handler == ["on"] * 5


@pytest.mark.postgres_only("synchronous_commit is a PostgreSQL setting")
@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_nothing_is_relaxed(sync_handler, commits):
    with transaction.atomic():
        deliver("sync_own", audited=True)
        deliver("sync_own", audited=True)
        deliver("sync_next", audited=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            assert cursor.fetchone()[0] == "on"
    assert commits == ["on"]
    assert sync_handler == ["on", "on"]


def test_every_statement_names_only_the_models_tables():
    tables = {model._meta.db_table for model in apps.get_models()}
    statements = {
        name: value
        for name, value in vars(queries).items()
        if name.isupper() and isinstance(value, str)
    }
    named = set()
    for statement in statements.values():
        named |= set(re.findall(r"(?:FROM|INTO|UPDATE)\s+([a-z_]+)", statement))
    named -= {"claimed", "audited", "tallied"}  # the statements' own CTEs
    assert named == {
        "webhook_receiver_webhookreceipt",
        "webhook_receiver_requestaudit",
        "webhook_receiver_failedevent",
        "webhook_receiver_rejectiontally",
    }
    assert named <= tables


@pytest.mark.django_db
def test_an_event_with_more_lines_than_one_statement_takes_is_applied_whole(client):
    # given: 11,000 lines, more parameters than PostgreSQL (65,535) or SQLite allow in
    # one statement; well under the 1 MiB body limit
    lines = [(f"SKU-{n}", 1) for n in range(11_000)]
    body = reserved("ord_big", *lines)
    assert len(body) < 1024 * 1024

    # when
    answer = post(client, "shop", body, standard_headers(body, msg_id="msg_big"))

    # then
    assert answer.status_code == 200, answer.content
    assert json.loads(answer.content)["status"] == "applied"
    assert InventoryLedgerEntry.objects.filter(event_key="msg_big").count() == 11_000
