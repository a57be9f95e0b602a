"""The admin's overview page: permission, one row per source with its state and reasons,
the verdict, links that open the filtered lists, and the chart, in the test client and
in a real headless Chromium."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.support.browser import screenshot
from tests.support.status import (  # noqa: F401 (fixture)
    accepted,
    beat_seen,
    failed,
    refused,
    repair,
    run,
    silence,
)
from webhook_receiver.models import RunOutcome

OVERVIEW = reverse("admin:webhook_receiver_sourceoverview_changelist")


def a_busy_day(settings) -> None:
    """shop: steady traffic and 4 dead letters (attention); stripe: silent, with refusals
    (alert); github: reconciled, repair items open (alert); the rest quiet."""
    now = timezone.now()
    config = settings.WEBHOOK_RECEIVER
    sources = dict(config["SOURCES"])
    sources["github"] = {
        **sources["github"],
        "RECONCILE": {"ADAPTER": "file", "OPTIONS": {"PATH": "/nonexistent"}},
        "ACTIVE_HOURS": {"DAYS": "mon-fri", "START": "08:00", "END": "20:00"},
    }
    settings.WEBHOOK_RECEIVER = {**config, "SOURCES": sources}

    # shop: an event every 10 to 40 minutes for a day, busier in the last hours
    at = now - timedelta(hours=24)
    step = 0
    while at < now - timedelta(minutes=1):
        accepted("shop", at)
        step += 1
        at += timedelta(minutes=(10, 25, 40, 5, 3)[step % 5])
    for minutes in (5, 15, 90, 600):
        failed("shop", "dead", first=now - timedelta(minutes=minutes))
    failed("shop", "retrying", first=now - timedelta(minutes=8), due=now + timedelta(minutes=2))

    # stripe: busy until 3 hours ago, silent since, refusals in the silence
    for minutes in range(180, 600, 7):
        accepted("stripe", now - timedelta(minutes=minutes))
    silence(
        "stripe",
        opened=now - timedelta(minutes=160),
        last=now - timedelta(minutes=180),
        rejected_counts={"invalid_signature": 9},
        rejected_total=9,
    )
    for minutes in range(2, 170, 20):
        refused("stripe", now - timedelta(minutes=minutes))

    # github: the last run found two missing events
    for minutes in range(30, 1400, 45):
        accepted("github", now - timedelta(minutes=minutes))
    found = run("github", RunOutcome.NEEDS_REPAIR, started=now - timedelta(minutes=12))
    repair("github", "missing", "gh_1", found)
    repair("github", "missing", "gh_2", found)


# --- the test client ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("beat_seen")
def test_superuser_sees_a_row_per_source_and_the_verdict(admin_client, settings):
    # given
    a_busy_day(settings)

    # when
    response = admin_client.get(OVERVIEW)

    # then
    assert response.status_code == 200
    assert response.templates[0].name == "admin/webhook_receiver/overview.html"
    rows = {row.status.source: row for row in response.context["rows"]}
    assert list(rows) == ["shop", "stripe", "github", "small", "keyed"]
    assert {s: r.state for s, r in rows.items()} == {
        "shop": "attention",
        "stripe": "alert",
        "github": "alert",
        "small": "ok",
        "keyed": "ok",
    }
    content = response.content.decode()
    verdict = re.search(r'<span class="wr-verdict-text">(.*?)</span>', content).group(1)
    assert verdict == (
        "2 sources in alert: stripe — silent for 3 h 00 min (+1 more); github — 2 open repair "
        "items. 1 source needs attention: shop — 4 dead letters"
    )
    # the state as a word and a shape, not colour alone
    assert '<span class="wr-badge wr-alert">✖ Alert</span>' in content
    assert '<span class="wr-badge wr-attention">▲ Attention</span>' in content
    assert '<span class="wr-badge wr-ok">✔ OK</span>' in content
    # the reasons under the rows, the gaps next to the window, the active hours
    assert 'data-code="dead_letters"' in content
    assert "4 dead letters" in content
    assert "alert after 20 min" in content
    assert "p50 " in content and "p99 " in content and "max " in content
    assert "active mon,tue,wed,thu,fri 08:00-20:00 UTC" in content
    # one chart per configured source, bars with a title each
    assert content.count('<svg class="wr-chart"') == 5
    assert content.count("<title>") >= 5 * 288


@pytest.mark.django_db
def test_every_link_opens_its_filtered_list(admin_client, settings):
    # given
    a_busy_day(settings)
    content = admin_client.get(OVERVIEW).content.decode()

    # when: every link into the admin's lists on the page
    links = set(re.findall(r'href="(/admin/webhook_receiver/[^"]+\?[^"]+)"', content))

    # then: each filtered list loads (a filter the list refuses redirects to ?e=1)
    assert len(links) >= 10
    for link in links:
        response = admin_client.get(link.replace("&amp;", "&"))
        assert response.status_code == 200, link
    dead = "/admin/webhook_receiver/failedevent/?source=shop&amp;status__exact=dead"
    assert f'href="{dead}"' in content
    followed = admin_client.get(dead.replace("&amp;", "&"))
    assert len(followed.context["cl"].result_list) == 4


@pytest.mark.django_db
@pytest.mark.usefixtures("beat_seen")
def test_all_ok_says_so(admin_client):
    content = admin_client.get(OVERVIEW).content.decode()

    assert '<span class="wr-verdict-text">All 5 sources OK</span>' in content
    assert "no requests in these 24 hours" in content


@pytest.mark.django_db
def test_view_permission_is_needed(client, staff_user):
    # given: a staff user without permissions
    user = staff_user()
    client.force_login(user)

    # when / then
    assert client.get(OVERVIEW).status_code == 403

    # given: the overview's view permission alone: the page, without links to the lists
    staff_user.grant(user, "view_sourceoverview")
    failed("shop", "dead", first=timezone.now())
    response = client.get(OVERVIEW)
    assert response.status_code == 200
    content = response.content.decode()
    assert "1 source needs attention: shop — 1 dead letter" in content
    assert "/admin/webhook_receiver/failedevent/" not in content

    # given: and the failed events' view permission: the link appears
    staff_user.grant(user, "view_failedevent")
    content = client.get(OVERVIEW).content.decode()
    assert "/admin/webhook_receiver/failedevent/?source=shop&amp;status__exact=dead" in content


def test_anonymous_is_sent_to_login(client):
    response = client.get(OVERVIEW)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


# --- a real browser ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("beat_seen")
def test_overview_in_a_browser(admin_browser, live_server, settings):  # noqa: F811
    from selenium.webdriver.common.by import By

    # given
    a_busy_day(settings)

    # when
    admin_browser.get(live_server.url + OVERVIEW)

    # then: the verdict is the first thing on the page, and visible
    verdict = admin_browser.find_element(By.ID, "wr-verdict")
    assert verdict.is_displayed()
    assert "2 sources in alert" in verdict.text
    assert verdict.location["y"] < 200
    rows = admin_browser.find_elements(By.CSS_SELECTOR, "tr.wr-source-row")
    assert [r.get_attribute("data-state") for r in rows] == [
        "attention",
        "alert",
        "alert",
        "ok",
        "ok",
    ]
    # the chart: an SVG per source, with bars of both kinds drawn
    charts = admin_browser.find_elements(By.CSS_SELECTOR, "svg.wr-chart")
    assert len(charts) == 5 and all(c.is_displayed() for c in charts)
    assert admin_browser.find_elements(By.CSS_SELECTOR, "svg.wr-chart rect.wr-ok-bar")
    assert admin_browser.find_elements(By.CSS_SELECTOR, "svg.wr-chart rect.wr-bad-bar")
    first_bar = admin_browser.find_element(By.CSS_SELECTOR, "svg.wr-chart rect.wr-ok-bar")
    assert first_bar.size["height"] >= 1
    screenshot(admin_browser, "overview")
    # no sideways scrolling at 1400 px
    width = admin_browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= admin_browser.execute_script("return window.innerWidth")
    admin_browser.execute_script("document.getElementById('wr-charts').scrollIntoView()")
    screenshot(admin_browser, "overview-charts")
