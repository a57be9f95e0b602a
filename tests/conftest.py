from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from django.core.servers.basehttp import ThreadedWSGIServer
from django.db import connection
from django.test.testcases import LiveServerThread, _StaticFilesHandler

# fixtures kept beside the helpers they use: a real local HTTP receiver (the relay's
# tests), a headless browser (the admin pages), the Redis broker (a real Celery worker)
# and relay processes,
# the metrics token (/metrics/ scraped), silence watched and checked (watch, heard, check),
# the trace tests' story (story, shop_effects), repair items found by a run (repair_items)
pytest_plugins = [
    "tests.support.receiver",
    "tests.support.browser",
    "tests.support.worker",
    "tests.support.metrics",
    "tests.support.silence",
    "tests.support.trace",
    "tests.support.repairing",
]

# The suite's merchants listen on loopback: processes it starts on the demo's own settings
# (project.settings) let the relay reach them, as tests/settings.py does in this one.
os.environ.setdefault("WEBHOOK_EGRESS_ALLOWED_NETWORKS", "127.0.0.0/8,::1/128")


# pytest-django's fixtures behind the test database (the django_db marker asks for the first)
_TEST_DATABASE = {"_django_db_helper", "db", "transactional_db", "live_server"}


def uses_the_engine(item: pytest.Item) -> bool:
    """A test whose outcome the database engine can change: it uses the test database, or
    says how else it reaches the engine (@pytest.mark.both_engines("why"))."""
    return bool(
        _TEST_DATABASE & set(getattr(item, "fixturenames", ()))
        or item.get_closest_marker("django_db")
        or item.get_closest_marker("both_engines")
    )


def pytest_collection_modifyitems(config, items):
    """On PostgreSQL, every test. On SQLite (the second pass of ``make test``), the tests
    the engine can change, less those that need PostgreSQL: the others ran on PostgreSQL
    already and would run alike."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" in engine:
        return
    kept: list[pytest.Item] = []
    alike: list[pytest.Item] = []
    for item in items:
        (kept if uses_the_engine(item) else alike).append(item)
    if alike:
        config.hook.pytest_deselected(items=alike)
        items[:] = kept
    for item in items:
        marker = item.get_closest_marker("postgres_only")
        if marker is not None:
            # each test says what of PostgreSQL it needs: @pytest.mark.postgres_only("why")
            why = marker.args[0] if marker.args else "row-level concurrency"
            item.add_marker(pytest.mark.skip(reason=f"needs PostgreSQL: {why}"))


@pytest.fixture(autouse=True)
def _fresh_seam() -> Iterator[None]:
    """Each test runs with a fresh seam (core/seam.py): a jitter generator of its own."""
    from webhook_receiver.core import seam

    with seam.replaced():
        yield


@pytest.fixture(autouse=True)
def _fresh_source_records() -> Iterator[None]:
    """Each test reads the source records afresh: a snapshot of the last test's rows
    (rolled back since) must not answer for this one's."""
    from webhook_receiver.sources.lookup import records

    records.clear()
    yield
    records.clear()


@pytest.fixture
def is_postgres() -> bool:
    return connection.vendor == "postgresql"


class _WideBacklogServer(ThreadedWSGIServer):
    # socketserver's default backlog of 5 resets most of 32 simultaneous connects
    request_queue_size = 128


class _WideBacklogServerThread(LiveServerThread):
    server_class = _WideBacklogServer


@pytest.fixture
def threaded_server(transactional_db) -> Iterator[str]:
    """A real threaded HTTP server on loopback: one thread and one database connection
    per request, so concurrent requests race for real in PostgreSQL."""
    thread = _WideBacklogServerThread("127.0.0.1", _StaticFilesHandler)
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    yield f"http://127.0.0.1:{thread.port}"
    thread.terminate()


@pytest.fixture
def crash_handler(settings):
    """``test.crash`` fails while ``handlers.failures_left`` lasts; one attempt, then dead."""
    from tests.support import handlers
    from tests.support.failing import CRASH

    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "HANDLERS": {CRASH: "tests.support.handlers.fails_after_writing"},
        "RETRY_MAX_ATTEMPTS": 1,
    }
    handlers.failures_left["count"] = 0
    yield
    handlers.failures_left["count"] = 0


# --- staff users ---------------------------------------------------------------------------


class StaffUsers:
    """Staff users with exactly the permissions of the app they are given, by codename."""

    def __call__(self, *codenames: str, username: str = "operator"):
        from django.contrib.auth.models import User

        user = User.objects.create_user(username=username, password="pw", is_staff=True)
        self.grant(user, *codenames)
        return user

    def grant(self, user, *codenames: str) -> None:
        """Give ``user`` these permissions of the app too. A codename the app does not
        define fails here, rather than leave a test checking a user it did not mean."""
        from django.contrib.auth.models import Permission

        found = list(
            Permission.objects.filter(
                content_type__app_label="webhook_receiver", codename__in=codenames
            )
        )
        missing = set(codenames) - {permission.codename for permission in found}
        assert not missing, f"webhook_receiver defines no permission {sorted(missing)}"
        user.user_permissions.add(*found)


@pytest.fixture
def staff_user() -> StaffUsers:
    """``staff_user(*codenames, username="operator")``: a staff user (not a superuser)
    with exactly these permissions of the app; with none, one who may see nothing.
    Logging in is the caller's (``client.force_login``); ``staff_user.grant(user, …)``
    adds permissions later."""
    return StaffUsers()


# --- the four-failure set -------------------------------------------------------------------


@pytest.fixture
def failures(client, crash_handler, settings) -> dict:
    """Four failed events, each made the way production makes one (a signed delivery to
    the real endpoint whose processing fails), by name:

    - crash: ``test.crash`` on shop, its handler raised once: dead (one attempt allowed),
      and a replay now applies it (the handler works again: the fix is deployed);
    - schema: a reservation of quantity 0 on shop: dead at once (permanent), its last
      attempt moved back to 2020-01-01 12:00 UTC;
    - stripe: a Stripe event whose reservation has no lines: dead at once (permanent);
    - retrying: ``test.crash`` on shop, five attempts allowed: retrying.
    """
    import json
    from datetime import UTC, datetime

    from django.test import override_settings

    from tests.support import handlers
    from tests.support.failing import fail_crash, fail_schema
    from tests.support.http import post
    from tests.support.signing import stripe_headers
    from webhook_receiver.models import FailedEvent

    crash = fail_crash(client, "msg_crash")
    schema = fail_schema(client, "msg_schema")
    stripe_body = json.dumps(
        {
            "id": "evt_stripe_bad",
            "type": "inventory.reserved",
            "data": {"order_id": "ord_S", "version": 1, "lines": []},
        }
    ).encode()
    assert post(client, "stripe", stripe_body, stripe_headers(stripe_body)).status_code == 202
    stripe = FailedEvent.objects.get(source="stripe", event_key="evt_stripe_bad")
    with override_settings(WEBHOOK_RECEIVER={**settings.WEBHOOK_RECEIVER, "RETRY_MAX_ATTEMPTS": 5}):
        retrying = fail_crash(client, "msg_retrying", order_id="ord_2")
    long_ago = datetime(2020, 1, 1, 12, 0, tzinfo=UTC)
    FailedEvent.objects.filter(pk=schema.pk).update(last_attempt_at=long_ago)
    handlers.failures_left["count"] = 0  # the fix is deployed: the crash handler works now

    rows = {"crash": crash, "schema": schema, "stripe": stripe, "retrying": retrying}
    for row in rows.values():
        row.refresh_from_db()
    return rows
