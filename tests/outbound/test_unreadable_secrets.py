"""A destination whose secrets no configured key decrypts (the key that encrypted them
removed from SECRET_ENCRYPTION_KEYS): every page that shows it answers, with the state
in words; webhook_status names the condition and exits non-zero; the deploy check names
the row; the relay logs one line and sends nothing; new secrets set on its page make it
whole again."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from io import StringIO

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import TestCase
from django.urls import reverse
from django.utils import timezone

from tests.admin.test_destinations import form_data
from tests.support.admin import change_url
from tests.support.outbox import SECRET, destination, failed, message
from tests.support.status import status_command
from tests.support.worker import relay_running
from webhook_receiver.checks import check_destination_secrets_readable
from webhook_receiver.models import MessageStatus, OutboxMessage, RecoveryJob, WebhookDestination
from webhook_receiver.outbound.notices import ops_notice_enqueue
from webhook_receiver.outbound.recovery_run import recovery_step
from webhook_receiver.watch.trace import event_trace

pytestmark = pytest.mark.django_db

STATE = "secrets unreadable: none of the 2 keys decrypts them"
NEW_SECRET = "whsec_dGhlIG5ldyBzZWNyZXQgb2YgdGhlIHJvdGF0aW9u"
DESTINATIONS = reverse("admin:webhook_receiver_webhookdestination_changelist")


@pytest.fixture
def rotated_away(settings, receiver):
    """Two destinations: one whose key was removed from the settings (two other keys set
    now), one encrypted again under the new key before that."""
    lost = destination("lost", receiver.url)
    message(lost, "waiting")
    new, other = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "SECRET_ENCRYPTION_KEYS": [new, settings.WEBHOOK_RECEIVER["SECRET_ENCRYPTION_KEYS"][0]],
    }
    kept = destination("kept", receiver.url, secrets=[SECRET])
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "SECRET_ENCRYPTION_KEYS": [new, other],
    }
    return lost, kept


def test_the_list_and_the_change_page_show_the_state(rotated_away, admin_client):
    lost, kept = rotated_away

    listed = admin_client.get(DESTINATIONS)
    assert listed.status_code == 200
    page = listed.content.decode()
    assert STATE in page
    assert "1 secret" in page  # the other row, as it was

    changed = admin_client.get(change_url(lost))
    assert changed.status_code == 200
    form = changed.context["adminform"].form
    assert form.fields["keep_secrets"].disabled
    assert STATE in changed.content.decode()

    # the messages' pages do not decrypt a destination's secrets either
    one = OutboxMessage.objects.get()
    assert (
        admin_client.get(reverse("admin:webhook_receiver_outboxmessage_changelist")).status_code
        == 200
    )
    assert admin_client.get(change_url(one)).status_code == 200
    assert admin_client.get(reverse("admin:index")).status_code == 200


def test_the_change_page_takes_new_secrets_and_nothing_less(rotated_away, admin_client):
    lost, _ = rotated_away

    # saving without new secrets: refused, saying why
    response = admin_client.post(change_url(lost), form_data(name="lost", new_secrets=""))
    assert response.status_code == 200
    assert STATE in " ".join(response.context["adminform"].form.non_field_errors())

    response = admin_client.post(change_url(lost), form_data(name="lost", new_secrets=NEW_SECRET))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert WebhookDestination.objects.get(name="lost").secrets == [NEW_SECRET]
    assert STATE not in admin_client.get(DESTINATIONS).content.decode()


def test_the_command_can_give_it_new_secrets(rotated_away):
    out = StringIO()
    call_command("webhook_destination", "disable", "lost", stdout=out)
    assert STATE in out.getvalue()
    assert not WebhookDestination.objects.defer("secrets").get(name="lost").enabled

    call_command("webhook_destination", "update", "lost", "--secret", NEW_SECRET, stdout=out)
    assert WebhookDestination.objects.get(name="lost").secrets == [NEW_SECRET]


def test_webhook_status_names_the_condition_and_exits_non_zero(rotated_away):
    code, out = status_command()
    assert code == 1
    assert "lost: ATTENTION" in out and STATE in out

    code, out = status_command("--json")
    assert code == 1
    by_name = {d["destination"]: d for d in json.loads(out)["destinations"]}
    assert [r["code"] for r in by_name["lost"]["reasons"]] == ["secrets_unreadable"]
    assert by_name["kept"]["reasons"] == []


def test_the_deploy_check_names_the_row(rotated_away):
    lost, _ = rotated_away
    (error,) = check_destination_secrets_readable(databases=["default"])
    assert error.id == "webhook_receiver.E010"
    assert f"#{lost.pk} 'lost'" in error.msg and "'kept'" not in error.msg
    # a database check: nothing without a database
    assert check_destination_secrets_readable(databases=None) == []

    # a deploy check: check --database alone does not run it (nor migrate)
    call_command("check", "--database", "default", stdout=StringIO())
    with pytest.raises(SystemCheckError, match=r"webhook_receiver\.E010"):
        call_command("check", "--deploy", "--database", "default", stdout=StringIO())


def test_the_deploy_check_is_quiet_when_every_key_reads(receiver):
    destination("fine", receiver.url)
    assert check_destination_secrets_readable(databases=["default"]) == []


@pytest.mark.postgres_only("a relay's own database threads see what the test commits")
@pytest.mark.django_db(transaction=True)
def test_the_relay_logs_one_line_and_sends_nothing(rotated_away, receiver, caplog):
    lost, _ = rotated_away
    message(lost, "another")

    # when: a relay runs for a while, its poll waking the destination every 0.2 s
    with caplog.at_level(logging.INFO):
        relay = relay_running(1.5, poll_seconds=0.2)

    # then: one ERROR line in all, no traceback, nothing sent
    assert relay.answered == 0
    assert receiver.received == []
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    (line,) = errors
    assert "lost" in line.getMessage() and STATE in line.getMessage()
    assert line.exc_info is None
    assert set(OutboxMessage.objects.values_list("status", "attempts")) == {
        (MessageStatus.PENDING, 0)
    }


def test_a_trace_and_an_ops_notice_need_no_secrets(rotated_away, settings):
    lost, _ = rotated_away
    message(lost, "traced", origin_source="shop", origin_event_key="evt_1")
    (section,) = event_trace(source="shop", event_key="evt_1").outbox
    assert "lost" in str(section)

    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "OPS_DESTINATION": "lost"}
    with TestCase.captureOnCommitCallbacks(execute=False):
        assert ops_notice_enqueue(event_type="ops.test", key="ops-1", data={})
    assert OutboxMessage.objects.filter(key="ops-1", destination=lost).exists()


def test_a_recovery_job_works_on_it(rotated_away, admin_client):
    lost, _ = rotated_away
    now = timezone.now()
    failed(lost, "broke", last_attempt_at=now - timedelta(minutes=5))
    since = timezone.localtime(now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    asked = {"destination": lost.pk, "kind": "recover", "since": since}

    plan = admin_client.post(reverse("admin:webhook_receiver_recoveryjob_add"), asked)
    start = admin_client.post(
        reverse("admin:webhook_receiver_recoveryjob_add"), {**asked, "_start": "1"}
    )

    assert plan.status_code == 200 and plan.context["plan"].count == 1
    assert start.status_code == 302
    job = RecoveryJob.objects.get()
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=1))
    assert OutboxMessage.objects.get(key="broke").status == MessageStatus.PENDING


def test_reencrypt_does_the_others_and_names_it(rotated_away, settings):
    lost, kept = rotated_away
    with pytest.raises(
        CommandError, match=r"1 destination\(s\).*no key decrypts the secrets of lost"
    ):
        call_command("webhook_destination", "reencrypt", stdout=StringIO())
    assert WebhookDestination.objects.get(name="kept").secrets == [SECRET]
