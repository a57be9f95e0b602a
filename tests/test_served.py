"""Black-box tests of a served instance: gunicorn (2 sync workers) on the test database,
with and without the shipped nginx in front. Real sockets, real processes."""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from collections import Counter

import pytest

from tests.settings import SHOP_SECRET
from tests.support.served import (  # noqa: F401 (fixtures)
    NGINX_SITE,
    Served,
    SlowBodyFlood,
    gunicorn,
    nginx,
    nginx_with_probes,
)
from tests.support.signing import (
    event_body,
    github_headers,
    reserved,
    standard_headers,
    stripe_headers,
)
from tests.support.threads import run_together
from webhook_receiver.models import RequestAudit, WebhookReceipt
from webhook_receiver.schemes import sign

pytestmark = [
    pytest.mark.postgres_only(
        "the served instance shares the test database with the test (SQLite's is in memory)"
    ),
    pytest.mark.django_db(transaction=True),
]

SLOW_SECONDS = 5.0


def send(
    server: Served,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    *,
    chunked: bool = False,
    timeout: float = 15,
    source_address: str | None = None,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(
        server.host,
        server.port,
        timeout=timeout,
        source_address=(source_address, 0) if source_address else None,
    )
    try:
        if chunked:
            conn.request(
                "POST", path, body=iter([body[:7], body[7:]]), headers=headers, encode_chunked=True
            )
        else:
            conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def slow_sender(server: Served, answers: list[int]) -> threading.Thread:
    """A sender that announces 50 bytes and dribbles them over SLOW_SECONDS."""

    def run() -> None:
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            sock.sendall(
                b"POST /webhooks/shop/ HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\nContent-Length: 50\r\n\r\n"
            )
            for _ in range(50):
                sock.sendall(b" ")
                time.sleep(SLOW_SECONDS / 50)
            answers.append(int(sock.recv(1024).split(b" ", 2)[1]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def a_normal_request_takes(server: Served) -> float:
    """With 3 slow senders holding on, how long one ordinary signed delivery takes."""
    answers: list[int] = []
    slow = [slow_sender(server, answers) for _ in range(3)]
    time.sleep(0.5)  # they are all connected and dribbling
    body = reserved("ord_normal", ("SKU-N", 1))
    started = time.monotonic()
    status, answer = send(server, "/webhooks/shop/", body, standard_headers(body))
    took = time.monotonic() - started
    for thread in slow:
        thread.join(timeout=30)
    assert status == 200, answer
    assert answers == [400, 400, 400]  # no signature headers: refused, once they finished
    return took


def test_behind_nginx_three_slow_senders_do_not_delay_a_normal_request(nginx):  # noqa: F811
    assert a_normal_request_takes(nginx) < 1.0


def test_without_nginx_three_slow_senders_hold_both_sync_workers(gunicorn):  # noqa: F811
    # Why deploy/nginx.conf exists: straight to gunicorn, the normal request waits for a
    # worker until a slow sender has finished (make run serves this way: development only).
    assert a_normal_request_takes(gunicorn) > SLOW_SECONDS / 2


def shipped_seconds(directive: str) -> float:
    """A timeout of the shipped deploy/nginx.conf, as it stands."""
    found = re.search(rf"^\s*{directive}\s+(\d+)s;", NGINX_SITE.read_text(), re.MULTILINE)
    assert found, f"deploy/nginx.conf sets no {directive}"
    return float(found.group(1))


def deliveries_during(server: Served, seconds: float) -> list[tuple[int | str, float]]:
    """One ordinary signed delivery every half second: (status or error, seconds)."""
    answers: list[tuple[int | str, float]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        body = reserved(f"ord_during_{len(answers)}", ("SKU-N", 1))
        started = time.monotonic()
        try:
            status, _ = send(server, "/webhooks/shop/", body, standard_headers(body), timeout=5)
        except OSError as exc:
            status = type(exc).__name__
        answers.append((status, round(time.monotonic() - started, 2)))
        time.sleep(0.5)
    return answers


def test_behind_nginx_800_slow_bodies_from_one_address_leave_other_senders_served(nginx):  # noqa: F811
    # given: one address keeps 800 connections open, more than Debian's 768 worker
    # connections, each sending a body byte just within the shipped body timeout (with
    # the config before limits, no other sender got through at all)
    interval = shipped_seconds("client_body_timeout") * 0.8
    with SlowBodyFlood(nginx, connections=800, interval=interval) as flood:
        time.sleep(2)  # connected, their headers sent, their bodies started
        # when: another sender delivers, every half second for 15 s
        answers = deliveries_during(nginx, 15)

    # then: every one of its deliveries was served, promptly
    assert [a for a in answers if a[0] != 200 or a[1] > 2.0] == []
    assert WebhookReceipt.objects.count() == len(answers)
    # and the flooding address got its share and 429s for the rest
    assert flood.answers[429] > 800 - 32


def test_behind_nginx_a_sender_bursting_its_backlog_is_paced_not_refused(nginx):  # noqa: F811
    # given: a sender redelivering its backlog as fast as its 32 connections go
    bodies = [reserved(f"ord_backlog_{n}", ("SKU-B", 1)) for n in range(320)]
    answers: list[int] = []

    def sender(part: list[bytes]) -> None:
        for body in part:
            answers.append(send(nginx, "/webhooks/shop/", body, standard_headers(body))[0])

    # when
    threads = [threading.Thread(target=sender, args=(bodies[i::32],)) for i in range(32)]
    started = time.monotonic()
    run_together(threads, timeout=120)
    took = time.monotonic() - started

    # then: nothing refused, every event applied; paced, to at most 200 a second
    assert Counter(answers) == {200: 320}
    assert WebhookReceipt.objects.count() == 320
    assert took >= (320 - 64) / 200


# --- the client's address -----------------------------------------------------------

SENDER = "127.0.0.3"  # a sender's own address on loopback, not nginx's 127.0.0.1


@pytest.mark.parametrize(
    "forwarded_for",
    [None, "203.0.113.9", "203.0.113.9, 198.51.100.1", "not an address, [", ",,,", "x" * 4000],
)
def test_behind_nginx_each_record_has_the_senders_address_whatever_it_claims(
    nginx,  # noqa: F811
    forwarded_for,
):
    # given: a sender that puts its own X-Forwarded-For on its request, or none
    body = reserved("ord_addr", ("SKU-A", 1))
    headers = standard_headers(body)
    refused_headers: dict[str, str] = {}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = refused_headers["X-Forwarded-For"] = forwarded_for

    # when: a delivery and a refused request, both through nginx
    delivered = send(nginx, "/webhooks/shop/", body, headers, source_address=SENDER)
    refused = send(nginx, "/webhooks/shop/", body, refused_headers, source_address=SENDER)

    # then: both recorded with the address nginx saw, never the proxy's or the claim
    assert (delivered[0], refused[0]) == (200, 400)
    recorded = list(RequestAudit.objects.order_by("id").values_list("result", "remote_addr"))
    assert recorded == [("applied", SENDER), ("missing_signature_headers", SENDER)]


def test_straight_to_gunicorn_a_claimed_address_is_not_believed(gunicorn):  # noqa: F811
    # given: no proxy in front, none trusted (the setting's default)
    body = reserved("ord_claim", ("SKU-A", 1))
    headers = {**standard_headers(body), "X-Forwarded-For": "203.0.113.9"}

    # when
    status, _ = send(gunicorn, "/webhooks/shop/", body, headers, source_address=SENDER)

    # then: the peer's own address is recorded
    assert status == 200
    assert RequestAudit.objects.get().remote_addr == SENDER


APPLIED_OR_HELD = {200, 202}


def the_probe() -> list[tuple[str, str, bytes, dict[str, str], set[int], bool]]:
    """(name, path, body, headers, allowed answers, chunked): the hostile table again."""
    good = reserved("ord_probe", ("SKU-P", 1))
    stripe_nul = json.dumps(
        {"id": "evt_\u0000", "type": "order.paid", "data": {"order_id": "p1", "version": 1}}
    ).encode()
    deep = b'{"type": "inventory.reserved", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge = b'{"type": "order.paid", "data": {"order_id": "p2", "version": ' + b"9" * 5000 + b"}}"
    lines = reserved("ord_big", *[(f"S{n}", 1) for n in range(11_000)])
    weird_type = event_body("x\u0000y")
    far = sign(scheme="standard", secret=SHOP_SECRET, body=good, message_id="m", timestamp=10**25)
    svix = {k.replace("webhook-", "svix-"): v for k, v in standard_headers(good).items()}
    forged = {**standard_headers(good), "webhook-signature": "v1,AAAA"}
    ts_4301 = {**standard_headers(good), "webhook-timestamp": "9" * 4301}
    unsigned = {"Content-Type": "application/json"}
    shop, ok = "/webhooks/shop/", APPLIED_OR_HELD
    return [
        ("long webhook-id", shop, good, standard_headers(good, msg_id="m" * 300), ok, False),
        (
            "long github delivery",
            "/webhooks/github/",
            b"{}",
            github_headers(b"{}", delivery="d" * 300),
            ok,
            False,
        ),
        (
            "stripe id with NUL",
            "/webhooks/stripe/",
            stripe_nul,
            stripe_headers(stripe_nul),
            ok,
            False,
        ),
        ("type with NUL", shop, weird_type, standard_headers(weird_type), ok, False),
        ("slug with NUL", "/webhooks/sh%00op/", good, unsigned, {404}, False),
        ("4301-digit timestamp", shop, good, ts_4301, {400}, False),
        (
            "stripe 4301-digit t",
            "/webhooks/stripe/",
            good,
            {"Stripe-Signature": "t=" + "9" * 4301 + ",v1=00"},
            {400},
            False,
        ),
        ("signed timestamp 10**25", shop, good, far, {401}, False),
        ("chunked", shop, good, standard_headers(good), ok, True),
        ("chunked over the limit", "/webhooks/small/", b"x" * 1025, unsigned, {413}, True),
        ("11,000 lines", shop, lines, standard_headers(lines), ok, False),
        ("nested 100,000 deep", shop, deep, standard_headers(deep), ok, False),
        ("5,000-digit version", shop, huge, standard_headers(huge), ok, False),
        ("svix header names", shop, good, svix, ok, False),
        ("forged", shop, good, forged, {401}, False),
    ]


@pytest.mark.parametrize("front", ["gunicorn", "nginx"])
def test_the_hostile_table_as_a_black_box(request, front):
    server: Served = request.getfixturevalue(front)
    probe = the_probe()
    answers = {
        name: send(server, path, body, headers, chunked=chunked)
        for name, path, body, headers, _, chunked in probe
    }
    # nginx refuses a NUL in the path itself (400): that request never reaches the app
    by_nginx = {"slug with NUL"} if front == "nginx" else set()
    # every answer as documented (no 5xx at all; every authentic event applied or held),
    # and every request that reached the app audited
    unexpected = {
        name: (answers[name][0], answers[name][1][:200])
        for name, _, _, _, allowed, _ in probe
        if answers[name][0] not in (allowed if name not in by_nginx else {400})
    }
    assert unexpected == {}
    assert RequestAudit.objects.count() == len(probe) - len(by_nginx)
    assert WebhookReceipt.objects.filter(event_key__startswith="sha256:").count() == 3


# --- the probe under a flood ---------------------------------------------------------------


def probe(server: Served) -> tuple[int, bytes, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("GET", "/health/", headers={"Accept": "application/json"})
        response = conn.getresponse()
        return response.status, response.read(), time.monotonic() - started
    finally:
        conn.close()


def test_behind_nginx_the_probe_answers_within_2_s_under_a_lock_and_a_flood_from_its_address(
    nginx_with_probes,  # noqa: F811
):
    import psycopg
    from django.db import connection

    from tests.support.locks import table_locked

    server = nginx_with_probes
    body = reserved("ord_flood", ("SKU-A", 1))
    stop = threading.Event()
    flood_answers: Counter[int] = Counter()

    def flood() -> None:
        # from the probe's own address (127.0.0.1), more at once than limit_conn allows
        while not stop.is_set():
            try:
                status, _ = send(
                    server, "/webhooks/shop/", body, standard_headers(body), timeout=10
                )
            except OSError:
                status = 0
            flood_answers[status] += 1

    db = connection.settings_dict
    holder = psycopg.connect(dbname=db["NAME"], host=db["HOST"], port=db["PORT"], user=db["USER"])
    senders = [threading.Thread(target=flood, daemon=True) for _ in range(48)]
    probes: list[tuple[int, bytes, float]] = []
    try:
        # given: the receipts locked (a migration, a VACUUM FULL), and a sender flooding
        with table_locked(holder, "webhook_receiver_webhookreceipt", for_seconds=30):
            for sender in senders:
                sender.start()
            time.sleep(2)  # the flood at its height: nginx refuses its excess with 429
            # when: the probe asks, every half second
            for _ in range(10):
                probes.append(probe(server))
                time.sleep(0.5)
            stop.set()
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=20)
        holder.close()

    # then: the flood met the limits, and every probe got the app's answer within 2 s:
    # 503 naming the locked table, never nginx's 429
    assert flood_answers[429] > 0, flood_answers
    assert [status for status, _, _ in probes] == [503] * 10
    assert all(b"webhook_receiver_webhookreceipt" in answer for _, answer, _ in probes)
    assert max(took for _, _, took in probes) < 2.0, [round(t, 2) for *_, t in probes]
