"""Long unbroken values, as a person sees them in headless Chromium at 1400x1000: a
5,000-character event type, a 4,000-character header, a chart whose largest bucket holds
24,000 requests. Nothing stretches a page past the window or spills out of its box, and
each page is kept as a screenshot (tests/support/browser.py says where).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import no_sideways_scroll, screenshot
from tests.support.http import post
from tests.support.signing import event_body, standard_headers
from webhook_receiver.admin.cells import trace_url
from webhook_receiver.models import RequestAudit, WebhookReceipt

LONG_TYPE = "refund." + "x" * 5000
LONG_HEADER = "h" * 4000
BURST = 24_000


def inside(driver, inner, outer) -> None:
    """``inner`` lies within ``outer``'s box, left to right, and shows all of itself."""
    a, b = (
        driver.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return [r.left, r.right]", e
        )
        for e in (inner, outer)
    )
    assert b[0] - 0.5 <= a[0] and a[1] <= b[1] + 0.5, (a, b)


@pytest.fixture
def long_receipt(client) -> WebhookReceipt:
    """An event of a type no handler takes (ignored: a receipt), of 5,000 characters,
    delivered with a 4,000-character header."""
    body = event_body(LONG_TYPE, order_id="ord_long")
    headers = {**standard_headers(body, msg_id="msg_long"), "X-Long-Value": LONG_HEADER}
    response = post(client, "shop", body, headers)
    assert response.json()["status"] == "ignored", response.content
    return WebhookReceipt.objects.get(event_key="msg_long")


@pytest.mark.django_db(transaction=True)
def test_the_trace_page_of_a_5000_character_event_type_fits_the_window(
    admin_browser, live_server, long_receipt
):
    admin_browser.get(live_server.url + trace_url("shop", long_receipt.event_key))

    no_sideways_scroll(admin_browser, box=None)
    screenshot(admin_browser, "trace-long-event-type")


@pytest.mark.django_db(transaction=True)
def test_a_4000_character_header_stays_in_its_box(admin_browser, live_server, long_receipt):
    from selenium.webdriver.common.by import By

    url = reverse("admin:webhook_receiver_webhookreceipt_change", args=[long_receipt.pk])
    admin_browser.get(live_server.url + url)

    no_sideways_scroll(admin_browser, box=None)
    box = admin_browser.find_element(By.CSS_SELECTOR, ".field-pretty_headers")
    headers = box.find_element(By.TAG_NAME, "pre")
    assert LONG_HEADER[:100] in headers.text
    inside(admin_browser, headers, box)
    event_type = admin_browser.find_element(By.CSS_SELECTOR, ".field-event_type .readonly")
    inside(
        admin_browser, event_type, admin_browser.find_element(By.CSS_SELECTOR, ".field-event_type")
    )
    admin_browser.execute_script("arguments[0].scrollIntoView()", headers)
    screenshot(admin_browser, "receipt-long-header")


@pytest.mark.django_db(transaction=True)
def test_the_charts_scale_shows_a_burst_of_24000_whole(admin_browser, live_server):
    from selenium.webdriver.common.by import By

    # given: 24,000 accepted and 24,000 refused requests in one minute of the last hour
    moment = timezone.now() - timedelta(minutes=30)
    for verification, status in (("verified", 200), ("invalid_signature", 401)):
        RequestAudit.objects.bulk_create(
            [
                RequestAudit(
                    source="shop",
                    received_at=moment,
                    verification=verification,
                    result="applied" if status == 200 else verification,
                    response_status=status,
                    body_sha256="0" * 64,
                )
                for _ in range(BURST)
            ],
            batch_size=2000,
        )

    # when
    admin_browser.get(live_server.url + reverse("admin:webhook_receiver_sourceoverview_changelist"))

    # then: each scale label is drawn inside its chart, none clipped at the edge
    chart = admin_browser.find_element(By.CSS_SELECTOR, "[data-source=shop] svg.wr-chart")
    labels = chart.find_elements(By.CSS_SELECTOR, "text.wr-scale")
    assert len(labels) == 2
    for label in labels:
        inside(admin_browser, label, chart)
    assert [label.text for label in labels] == ["24k ▲", "24k ▼"]
    # and so is every time label, the last one included
    for label in chart.find_elements(By.CSS_SELECTOR, "text.wr-time"):
        inside(admin_browser, label, chart)
    titles = [
        t.get_attribute("textContent")
        for t in chart.find_elements(By.CSS_SELECTOR, "text.wr-scale title")
    ]
    assert titles == [
        f"{BURST} accepted in the busiest 5 min",
        f"{BURST} rejected in the busiest 5 min",
    ]
    no_sideways_scroll(admin_browser, box=None)
    screenshot(admin_browser, "overview-burst")


@pytest.mark.django_db(transaction=True)
def test_a_right_to_left_override_reads_as_stored_in_the_receipts_list(
    admin_browser, live_server, client
):
    from selenium.webdriver.common.by import By

    # given: an event type that the override would show as "refund.issinued.ok"
    spoofed = "refund.\u202edeunissi\u202c.ok"
    body = event_body(spoofed, order_id="ord_rtl")
    assert post(client, "shop", body, standard_headers(body)).json()["status"] == "ignored"

    # when
    admin_browser.get(live_server.url + reverse("admin:webhook_receiver_webhookreceipt_changelist"))

    # then: the cell, and the filter beside the list, show the escapes, not the override
    cell = admin_browser.find_element(By.CSS_SELECTOR, "#result_list td.field-event_type")
    assert cell.text == "refund.\\u202edeunissi\\u202c.ok"
    assert (
        "refund.\\u202edeunissi\\u202c.ok"
        in admin_browser.find_element(By.ID, "changelist-filter").text
    )
    screenshot(admin_browser, "receipts-override-escaped")
