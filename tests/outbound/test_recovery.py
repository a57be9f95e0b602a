"""Recovery jobs (outbound/recovery.py): the plan counts what the run releases, with the
same query, for every kind and every criterion; the run is paced and keeps id order;
a job is refused past the replay horizon, above the destination's rate, and beside
another running one; cancel stops it; a missing job stays inside its tenant."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone
from rest_framework import serializers

from tests.support.outbox import destination, message
from webhook_receiver.models import MessageStatus, OutboxMessage, RecoveryJob
from webhook_receiver.outbound import catalog
from webhook_receiver.outbound.recovery import (
    Criteria,
    RecoveryRefused,
    recovery_cancel,
    recovery_plan,
    recovery_start,
)
from webhook_receiver.outbound.recovery_run import recovery_step
from webhook_receiver.outbound.relay.wakeups import listen_params
from webhook_receiver.outbound.tenancy import EVERY_TENANT, tenant_scope

pytestmark = pytest.mark.django_db

FAILED, DELIVERED, PENDING = MessageStatus.FAILED, MessageStatus.DELIVERED, MessageStatus.PENDING


@pytest.fixture
def merchant():
    return destination("merchant", rate_count=100, event_types=["order.paid", "order.refunded"])


def ago(**kwargs) -> timezone.datetime:
    return timezone.now() - timedelta(**kwargs)


def run_to_the_end(job: RecoveryJob, *, deliver: bool = True) -> list[int]:
    """Step the job a second at a time until it is done, delivering what it released
    after each step (as the relay would); the ids released, in order."""
    released: list[int] = []
    now = timezone.now()
    for _ in range(1000):
        now += timedelta(seconds=1)
        recovery_step(job.pk, now=now)
        job.refresh_from_db()
        fresh = list(
            OutboxMessage.objects.filter(recovery=job, status=PENDING)
            .order_by("id")
            .values_list("id", flat=True)
        )
        released += fresh
        if deliver:
            OutboxMessage.objects.filter(pk__in=fresh).update(status=DELIVERED)
        if job.state != "running":
            return released
    raise AssertionError("the job never ended")


def start(dest, by="ops", rate=None, **criteria) -> RecoveryJob:
    return recovery_start(
        scope=EVERY_TENANT, destination=dest, criteria=Criteria(**criteria), by=by, rate=rate
    )


def plan(dest, **criteria):
    return recovery_plan(scope=EVERY_TENANT, destination=dest, criteria=Criteria(**criteria))


# --- plan == run ---------------------------------------------------------------------


CRITERIA = {
    "every failed one": {"kind": "recover"},
    "failed since an hour": {"kind": "recover", "since_hours": 1},
    "failed until half an hour ago": {"kind": "recover", "until_hours": 0.5},
    "failed with a 5xx": {"kind": "recover", "answer_classes": ["5xx"]},
    "failed without an answer": {"kind": "recover", "answer_classes": ["none"]},
    "failed refunds": {"kind": "recover", "event_types": ["order.refunded"]},
    "failed order.*": {"kind": "recover", "event_types": ["order.*"]},
    "failed of one order": {"kind": "recover", "ordering_key_prefix": "order:8"},
    "delivered ones": {"kind": "replay"},
    "delivered with a 2xx since an hour": {
        "kind": "replay", "answer_classes": ["2xx"], "since_hours": 1,
    },
}  # fmt: skip


@pytest.fixture
def history(merchant):
    """Forty messages of the merchant over two hours: failed and delivered, answered
    500, 404, 200 or not at all, of two types and four orders."""
    for n in range(40):
        message(
            merchant,
            f"k{n}",
            status=FAILED if n % 2 else DELIVERED,
            event_type="order.refunded" if n % 5 == 0 else "order.paid",
            ordering_key=f"order:{n % 4 + 5}",
            created_at=ago(minutes=120 - 3 * n),
            last_status_code=[500, 404, None][n % 3] if n % 2 else 200,
        )
    return merchant


@pytest.mark.parametrize("name", sorted(CRITERIA))
def test_the_run_releases_exactly_what_the_plan_counted(history, name):
    asked = dict(CRITERIA[name])
    since = ago(hours=asked.pop("since_hours", 3))
    until_hours = asked.pop("until_hours", None)
    until = ago(hours=until_hours) if until_hours else None
    criteria = {"since": since, "until": until, **asked}
    counted = plan(history, **criteria)

    job = start(history, **criteria)
    released = run_to_the_end(job)

    assert counted.count > 0
    assert job.planned == counted.count == job.released == len(released)
    assert released == sorted(released)
    assert counted.sample == [
        tuple(row)
        for row in OutboxMessage.objects.filter(pk__in=released)
        .order_by("id")
        .values_list("key", "event_type", "created_at")[:5]
    ]
    assert job.state == "done" and job.finished_at is not None


def test_a_recovered_message_gets_its_whole_retry_budget_and_ends_the_breaker(merchant):
    failed = message(merchant, "k1", status=FAILED, failures=12, attempts=12)
    merchant.paused_until = timezone.now() + timedelta(minutes=1)
    merchant.save()
    changed = merchant.updated_at

    job = start(merchant, kind="recover", since=ago(hours=1))
    run_to_the_end(job, deliver=False)

    failed.refresh_from_db()
    merchant.refresh_from_db()
    assert (failed.status, failed.failures, failed.attempts, failed.recovery_id) == (
        PENDING, 0, 12, job.pk,
    )  # fmt: skip
    # ended as an enable ends it: the status owes it sends from then
    assert merchant.paused_until is None and merchant.updated_at > changed


def test_messages_admitted_after_the_plan_are_not_in_its_run(merchant):
    message(merchant, "before", status=FAILED)
    job = start(merchant, kind="recover", since=ago(hours=1))
    message(merchant, "after", status=FAILED)

    released = run_to_the_end(job)

    assert [OutboxMessage.objects.get(pk=i).key for i in released] == ["before"]
    assert OutboxMessage.objects.get(key="after").status == FAILED


# --- the pace ------------------------------------------------------------------------


def test_a_job_releases_at_its_rate_and_waits_while_two_seconds_of_it_wait(merchant):
    for n in range(100):
        message(merchant, f"k{n}", status=FAILED)
    job = start(merchant, kind="recover", since=ago(hours=1), rate=10)
    t0 = job.stepped_at

    counts = []
    for second in (1, 2, 3, 4):
        recovery_step(job.pk, now=t0 + timedelta(seconds=second))
        counts.append(OutboxMessage.objects.filter(recovery=job).count())
    # nothing of the first 20 was sent: it waits with two seconds of its rate pending
    assert counts == [10, 20, 20, 20]

    OutboxMessage.objects.filter(recovery=job).update(status=DELIVERED)
    recovery_step(job.pk, now=t0 + timedelta(seconds=5))
    # its credit never grows past two seconds of its rate
    assert OutboxMessage.objects.filter(recovery=job).count() == 40


def test_a_job_waits_while_the_live_messages_waiting_grow(merchant):
    # the merchant takes 4 at once; the job's messages would go before the live ones
    for n in range(40):
        message(merchant, f"k{n}", status=FAILED)
    job = start(merchant, kind="recover", since=ago(hours=1), rate=10)
    t0 = job.stepped_at

    def step(second: int, live: int) -> int:
        for n in range(live):
            message(merchant, f"live-{second}-{n}")
        OutboxMessage.objects.filter(recovery=job).update(status=DELIVERED)
        recovery_step(job.pk, now=t0 + timedelta(seconds=second))
        return OutboxMessage.objects.filter(recovery=job, status=PENDING).count()

    # a few live ones waiting, fewer than it sends at once: the job goes on
    assert step(1, live=3) == 10
    # more and more of them waiting: the destination is not keeping up, the job waits
    assert step(2, live=6) == 0
    assert step(3, live=6) == 0
    # as many as before (delivered as fast as admitted, or held back): it goes on, with
    # what its rate allowed meanwhile, two seconds of it at most
    assert step(4, live=0) == 20


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: PostgreSQL")
def test_a_job_another_process_is_stepping_is_left_to_it(merchant):
    message(merchant, "k", status=FAILED)
    job = start(merchant, kind="recover", since=ago(hours=1))
    later = timezone.now() + timedelta(seconds=5)
    with psycopg.connect(**listen_params(), autocommit=False) as other:
        other.execute(
            "SELECT 1 FROM webhook_receiver_recoveryjob WHERE id = %s FOR UPDATE", [job.pk]
        )
        assert recovery_step(job.pk, now=later) is None
    assert recovery_step(job.pk, now=later) == merchant.pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks: PostgreSQL")
def test_a_step_waits_for_no_lock_the_relay_holds(merchant):
    message(merchant, "k", status=FAILED)
    job = start(merchant, kind="recover", since=ago(hours=1))
    with psycopg.connect(**listen_params(), autocommit=False) as relay:
        # the relay's claim holds its destinations' rows while it records and claims
        relay.execute(
            "SELECT 1 FROM webhook_receiver_webhookdestination WHERE id = %s FOR UPDATE",
            [merchant.pk],
        )
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a wait fails the test, never hangs it
        try:
            assert recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=1)) == merchant.pk
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")


# --- refused -------------------------------------------------------------------------


def test_past_the_replay_horizon_a_job_is_refused_and_says_until_when(merchant):
    with pytest.raises(RecoveryRefused, match=r"past merchant's replay horizon of 30 days"):
        plan(merchant, kind="replay", since=ago(days=31))
    merchant.replay_horizon_days = 40
    merchant.save()
    assert plan(merchant, kind="replay", since=ago(days=31)).count == 0


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        ({"rate": 100}, r"below merchant's own, 100/s"),
        ({"rate": 0}, r"at least 0.001/s"),
        ({"answer_classes": ["6xx"]}, r"no answer class 6xx"),
        ({"kind": "again"}, r"no recovery of kind 'again'"),
        ({"until_minutes": 90}, r"the end \(until\) must come after the start"),
        ({"kind": "missing", "answer_classes": ["5xx"]}, r"never answered"),
    ],
)
def test_what_cannot_be_is_refused_with_why(merchant, asked, why):
    asked = {"kind": "recover", **asked}
    rate = asked.pop("rate", None)
    until = ago(minutes=asked.pop("until_minutes")) if "until_minutes" in asked else None
    with pytest.raises(RecoveryRefused, match=why):
        recovery_start(
            scope=EVERY_TENANT,
            destination=merchant,
            criteria=Criteria(since=ago(hours=1), until=until, **asked),
            by="ops",
            rate=rate,
        )
    assert not RecoveryJob.objects.exists()


def test_one_job_runs_for_a_destination_at_a_time_and_cancel_stops_it(merchant):
    for n in range(30):
        message(merchant, f"k{n}", status=FAILED)
    job = start(merchant, kind="recover", since=ago(hours=1), rate=10)
    with pytest.raises(RecoveryRefused, match=rf"recovery #{job.pk} of merchant is running"):
        start(merchant, kind="replay", since=ago(hours=1))
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=1))

    assert recovery_cancel(scope=EVERY_TENANT, job=job.pk, by="ana")
    assert not recovery_cancel(scope=EVERY_TENANT, job=job.pk, by="ana")
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=9))

    job.refresh_from_db()
    assert (job.state, job.cancelled_by, job.released) == ("cancelled", "ana", 10)
    # what it released is still sent; the rest stays failed
    assert OutboxMessage.objects.filter(status=PENDING).count() == 10
    assert OutboxMessage.objects.filter(status=FAILED).count() == 20
    assert start(merchant, kind="recover", since=ago(hours=1)).planned == 20


# --- missing -------------------------------------------------------------------------


class Refill(serializers.Serializer):
    """A shelf was refilled."""

    key = serializers.CharField()


REFILLS = ("refill.done", "refill.undone", "refill.secret")


@pytest.fixture
def declared():
    for name in REFILLS:
        catalog.webhook_event(name, serializer=Refill, opt_in=name == "refill.secret")
    yield
    for name in REFILLS:
        catalog.undeclare(name)


def test_missing_events_come_from_the_tenants_other_destinations_once_each(declared):
    new = destination("acme-new", tenant="acme", rate_count=100, event_types=["refill.*"])
    old = destination("acme-old", tenant="acme")
    other = destination("acme-other", tenant="acme")
    stranger = destination("bolt-shop", tenant="bolt")
    for n in range(6):
        message(old, f"e{n}", event_type="refill.done", ordering_key="shelf:1")
        message(other, f"e{n}", event_type="refill.done", ordering_key="shelf:1")
    message(old, "secret", event_type="refill.secret")  # opt-in: not reached by refill.*
    message(new, "e0", event_type="refill.done", status=DELIVERED)  # it had that one
    message(stranger, "bolt-1", event_type="refill.done")  # another tenant's
    scope = tenant_scope("acme")

    counted = recovery_plan(
        scope=scope, destination=new, criteria=Criteria(kind="missing", since=ago(hours=1))
    )
    job = recovery_start(
        scope=scope, destination=new, criteria=Criteria(kind="missing", since=ago(hours=1)), by="p"
    )
    run_to_the_end(job, deliver=False)

    written = OutboxMessage.objects.filter(destination=new, recovery=job).order_by("id")
    assert counted.count == job.planned == job.released == 5
    assert [m.key for m in written] == ["e1", "e2", "e3", "e4", "e5"]
    assert {m.ordering_key for m in written} == {"shelf:1"}
    assert counted.matched_types == ["refill.done"]
    assert not OutboxMessage.objects.filter(destination=new, key__in=["bolt-1", "secret"]).exists()


def test_a_missing_event_its_filter_leaves_out_is_written_discarded(declared):
    new = destination(
        "acme-new", tenant="acme", rate_count=100, event_types=["refill.done"],
        filter={"data.key": {"$in": ["e1"]}},
    )  # fmt: skip
    old = destination("acme-old", tenant="acme")
    for n in range(3):
        message(old, f"e{n}", event_type="refill.done")

    job = start(new, kind="missing", since=ago(hours=1))
    run_to_the_end(job, deliver=False)

    statuses = dict(OutboxMessage.objects.filter(destination=new).values_list("key", "status"))
    assert statuses == {"e0": "discarded", "e1": "pending", "e2": "discarded"}
    assert job.planned == 3
    assert "filter" in plan(new, kind="missing", since=ago(hours=1)).warnings[0]


def test_a_job_is_not_held_up_by_its_messages_held_behind_a_failed_one(declared):
    # the new destination failed an earlier event of the shelf: what the job writes for
    # that shelf waits for an operator, and the job goes on with the rest
    new = destination("acme-new", tenant="acme", rate_count=4, event_types=["refill.*"])
    old = destination("acme-old", tenant="acme")
    message(new, "before", event_type="refill.done", ordering_key="shelf:1", status=FAILED)
    for n in range(10):
        message(old, f"e{n}", event_type="refill.done", ordering_key="shelf:1")

    job = start(new, kind="missing", since=ago(hours=1), rate=1)
    run_to_the_end(job, deliver=False)

    job.refresh_from_db()
    assert (job.state, job.released) == ("done", 10)
