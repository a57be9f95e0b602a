"""The portal's pages as a merchant sees them: headless Chromium (tests/support/browser.py)
against a live server, entering through a real link (its token in the fragment, posted
by the entry page's script), one screenshot per page, kept in SCREENSHOT_DIR for a
person to open. Each page fits its window (no sideways scrolling), at 1400 px and, for
the pages with tables, at 400 px (a phone, a narrow iframe)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import click_through, no_sideways_scroll, screenshot
from tests.support.outbox import destination, failed, message
from webhook_receiver.models import DeliveryAttempt, MessageStatus, OutboxMessage, RecoveryJob
from webhook_receiver.portal.access import portal_link
from webhook_receiver.portal.models import Capability

# the longest a page is shot (taller ones are cut there)
TALLEST = 4000
ANSWER = '{"error": "upstream timeout", "detail": "the order service did not answer in 5 s"}'


def url(name: str, *args) -> str:
    return reverse(f"webhook_portal:{name}", args=args)


def enter(browser, live_server, capabilities) -> None:
    """Open a link as a merchant does: the entry page posts its token, the session's
    cookie is set, and the browser lands on the endpoints."""
    from selenium.webdriver.support.ui import WebDriverWait

    link = portal_link("acme", capabilities, base_url=live_server.url + url("enter"))
    browser.delete_all_cookies()
    browser.get(link.url)
    WebDriverWait(browser, 15).until(lambda d: d.current_url.endswith(url("endpoints")))


def shot(browser, name: str, *, width: int = 1400) -> None:
    """The whole page (to TALLEST px) at ``width``, fitting it, saved as ``portal-NAME``."""
    browser.set_window_size(width, 1000)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(width, min(max(height + 140, 600), TALLEST))
    no_sideways_scroll(browser, None)
    screenshot(browser, f"portal-{name}")
    browser.set_window_size(1400, 1000)


def go(browser, live_server, path: str) -> None:
    browser.get(live_server.url + path)


@pytest.fixture
def acme():
    """Acme's two endpoints: a healthy one, and one failing for two days with its breaker
    open, a failed message of three attempts, a delivered one and a pending one."""
    now = timezone.now()
    destination(
        "acme-warehouse",
        tenant="acme",
        event_types=["inventory.*"],
        description="Warehouse stock sync",
        last_success_at=now - timedelta(minutes=3),
    )
    shop = destination(
        "acme-shop",
        tenant="acme",
        event_types=["order.*", "outbox.message_failed"],
        filter={"data.status": {"$in": ["paid", "cancelled"]}},
        description="Production order sync",
        consecutive_failures=12,
        paused_until=now + timedelta(seconds=45),
        failing_since=now - timedelta(days=2, hours=3),
        last_failure_at=now - timedelta(seconds=20),
        last_success_at=now - timedelta(days=2, hours=3),
    )
    lost = failed(
        shop,
        "order:ord_1042:paid:v3",
        last_attempt_at=now - timedelta(minutes=5),
        ordering_key="order:ord_1042",
        payload={"type": "order.paid", "data": {"order_id": "ord_1042", "status": "paid"}},
    )
    OutboxMessage.objects.filter(pk=lost.pk).update(
        attempts=3, failures=3, last_status_code=503, last_error=ANSWER
    )
    DeliveryAttempt.objects.filter(message=lost).update(status_code=500, response_excerpt="oops")
    for number, minutes in ((2, 4), (3, 1)):
        DeliveryAttempt.objects.create(
            message=lost,
            number=number,
            started_at=now - timedelta(minutes=minutes),
            duration_ms=5003 if number == 3 else 212,
            status_code=503 if number == 3 else None,
            error="" if number == 3 else "ConnectError: connection refused",
            response_excerpt=ANSWER if number == 3 else "",
        )
    message(shop, "order:ord_1043:paid:v1", status=MessageStatus.DELIVERED, delivered_at=now)
    message(shop, "order:ord_1044:cancelled:v2", event_type="order.cancelled")
    return shop


@pytest.mark.django_db(transaction=True)
def test_every_page_as_a_session_with_every_capability(browser, live_server, acme):
    from selenium.webdriver.common.by import By

    enter(browser, live_server, Capability.values)
    shot(browser, "endpoints")
    shot(browser, "endpoints-400px", width=400)

    go(browser, live_server, url("endpoint", acme.pk))
    assert "retired in 2 d 20 h unless a delivery succeeds" in browser.page_source
    shot(browser, "endpoint-failing")
    shot(browser, "endpoint-failing-400px", width=400)

    go(browser, live_server, url("endpoint_add"))
    shot(browser, "endpoint-add")
    browser.find_element(By.ID, "id_url").send_keys("http://169.254.169.254/latest")
    click_through(browser, browser.find_element(By.CSS_SELECTOR, "button.primary[type=submit]"))
    assert "refused by the egress guard" in browser.page_source
    shot(browser, "endpoint-add-refused")
    browser.find_element(By.ID, "id_url").clear()
    browser.find_element(By.ID, "id_url").send_keys("http://127.0.0.1:9/new-hook")
    browser.find_element(By.ID, "id_description").send_keys("Staging")
    browser.find_element(By.ID, "sub-order-all").click()
    click_through(browser, browser.find_element(By.CSS_SELECTOR, "button.primary[type=submit]"))
    assert "it is never shown again" in browser.page_source
    shot(browser, "endpoint-added-secret-once")

    go(browser, live_server, url("endpoint_secret", acme.pk))
    shot(browser, "secret")
    click_through(browser, browser.find_element(By.CSS_SELECTOR, "button.primary[type=submit]"))
    assert "keeps signing beside the new one until" in browser.page_source
    shot(browser, "secret-rotated-shown-once")

    go(browser, live_server, url("endpoint_test", acme.pk))
    click_through(browser, browser.find_element(By.CSS_SELECTOR, "button.primary[type=submit]"))
    assert "Follow its story" in browser.page_source
    shot(browser, "test-event-sent")

    go(browser, live_server, url("messages") + f"?endpoint={acme.pk}")
    shot(browser, "messages")
    shot(browser, "messages-400px", width=400)

    lost = OutboxMessage.objects.get(key="order:ord_1042:paid:v3")
    go(browser, live_server, url("message", lost.pk))
    shot(browser, "message-story")

    go(browser, live_server, url("endpoint_recover", acme.pk))
    click_through(browser, browser.find_element(By.NAME, "plan"))
    assert "The plan: 1 message" in browser.page_source
    shot(browser, "recovery-plan")
    click_through(browser, browser.find_element(By.NAME, "start"))
    assert RecoveryJob.objects.filter(destination=acme).exists()
    shot(browser, "recovery-job")

    go(browser, live_server, url("recovery_jobs"))
    shot(browser, "recovery-jobs")

    go(browser, live_server, url("catalog"))
    browser.find_element(By.CSS_SELECTOR, "#group-order ~ .event details summary").click()
    shot(browser, "catalog")


@pytest.mark.django_db(transaction=True)
def test_the_endpoint_and_a_story_as_a_read_only_session(browser, live_server, acme):
    enter(browser, live_server, [])

    go(browser, live_server, url("endpoint", acme.pk))
    assert "Edit" not in browser.page_source and "Recover…" not in browser.page_source
    shot(browser, "read-only-endpoint")

    lost = OutboxMessage.objects.get(key="order:ord_1042:paid:v3")
    go(browser, live_server, url("message", lost.pk))
    assert "upstream timeout" not in browser.page_source and "bytes, hidden" in browser.page_source
    shot(browser, "read-only-message-story")
