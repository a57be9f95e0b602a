"""The two walks a newcomer reads (docs/testing.md): every function of the app entered,
in order, from ``WebhookView.post`` to the commit of a new event, and from
``enqueue_webhook`` to the attempt its relay run records (through the task and its
lane). Recorded by a profiler, not by hand; ``pytest tests/test_walks.py -s`` prints
them. Each walk may not grow: a change that makes it longer raises the bound it passes,
and says why, in the same commit. And neither walk enters a module again from below it
(A calls B, which calls back into A), except through a callback A handed down: a
closure or lambda of A's own, such as the statement ``core/outages.py`` runs for
``admission.py``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType

import pytest
from django.db import transaction
from webhook_receiver.outbound.relay.lanes import RelayLanes

from tests.support.http import post
from tests.support.outbox import relay_merchant
from tests.support.peers import answer, hostile_peer
from tests.support.signing import reserved, standard_headers
from webhook_receiver import tasks
from webhook_receiver.core import seam, tracing
from webhook_receiver.models import DeliveryAttempt
from webhook_receiver.outbound.admission import enqueue_webhook
from webhook_receiver.outbound.relay import lanes as lanes_module

PACKAGE = Path(__file__).resolve().parents[1] / "webhook_receiver"

# (files, functions) at most; comprehensions and lambdas are not counted as functions
RECEIVE_BOUND = (17, 67)
SEND_BOUND = (24, 98)


def _app_module(frame: FrameType) -> str | None:
    """The app's module a frame runs in (its path under webhook_receiver/), or None."""
    path = frame.f_code.co_filename
    return str(Path(path).relative_to(PACKAGE)) if path.startswith(f"{PACKAGE}/") else None


class Walk:
    """The app's functions entered while the block runs, in every thread, in order."""

    def __init__(self) -> None:
        self.entered: list[tuple[str, str]] = []
        # a module entered again from below it: (the call, the modules it came through)
        self.reentered: list[tuple[str, str]] = []
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        module = _app_module(frame)
        if module is None:
            return
        name = frame.f_code.co_qualname
        if name.rsplit(".", 1)[-1].startswith("<"):  # a comprehension or a lambda
            return
        place = (module, name)
        with self._lock:
            if place not in self._seen:
                self._seen.add(place)
                self.entered.append(place)
        if "<locals>" not in name:  # a callback handed down is not a return
            self._check_reentry(place, frame)

    def _check_reentry(self, place: tuple[str, str], frame: FrameType) -> None:
        # the app's modules on the stack, nearest first, a run of one module's frames once
        below: list[str] = []
        caller = frame.f_back
        while caller is not None:
            module = _app_module(caller)
            if module is not None and (not below or below[-1] != module):
                below.append(module)
            caller = caller.f_back
        module = place[0]
        if below and below[0] != module and module in below:
            found = (f"{module}: {place[1]}", " < ".join(below[: below.index(module) + 1]))
            with self._lock:
                if found not in self.reentered:
                    self.reentered.append(found)

    def __enter__(self) -> Walk:
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(path for path, _ in self.entered))

    def told(self, title: str) -> str:
        lines = [f"{title}: {len(self.files)} files, {len(self.entered)} functions"]
        lines += [f"  {path}: {name}" for path, name in self.entered]
        return "\n".join(lines)


@pytest.fixture(autouse=True)
def untraced(monkeypatch):
    """As a host without a tracer provider runs it: another test of this process may
    have set one, which OpenTelemetry keeps for the process's life."""
    if tracing.trace is not None:
        proxy = tracing.trace.ProxyTracerProvider()
        monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: proxy)


def within(walk: Walk, bound: tuple[int, int]) -> bool:
    return len(walk.files) <= bound[0] and len(walk.entered) <= bound[1]


@pytest.mark.django_db(transaction=True)
def test_the_receive_walk_does_not_grow(client):
    # given: one event received already (first use of each piece is not the walk)
    warm = reserved("ord_warm", ("SKU-A", 1))
    post(client, "shop", warm, standard_headers(warm, msg_id="warm"))
    body = reserved("ord_walk", ("SKU-A", 1))
    headers = standard_headers(body, msg_id="walk")

    # when
    with Walk() as walk:
        answered = post(client, "shop", body, headers)

    # then
    assert answered.json()["status"] == "applied"
    print("\n" + walk.told("receive"))
    assert within(walk, RECEIVE_BOUND), walk.told("receive")
    assert walk.reentered == []


@pytest.mark.postgres_only("a lane's thread writes while the test's connection reads")
@pytest.mark.django_db(transaction=True)
def test_the_send_walk_does_not_grow(monkeypatch):
    # given: a merchant that answers 200, this process's lanes, and the task run where
    # the relay is started (as a worker would run it)
    lanes = RelayLanes()
    monkeypatch.setattr(lanes_module, "lanes", lanes)
    with (
        hostile_peer(lambda request: [(0, answer(200, {}, b"ok"))]) as peer,
        seam.replaced(
            relay=lambda destination_id, countdown: tasks.relay_destination.run(destination_id)
        ),
    ):
        merchant = relay_merchant(peer.url)
        with transaction.atomic():
            enqueue_webhook(merchant, "order.paid", "warm", {"n": 1})
        assert lanes.finish(timeout=10)

        # when: a fresh pool, whose lane thread starts within the walk
        lanes = RelayLanes()
        monkeypatch.setattr(lanes_module, "lanes", lanes)
        with Walk() as walk:
            with transaction.atomic():
                enqueue_webhook(merchant, "order.paid", "walk", {"n": 2})
            assert lanes.finish(timeout=10)

    # then
    assert DeliveryAttempt.objects.filter(message__key="walk", status_code=200).count() == 1
    print("\n" + walk.told("send"))
    assert within(walk, SEND_BOUND), walk.told("send")
    assert walk.reentered == []
