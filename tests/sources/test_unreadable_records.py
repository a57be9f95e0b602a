"""One source record whose secrets cannot be read (its key removed too early, or a key of
SECRET_ENCRYPTION_KEYS malformed) is that record's problem alone: its requests are
answered 503 with one log line each, its admin row and webhook_status say so, and every
other source, record or settings, goes on; an unknown slug is still a 404."""

from __future__ import annotations

import io
import json
import logging

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from tests.settings import SECRET_ENCRYPTION_KEY, SHOP_SECRET
from tests.sources.conftest import ACME_NEW_SECRET, ACME_SECRET
from tests.sources.test_admin_and_command import form
from tests.support.browser import screenshot
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.sources.lookup import records
from webhook_receiver.sources.operations import source_add

pytestmark = pytest.mark.django_db

OTHER_KEY = Fernet.generate_key().decode()
BETA_SECRET = "whsec_YmV0YSdzIG93biBzaWduaW5nIHNlY3JldCwgbG9uZw"
LIST = reverse("admin:webhook_receiver_webhooksource_changelist")
DESTINATIONS = reverse("admin:webhook_receiver_webhookdestination_changelist")
OVERVIEW = reverse("admin:webhook_receiver_sourceoverview_changelist")
UNREADABLE = "secrets unreadable: none of the 1 key decrypts them"


def with_keys(settings, *keys: str) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SECRET_ENCRYPTION_KEYS": list(keys)}
    records.clear()


@pytest.fixture
def acme_unreadable(settings, acme):
    """ "acme" encrypted under the settings' key, "beta" under another; then only the
    other is set: acme's key was removed before its secrets were encrypted again."""
    with_keys(settings, OTHER_KEY, SECRET_ENCRYPTION_KEY)
    source_add(slug="beta", scheme="standard", secrets=[BETA_SECRET])
    with_keys(settings, OTHER_KEY)
    return acme


def deliver(client, slug: str, secret: str, order: str) -> int:
    body = reserved(order, ("SKU-A", 1))
    return post(client, slug, body, standard_headers(body, secret=secret)).status_code


def status(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("webhook_status", *args, stdout=out, stderr=err, no_color=True)
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def test_an_unreadable_record_answers_503_alone(client, acme_unreadable, caplog):
    # when
    with caplog.at_level(logging.INFO, logger="webhook_receiver"):
        acme = deliver(client, "acme", ACME_SECRET, "ord_acme")
    beta = deliver(client, "beta", BETA_SECRET, "ord_beta")
    made_up = deliver(client, "made-up", BETA_SECRET, "ord_x")
    shop = deliver(client, "shop", SHOP_SECRET, "ord_shop")

    # then: acme is retried by its sender; everything else is answered as ever
    assert (acme, beta, made_up, shop) == (503, 200, 404, 200)
    # one line for acme's request (the made-up slug's refusal is a WARNING of its own)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert lines == [
        "webhook request not verified: its source record's secrets cannot be read; "
        f'answered 503, the sender will retry: source=acme state="{UNREADABLE}"'
    ]


def test_the_admin_lists_it_as_unreadable_and_its_page_replaces_its_secrets(
    admin_client, client, acme_unreadable
):
    listing = admin_client.get(LIST)
    assert listing.status_code == 200
    text = listing.content.decode()
    assert f"{UNREADABLE}: answered 503" in text and "receiving" in text

    page = reverse("admin:webhook_receiver_webhooksource_change", args=[acme_unreadable.pk])
    shown = admin_client.get(page)
    assert shown.status_code == 200 and UNREADABLE in shown.content.decode()

    # saved without new secrets: refused, saying why
    refused = admin_client.post(page, form())
    assert refused.status_code == 200
    assert "Add new secrets (they replace them)" in refused.content.decode()
    # saved with a new secret: it replaces the unreadable ones, and acme receives again
    saved = admin_client.post(page, form(new_secrets=ACME_NEW_SECRET))
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert deliver(client, "acme", ACME_NEW_SECRET, "ord_acme_2") == 200


def test_webhook_status_names_it_and_shows_the_rest(acme_unreadable):
    code, out, err = status()
    assert "Traceback" not in out + err
    assert "acme" in out and UNREADABLE in out and "beta" in out
    assert code == 2  # an alert: none of its requests can be verified

    _, text, _ = status("--json")
    sources = {s["source"]: s for s in json.loads(text)["sources"]}
    assert sources["acme"]["secrets_unreadable"] == UNREADABLE
    assert sources["acme"]["configured"] is True
    assert "secrets_unreadable" in [r["code"] for r in sources["acme"]["reasons"]]
    assert sources["beta"]["secrets_unreadable"] is None


def test_the_command_lists_it_disables_it_and_refuses_to_rotate_it(acme_unreadable):
    out = io.StringIO()
    call_command("webhook_source", "list", stdout=out)
    listing = out.getvalue()
    assert f"SECRETS UNREADABLE ({UNREADABLE})" in listing
    assert "beta: enabled, standard, 1 secret(s)" in listing

    with pytest.raises(CommandError, match="give it new secrets in the admin"):
        call_command("webhook_source", "add-secret", "acme", "--secret", ACME_NEW_SECRET)
    out = io.StringIO()
    call_command("webhook_source", "disable", "acme", stdout=out)
    assert out.getvalue().startswith("disabled acme: DISABLED, standard, 1 secret(s)")


def test_a_malformed_key_leaves_the_settings_sources_and_every_page_working(
    settings, admin_client, client, acme
):
    # given: a key that is no Fernet key at all
    with_keys(settings, "not-a-fernet-key")
    malformed = "secrets unreadable: key #1 of SECRET_ENCRYPTION_KEYS is malformed"

    # then: the record waits, the settings' source is answered, and the pages show it
    assert deliver(client, "acme", ACME_SECRET, "ord_acme") == 503
    assert deliver(client, "shop", SHOP_SECRET, "ord_shop") == 200
    for page in (LIST, DESTINATIONS, OVERVIEW):
        response = admin_client.get(page)
        assert response.status_code == 200, page
        assert "not-a-fernet-key" not in response.content.decode()
    assert malformed in admin_client.get(LIST).content.decode()
    _, out, err = status()
    assert malformed in out and "Traceback" not in out + err


@pytest.mark.django_db(transaction=True)
def test_the_sources_list_in_a_browser(admin_browser, live_server, settings):
    from selenium.webdriver.common.by import By

    # given: acme unreadable beside beta, as the fixture makes them (a live server's
    # test runs in no transaction of its own)
    source_add(slug="acme", scheme="standard", secrets=[ACME_SECRET])
    with_keys(settings, OTHER_KEY, SECRET_ENCRYPTION_KEY)
    source_add(slug="beta", scheme="standard", secrets=[BETA_SECRET])
    with_keys(settings, OTHER_KEY)

    # when
    admin_browser.get(live_server.url + LIST)

    # then: each row says what it is, acme's why
    rows = {
        row.find_element(By.CSS_SELECTOR, "th").text: row.text
        for row in admin_browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    }
    assert f"{UNREADABLE}: answered 503" in rows["acme"]
    assert "receiving" in rows["beta"]
    screenshot(admin_browser, "sources-unreadable")
