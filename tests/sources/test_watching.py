"""The watch covers record sources as it covers the settings': silence with the
record's own window and active hours, and the status page's rows."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.sources.conftest import ACME_SECRET
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.sources.operations import source_add, source_set_enabled
from webhook_receiver.watch.silence import OPENED, OUTSIDE_HOURS, RECEIVING, check_silence
from webhook_receiver.watch.sources import source_statuses

pytestmark = pytest.mark.django_db


def by_source(checks) -> dict[str, str]:
    return {check.source: check.state for check in checks}


def test_a_record_source_is_watched_for_silence_with_its_own_window(client):
    source_add(slug="acme", scheme="standard", secrets=[ACME_SECRET], silence_after_seconds=60)
    body = reserved("ord_1", ("SKU-A", 1))
    assert post(client, "acme", body, standard_headers(body, secret=ACME_SECRET)).status_code == 200
    now = timezone.now()

    assert by_source(check_silence(now=now + timedelta(seconds=30)))["acme"] == RECEIVING
    assert by_source(check_silence(now=now + timedelta(seconds=90)))["acme"] == OPENED


def test_a_record_source_outside_its_active_hours_opens_no_alert(client):
    source_add(
        slug="acme",
        scheme="standard",
        secrets=[ACME_SECRET],
        silence_after_seconds=60,
        active_days="mon-sun",
        active_start=(timezone.now() + timedelta(hours=3)).time().replace(microsecond=0),
        active_end=(timezone.now() + timedelta(hours=4)).time().replace(microsecond=0),
    )
    body = reserved("ord_1", ("SKU-A", 1))
    post(client, "acme", body, standard_headers(body, secret=ACME_SECRET))

    states = by_source(check_silence(now=timezone.now() + timedelta(seconds=90)))

    assert states["acme"] == OUTSIDE_HOURS


def test_the_status_lists_enabled_records_after_the_settings_sources(db):
    source_add(slug="acme", scheme="standard", secrets=[ACME_SECRET])
    source_add(slug="beta", scheme="standard", secrets=[ACME_SECRET])
    source_set_enabled("beta", False)

    slugs = [status.source for status in source_statuses()]

    assert "acme" in slugs and "beta" not in slugs
    assert slugs.index("acme") > slugs.index("shop")


def test_active_days_alone_mean_whole_days(db):
    from webhook_receiver.sources.lookup import source_lookup

    source_add(slug="acme", scheme="standard", secrets=[ACME_SECRET], active_days="mon-sun")

    hours = source_lookup("acme").active_hours

    assert hours is not None and hours.contains(timezone.now())
