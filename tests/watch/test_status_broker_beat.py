"""Nothing is OK while Celery's broker does not answer, or while beat's heartbeat is
older than two of its intervals: ``webhook_status`` (text, JSON, exit code), the
overview and ``/health/`` say so, and name it. The broker is a private Redis of the
test's own, stopped and started; the heartbeat a row aged."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from celery.app import app_or_default
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from tests.support.private_servers import PrivateRedis, private_redis  # noqa: F401 (fixture)
from webhook_receiver.watch.heartbeat import record_heartbeat

pytestmark = pytest.mark.django_db

BROKER_DOWN = "broker unreachable: cannot connect to the redis broker (OperationalError)"


def status(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("webhook_status", *args, stdout=out, stderr=io.StringIO(), no_color=True)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue()
    return 0, out.getvalue()


@pytest.fixture
def broker(private_redis: PrivateRedis, monkeypatch) -> PrivateRedis:  # noqa: F811
    """Celery's broker is the private Redis (for this test). Celery reads the
    environment's CELERY_BROKER_URL before its configuration: both are set."""
    # the configuration first: its old value is read (and put back) before the
    # environment, which Celery reads first, names the private Redis
    monkeypatch.setattr(app_or_default().conf, "broker_url", private_redis.url)
    monkeypatch.setenv("CELERY_BROKER_URL", private_redis.url)
    return private_redis


def test_a_stopped_broker_is_named_in_the_verdict_and_exits_2(broker, admin_client):
    # given: beat seen just now, all well, and then the broker stopped
    record_heartbeat()
    assert status()[0] == 0
    broker.stop()

    # when
    code, out = status()
    json_code, document = status("--json")

    # then: an alert, named at the verdict's head, in the text and the JSON
    assert code == 2 == json_code
    assert out.splitlines()[1] == f"ALERT: {BROKER_DOWN}"
    document = json.loads(document)
    assert (document["state"], document["exit_code"]) == ("alert", 2)
    assert document["verdict"] == BROKER_DOWN
    assert document["broker"] == {
        "reachable": False,
        "error": "cannot connect to the redis broker (OperationalError)",
    }
    assert [r["code"] for r in document["reasons"]] == ["broker_unreachable"]
    # and the overview says the same
    page = admin_client.get(reverse("admin:webhook_receiver_sourceoverview_changelist"))
    assert BROKER_DOWN in page.content.decode()

    # when: the broker is back
    broker.start()

    # then: OK again at once
    code, out = status()
    assert code == 0
    assert out.splitlines()[1] == "OK: All 5 sources OK"


@pytest.mark.parametrize(
    "age, code, verdict",
    [
        (timedelta(seconds=30), 0, "OK: All 5 sources OK"),  # between two beats: fine
        (timedelta(minutes=2), 2, "ALERT: beat not seen for 2 min"),
    ],
)
def test_a_heartbeat_older_than_two_intervals_is_an_alert(age, code, verdict):
    # given: beat's last heartbeat, aged (the schedule sends one every 20 s)
    record_heartbeat(now=timezone.now() - age)

    # when
    got, out = status()

    # then
    assert got == code
    assert out.splitlines()[1] == verdict


def test_beat_never_seen_is_an_alert_with_its_reason():
    code, out = status("--json")
    document = json.loads(out)
    assert code == 2
    assert document["verdict"] == "beat never seen"
    assert document["beat"] == {
        "seen_at": None,
        "age_seconds": None,
        "stale_after_seconds": 40.0,
        "interval_seconds": 20.0,
    }
    (reason,) = document["reasons"]
    assert reason["code"] == "beat_not_seen"
    assert "stale after 40 s, sent every 20 s" in reason["text"]


def test_health_after_a_broker_outage_says_it_waits_for_beats_next_heartbeat(broker, client):
    # given: the broker stopped; beat's last heartbeat from before the outage
    record_heartbeat(now=timezone.now() - timedelta(seconds=183))
    broker.stop()
    body = client.get("/health/?format=json").json()
    assert body["Broker(transport='redis')"] == (
        "Unavailable: cannot connect to the redis broker (OperationalError)"
    )

    # when: the broker is back, beat's next heartbeat not yet run
    broker.start()
    response = client.get("/health/?format=json")

    # then: 503 still, on the heartbeat alone, saying what it waits for and how long
    body = response.json()
    assert response.status_code == 503
    assert body["Broker(transport='redis')"] == "OK"
    beat = body["BeatHeartbeat(name='beat')"]
    assert beat.startswith("Unavailable: beat last seen 183 s ago")
    assert beat.endswith(
        "waiting for beat's next heartbeat, sent every 20 s: after a broker outage it "
        "comes within 20 s of the broker's return, once beat and a worker reach it again"
    )

    # when: beat's next heartbeat runs
    record_heartbeat()

    # then: healthy at once
    assert client.get("/health/?format=json").status_code == 200
