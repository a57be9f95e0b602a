"""One merchant's whole story in a real browser (headless Chromium), against a live
server and a relay running recovery jobs: it opens the link it was given, finds the
message that failed while its server was down, recovers it from the portal, and sees it
delivered to its server, which now answers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import click_through, screenshot
from tests.support.outbox import destination, failed
from tests.support.peers import answer, hostile_peer
from tests.support.worker import relay_in_background, wait_for
from webhook_receiver.models import DeliveryAttempt, OutboxMessage
from webhook_receiver.portal.access import portal_link

KEY = "order:ord_7:paid:v1"


def url(name: str, *args) -> str:
    return reverse(f"webhook_portal:{name}", args=args)


@pytest.mark.postgres_only("the relay's database thread writes while the live server reads")
@pytest.mark.django_db(transaction=True)
def test_a_merchant_opens_its_link_recovers_a_failed_message_and_sees_it_delivered(
    browser, live_server
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # given: acme's endpoint, whose server was down half an hour ago (a message failed
    # then) and answers 200 again now; a relay that runs recovery jobs
    now = timezone.now()
    with (
        hostile_peer(lambda request: [(0, answer(200, {}, b"ok"))]) as merchant,
        relay_in_background(poll_seconds=0.1, recoveries=True),
    ):
        shop = destination(
            "acme-shop",
            url=merchant.url,
            secrets=["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            tenant="acme",
            event_types=["order.*"],
            last_success_at=now - timedelta(hours=2),
        )
        lost = failed(
            shop, KEY, last_attempt_at=now - timedelta(minutes=25),
            created_at=now - timedelta(minutes=30),
        )  # fmt: skip
        link = portal_link("acme", ["recover"], base_url=live_server.url + url("enter"))

        # when: the merchant opens its link
        browser.delete_all_cookies()
        browser.get(link.url)
        WebDriverWait(browser, 15).until(lambda d: d.current_url.endswith(url("endpoints")))

        # it finds the failed message in its log
        browser.get(f"{live_server.url}{url('messages')}?status=failed")
        assert KEY in browser.page_source and "Failed" in browser.page_source
        screenshot(browser, "portal-story-1-failed")

        # it plans a recovery from the endpoint's page, then starts it
        browser.get(live_server.url + url("endpoint", shop.pk))
        click_through(browser, browser.find_element(By.LINK_TEXT, "Recover…"))
        click_through(browser, browser.find_element(By.CSS_SELECTOR, "button[name=plan]"))
        assert "The plan: 1 message" in browser.page_source and KEY in browser.page_source
        screenshot(browser, "portal-story-2-plan")
        click_through(browser, browser.find_element(By.CSS_SELECTOR, "button[name=start]"))
        assert "Started: the relay sends" in browser.page_source

        # then: the relay sends it, and its log says delivered
        delivered = OutboxMessage.objects.filter(pk=lost.pk, status="delivered")
        wait_for(delivered.exists, 30, "the recovered message delivered")
        browser.get(f"{live_server.url}{url('message', lost.pk)}")
        assert "Delivered" in browser.page_source
        screenshot(browser, "portal-story-3-delivered")

    attempts = DeliveryAttempt.objects.filter(message=lost).order_by("number")
    assert [a.status_code for a in attempts] == [404, 200]
    assert OutboxMessage.objects.get(pk=lost.pk).recovery is not None
