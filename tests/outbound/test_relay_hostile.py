"""The relay against a hostile or broken destination, on real loopback servers and the
real database: answers no column takes as they are, a charset no codec reads, headers
trickled a line at a time, a round the database refuses to record, a locked outbox."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import TestCase
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.outbox import relay_merchant
from tests.support.peers import answer, hostile_peer, timed, trickled
from tests.support.worker import relay_running
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import relay_destination
from webhook_receiver.outbound.relay.steps import relay_claim, relay_send
from webhook_receiver.outbound.relay.writes import UNRECORDED
from webhook_receiver.watch.destinations import destination_statuses

pytestmark = pytest.mark.django_db
OUTBOX = "webhook_receiver_outboxmessage"


def destination(url: str, **fields) -> WebhookDestination:
    return relay_merchant(
        url, backoff_base_seconds=fields.pop("backoff_base_seconds", 60), **fields
    )


def admit(dest: WebhookDestination, key: str, *, committed: bool = False) -> None:
    if committed:
        with transaction.atomic():
            enqueue_webhook(dest, "order.paid", key, {"type": "order.paid", "data": {}})
        return
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(dest, "order.paid", key, {"type": "order.paid", "data": {}})


def key_of(request: bytes) -> str:
    for line in request.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"webhook-id":
            return value.strip().decode()
    return ""


def only_attempt(key: str) -> DeliveryAttempt:
    (attempt,) = DeliveryAttempt.objects.filter(message__key=key)
    return attempt


# --- every answer is recordable --------------------------------------------------------


def test_an_answer_with_a_nul_in_its_body_is_recorded_and_spends_the_budget():
    # given: a destination that answers 500 with a NUL in its body (PostgreSQL's text
    # columns refuse NUL)
    body = b'{"error": "bad\x00byte"}'
    with hostile_peer(lambda request: [(0, answer(500, {}, body))]) as peer:
        dest = destination(peer.url)
        admit(dest, "order:o1:paid:v1")

        # when
        relay_destination(destination_id=dest.pk)

    # then: the attempt is recorded, with the NUL escaped; one failure is spent and the
    # message waits for its backoff, sent once
    attempt = only_attempt("order:o1:paid:v1")
    assert (attempt.number, attempt.status_code) == (1, 500)
    assert attempt.response_excerpt == '{"error": "bad\\x00byte"}'
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts, message.failures) == ("pending", 1, 1)
    assert message.last_error == attempt.response_excerpt
    assert len(peer.requests) == 1


@pytest.mark.parametrize(
    "charset", ["base64", "rot13", "no-such-charset", "idna", "utf-16", "uu_codec"]
)
def test_an_answer_in_a_charset_no_text_codec_reads_is_recorded(charset):
    # given: a 422 whose Content-Type names a codec that is not a text encoding (a
    # LookupError in bytes.decode), none at all, or one these bytes break
    body = "refusé \x00 \u202e".encode() + b"\xff\xfe"
    headers = {"content-type": f"text/plain; charset={charset}"}
    with hostile_peer(lambda request: [(0, answer(422, headers, body))]) as peer:
        dest = destination(peer.url)
        admit(dest, "order:o2:paid:v1")

        # when
        relay_destination(destination_id=dest.pk)

    # then: recorded, terminal, with the body read as text somehow
    attempt = only_attempt("order:o2:paid:v1")
    assert attempt.status_code == 422
    assert attempt.response_excerpt
    assert "\x00" not in attempt.response_excerpt
    assert OutboxMessage.objects.get().status == "failed"


# --- one deadline from connect to the last byte kept ------------------------------------


@pytest.mark.parametrize("what", ["headers", "status line"])
def test_an_answer_that_trickles_its_head_ends_at_the_destination_timeout(what):
    # given: a destination whose answer comes a header line (or a byte of the status line)
    # every 0.3 s for 6 s: each read is well within the 1 s timeout, the whole is not
    if what == "headers":
        pieces = [b"HTTP/1.1 200 OK\r\n"] + [b"x-slow: 1\r\n"] * 20
    else:
        pieces = [bytes([c]) for c in b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n"]
    with hostile_peer(lambda request: trickled(pieces, every=0.3, then=b"\r\n")) as peer:
        dest = destination(peer.url, timeout_seconds=1)
        admit(dest, "order:o3:paid:v1")

        # when
        _, took = timed(lambda: relay_destination(destination_id=dest.pk))

    # then: the request ended at its timeout (a read's slack), as no answer, recorded and
    # backing off; its lease (timeout + 24 s) outlived it by far
    assert took < dest.timeout_seconds + 0.5, took
    attempt = only_attempt("order:o3:paid:v1")
    assert attempt.status_code is None and attempt.error.startswith("ReadTimeout")
    assert attempt.duration_ms < (dest.timeout_seconds + 0.5) * 1000
    message = OutboxMessage.objects.get()
    assert (message.status, message.failures) == ("pending", 1)


# --- a round that cannot be recorded -----------------------------------------------------


def test_attempts_that_were_never_recorded_spend_the_budget():
    # given: a destination allowing 3 attempts, and a relay that sends but never records
    # (a worker killed after each request, or a database that refused each round)
    with hostile_peer(lambda request: [(0, answer(500, {}, b"down"))]) as peer:
        dest = destination(peer.url, max_attempts=3)
        admit(dest, "order:o4:paid:v1")
        sent = []
        for _ in range(4):
            claimed = relay_claim(destination=dest).claimed
            sent += relay_send(dest, claimed)
            # its lease runs out (moved to the past rather than waited for)
            OutboxMessage.objects.filter(status="sending").update(
                lease_until=timezone.now() - timedelta(seconds=1)
            )

    # then: three requests, and the claim after them failed the message instead of a
    # fourth: its budget was spent by the attempts nobody recorded
    assert len(peer.requests) == len(sent) == 3
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts, message.failures) == ("failed", 3, 3)
    assert message.last_error == UNRECORDED
    assert message.lease_until is None
    assert relay_claim(destination=dest).claimed == []


@pytest.mark.postgres_only("a CHECK constraint added to a table for the test")
def test_a_round_refused_as_a_whole_is_recorded_answer_by_answer():
    # given: three messages answered in one round, and a database that refuses one of
    # their excerpts (a constraint stands in for whatever a column may refuse)
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE webhook_receiver_deliveryattempt ADD CONSTRAINT no_poison "
            "CHECK (response_excerpt NOT LIKE '%%poison%%')"
        )
    bodies = {"k1": b"fine", "k2": b"poison", "k3": b"also fine"}
    with hostile_peer(lambda request: [(0, answer(422, {}, bodies[key_of(request)]))]) as peer:
        dest = destination(peer.url)
        for key in bodies:
            admit(dest, key)

        # when
        sent, _ = relay_destination(destination_id=dest.pk)

    # then: one round of three, each recorded: the refused one without its excerpt, and
    # with why; each spent one failure
    assert sent == 3 and len(peer.requests) == 3
    excerpts = {a.message.key: a for a in DeliveryAttempt.objects.select_related("message")}
    assert excerpts["k1"].response_excerpt == "fine"
    assert excerpts["k3"].response_excerpt == "also fine"
    assert excerpts["k2"].response_excerpt == "" and excerpts["k2"].status_code == 422
    assert excerpts["k2"].error.startswith("answer not recordable: IntegrityError")
    messages = OutboxMessage.objects.all()
    assert {(m.status, m.attempts, m.failures) for m in messages} == {("failed", 1, 1)}
    # the destination says why the round was refused
    dest.refresh_from_db()
    assert dest.record_error.startswith("IntegrityError")


class OutboxLock:
    """ACCESS EXCLUSIVE on the outbox table, held by another connection (a migration, a
    VACUUM FULL) from ``take()`` until ``release()``."""

    def __init__(self) -> None:
        self.held, self.done = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None

    def take(self) -> None:
        def hold() -> None:
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(f"LOCK TABLE {OUTBOX} IN ACCESS EXCLUSIVE MODE")
                    self.held.set()
                    self.done.wait(20)
            finally:
                connection.close()

        self.thread = threading.Thread(target=hold, daemon=True)
        self.thread.start()
        assert self.held.wait(10), "the lock was not taken"

    def release(self) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join(10)


@pytest.fixture
def outbox_lock(settings):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "LOCK_TIMEOUT_MS": 300}
    lock = OutboxLock()
    yield lock
    lock.release()


@pytest.mark.postgres_only("a table lock held by another session")
@pytest.mark.django_db(transaction=True)
def test_a_round_the_locked_outbox_cannot_record_is_named_and_spends_the_budget(
    outbox_lock, caplog
):
    # given: a destination allowing one attempt, which answers 500 once the outbox table
    # has been locked by another session (after the claim, before the record)
    def locked_then_answered(request: bytes):
        outbox_lock.take()
        return [(0, answer(500, {}, b"down"))]

    with hostile_peer(locked_then_answered) as peer:
        dest = destination(peer.url, max_attempts=1)
        admit(dest, "order:o5:paid:v1", committed=True)

        # when: the relay runs, and its record waits for the lock
        with caplog.at_level(logging.WARNING, logger="webhook_receiver"):
            _, took = timed(lambda: relay_destination(destination_id=dest.pk))

        # then: the round ended at the lock timeout with one line, no traceback
        assert took < 5, took
        lines = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
        assert len(lines) == 1 and lines[0].exc_info is None
        assert "relay stopped at its database bounds" in lines[0].getMessage()
        assert "lock timeout" in lines[0].getMessage()
        outbox_lock.release()
        # the overview names the cause, not "the worker or the sweep is down"
        (status,) = destination_statuses()
        assert [r.code for r in status.reasons] == ["record_failing"]
        assert status.reasons[0].text.startswith(
            "the relay could not record its answers: OperationalError: canceling statement "
            "due to lock timeout"
        )

        # when: the lease runs out (moved to the past here), and the relay runs again
        OutboxMessage.objects.update(lease_until=timezone.now() - timedelta(seconds=1))
        relay_destination(destination_id=dest.pk)

    # then: the unrecorded attempt spent the one allowed: failed, never sent twice
    assert len(peer.requests) == 1
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts, message.failures) == ("failed", 1, 1)
    assert message.last_error == UNRECORDED


@pytest.mark.postgres_only("a table lock held by another session")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("what", ["the poll", "a round"])
def test_the_relay_under_a_locked_outbox_stops_within_seconds_with_one_line(
    outbox_lock, caplog, what
):
    # given: a message due, and the outbox table locked by another session
    dest = destination("http://127.0.0.1:9/hooks")
    admit(dest, "order:o6:paid:v1", committed=True)
    outbox_lock.take()

    # when: a relay polls for it (three times a second, for two seconds), or a round
    # claims it
    with caplog.at_level(logging.WARNING, logger="webhook_receiver"):
        if what == "the poll":
            relay_running(2.0, poll_seconds=0.3)
            took = 0.0
        else:
            (answered, _), took = timed(lambda: relay_destination(destination_id=dest.pk))
            assert answered == 0

    # then: each stops at the lock timeout, with one WARNING for the stretch and no
    # traceback, and sends nothing; the message is due again
    assert took < 3, took
    lines = [r for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert "stopped at its database bounds" in lines[0].getMessage()
    assert "tried again every second" in lines[0].getMessage()
    outbox_lock.release()
    assert OutboxMessage.objects.get().status == "pending"


# --- the relay's own log lines -----------------------------------------------------------


def test_each_answer_that_is_not_a_2xx_is_one_warning_and_deliveries_are_not_logged(
    django_capture_on_commit_callbacks, caplog
):
    # given: four messages, answered 500, 422, 429 with Retry-After, and 200
    answers = {
        "k-500": answer(500, {}, b"oops"),
        "k-422": answer(422, {}, b"no"),
        "k-429": answer(429, {"retry-after": "120"}, b""),
        "k-200": answer(200, {}, b"ok"),
    }
    with hostile_peer(lambda request: [(0, answers[key_of(request)])]) as peer:
        dest = destination(peer.url, max_attempts=5)
        for key in answers:
            admit(dest, key)

        # when
        with (
            caplog.at_level(logging.INFO, logger="webhook_receiver"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            relay_destination(destination_id=dest.pk)

    # then: one line per answer that was not a 2xx, naming the destination, the key, the
    # attempt, the answer and what happens next; nothing for the delivery
    lines = {
        r.webhook["key"]: r.getMessage()
        for r in caplog.records
        if r.name.startswith("webhook_receiver.outbound.relay")
    }
    assert set(lines) == {"k-500", "k-422", "k-429"}
    assert lines["k-500"].startswith(
        "outbox: merchant answered 500 to k-500, attempt 1: retried in"
    )
    assert "(failure 1 of 5)" in lines["k-500"]
    assert lines["k-422"] == (
        "outbox: merchant answered 422 to k-422, attempt 1: failed for good (a terminal "
        "answer), waiting for an operator"
    )
    assert lines["k-429"].endswith("attempt 1: deferred 2 min as Retry-After asks")
    relay_lines = [
        r for r in caplog.records if r.name.startswith("webhook_receiver.outbound.relay")
    ]
    assert {r.levelno for r in relay_lines} == {logging.WARNING}


def test_a_request_that_got_no_answer_is_one_warning(django_capture_on_commit_callbacks, caplog):
    # given: a destination that closes the connection without answering
    with hostile_peer(lambda request: []) as peer:
        dest = destination(peer.url)
        admit(dest, "k-dropped")

        # when
        with (
            caplog.at_level(logging.WARNING, logger="webhook_receiver"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            relay_destination(destination_id=dest.pk)

    # then
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("webhook_receiver.outbound.relay")
    ]
    assert line.startswith("outbox: merchant gave no answer (RemoteProtocolError: ")
    assert "to k-dropped, attempt 1: retried in" in line


# --- fuzzing what a destination may answer -----------------------------------------------

CHARSETS = st.sampled_from(
    ["utf-8", "latin-1", "utf-16", "base64", "rot13", "idna", "bogus", "utf-8\x00", ""]
)
HEADER_VALUES = st.binary(max_size=60).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"").decode("latin-1")
)
RETRY_AFTER = st.sampled_from(
    ["120", "²", "-1", "99999999999999999999", "Wed, 21 Oct 2015 07:28:00 GMT", "soon", ""]
) | st.text(max_size=30).map(lambda t: t.replace("\r", "").replace("\n", ""))
_fuzz_keys = iter(range(10**9))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    status=st.integers(200, 999),
    charset=CHARSETS,
    retry_after=RETRY_AFTER,
    headers=st.lists(
        st.tuples(st.sampled_from(["x-a", "content-type", "location", "x-b"]), HEADER_VALUES),
        max_size=4,
    ),
    body=st.binary(max_size=3000),
)
def test_any_answer_is_recorded_as_one_attempt(status, charset, retry_after, headers, body):
    # given: a destination answering with these status, headers and bytes
    head = [("content-type", f"application/json; charset={charset}"), *headers]
    if retry_after:
        head.append(("retry-after", retry_after))
    with hostile_peer(lambda request: [(0, answer(status, head, body))]) as peer:
        # one token, refilled hourly: the run sends once, whatever the answer says
        key = f"fuzz-{next(_fuzz_keys)}"
        dest = destination(
            peer.url, name=key, timeout_seconds=2, rate_count=1, rate_seconds=3600, burst=1
        )
        admit(dest, key)

        # when
        relay_destination(destination_id=dest.pk)

    # then: one request, one attempt recorded, the message no longer claimed
    assert len(peer.requests) == 1
    attempt = only_attempt(key)
    assert attempt.number == 1
    assert attempt.status_code == status or (attempt.status_code is None and attempt.error)
    message = OutboxMessage.objects.get(key=key)
    assert message.status in {"pending", "delivered", "failed"} and message.lease_until is None
    if message.status == "pending":
        assert message.next_attempt_at <= timezone.now() + timedelta(hours=1, seconds=5)
