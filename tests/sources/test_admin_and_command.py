"""Managing source records without a deploy: the admin (add, rotate, disable; secrets
never shown; the settings' slugs refused; permissions) and ``manage.py webhook_source``,
each change live at once in the process that made it."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from tests.sources.conftest import ACME_NEW_SECRET, ACME_SECRET
from tests.support.admin import change_url
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.core.fingerprints import secret_fingerprint
from webhook_receiver.models import WebhookSource
from webhook_receiver.schemes import SCHEMES

pytestmark = pytest.mark.django_db

ADD = reverse("admin:webhook_receiver_webhooksource_add")
LIST = reverse("admin:webhook_receiver_webhooksource_changelist")


def deliver(client, slug: str, secret: str, order: str) -> int:
    body = reserved(order, ("SKU-A", 1))
    return post(client, slug, body, standard_headers(body, secret=secret)).status_code


def form(**fields) -> dict:
    base = {
        "slug": "acme",
        "scheme": "standard",
        "enabled": "on",
        "tolerance_seconds": 300,
        "max_body_bytes": 1048576,
        "silence_after_seconds": 1200,
        "active_days": "",
        "active_start": "",
        "active_end": "",
        "active_time_zone": "UTC",
        "new_secrets": "",
    }
    return {k: v for k, v in {**base, **fields}.items() if v is not None}


def run(*args: str) -> str:
    out = StringIO()
    call_command("webhook_source", *args, stdout=out)
    return out.getvalue()


# --- the admin ---------------------------------------------------------------------------------


def test_a_source_added_in_the_admin_receives_at_once(admin_client, client):
    assert deliver(client, "acme", ACME_SECRET, "ord_1") == 404

    response = admin_client.post(ADD, form(new_secrets=ACME_SECRET))

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert deliver(client, "acme", ACME_SECRET, "ord_2") == 200


def test_the_admin_refuses_a_slug_of_the_settings(admin_client):
    response = admin_client.post(ADD, form(slug="shop", new_secrets=ACME_SECRET))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "WEBHOOK_RECEIVER['SOURCES']" in " ".join(errors["slug"])
    assert not WebhookSource.objects.exists()


def test_the_admin_refuses_a_secret_the_scheme_cannot_use_without_echoing_it(admin_client):
    response = admin_client.post(ADD, form(new_secrets="not-a-whsec-secret-value"))

    assert response.status_code == 200
    assert "not-a-whsec-secret-value" not in response.content.decode()
    assert not WebhookSource.objects.exists()


def test_a_rotation_in_the_admin_shows_fingerprints_and_when_each_verified(
    admin_client, client, acme
):
    url = change_url(acme)
    fields = form(slug=None, keep_secrets=[secret_fingerprint(ACME_SECRET)])
    assert deliver(client, "acme", ACME_SECRET, "ord_old") == 200

    # when: a new secret is added beside the old one
    response = admin_client.post(url, {**fields, "new_secrets": ACME_NEW_SECRET})
    assert response.status_code == 302, response.context["adminform"].form.errors

    # then: both verify at once, and the page names each by fingerprint, never by value
    assert deliver(client, "acme", ACME_NEW_SECRET, "ord_new") == 200
    page = admin_client.get(url).content.decode()
    for secret in (ACME_SECRET, ACME_NEW_SECRET):
        assert secret not in page and secret.removeprefix("whsec_") not in page
        assert secret_fingerprint(secret) in page
    assert page.count("last verified a request") == 2
    assert "within 5 seconds" in page

    # when: the old one is unticked
    keep = [secret_fingerprint(ACME_NEW_SECRET)]
    admin_client.post(url, {**fields, "keep_secrets": keep})

    # then: it verifies nothing any more; the history never names a secret
    assert deliver(client, "acme", ACME_SECRET, "ord_late") == 401
    acme.refresh_from_db()
    assert acme.secrets == [ACME_NEW_SECRET]
    for log in LogEntry.objects.all():
        assert ACME_SECRET not in log.get_change_message()


def test_disabling_in_the_admin_answers_404_at_once(admin_client, client, acme):
    fields = form(slug=None, keep_secrets=[secret_fingerprint(ACME_SECRET)], enabled=None)

    admin_client.post(change_url(acme), fields)

    assert deliver(client, "acme", ACME_SECRET, "ord_1") == 404


def test_the_list_counts_secrets_and_marks_a_shadowed_record(admin_client, acme):
    WebhookSource.objects.create(slug="shop", secrets=[ACME_SECRET])

    page = admin_client.get(LIST).content.decode()

    assert "1 secret" in page
    assert "not used: the settings define this slug" in page
    assert ACME_SECRET not in page


def test_staff_without_the_permissions_may_not_see_or_change_sources(client, staff_user, acme):
    client.force_login(staff_user())
    assert client.get(LIST).status_code == 403
    assert client.post(change_url(acme), form(slug=None)).status_code == 403

    client.force_login(staff_user("view_webhooksource", username="viewer"))
    assert client.get(LIST).status_code == 200
    page = client.get(change_url(acme)).content.decode()
    assert ACME_SECRET not in page
    assert client.post(change_url(acme), form(slug=None, enabled=None)).status_code == 403
    acme.refresh_from_db()
    assert acme.enabled


# --- the command -------------------------------------------------------------------------------


def test_the_command_adds_rotates_and_disables(client):
    out = run("add", "acme", "--secret", ACME_SECRET)
    assert out.startswith("added acme: enabled, standard, 1 secret(s)")
    assert "live within 5 s" in out
    assert deliver(client, "acme", ACME_SECRET, "ord_1") == 200

    out = run("add-secret", "acme", "--secret", ACME_NEW_SECRET)
    assert f"added secret {secret_fingerprint(ACME_NEW_SECRET)} to acme" in out
    assert deliver(client, "acme", ACME_NEW_SECRET, "ord_2") == 200

    listing = run("list", "acme")
    assert f"secret {secret_fingerprint(ACME_SECRET)}: last verified a request" in listing
    assert f"secret {secret_fingerprint(ACME_NEW_SECRET)}: last verified a request" in listing
    assert ACME_SECRET not in listing and ACME_NEW_SECRET not in listing

    out = run("remove-secret", "acme", secret_fingerprint(ACME_SECRET)[:8])
    assert "removed a secret from acme: enabled, standard, 1 secret(s)" in out
    assert deliver(client, "acme", ACME_SECRET, "ord_3") == 401

    assert run("disable", "acme").startswith("disabled acme")
    assert deliver(client, "acme", ACME_NEW_SECRET, "ord_4") == 404
    assert run("disable", "acme").startswith("unchanged acme, already disabled")
    assert run("enable", "acme").startswith("enabled acme")
    assert deliver(client, "acme", ACME_NEW_SECRET, "ord_5") == 200


def test_the_command_refuses_what_would_break_a_source(acme):
    with pytest.raises(CommandError, match=r"WEBHOOK_RECEIVER\['SOURCES'\]"):
        run("add", "shop", "--secret", ACME_SECRET)
    with pytest.raises(CommandError, match="exists already"):
        run("add", "acme", "--secret", ACME_SECRET)
    with pytest.raises(CommandError, match="only secret"):
        run("remove-secret", "acme", secret_fingerprint(ACME_SECRET))
    with pytest.raises(CommandError, match="no single secret") as refused:
        run("remove-secret", "acme", "abc")
    assert ACME_SECRET not in str(refused.value)
    with pytest.raises(CommandError, match="is not 'whsec_' \\+ base64") as refused:
        run("add-secret", "acme", "--secret", "plain-text-secret")
    assert "plain-text-secret" not in str(refused.value)
    with pytest.raises(CommandError, match="no source record 'nope'"):
        run("disable", "nope")


def test_list_without_records_says_so(db):
    assert run("list") == "no source records (the settings' sources: manage.py check)\n"


def test_a_key_rotation_reencrypts_the_source_records_too(settings, client, acme):
    # given: a new key put first, the old one kept
    old_keys = settings.WEBHOOK_RECEIVER["SECRET_ENCRYPTION_KEYS"]
    new_key = "q1wJZyAeYq3S3b0yb3ZxWkz3lYd1m8r8bQ6oXv3oJ5U="
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        "SECRET_ENCRYPTION_KEYS": [new_key, *old_keys],
    }

    # when: reencrypt runs, and the old key is removed
    out = StringIO()
    call_command("webhook_destination", "reencrypt", stdout=out)
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SECRET_ENCRYPTION_KEYS": [new_key]}

    # then: the record's secret still verifies
    assert "and 1 source record(s)" in out.getvalue()
    assert WebhookSource.objects.get().secrets == [ACME_SECRET]
    assert deliver(client, "acme", ACME_SECRET, "ord_1") == 200


def test_a_source_deleted_in_the_admin_answers_404_at_once(admin_client, client, acme):
    assert deliver(client, "acme", ACME_SECRET, "ord_1") == 200
    delete = reverse("admin:webhook_receiver_webhooksource_delete", args=[acme.pk])

    assert admin_client.post(delete, {"post": "yes"}).status_code == 302

    assert deliver(client, "acme", ACME_SECRET, "ord_2") == 404


def test_a_record_offers_every_built_in_scheme_and_only_those():
    offered = [value for value, _label in WebhookSource._meta.get_field("scheme").choices]

    assert offered == list(SCHEMES)
