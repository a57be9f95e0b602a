"""Tenants (outbound/tenancy.py): every scoped service, given tenant B's scope and tenant
A's ids, finds nothing (not "forbidden": nothing) and changes nothing; the staff's scope
reaches both. A new service that takes a scope fails here until it has its case."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest
from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone

from tests.support.outbox import destination, destination_added, failed, message
from webhook_receiver.models import OutboxMessage, RecoveryJob, WebhookDestination
from webhook_receiver.outbound import endpoints, operations, recovery
from webhook_receiver.outbound.endpoints import EndpointFields
from webhook_receiver.outbound.recovery import Criteria
from webhook_receiver.outbound.tenancy import EVERY_TENANT, Scope, tenant_scope

pytestmark = pytest.mark.django_db

ACME, BOLT = tenant_scope("acme"), tenant_scope("bolt")


@pytest.fixture
def acme():
    """Tenant acme's destinations: one disabled, with a failed and a pending message, and
    one enabled; tenant bolt's destination beside them."""
    dest = destination("acme-shop", tenant="acme", enabled=False)
    live = destination("acme-live", tenant="acme")
    destination("bolt-shop", tenant="bolt")
    since = timezone.now() - timedelta(hours=1)
    found = {
        "destination": dest,
        "live": live,
        "since": since,
        "failed": failed(dest, "k-failed", last_attempt_at=timezone.now()),
        "pending": message(dest, "k-pending"),
        "delivered": message(live, "k-delivered", status="delivered"),
    }
    found["job"] = recovery.recovery_start(
        scope=EVERY_TENANT, destination=live, criteria=Criteria("replay", since), by="ops"
    )
    return found


def snapshot() -> list[tuple]:
    messages = OutboxMessage.objects.order_by("id").values_list(
        "id", "status", "failures", "next_attempt_at", "discarded_by"
    )
    destinations = WebhookDestination.objects.order_by("id").values_list(
        "id", "enabled", "paused_until", "url", "secrets"
    )
    jobs = RecoveryJob.objects.order_by("id").values_list("id", "state", "released")
    return [*messages, *destinations, *jobs]


RECOVER = Criteria("recover", timezone.now() - timedelta(hours=2))
# each scoped service, called in a scope with A's ids: (name, call)
CASES = {
    "selection": lambda scope, a: list(
        recovery.selection(scope, a["destination"], RECOVER, None, 10**9)
    ),
    "recovery_plan": lambda scope, a: (
        recovery.recovery_plan(scope=scope, destination=a["destination"].pk, criteria=RECOVER).count
    ),
    "recovery_start": lambda scope, a: recovery.recovery_start(
        scope=scope, destination=a["destination"].pk, criteria=RECOVER, by="b"
    ),
    "recovery_cancel": lambda scope, a: recovery.recovery_cancel(
        scope=scope, job=a["job"].pk, by="b"
    ),
    "recovery_jobs_shown": lambda scope, a: recovery.recovery_jobs_shown(
        scope=scope, destination_name="acme-live"
    ),
    "message_retry_now": lambda scope, a: operations.message_retry_now(
        scope=scope, message_ids=[a["failed"].pk, a["pending"].pk], by="b"
    ),
    "message_discard": lambda scope, a: operations.message_discard(
        scope=scope, message_ids=[a["failed"].pk, a["pending"].pk], by="b", reason="x"
    ),
    "destination_enable": lambda scope, a: operations.destination_enable(
        scope=scope, destination=a["destination"].pk, by="b"
    ),
    "destination_disable": lambda scope, a: operations.destination_disable(
        scope=scope, destination=a["live"].pk, by="b"
    ),
    "endpoint_update": lambda scope, a: endpoints.endpoint_update(
        scope=scope, destination=a["live"].pk, fields=CHANGED, by="b"
    ),
    "secret_rotate": lambda scope, a: endpoints.secret_rotate(
        scope=scope, destination=a["live"].pk, overlap=timedelta(hours=1), by="b"
    ),
    "send_test_event": lambda scope, a: endpoints.send_test_event(
        scope=scope, destination=a["live"].pk, event_type="order.paid", by="b"
    ),
}
CHANGED = EndpointFields("https://changed.example/in", ["order.paid"])
# the services that make a record: it is the scope's tenant's (a test of its own below)
CREATORS = {"endpoint_create"}


# the services that only read: in the tenant's own scope they find, and change nothing
READERS = {"recovery_plan", "recovery_jobs_shown", "selection"}


def test_every_service_that_takes_a_scope_has_its_case_here():
    scoped = {
        name
        for module in (endpoints, operations, recovery)
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if fn.__module__ == module.__name__
        and "scope" in inspect.signature(fn).parameters
        and not name.startswith("_")
    }
    assert scoped == set(CASES) | CREATORS


@pytest.mark.parametrize("service", sorted(CASES))
def test_another_tenants_ids_find_nothing_and_change_nothing(acme, service):
    before = snapshot()

    try:
        answer = CASES[service](BOLT, acme)
    except ObjectDoesNotExist:
        answer = "not found"

    assert answer in ([], "not found")
    assert snapshot() == before


@pytest.mark.parametrize("scope", [ACME, EVERY_TENANT], ids=str)
@pytest.mark.parametrize("service", sorted(CASES))
def test_the_tenants_own_scope_and_the_staffs_reach_them(acme, service, scope):
    before = snapshot()

    answer = CASES[service](scope, acme)

    assert answer not in ([], 0, None, False), answer
    assert (snapshot() == before) is (service in READERS)


def test_a_scope_reads_its_tenants_destinations_messages_and_attempts(acme):
    assert sorted(d.name for d in ACME.destinations()) == ["acme-live", "acme-shop"]
    assert [d.name for d in BOLT.destinations()] == ["bolt-shop"]
    assert ACME.messages().count() == 3 and not BOLT.messages().exists()
    assert ACME.recovery_jobs().count() == 1 and not BOLT.recovery_jobs().exists()
    assert ACME.attempts().count() == 1 and not BOLT.attempts().exists()
    assert EVERY_TENANT.destinations().count() == 3
    assert str(ACME) == "tenant acme" and str(EVERY_TENANT) == "every tenant"


@pytest.mark.parametrize("key", ["", "  ", None])
def test_a_tenant_has_a_name(key):
    with pytest.raises(ValueError, match="a tenant is named by a non-empty key"):
        tenant_scope(key)  # type: ignore[arg-type]
    assert Scope(None) == EVERY_TENANT


def test_the_command_names_the_tenant_of_a_destination():
    out = destination_added("acme-hooks", "--tenant", "acme", "--filter", '{"data.status": "paid"}')
    assert out.startswith("added acme-hooks: tenant acme, enabled, ")
    assert 'filter {"data.status": "paid"}' in out
    assert WebhookDestination.objects.get(name="acme-hooks").tenant == "acme"
    assert [d.name for d in ACME.destinations()] == ["acme-hooks"]


def test_an_endpoint_made_in_a_tenants_scope_is_that_tenants():
    made, _ = endpoints.endpoint_create(scope=BOLT, fields=CHANGED, by="b")
    assert made.tenant == "bolt" and list(BOLT.destinations()) == [made]
    assert not ACME.destinations().filter(pk=made.pk).exists()
