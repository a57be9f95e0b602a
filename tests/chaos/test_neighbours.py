"""The noisy neighbours on loopback: a black hole holds a request until its client gives
up (or the server stops), and counts it in flight meanwhile; a failing one answers 503."""

from __future__ import annotations

import http.client
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.chaos.neighbours import BadMerchant
from tests.support.worker import wait_for


def _post(url: str, timeout: float) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", parts.path, b'{"type": "order.paid"}',
                     {"Content-Type": "application/json"})  # fmt: skip
        return conn.getresponse().status
    finally:
        conn.close()


def test_a_black_hole_holds_the_request_until_its_client_gives_up():
    hole = BadMerchant("neighbour-0", fails=False)
    hole.start()
    try:
        with pytest.raises(TimeoutError):
            _post(hole.url, timeout=0.5)
        wait_for(lambda: hole.in_flight == 0, 5, "the hole to see the client go")
        assert (hole.requests, hole.most_in_flight) == (1, 1)
    finally:
        hole.stop()


def test_a_black_hole_lets_its_held_requests_go_when_it_stops():
    hole = BadMerchant("neighbour-0", fails=False)
    hole.start()
    errors: list[BaseException] = []

    def post() -> None:
        try:
            _post(hole.url, timeout=30)
        except (OSError, http.client.HTTPException) as exc:
            errors.append(exc)

    clients = [threading.Thread(target=post) for _ in range(3)]
    for client in clients:
        client.start()
    wait_for(lambda: hole.in_flight == 3, 5, "three requests held")
    began = time.monotonic()
    hole.stop()
    for client in clients:
        client.join(10)

    assert time.monotonic() - began < 5
    assert len(errors) == 3  # cut, never answered
    # each holding thread sees the stop at its next poll, after the client saw the cut
    wait_for(lambda: hole.in_flight == 0, 5, "the held requests let go")
    assert (hole.requests, hole.most_in_flight) == (3, 3)


def test_a_failing_neighbour_answers_503():
    failing = BadMerchant("neighbour-5", fails=True)
    failing.start()
    try:
        assert [_post(failing.url, timeout=5) for _ in range(2)] == [503, 503]
        assert (failing.requests, failing.most_in_flight) == (2, 0)
    finally:
        failing.stop()
