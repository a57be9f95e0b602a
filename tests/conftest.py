from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.servers.basehttp import ThreadedWSGIServer
from django.db import connection
from django.test.testcases import LiveServerThread, _StaticFilesHandler

# fixtures kept beside the helpers they use: a real local HTTP receiver (the relay's
# tests), a headless browser (the admin pages), the Redis broker (a real Celery worker)
pytest_plugins = ["tests.support.receiver", "tests.support.browser", "tests.support.worker"]


def pytest_collection_modifyitems(config, items):
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" in engine:
        return
    for item in items:
        marker = item.get_closest_marker("postgres_only")
        if marker is not None:
            # each test says what of PostgreSQL it needs: @pytest.mark.postgres_only("why")
            why = marker.args[0] if marker.args else "row-level concurrency"
            item.add_marker(pytest.mark.skip(reason=f"needs PostgreSQL: {why}"))


@pytest.fixture(autouse=True)
def _fresh_duplicate_share() -> Iterator[None]:
    """Each test starts with no history of duplicates (so "adaptive" claims first)."""
    from webhook_receiver.inbound.claim import duplicate_share

    duplicate_share._shares.clear()
    yield
    duplicate_share._shares.clear()


@pytest.fixture(params=["claim_first", "read_first"])
def duplicate_check(request, settings) -> str:
    """Run a test under each order of the first statement (DUPLICATE_CHECK)."""
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "DUPLICATE_CHECK": request.param}
    return request.param


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
