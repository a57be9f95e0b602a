"""Black-box tests of a served instance: gunicorn (2 sync workers) on the test database,
with and without the shipped nginx in front. Real sockets, real processes."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from tests.served import Served, gunicorn, nginx  # noqa: F401 (fixtures)
from tests.settings import SHOP_SECRET
from tests.signing import event_body, github_headers, reserved, standard_headers, stripe_headers
from webhook_receiver.models import RequestAudit, WebhookReceipt
from webhook_receiver.signatures import sign

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
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=15)
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
