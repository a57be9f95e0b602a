"""Silence alerts in the admin: the list by state and source, read-only, and the list
and an alert's page in headless Chromium. The alerts are opened and resolved by the real
check over real deliveries (tests/support/silence.py)."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import screenshot
from tests.support.silence import MINUTE, send_event, send_forged, send_stale
from webhook_receiver.models import SilenceAlert, WebhookReceipt

pytestmark = pytest.mark.django_db


def _accepted(client, order: str, at: datetime) -> None:
    """An event accepted, its receipt dated ``at`` (the past, for a coherent history)."""
    send_event(client, order=order)
    WebhookReceipt.objects.filter(subject=order).update(received_at=at)


def _incidents(client, check) -> None:
    """shop: an incident three hours ago, resolved, and one open for two hours; small:
    refused from its first request."""
    now = timezone.now()
    _accepted(client, "ord_1", now - 180 * MINUTE)
    check(now - 155 * MINUTE)
    _accepted(client, "ord_2", now - 130 * MINUTE)
    check(now - 129 * MINUTE)
    check(now - 105 * MINUTE)
    send_forged(client, source="small", count=4)
    send_stale(client, source="small")
    check()


def test_the_admin_lists_alerts_by_state_and_source(client, admin_client, watch, check):
    # given
    _incidents(client, check)
    changelist = reverse("admin:webhook_receiver_silencealert_changelist")

    # when
    everything = admin_client.get(changelist).content.decode()
    still_open = admin_client.get(changelist, {"state": "open"}).content.decode()
    small = admin_client.get(changelist, {"source": "small"}).content.decode()

    # then
    assert everything.count('class="field-source"') == 3
    assert still_open.count('class="field-source"') == 2
    assert "never accepted an event" in small
    assert "<strong>5</strong>" in small
    assert "invalid_signature: 4</span>" in small
    assert "timestamp_out_of_tolerance: 1</span>" in small
    # and it is read-only
    alert = SilenceAlert.objects.filter(source="small").get()
    detail = admin_client.get(
        reverse("admin:webhook_receiver_silencealert_change", args=[alert.pk])
    )
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content
    assert admin_client.get(reverse("admin:webhook_receiver_silencealert_add")).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_the_alert_list_in_a_browser(client, watch, live_server, admin_browser, check):  # noqa: F811
    # given
    _incidents(client, check)

    # when
    admin_browser.get(live_server.url + reverse("admin:webhook_receiver_silencealert_changelist"))

    # then
    page = admin_browser.page_source
    assert "never accepted an event" in page
    assert "50 min" in page and "2 h 10 min so far" in page
    screenshot(admin_browser, "silence_alerts")

    # and one alert's page, with the way to its requests
    alert = SilenceAlert.objects.get(source="small")
    change = reverse("admin:webhook_receiver_silencealert_change", args=[alert.pk])
    admin_browser.get(live_server.url + change)
    assert "/admin/webhook_receiver/requestaudit/?source=small" in admin_browser.page_source
    screenshot(admin_browser, "silence_alert")
