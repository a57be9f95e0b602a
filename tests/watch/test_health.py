"""GET /health/: the database, Celery's broker, beat's heartbeat and a relay's, each real.

The healthy answer and the beat cases run in process, on the test database and the real
Redis broker of tests/settings.py. An unreachable database or broker is a real process
(gunicorn) started with a URL to a closed port, asked over HTTP.
"""

from __future__ import annotations

import http.client
import json
import os
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.utils import timezone
from health_check.base import HealthCheck, HealthCheckResult

from tests.bench.server import GunicornServer, free_port
from tests.support.commands import manage
from webhook_receiver.models import WebhookDestination
from webhook_receiver.watch.health import BeatHeartbeat, Broker
from webhook_receiver.watch.heartbeat import heartbeat_interval, record_heartbeat
from webhook_receiver.watch.relays import record_relay_heartbeat

DATABASE = "Database(alias='default')"
BROKER = "Broker(transport='redis')"
BEAT = "BeatHeartbeat(name='beat')"
RELAY = "RelayHeartbeat()"
TABLES = "Tables()"
ALL_OK = {DATABASE: "OK", BROKER: "OK", BEAT: "OK", RELAY: "OK", TABLES: "OK"}


def health_json(client, **extra) -> tuple[int, dict[str, str]]:
    response = client.get("/health/", HTTP_ACCEPT="application/json", **extra)
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()


def served_health(server: GunicornServer) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=20)
    try:
        conn.request("GET", "/health/?format=json")
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def run_check(check: HealthCheck) -> HealthCheckResult:
    """Run one check as the view does under WSGI: from this thread, through async_to_sync,
    so that its database reads use this thread's connection (and the test's transaction)."""
    return async_to_sync(check.get_result)()


def closed_port_url(scheme: str, path: str) -> str:
    """A URL to a port that nothing listens on (one just freed by free_port)."""
    return f"{scheme}://127.0.0.1:{free_port()}/{path}"


def served_env(**overrides: str) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", **overrides}
    env.pop("GUNICORN_CMD_ARGS", None)
    return env


# --- in process: healthy, and beat not seen --------------------------------------------


@pytest.mark.django_db
def test_healthy_with_a_fresh_heartbeat_answers_200_as_json(client):
    # given: beat ran just now; the database and Redis are up
    record_heartbeat()

    # when
    status, body = health_json(client)

    # then: one entry per check, each "OK"
    assert status == 200
    assert body == ALL_OK


@pytest.mark.django_db
def test_format_json_and_the_default_html_answer_the_same_status(client):
    # given
    record_heartbeat()

    # when
    as_json = client.get("/health/?format=json")
    as_html = client.get("/health/", HTTP_ACCEPT="*/*")  # what most probes send

    # then: no login, no session needed; never cached
    assert as_json.status_code == 200
    assert as_json.json() == ALL_OK
    assert as_html.status_code == 200
    assert as_html["Content-Type"].startswith("text/html")
    assert "no-cache" in as_html["Cache-Control"]
    assert b"BeatHeartbeat" in as_html.content


@pytest.mark.django_db
def test_only_get_and_head_are_allowed(client):
    record_heartbeat()

    assert client.head("/health/").status_code == 200
    # a POST without a CSRF token is refused as a method, not by the CSRF middleware
    assert client.post("/health/").status_code == 405


@pytest.mark.django_db
def test_beat_never_seen_answers_503(client):
    # given: no heartbeat at all (a fresh install, or beat never started)

    # when
    status, body = health_json(client)

    # then: the database and broker are fine; beat is what is wrong
    assert status == 503
    assert body[DATABASE] == "OK"
    assert body[BROKER] == "OK"
    assert body[BEAT].startswith("Unavailable: beat never seen")


@pytest.mark.django_db
def test_no_relay_running_answers_503_while_there_is_a_destination(client):
    # given: beat runs, and nothing is to be sent: no relay is needed
    record_heartbeat()
    assert health_json(client) == (200, ALL_OK)

    # when: a destination is added, and no relay has ever run
    WebhookDestination.objects.create(name="merchant", url="http://127.0.0.1:9/")
    status, body = health_json(client)

    # then: the relay is what is wrong
    assert status == 503
    assert body[RELAY].startswith("Unavailable: no relay running: none ever seen")
    assert {name for name, said in body.items() if said != "OK"} == {RELAY}

    # a relay seen 20 s ago runs; one last seen 31 s ago does not
    record_relay_heartbeat("relay host 7", now=timezone.now() - timedelta(seconds=20))
    assert health_json(client) == (200, ALL_OK)
    record_relay_heartbeat("relay host 7", now=timezone.now() - timedelta(seconds=31))
    status, body = health_json(client)
    assert status == 503 and "the last one seen 31 s ago (at most 30 s)" in body[RELAY]


@pytest.mark.django_db
def test_beat_unseen_for_two_of_its_intervals_answers_503(client, settings):
    # given: the demo's schedule sends the heartbeat every 20 s; the last one is 41 s old
    assert heartbeat_interval() == timedelta(seconds=20)
    record_heartbeat(now=timezone.now() - timedelta(seconds=41))

    # when
    status, body = health_json(client)

    # then: the same rule as webhook_status's, two intervals
    assert status == 503
    assert body[BEAT].startswith("Unavailable: beat last seen 41 s ago")
    assert "at most 40 s" in body[BEAT]

    # and HEARTBEAT_MAX_AGE_SECONDS caps it: a host may ask for less, never more
    record_heartbeat(now=timezone.now() - timedelta(seconds=35))
    assert health_json(client) == (200, ALL_OK)
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "HEARTBEAT_MAX_AGE_SECONDS": 30}
    status, body = health_json(client)
    assert status == 503 and "at most 30 s" in body[BEAT]


@pytest.mark.django_db
def test_a_heartbeat_just_inside_two_intervals_is_healthy(client):
    record_heartbeat(now=timezone.now() - timedelta(seconds=37))

    assert health_json(client) == (200, ALL_OK)


@pytest.mark.django_db
def test_the_beat_check_with_its_own_name_and_max_age():
    # given: a host composing its own checks, for another periodic process
    record_heartbeat("nightly", now=timezone.now() - timedelta(hours=2))

    # when
    fresh_enough = run_check(BeatHeartbeat("nightly", max_age=timedelta(days=1)))
    too_old = run_check(BeatHeartbeat("nightly", max_age=timedelta(hours=1)))

    # then
    assert fresh_enough.error is None
    assert "nightly last seen 7200 s ago" in str(too_old.error)


# --- the broker check, on each transport ----------------------------------------------


def test_the_broker_check_fails_for_a_closed_redis_port():
    # given: nothing listens there
    check = Broker(url=closed_port_url("redis", "0"))

    # when
    result = run_check(check)

    # then: unavailable, quickly, and the URL is not in the report
    assert str(result.error) == "Unavailable: cannot connect to the redis broker (OperationalError)"
    assert result.time_taken < 5
    assert repr(check) == "Broker(transport='redis')"


def test_the_broker_check_passes_for_the_configured_redis():
    assert run_check(Broker()).error is None


def test_the_broker_check_on_the_embedded_filesystem_broker(tmp_path):
    # given: the demo's default broker, with its folders as project/settings.py makes them
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    present = Broker(url="filesystem://", transport_options=options)
    missing = Broker(
        url="filesystem://",
        transport_options={**options, "data_folder_out": str(tmp_path / "gone")},
    )

    # when
    ok = run_check(present)
    gone = run_check(missing)

    # then
    assert repr(present) == "Broker(transport='filesystem')"
    assert ok.error is None
    assert str(gone.error) == (
        "Unavailable: filesystem broker: data_folder_out is missing or not writable"
    )


def test_the_demo_default_checks_its_filesystem_broker(tmp_path):
    """The demo's settings with no environment: SQLite and the filesystem broker, through
    the library's own command (which runs the /health/ view's checks)."""
    # given: an embedded default in a fresh folder, migrated as `make run` does; beat
    # never run (checking a database that was never migrated races the checks' first
    # connections for SQLite's switch to WAL: not a state `make run` leaves)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DEMO_VAR_DIR": str(tmp_path),
        "SHOP_WEBHOOK_SECRETS": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    }
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)

    assert manage("migrate", "--noinput", env=env, timeout=120).returncode == 0

    # when
    run = manage("health_check", "health", "--no-http", env=env, timeout=120)

    # then: the database and the broker are fine; beat was never seen: exit 1
    lines = run.stdout.splitlines()
    assert "Broker(transport='filesystem'): OK" in lines, run.stdout + run.stderr
    assert f"{DATABASE}: OK" in lines
    assert any(line.startswith(f"{BEAT}: Unavailable: beat never seen") for line in lines), lines
    assert run.returncode == 1


# --- a real process whose database or broker is down ----------------------------------


def test_an_unreachable_database_answers_503(tmp_path):
    # given: the app served with its database on a closed port
    env = served_env(DATABASE_URL=closed_port_url("postgres", "webhook_receiver"))

    # when
    with GunicornServer(env, tmp_path / "gunicorn.log") as server:
        status, body = served_health(server)

    # then: the database check and the heartbeat (read from it) fail; the broker is fine
    assert status == 503
    assert body[DATABASE] == "Unavailable: connection failed"
    assert body[BEAT] == "Unavailable: cannot read the heartbeat: database error"
    assert body[BROKER] == "OK"
    if "postgres" in env["DATABASE_URL"]:
        assert body[TABLES] == "Unavailable: cannot read the tables' locks: database error"


@pytest.mark.postgres_only("the served instance reads the heartbeat from the test database")
@pytest.mark.django_db(transaction=True)
def test_an_unreachable_broker_answers_503(tmp_path):
    # given: a fresh heartbeat, committed; the app served with its broker on a closed port
    record_heartbeat()
    db = connection.settings_dict
    env = served_env(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
        CELERY_BROKER_URL=closed_port_url("redis", "0"),
    )

    # when
    with GunicornServer(env, tmp_path / "gunicorn.log") as server:
        status, body = served_health(server)

    # then: only the broker is down, and that alone takes the app out of rotation
    assert status == 503
    assert body == {
        DATABASE: "OK",
        BEAT: "OK",
        RELAY: "OK",
        TABLES: "OK",
        BROKER: "Unavailable: cannot connect to the redis broker (OperationalError)",
    }
