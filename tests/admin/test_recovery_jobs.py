"""The recovery jobs' admin: the plan page (its first values, the plan with its count
and sample, a refusal in words), Start behind the add permission, the list with each
job's progress, Cancel behind its own permission; and the pages in headless Chromium."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import messages
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from tests.support.admin import act, action_values, change_url, flash
from tests.support.browser import click_through, no_sideways_scroll, screenshot
from tests.support.outbox import destination, message
from webhook_receiver.models import MessageStatus, OutboxMessage, RecoveryJob
from webhook_receiver.outbound.recovery_run import recovery_step

pytestmark = pytest.mark.django_db

PLAN = reverse("admin:webhook_receiver_recoveryjob_add")
JOBS = reverse("admin:webhook_receiver_recoveryjob_changelist")


@pytest.fixture
def merchant():
    """merchant-7, which last worked an hour ago, and failed twelve messages since."""
    now = timezone.now()
    dest = destination("merchant-7", rate_count=20, last_success_at=now - timedelta(hours=1))
    for n in range(12):
        message(
            dest,
            f"order:ord_{n}:paid:v1",
            MessageStatus.FAILED,
            created_at=now - timedelta(minutes=50 - n),
            last_status_code=503,
        )
    return dest


def shown(response) -> str:
    """The page's text, as read: tags out, runs of white space one space."""
    return " ".join(strip_tags(response.content.decode()).split())


def asked(dest, **fields) -> dict[str, object]:
    since = timezone.localtime(dest.last_success_at).strftime("%Y-%m-%dT%H:%M")
    return {"destination": dest.pk, "kind": "recover", "since": since, **fields}


def test_the_plan_page_starts_from_the_destinations_last_success(admin_client, merchant):
    page = admin_client.get(f"{PLAN}?destination={merchant.pk}")

    assert page.status_code == 200
    shown = f"{timezone.localtime(merchant.last_success_at):%Y-%m-%dT%H:%M}"
    html = page.content.decode()
    assert f'type="datetime-local" name="since" value="{shown}"' in html
    assert f'<option value="{merchant.pk}" selected>merchant-7</option>' in html
    assert 'name="_start"' not in html


def test_plan_shows_what_it_would_send_and_writes_nothing(admin_client, merchant):
    page = admin_client.post(PLAN, asked(merchant, answer_classes=["5xx"], rate="4"))

    text = shown(page)
    assert page.status_code == 200
    assert "The plan: 12 messages of merchant-7 At 4 a second: about 3 s." in text, text
    assert "order:ord_0:paid:v1order.paid" in text and "and 7 more" in text
    assert 'value="Start: send 12 messages"' in page.content.decode()
    assert not RecoveryJob.objects.exists()


def test_start_starts_the_job_and_keeps_who(client, staff_user, merchant):
    user = staff_user("view_recoveryjob", "add_recoveryjob")
    client.force_login(user)

    response = client.post(PLAN, {**asked(merchant), "_start": "1"})

    job = RecoveryJob.objects.get()
    assert response.status_code == 302 and response.url == change_url(job)
    assert (job.planned, job.rate, job.created_by, job.state) == (
        12,
        10.0,
        user.username,
        "running",
    )
    assert flash(response) == [
        (
            messages.SUCCESS,
            f"Started recovery #{job.pk}: 12 messages, at 10/s. The relay processes send "
            "them; this page follows it.",
        )
    ]
    assert LogEntry.objects.get(user=user, object_id=str(job.pk)).change_message.startswith(
        "Started recovery"
    )


def test_a_refusal_is_said_on_the_page(admin_client, merchant):
    since = timezone.localtime(timezone.now() - timedelta(days=45)).strftime("%Y-%m-%dT%H:%M")

    page = admin_client.post(PLAN, {**asked(merchant), "since": since, "_start": "1"})

    assert page.status_code == 200
    assert "past merchant-7&#x27;s replay horizon of 30 days" in page.content.decode()
    assert not RecoveryJob.objects.exists()


def test_starting_and_cancelling_take_their_permissions(client, staff_user, merchant):
    client.force_login(staff_user("view_recoveryjob"))
    assert client.get(PLAN).status_code == 403
    assert client.post(PLAN, {**asked(merchant), "_start": "1"}).status_code == 403
    assert not RecoveryJob.objects.exists()
    assert "cancel_selected" not in action_values(client.get(JOBS))


def test_the_list_shows_progress_and_cancel_stops_a_job(client, staff_user, merchant):
    user = staff_user("view_recoveryjob", "add_recoveryjob", "cancel_recoveryjob")
    client.force_login(user)
    client.post(PLAN, {**asked(merchant), "rate": "2", "_start": "1"})
    job = RecoveryJob.objects.get()
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=2))
    OutboxMessage.objects.filter(recovery=job).update(status=MessageStatus.DELIVERED)
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=3))

    listed = shown(client.get(JOBS))
    response = act(client, JOBS, "cancel_selected", job)

    assert "Running6 of 122 pending, 4 delivered" in listed, listed
    assert flash(response) == [
        (
            messages.SUCCESS,
            f"Cancelled recovery #{job.pk}: it releases nothing more; the 6 it released are sent.",
        )
    ]
    job.refresh_from_db()
    assert (job.state, job.cancelled_by) == ("cancelled", user.username)


# --- in a browser --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_plan_and_the_job_as_an_operator_sees_them(admin_browser, live_server, merchant):
    from selenium.webdriver.common.by import By

    admin_browser.get(f"{live_server.url}{PLAN}?destination={merchant.pk}")
    admin_browser.find_element(By.CSS_SELECTOR, 'input[value="5xx"]').click()
    click_through(admin_browser, admin_browser.find_element(By.NAME, "_plan"))
    plan = admin_browser.find_element(By.ID, "wr-plan").text
    assert plan.startswith("THE PLAN: 12 MESSAGES OF MERCHANT-7") or plan.startswith(
        "The plan: 12 messages of merchant-7"
    ), plan
    no_sideways_scroll(admin_browser, None)
    screenshot(admin_browser, "recovery-plan")

    click_through(admin_browser, admin_browser.find_element(By.NAME, "_start"))
    job = RecoveryJob.objects.get()
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=1))
    admin_browser.get(live_server.url + JOBS)
    row = admin_browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr").text
    assert f"#{job.pk}" in row and "10 of 12" in row and "10 pending" in row, row
    no_sideways_scroll(admin_browser)
    screenshot(admin_browser, "recovery-jobs")
