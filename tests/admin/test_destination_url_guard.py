"""The egress guard when a destination's URL is saved, through the admin's form and
``manage.py webhook_destination``: every internal address form refused with its rule
named, credentials in a URL refused, a name that does not resolve saved with a warning;
URLs shown with their query masked to whoever may not change the destination; and an
answer's text shown only to staff who may change the destination."""

from __future__ import annotations

from io import StringIO

import pytest
from django.conf import settings
from django.contrib import messages
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from tests.admin.test_destinations import form_data
from tests.core.test_check_url import REFUSED_FORMS
from tests.support.admin import change_url, flash
from tests.support.listener import listening
from tests.support.outbox import SECRET, destination, message
from tests.support.status import receipt
from webhook_receiver.models import DeliveryAttempt, OutboxMessage, WebhookDestination
from webhook_receiver.outbound.relay.steps import relay_claim, relay_record, relay_send

pytestmark = pytest.mark.django_db

ADD = reverse("admin:webhook_receiver_webhookdestination_add")
DESTINATIONS = reverse("admin:webhook_receiver_webhookdestination_changelist")
MESSAGES = reverse("admin:webhook_receiver_outboxmessage_changelist")


def allowed(networks: list[str]):
    return override_settings(
        WEBHOOK_RECEIVER={**settings.WEBHOOK_RECEIVER, "EGRESS_ALLOWED_NETWORKS": networks}
    )


def url_errors(response) -> list[str]:
    assert response.status_code == 200, "the form was expected back with an error"
    return list(response.context["adminform"].form.errors.get("url", []))


# --- the admin's form ------------------------------------------------------------------


@pytest.mark.parametrize(("host", "rule"), REFUSED_FORMS)
def test_the_form_refuses_every_internal_form_naming_the_rule(admin_client, host, rule):
    with allowed([]):
        response = admin_client.post(ADD, form_data(url=f"https://{host}:8443/hooks"))

    [error] = url_errors(response)
    assert error.startswith("refused by the egress guard: ")
    assert rule in error
    assert rule in response.content.decode().replace("&#x27;", "'")
    assert not WebhookDestination.objects.exists()


def test_the_allow_list_lets_loopback_through_at_save(admin_client):
    with allowed(["127.0.0.0/8", "::1/128"]):
        response = admin_client.post(ADD, form_data(url="http://localhost:8000/hooks"))

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert WebhookDestination.objects.get().url == "http://localhost:8000/hooks"
    assert [level for level, _ in flash(response)] == [messages.SUCCESS]  # no warning


def test_credentials_in_the_url_are_refused_by_the_form(admin_client):
    response = admin_client.post(ADD, form_data(url="https://shop:s3cret@merchant9.example/h"))

    assert url_errors(response) == [
        "refused by the egress guard: credentials do not belong in the URL; put the secret "
        "in the secret field"
    ]
    assert not WebhookDestination.objects.exists()


def test_an_unresolvable_name_is_saved_with_a_warning(admin_client):
    response = admin_client.post(ADD, form_data(url="https://not-yet.invalid/hooks"))

    assert response.status_code == 302
    assert WebhookDestination.objects.get().url == "https://not-yet.invalid/hooks"
    warnings = [text for level, text in flash(response) if level == messages.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("merchant-9: not-yet.invalid does not resolve now (")
    assert "checked by the egress guard again before each send" in warnings[0]


def test_a_change_to_an_internal_address_is_refused_and_the_old_url_kept(admin_client):
    dest = destination("merchant-9", "https://merchant9.example/hooks", secrets=[SECRET])
    with allowed([]):
        response = admin_client.post(
            change_url(dest), form_data(url="http://169.254.169.254/latest/meta-data/")
        )

    [error] = url_errors(response)
    assert error == (
        "refused by the egress guard: 169.254.169.254, which is link-local (the cloud "
        "metadata address among them)"
    )
    dest.refresh_from_db()
    assert dest.url == "https://merchant9.example/hooks"


# --- the command -------------------------------------------------------------------------


def command(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("webhook_destination", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("host", "rule"), REFUSED_FORMS)
def test_the_command_refuses_every_internal_form_naming_the_rule(host, rule):
    with allowed([]), pytest.raises(CommandError) as refused:
        command("add", "merchant-9", "--url", f"https://{host}/hooks", "--secret", SECRET)

    assert str(refused.value).startswith("--url: refused by the egress guard: ")
    assert rule in str(refused.value)
    assert not WebhookDestination.objects.exists()


def test_the_command_exits_non_zero_with_the_message(capsys):
    from django.core.management import ManagementUtility

    utility = ManagementUtility(
        ["manage.py", "webhook_destination", "add", "m", "--url", "https://u:p@m.example/"]
    )
    with pytest.raises(SystemExit) as exit_status:
        utility.execute()
    assert exit_status.value.code == 1
    assert "credentials do not belong in the URL" in capsys.readouterr().err


def test_the_command_saves_an_unresolvable_name_with_a_warning_line():
    out, err = command(
        "add", "merchant-9", "--url", "https://not-yet.invalid/hooks?token=abc", "--secret", SECRET
    )

    assert err.startswith("warning: --url: not-yet.invalid does not resolve now (")
    assert out.startswith("added merchant-9: enabled, https://not-yet.invalid/hooks?token=…,")
    assert "abc" not in out
    assert WebhookDestination.objects.get().url == "https://not-yet.invalid/hooks?token=abc"


def test_the_command_lets_loopback_through_with_the_allow_list():
    with allowed(["127.0.0.0/8"]):
        out, err = command("add", "dev", "--url", "http://127.0.0.1:8000/h", "--secret", SECRET)
    assert out.startswith("added dev: enabled, http://127.0.0.1:8000/h,")
    assert err == ""


# --- masked URLs ---------------------------------------------------------------------------

TOKEN_URL = "https://merchant9.example/hooks?token=tok_live_123&v=2"


def test_the_list_and_the_message_page_mask_the_query(admin_client):
    dest = destination("merchant-9", TOKEN_URL)
    msg = message(dest, "order:ord_1:paid:v1")

    for page in (admin_client.get(DESTINATIONS), admin_client.get(change_url(msg))):
        content = page.content.decode()
        assert "https://merchant9.example/hooks?token=…&amp;v=…" in content
        assert "tok_live_123" not in content


def test_the_change_form_keeps_the_real_url_for_who_may_change_it(admin_client):
    dest = destination("merchant-9", TOKEN_URL)

    content = admin_client.get(change_url(dest)).content.decode()

    assert 'value="https://merchant9.example/hooks?token=tok_live_123&amp;v=2"' in content


def test_a_view_only_user_reads_the_url_masked(client, staff_user):
    dest = destination("merchant-9", TOKEN_URL)
    client.force_login(staff_user("view_webhookdestination"))

    response = client.get(change_url(dest))

    assert response.status_code == 200
    content = response.content.decode()
    assert "https://merchant9.example/hooks?token=…&amp;v=…" in content
    assert "tok_live_123" not in content


# --- answers' text behind the change permission ------------------------------------------


@pytest.fixture
def answered(receiver):
    """A message the real relay sent to a real receiver, answered 412 with its body."""
    dest = destination("merchant-7", receiver.url, max_attempts=1)
    msg = message(dest, "order:ord_1:paid:v1", origin_source="shop", origin_event_key="e1")
    receiver.answer(412)
    now = timezone.now()
    claimed = relay_claim(destination=dest, now=now).claimed
    relay_record(dest, relay_send(dest, claimed), now=now)
    msg.refresh_from_db()
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.status_code, attempt.response_excerpt) == (412, '{"ok": true}')
    return msg


def test_a_view_only_user_sees_the_status_and_size_of_an_answer_not_its_text(
    client, staff_user, answered
):
    client.force_login(staff_user("view_outboxmessage"))

    for page in (client.get(change_url(answered)), client.get(MESSAGES)):
        assert page.status_code == 200
        content = page.content.decode()
        assert "HTTP 412" in content
        assert "12 bytes, hidden: you may not change this destination" in content
        assert "ok&quot;: true" not in content
        assert '"ok": true' not in content


def test_staff_who_may_change_the_destination_read_the_answer(client, staff_user, answered):
    client.force_login(staff_user("view_outboxmessage", "change_webhookdestination"))

    content = client.get(change_url(answered)).content.decode()

    assert '<pre class="wr-excerpt">{&quot;ok&quot;: true}</pre>' in content
    assert "HTTP 412: {&quot;ok&quot;: true}" in content  # the last answer
    assert "hidden: you may not change" not in content


def test_the_trace_page_shows_an_answers_status_never_its_text(client, staff_user, answered):
    receipt("shop", timezone.now(), key="e1")  # the event the message came of
    client.force_login(staff_user("view_outboxmessage", "view_sourceoverview"))
    trace = reverse("admin:webhook_receiver_trace")

    response = client.get(trace, {"source": "shop", "key": "e1"})

    assert response.status_code == 200
    content = response.content.decode()
    assert OutboxMessage.objects.get().key in content
    assert "<td>412</td>" in content
    assert "ok&quot;: true" not in content


def test_the_refusal_is_the_same_for_an_open_and_a_closed_port(admin_client):
    with listening() as server, allowed([]):
        errors = {
            port: url_errors(admin_client.post(ADD, form_data(url=f"http://127.0.0.1:{port}/h")))
            for port in (server.port, 9)
        }
        assert server.connections() == 0  # the check at save connects to nothing

    assert (
        errors[server.port]
        == errors[9]
        == ["refused by the egress guard: 127.0.0.1, which is loopback"]
    )
