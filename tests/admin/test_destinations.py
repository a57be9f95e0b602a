"""The outbox destinations' admin: the list with each one's health figures, the form with
its secrets (never shown, rotated by fingerprint), Recover… with its permission,
and the pages as a person sees them in headless Chromium at 1400x1000. The health
figures are checked against rows written with known values."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import messages
from django.contrib.admin.models import LogEntry
from django.contrib.admin.sites import site
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.support.admin import act, action_values, button_url, change_url, flash
from tests.support.browser import click_through, no_sideways_scroll, screenshot
from tests.support.outbox import OLD_SECRET, SECRET, destination, failed, message
from webhook_receiver.admin.forms import secret_label
from webhook_receiver.models import MessageStatus, OutboxMessage, WebhookDestination
from webhook_receiver.outbound.retirement import GONE_REASON
from webhook_receiver.schemes.standard_keys import is_signing_key, new_signing_key, public_key_of

pytestmark = pytest.mark.django_db

NEW_SECRET = "whsec_dGhlIG5ldyBzZWNyZXQgb2YgdGhlIHJvdGF0aW9u"
MESSAGES = reverse("admin:webhook_receiver_outboxmessage_changelist")
DESTINATIONS = reverse("admin:webhook_receiver_webhookdestination_changelist")
PLAN = reverse("admin:webhook_receiver_recoveryjob_add")


# --- the destinations' list: health ------------------------------------------------------


@pytest.fixture
def fleet():
    """Three destinations with known figures.

    - merchant-7: breaker open for 10 min; 2 pending (one due, created 10 min ago, one
      deferred), 1 sending, 3 failed, 4 delivered, 1 discarded;
    - warehouse: half-open (at its threshold, pause over); 1 pending due, created 90 s ago;
    - crm: closed after 3 failures in a row; nothing open; disabled.
    """
    now = timezone.now()
    merchant = destination(
        "merchant-7",
        "https://merchant.example/hooks/outbox",
        breaker_threshold=5,
        consecutive_failures=7,
        paused_until=now + timedelta(minutes=10),
        last_success_at=now - timedelta(hours=1),
        last_failure_at=now - timedelta(minutes=1),
    )
    warehouse = destination(
        "warehouse", breaker_threshold=5, consecutive_failures=5, secrets=[SECRET]
    )
    crm = destination("crm", consecutive_failures=3, enabled=False)
    message(merchant, "m-due", created_at=now - timedelta(minutes=10))
    message(merchant, "m-deferred", next_attempt_at=now + timedelta(minutes=5))
    message(merchant, "m-sending", MessageStatus.SENDING, lease_until=now + timedelta(seconds=30))
    for n in range(3):
        failed(merchant, f"m-failed-{n}", last_attempt_at=now - timedelta(minutes=n))
    for n in range(4):
        message(merchant, f"m-delivered-{n}", MessageStatus.DELIVERED)
    message(merchant, "m-discarded", MessageStatus.DISCARDED)
    message(warehouse, "w-due", created_at=now - timedelta(seconds=90))
    return {"merchant": merchant, "warehouse": warehouse, "crm": crm}


def test_the_destination_list_shows_each_ones_health(admin_client, fleet):
    # when
    response = admin_client.get(DESTINATIONS)

    # then: the figures, as computed for the page
    assert response.status_code == 200
    figures = {
        d.name: (d.backlog, d.failed_count, d.oldest_eligible_at is not None)
        for d in response.context["cl"].result_list
    }
    assert figures == {
        "merchant-7": (3, 3, True),
        "warehouse": (1, 0, True),
        "crm": (0, 0, False),
    }
    rows = {d.name: d for d in response.context["cl"].result_list}
    model_admin = site.get_model_admin(WebhookDestination)
    assert model_admin.oldest_eligible(rows["merchant-7"]).endswith(">10 min</span>")
    assert model_admin.oldest_eligible(rows["warehouse"]).endswith(">1 min</span>")
    # and as shown: the breaker in words, the counts linking to the messages behind them
    content = response.content.decode()
    assert 'class="wr-line wr-open">open</span>' in content
    assert 'class="wr-line wr-half">half-open</span>' in content
    assert "3 failures in a row" in content
    merchant = fleet["merchant"].pk
    assert (
        f'class="wr-figure wr-failed" href="{MESSAGES}?destination__id__exact={merchant}'
        f'&amp;status__exact=failed">3</a>'
    ) in content
    assert "2 secrets" in content and "1 secret<" in content


def test_the_health_figures_take_the_same_queries_for_three_destinations_or_thirty(
    admin_client, fleet
):
    with CaptureQueriesContext(connection) as few:
        admin_client.get(DESTINATIONS)
    for n in range(27):
        dest = destination(f"extra-{n}")
        failed(dest, f"x-{n}", last_attempt_at=timezone.now())
    with CaptureQueriesContext(connection) as many:
        response = admin_client.get(DESTINATIONS)

    assert len(response.context["cl"].result_list) == 30
    assert len(many) == len(few)


def test_no_secret_is_ever_shown(admin_client, fleet):
    merchant = fleet["merchant"]

    pages = [admin_client.get(DESTINATIONS), admin_client.get(change_url(merchant))]

    for page in pages:
        content = page.content.decode()
        for secret in (SECRET, OLD_SECRET):
            assert secret not in content
            assert secret.removeprefix("whsec_") not in content
    # the change form names each by its last four characters
    assert secret_label(SECRET) == "whsec_…LaSw"
    assert "whsec_…LaSw" in pages[1].content.decode()
    assert "whsec_…b7oD" in pages[1].content.decode()


# --- the destinations' form ---------------------------------------------------------------


def form_data(**fields) -> dict:
    data = {
        "name": "merchant-9",
        "url": "https://merchant9.example/hooks",
        "enabled": "on",
        "event_types": "order.paid\norder.cancelled, order.refunded",
        "new_secrets": SECRET,
        "rate_count": 10,
        "rate_seconds": 1.0,
        "burst": 10,
        "max_in_flight": 4,
        "timeout_seconds": 10.0,
        "max_attempts": 12,
        "backoff_base_seconds": 2.0,
        "backoff_cap_seconds": 3600.0,
        "retry_after_cap_seconds": 300.0,
        "breaker_threshold": 10,
        "breaker_cooldown_seconds": 60.0,
        "replay_horizon_days": 30,
    }
    return {**data, **fields}


def test_a_destination_is_added_from_the_admin(admin_client):
    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"), form_data()
    )

    assert response.status_code == 302, response.context["adminform"].form.errors
    dest = WebhookDestination.objects.get(name="merchant-9")
    assert dest.secrets == [SECRET]
    assert dest.event_types == ["order.paid", "order.cancelled", "order.refunded"]


def test_a_secret_that_is_not_one_is_refused_without_being_echoed(admin_client):
    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"),
        form_data(new_secrets=f"{SECRET}\nsk_live_abcdef"),
    )

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["new_secrets"] == [
        "Line 2 is not a Standard Webhooks secret: whsec_ followed by base64, or a signing "
        "key: whsk_ followed by the base64 of a 32-byte Ed25519 seed."
    ]
    assert "sk_live_abcdef" not in response.content.decode()
    assert not WebhookDestination.objects.filter(name="merchant-9").exists()


def test_a_rotation_adds_a_secret_then_drops_the_old_one(admin_client, fleet):
    # given: the merchant signs with two secrets
    from webhook_receiver.admin.forms import secret_fingerprint

    merchant = fleet["merchant"]
    url = change_url(merchant)
    fields = form_data(name="merchant-7", url=merchant.url, new_secrets=NEW_SECRET)

    # when: a new secret is added, both current ones kept
    keep = [secret_fingerprint(SECRET), secret_fingerprint(OLD_SECRET)]
    response = admin_client.post(url, {**fields, "keep_secrets": keep})

    # then
    assert response.status_code == 302, response.context["adminform"].form.errors
    merchant.refresh_from_db()
    assert merchant.secrets == [NEW_SECRET, SECRET, OLD_SECRET]

    # when: the old one is unticked, nothing added
    keep = [secret_fingerprint(NEW_SECRET), secret_fingerprint(SECRET)]
    admin_client.post(url, {**fields, "new_secrets": "", "keep_secrets": keep})

    # then: the history names the fields changed, never a secret
    merchant.refresh_from_db()
    assert merchant.secrets == [NEW_SECRET, SECRET]
    for log in LogEntry.objects.filter(object_id=str(merchant.pk)):
        for secret in (SECRET, OLD_SECRET, NEW_SECRET):
            assert secret not in log.change_message and secret not in log.get_change_message()


def test_a_destination_keeps_at_least_one_secret(admin_client, fleet):
    merchant = fleet["merchant"]

    response = admin_client.post(
        change_url(merchant),
        form_data(name="merchant-7", url=merchant.url, new_secrets="", keep_secrets=[]),
    )

    assert response.status_code == 200
    assert "A destination needs at least one secret" in response.content.decode()
    merchant.refresh_from_db()
    assert merchant.secrets == [SECRET, OLD_SECRET]


def test_the_change_page_shows_the_public_keys_never_the_signing_key(admin_client):
    # given: a destination signing with a shared secret and an Ed25519 key
    key = new_signing_key()
    dest = destination("merchant-8", secrets=[key, SECRET])

    # when
    page = admin_client.get(change_url(dest)).content.decode()

    # then: the public key to copy; the signing key known by its last characters alone
    assert f'<code class="wr-public-key">{public_key_of(key)}</code>' in page
    seed = key.removeprefix("whsk_")
    assert not any(seed[n : n + 8] in page for n in range(len(seed) - 7))  # nothing of it
    assert secret_label(key) == f"whsk_… of whpk_…{public_key_of(key)[-4:]}"
    assert secret_label(key) in page
    assert (
        "it has no signing key"
        in admin_client.get(change_url(destination("plain"))).content.decode()
    )


def test_a_signing_key_is_generated_from_the_form_beside_the_kept_secret(admin_client):
    from webhook_receiver.admin.forms import secret_fingerprint

    dest = destination("merchant-8", secrets=[SECRET])
    fields = form_data(name="merchant-8", url=dest.url, new_secrets="")

    response = admin_client.post(
        change_url(dest),
        {**fields, "keep_secrets": [secret_fingerprint(SECRET)], "generate_signing_key": "on"},
    )

    assert response.status_code == 302, response.context["adminform"].form.errors
    dest.refresh_from_db()
    new, kept = dest.secrets
    assert is_signing_key(new) and kept == SECRET
    assert public_key_of(new) in admin_client.get(change_url(dest)).content.decode()


def test_a_signing_key_may_be_pasted_and_a_public_key_may_not(admin_client):
    key = new_signing_key()
    add = reverse("admin:webhook_receiver_webhookdestination_add")

    refused = admin_client.post(add, form_data(new_secrets=public_key_of(key)))
    added = admin_client.post(add, form_data(new_secrets=key))

    assert refused.status_code == 200
    assert "Line 1 is a public key (whpk_), which cannot sign" in refused.content.decode()
    assert added.status_code == 302
    assert WebhookDestination.objects.get(name="merchant-9").secrets == [key]


def test_saving_the_form_never_writes_back_the_relays_state(rf, admin_user, fleet):
    # given: the form's copy of the row, read before the relay recorded a success
    model_admin = site.get_model_admin(WebhookDestination)
    stale = WebhookDestination.objects.get(name="merchant-7")
    succeeded = timezone.now()
    WebhookDestination.objects.filter(pk=stale.pk).update(
        consecutive_failures=0, paused_until=None, last_success_at=succeeded, tokens=3.5
    )

    # when: the operator's change is saved from that copy
    stale.rate_count = 5
    request = rf.post("/")
    request.user = admin_user
    model_admin.save_model(request, stale, form=None, change=True)

    # then: the change is saved, the relay's state is the relay's
    fresh = WebhookDestination.objects.get(pk=stale.pk)
    assert fresh.rate_count == 5
    assert (fresh.consecutive_failures, fresh.paused_until, fresh.last_success_at) == (
        0,
        None,
        succeeded,
    )
    assert fresh.tokens == 3.5


def test_a_destination_cannot_be_deleted_from_the_admin(admin_client, fleet):
    url = reverse("admin:webhook_receiver_webhookdestination_delete", args=[fleet["crm"].pk])

    assert admin_client.post(url, {"post": "yes"}).status_code == 403
    assert WebhookDestination.objects.filter(name="crm").exists()


# --- Recover… (a recovery job: tests/admin/test_recovery_jobs.py) -------------------------


def test_recover_is_behind_the_recovery_jobs_add_permission(client, staff_user, fleet):
    client.force_login(staff_user("view_webhookdestination", "change_webhookdestination"))
    merchant = fleet["merchant"]

    assert "recover_selected" not in action_values(client.get(DESTINATIONS))
    assert 'id="wr-recover"' not in client.get(change_url(merchant)).content.decode()
    assert client.get(button_url(merchant, "recover")).status_code == 403


def test_recover_opens_the_plan_page_of_that_destination(client, staff_user, fleet):
    client.force_login(staff_user("view_webhookdestination", "add_recoveryjob"))
    merchant = fleet["merchant"]
    assert 'id="wr-recover"' in client.get(change_url(merchant)).content.decode()

    response = client.get(button_url(merchant, "recover"))

    assert response.status_code == 302
    assert response.url == f"{PLAN}?destination={merchant.pk}"


def test_recover_as_an_action_takes_one_destination(admin_client, fleet):
    several = act(admin_client, DESTINATIONS, "recover_selected", fleet["merchant"], fleet["crm"])
    one = act(admin_client, DESTINATIONS, "recover_selected", fleet["crm"])

    assert flash(several) == [
        (messages.WARNING, "A recovery job is planned for one destination: select one.")
    ]
    assert one.status_code == 302 and one.url == f"{PLAN}?destination={fleet['crm'].pk}"


# --- in a browser --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_destination_list_shows_health(admin_browser, live_server, fleet):
    from selenium.webdriver.common.by import By

    # when
    admin_browser.get(live_server.url + DESTINATIONS)

    # then
    no_sideways_scroll(admin_browser)

    def cells(name: str) -> dict[str, str]:
        row = admin_browser.find_element(By.XPATH, f"//tr[.//a[.='{name}']]")
        return {
            td.get_attribute("class").split()[0].removeprefix("field-"): td.text
            for td in row.find_elements(By.TAG_NAME, "td")
        }

    merchant = cells("merchant-7")
    assert merchant["breaker"].startswith("open\nuntil ")
    assert (merchant["backlog_figure"], merchant["failed_figure"]) == ("3", "3")
    assert merchant["oldest_eligible"] == "10 min"
    assert merchant["secret_count"] == "2 secrets"
    assert cells("warehouse")["breaker"] == "half-open\none probe at a time"
    assert cells("crm")["breaker"] == "closed\n3 failures in a row"
    assert cells("crm")["last_success"] == "never"
    screenshot(admin_browser, "outbox-destinations")

    # the destination's page, and the plan page its Recover… opens
    click_through(admin_browser, admin_browser.find_element(By.LINK_TEXT, "merchant-7"))
    assert SECRET not in admin_browser.page_source
    screenshot(admin_browser, "outbox-destination-detail")
    health = admin_browser.find_element(By.CSS_SELECTOR, ".field-breaker_state")
    admin_browser.execute_script("arguments[0].scrollIntoView()", health)
    screenshot(admin_browser, "outbox-destination-health")
    click_through(admin_browser, admin_browser.find_element(By.ID, "wr-recover"))
    assert admin_browser.find_element(By.TAG_NAME, "h1").text == "Plan a recovery"
    screenshot(admin_browser, "outbox-recover-plan")


@pytest.mark.django_db(transaction=True)
def test_a_group_reaching_no_declared_type_and_a_regex_filter_are_refused_on_the_page(
    admin_browser, live_server
):
    from selenium.webdriver.common.by import By

    admin_browser.get(live_server.url + reverse("admin:webhook_receiver_webhookdestination_add"))
    fields = form_data(event_types="order.*\nrefund.*", filter='{"data.status": {"$regex": "^p"}}')
    for name, value in fields.items():
        field = admin_browser.find_elements(By.NAME, name)
        if field and field[0].get_attribute("type") not in ("checkbox", "hidden"):
            field[0].clear()
            field[0].send_keys(str(value))
    click_through(admin_browser, admin_browser.find_element(By.NAME, "_save"))

    errors = admin_browser.find_element(By.CSS_SELECTOR, ".field-event_types .errorlist")
    assert errors.text == (
        "refund.* matches no declared event type (an opt-in type is subscribed to by its name)"
    )
    help_text = admin_browser.find_element(By.CSS_SELECTOR, ".field-event_types .help").text
    assert "a group (order.*: every declared type of it but the opt-in ones)" in help_text
    errors = admin_browser.find_element(By.CSS_SELECTOR, ".field-filter .errorlist")
    assert errors.text == (
        "data.status: '$regex' is not an operator ($eq, $neq, $in, $nin, $startsWith, $exist)"
    )
    assert SECRET not in admin_browser.page_source
    assert not WebhookDestination.objects.filter(name="merchant-9").exists()
    field = admin_browser.find_element(By.CSS_SELECTOR, ".field-event_types")
    admin_browser.execute_script("arguments[0].scrollIntoView()", field)
    screenshot(admin_browser, "outbox-destination-subscriptions")


# --- Enable -----------------------------------------------------------------------------


@pytest.fixture
def gone():
    """A destination the relay disabled after a 410, holding two messages."""
    now = timezone.now()
    dest = destination(
        "gone-shop",
        enabled=False,
        disabled_reason=GONE_REASON,
        disabled_at=now - timedelta(hours=2),
        failing_since=now - timedelta(hours=3),
    )
    message(dest, "g-1", created_at=now - timedelta(hours=3))
    message(dest, "g-2", created_at=now - timedelta(hours=1))
    return dest


def test_enable_is_behind_the_change_permission(client, staff_user, gone):
    client.force_login(staff_user("view_webhookdestination", "retry_outboxmessage"))

    assert "enable_selected" not in action_values(client.get(DESTINATIONS))
    page = client.get(change_url(gone)).content.decode()
    assert 'id="wr-enable"' not in page
    assert "disabled by the relay since" in page and GONE_REASON in page
    response = client.post(button_url(gone, "enable"), {"post": "yes", "reason": ""})
    assert response.status_code == 403
    assert not WebhookDestination.objects.get(pk=gone.pk).enabled


def test_enable_from_the_destination_page_resumes_its_messages(client, staff_user, gone):
    # given: a user who may change destinations; the button on the disabled one only
    user = staff_user("view_webhookdestination", "change_webhookdestination")
    client.force_login(user)
    other = destination("fine-shop")
    assert 'id="wr-enable"' not in client.get(change_url(other)).content.decode()
    assert 'id="wr-enable"' in client.get(change_url(gone)).content.decode()

    # when: the button's confirmation page, then confirmed
    page = client.get(button_url(gone, "enable"))
    assert page.status_code == 200 and GONE_REASON in page.content.decode()
    response = client.post(
        button_url(gone, "enable"), {"post": "yes", "reason": "merchant moved back"}
    )

    # then: enabled, its reason and span cleared, its messages pending (the relays are
    # woken as it commits: tests/outbound/test_operations.py hears it)
    assert response.status_code == 302 and response.url == change_url(gone)
    gone.refresh_from_db()
    assert gone.enabled and gone.disabled_reason == "" and gone.failing_since is None
    assert set(OutboxMessage.objects.filter(destination=gone).values_list("status", flat=True)) == {
        MessageStatus.PENDING
    }
    [(level, text)] = flash(response)
    assert (level, text) == (
        messages.SUCCESS,
        "gone-shop: Enabled: 2 held messages to send, in their order.",
    )
    log = LogEntry.objects.get(user=user, object_id=str(gone.pk))
    assert log.change_message.endswith("merchant moved back")


def test_enable_as_an_action_leaves_an_enabled_one_alone(admin_client, gone):
    other = destination("fine-shop")

    response = act(admin_client, DESTINATIONS, "enable_selected", gone, other, reason="")

    assert response.status_code == 302
    assert set(flash(response)) == {
        (messages.SUCCESS, "gone-shop: Enabled: 2 held messages to send, in their order."),
        (messages.WARNING, "fine-shop was enabled already."),
    }
    assert WebhookDestination.objects.filter(enabled=True).count() == 2


def test_ticking_enabled_in_the_form_enables_it_through_the_operation(admin_client, gone):
    # the form's enabled goes through the operations: ticked, the relay's reason goes
    page = admin_client.get(change_url(gone))
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "keep_secrets"}
    data |= {
        "enabled": "on",
        "event_types": "order.paid",
        "keep_secrets": form.initial.get("keep_secrets", []),
    }
    response = admin_client.post(change_url(gone), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    gone.refresh_from_db()
    assert gone.enabled and gone.disabled_reason == "" and gone.disabled_at is None
