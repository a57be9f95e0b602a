"""The two walks a newcomer reads (docs/testing.md): every function of the app entered,
in order, from ``WebhookView.post`` to the commit of a new event, and from
``enqueue_webhook`` to the attempt a running relay records (its poll, its round, the
request, the round that records the answer). Recorded by a profiler, not by hand;
``pytest tests/test_walks.py -s`` prints them. Each walk may not grow: a change that
makes it longer raises the bound it passes, and says why, in the same commit. And
neither walk enters a module again from below it (A calls B, which calls back into A),
except through a callback A handed down: a closure or lambda of A's own, such as the
statement ``core/outages.py`` runs for ``admission.py``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType

import pytest
from django.db import transaction

from tests.support.http import post
from tests.support.outbox import relay_merchant
from tests.support.peers import answer, hostile_peer
from tests.support.signing import reserved, standard_headers
from tests.support.worker import Background, relay_in_background, wait_for
from webhook_receiver.core import tracing
from webhook_receiver.models import DeliveryAttempt
from webhook_receiver.outbound.admission import enqueue_webhook

PACKAGE = Path(__file__).resolve().parents[1] / "webhook_receiver"

# (files, functions) at most; comprehensions and lambdas are not counted as functions
# 17 files before the fingerprint was keyed by the server (core/fingerprints.py, whose
# cached HMAC sits behind a function that reads SECRET_KEY); 18 and 68 before the claim
# became the one path (no storm detector, no read first)
RECEIVE_BOUND = (17, 62)
# the relay as one loop: 89 functions (98 through Celery's task and a lane), in 26 files
# (the relay's rooms: its loop, lanes, rows, round and its write, session, wake-ups); 86
# before answers waited for their bucket's claim (the check) and the database's trouble
# was told from reporting.py (a round that works ends a stretch), 88 before lanes waiting
# for the process's room were let in by what ended (_let_waiting_in), 89 before an IP
# literal was read in every form a proxy would resolve (egress._literal_host), 90 in 26
# before the event catalog checked each admission (outbound/catalog.py: the check, its
# setting, the reason, the counter), 94 in 27 before the destination's filter was read
# there (outbound/filters.py), 95 before the filtered fields were cut by one function that
# recovery jobs share (admission.as_filtered), 96 in 28 before a rotation's outgoing
# secrets signed until their overlap ends (WebhookDestination.signing_with, models.py);
# 97 before the breaker was decided in breaker.py alone (breaker_after, for limits.py's
# _unchanged) and a round that retires nothing left retirement.py alone
SEND_BOUND = (29, 96)
# a reader's steps, (files, functions) at most: only the functions that call further into
# the app (a leaf is one idea in its home: the signature's check, the guard, a bound)
RECEIVE_STEPS_BOUND = (12, 28)
SEND_STEPS_BOUND = (18, 47)


def _app_module(frame: FrameType) -> str | None:
    """The app's module a frame runs in (its path under webhook_receiver/), or None."""
    path = frame.f_code.co_filename
    return str(Path(path).relative_to(PACKAGE)) if path.startswith(f"{PACKAGE}/") else None


def _app_caller(frame: FrameType | None) -> tuple[str, str] | None:
    """The app's function a call came from: the nearest app frame below it, a
    comprehension's or a lambda's counted as the function it is written in."""
    while frame is not None:
        module = _app_module(frame)
        if module is not None:
            parts = frame.f_code.co_qualname.split(".")
            while parts and (parts[-1].startswith("<")):
                parts.pop()  # "<listcomp>", "<lambda>", then its "<locals>"
            return (module, ".".join(parts)) if parts else None
        frame = frame.f_back
    return None


class Walk:
    """The app's functions entered while the block runs, in every thread, in order."""

    def __init__(self) -> None:
        self.entered: list[tuple[str, str]] = []
        # a module entered again from below it: (the call, the modules it came through)
        self.reentered: list[tuple[str, str]] = []
        self._seen: set[tuple[str, str]] = set()
        # the functions that called further into the app: a reader's steps (the leaves,
        # each one idea in its home, left out)
        self.callers: set[tuple[str, str]] = set()
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
        caller = _app_caller(frame.f_back)
        with self._lock:
            if place not in self._seen:
                self._seen.add(place)
                self.entered.append(place)
            if caller is not None and caller != place:
                self.callers.add(caller)
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

    def follow(self, relay: Background) -> None:
        """Record in a relay's threads too (started before the walk)."""
        relay.in_its_threads(lambda: sys.setprofile(self._profile))

    def unfollow(self, relay: Background) -> None:
        relay.in_its_threads(lambda: sys.setprofile(None))

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(path for path, _ in self.entered))

    @property
    def steps(self) -> list[tuple[str, str]]:
        """The functions entered that called further into the app, in order."""
        return [place for place in self.entered if place in self.callers]

    def told(self, title: str) -> str:
        step_files = len(dict.fromkeys(path for path, _ in self.steps))
        lines = [
            f"{title}: {len(self.files)} files, {len(self.entered)} functions; "
            f"a reader's steps (those that call further in): {step_files} files, "
            f"{len(self.steps)} functions"
        ]
        lines += [f"  {path}: {name}" for path, name in self.entered]
        return "\n".join(lines)


@pytest.fixture(autouse=True)
def untraced(monkeypatch):
    """As a host without a tracer provider runs it: another test of this process may
    have set one, which OpenTelemetry keeps for the process's life."""
    if tracing.trace is not None:
        monkeypatch.setattr(tracing.trace, "_TRACER_PROVIDER", None)


def within(walk: Walk, bound: tuple[int, int], steps: tuple[int, int]) -> bool:
    step_files = len(dict.fromkeys(path for path, _ in walk.steps))
    return (
        len(walk.files) <= bound[0]
        and len(walk.entered) <= bound[1]
        and step_files <= steps[0]
        and len(walk.steps) <= steps[1]
    )


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
    assert within(walk, RECEIVE_BOUND, RECEIVE_STEPS_BOUND), walk.told("receive")
    assert walk.reentered == []


@pytest.mark.postgres_only("the relay's database thread writes while the test's reads")
@pytest.mark.django_db(transaction=True)
def test_the_send_walk_does_not_grow():
    # given: a merchant that answers 200, and a relay running in this process (its poll
    # finds what is admitted), warmed by a first message
    attempts = DeliveryAttempt.objects.filter(status_code=200)
    with (
        hostile_peer(lambda request: [(0, answer(200, {}, b"ok"))]) as peer,
        relay_in_background(poll_seconds=0.1) as relay,
    ):
        merchant = relay_merchant(peer.url)
        with transaction.atomic():
            enqueue_webhook(merchant, "order.paid", "warm", {"n": 1})
        wait_for(lambda: attempts.filter(message__key="warm").exists(), 10, "the warm one")

        # when
        with Walk() as walk:
            walk.follow(relay)
            with transaction.atomic():
                enqueue_webhook(merchant, "order.paid", "walk", {"n": 2})
            wait_for(lambda: attempts.filter(message__key="walk").exists(), 10, "the walk")
            walk.unfollow(relay)

    # then
    assert attempts.filter(message__key="walk").count() == 1
    print("\n" + walk.told("send"))
    assert within(walk, SEND_BOUND, SEND_STEPS_BOUND), walk.told("send")
    assert walk.reentered == []
