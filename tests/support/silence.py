"""Silence alerts in tests: a sender's deliveries (accepted, forged, stale), the
configuration that watches shop, every silence signal heard, and the check run at any
moment with its notices sent as a commit sends them."""

from __future__ import annotations

import base64
import time
from datetime import datetime, timedelta

import pytest

from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.models import SilenceAlert
from webhook_receiver.signals import silence_alert_opened, silence_alert_resolved
from webhook_receiver.watch.silence import check_silence
from webhook_receiver.watch.traffic import last_accepted_at

MINUTE = timedelta(minutes=1)
WRONG_SECRET = "whsec_" + base64.b64encode(b"a secret the shop never had").decode()


def send_event(client, source: str = "shop", order: str = "ord_1") -> datetime:
    """A signed event, accepted; returns the source's last accepted moment."""
    body = reserved(order, ("SKU-1", 1))
    assert post(client, source, body, standard_headers(body)).status_code == 200
    return last_accepted_at(source)


def send_forged(client, source: str = "shop", count: int = 1) -> None:
    """Requests signed with a secret we do not hold (a rotation on the sender's side)."""
    for i in range(count):
        body = reserved(f"ord_forged_{i}", ("SKU-1", 1))
        headers = standard_headers(body, secret=WRONG_SECRET)
        assert post(client, source, body, headers).status_code == 401


def send_stale(client, source: str = "shop", count: int = 1) -> None:
    """Correctly signed, an hour ago: outside the tolerance (a clock off)."""
    for i in range(count):
        body = reserved(f"ord_stale_{i}", ("SKU-1", 1))
        headers = standard_headers(body, timestamp=int(time.time()) - 3600)
        assert post(client, source, body, headers).status_code == 401


@pytest.fixture
def watch(settings):
    """The test sources with shop watched (20 minutes), every built-in notifier on, and
    an admin to mail. Call it again to change shop's options or the notifiers."""

    def configure(notifiers=("log", "mail_admins", "signal"), **shop) -> None:
        sources = dict(settings.WEBHOOK_RECEIVER["SOURCES"])
        sources["shop"] = {**sources["shop"], "SILENCE_AFTER_SECONDS": 1200, **shop}
        settings.WEBHOOK_RECEIVER = {
            **settings.WEBHOOK_RECEIVER,
            "SOURCES": sources,
            "NOTIFIERS": list(notifiers),
        }

    settings.ADMINS = [("Ops", "ops@example.com")]
    configure()
    return configure


@pytest.fixture
def heard():
    """Every silence signal sent, as (signal, source, alert id)."""
    events: list[tuple[str, str, int]] = []

    def opened(sender, alert, **kwargs):
        assert sender is SilenceAlert
        events.append(("opened", alert.source, alert.pk))

    def resolved(sender, alert, **kwargs):
        assert sender is SilenceAlert
        events.append(("resolved", alert.source, alert.pk))

    silence_alert_opened.connect(opened, dispatch_uid="test_silence_opened")
    silence_alert_resolved.connect(resolved, dispatch_uid="test_silence_resolved")
    yield events
    silence_alert_opened.disconnect(dispatch_uid="test_silence_opened")
    silence_alert_resolved.disconnect(dispatch_uid="test_silence_resolved")


@pytest.fixture
def check(django_capture_on_commit_callbacks):
    """check_silence at a moment, its notices sent as a commit sends them; the results
    by source."""

    def run(at: datetime | None = None):
        with django_capture_on_commit_callbacks(execute=True):
            results = check_silence(now=at)
        return {result.source: result for result in results}

    return run
