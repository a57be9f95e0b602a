"""The relay's lanes (relay/lanes.py): the relay_destination task hands its destination
to a lane, a thread of the process, and returns at once; a destination that never
answers holds its own lane, and another's is relayed meanwhile. Real threads, real
sockets on loopback, the real database."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from webhook_receiver.outbound.relay.lanes import RelayLanes

from tests.support.outbox import destination
from tests.support.peers import hostile_peer
from tests.support.worker import wait_for
from webhook_receiver import tasks
from webhook_receiver.models import OutboxMessage
from webhook_receiver.outbound.admission import enqueue_webhook
from webhook_receiver.outbound.relay import lanes as lanes_module

pytestmark = pytest.mark.django_db(transaction=True)


def never_answers(request: bytes):
    yield 60.0, b""


def admit(dest, key: str) -> None:
    enqueue_webhook(dest, "order.paid", key, {"type": "order.paid"})


def delivered(key: str) -> bool:
    return OutboxMessage.objects.filter(key=key, status="delivered").exists()


@pytest.mark.postgres_only("two lanes writing at once: SQLite's in-memory test database locks")
def test_the_task_returns_at_once_and_a_hanging_destination_holds_only_its_lane(
    receiver, monkeypatch
):
    # given: this process's lanes, a destination that never answers and a healthy one
    lanes = RelayLanes()
    monkeypatch.setattr(lanes_module, "lanes", lanes)
    with hostile_peer(never_answers) as hole:
        hanging = destination("hanging", hole.url, timeout_seconds=5)
        healthy = destination("healthy", receiver.url)
        admit(hanging, "order:o1:paid:v1")
        admit(healthy, "order:o1:paid:v1")

        # when: the task runs for each, the hanging one first
        began = time.monotonic()
        assert tasks.relay_destination(hanging.pk) is True
        assert tasks.relay_destination(healthy.pk) is True
        handed_off = time.monotonic() - began

        # then: both tasks returned at once, and the healthy one is delivered while the
        # other's request hangs
        assert handed_off < 0.5
        wait_for(lambda: delivered("order:o1:paid:v1"), 5, "the healthy delivery")
        # the hanging lane's thread may reach its peer after the healthy one is done
        # on a loaded machine; what matters is that its request is then still open
        wait_for(lambda: hole.requests, 5, "the hanging request")
        assert lanes.running() == [hanging.pk]
        assert time.monotonic() - began < 2
        # the hanging one's lane ends at its timeout, its answer recorded
        assert lanes.finish(timeout=10)
    message = OutboxMessage.objects.get(destination=hanging)
    assert (message.status, message.failures) == ("pending", 1)
    assert "ReadTimeout" in message.last_error


def test_a_task_while_the_lane_runs_makes_it_run_once_more(receiver):
    # given: a lane whose run is held until the test lets it go
    go = threading.Event()
    started = threading.Event()

    def start(target, name):
        def held():
            started.set()
            go.wait(5)
            target()

        threading.Thread(target=held, daemon=True).start()

    lanes = RelayLanes(start=start)
    healthy = destination("healthy", receiver.url)
    admit(healthy, "order:o1:paid:v1")
    assert lanes.relay(healthy.pk) is True
    started.wait(5)

    # when: the task comes again (a message admitted after the lane's last claim)
    admit(healthy, "order:o2:paid:v1")
    assert lanes.relay(healthy.pk) is False
    assert lanes.relay(healthy.pk) is False  # twice is once more, not twice
    go.set()

    # then: the lane goes once more and both are delivered; then it ends
    assert lanes.finish(timeout=10)
    assert delivered("order:o1:paid:v1") and delivered("order:o2:paid:v1")
    assert lanes.running() == []


def test_past_its_most_a_process_leaves_a_destination_to_the_sweep_with_one_line(caplog):
    # given: lanes of at most one, the one running
    go = threading.Event()
    lanes = RelayLanes(
        start=lambda target, name: threading.Thread(
            target=lambda: (go.wait(5), target()), daemon=True
        ).start(),
        limit=1,
    )
    first, second, third = (destination(f"d{n}") for n in range(3))
    assert lanes.relay(first.pk)

    # when: two more destinations come
    with caplog.at_level(logging.WARNING, logger="webhook_receiver"):
        assert lanes.relay(second.pk) is False
        assert lanes.relay(third.pk) is False

    # then: one line for the stretch, naming the first left out
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert len(lines) == 1 and "waits for the next sweep" in lines[0]
    go.set()
    assert lanes.finish(timeout=10)


def test_a_lane_that_could_not_start_leaves_its_destination_free_for_the_next_task():
    # given: a start that fails once, as a soft time limit firing in the task would
    class TimeLimit(BaseException):
        pass

    started: list[str] = []

    def start(target, name):
        if not started:
            started.append("refused")
            raise TimeLimit
        started.append(name)

    lanes = RelayLanes(start=start, run=lambda destination_id: 0)

    # when
    with pytest.raises(TimeLimit):
        lanes.relay(7)

    # then: not left marked as running: the next task starts its lane
    assert lanes.running() == []
    assert lanes.relay(7) is True
    assert started == ["refused", "relay-lane-7"]
