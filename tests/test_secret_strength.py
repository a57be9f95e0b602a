"""Secrets too short to be safe: a source's secret under 24 bytes of key material (as its
scheme keys the HMAC) and a short METRICS_TOKEN are system check warnings (W003, W004);
a destination's secret under 24 bytes is refused wherever one is set (the admin's form,
``manage.py webhook_destination``), by one rule. Each at its boundary: 23 and 24."""

from __future__ import annotations

import base64
import os
from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from hypothesis import given
from hypothesis import strategies as st

from tests.admin.test_destinations import form_data
from tests.sources.test_admin_and_command import form
from webhook_receiver.checks import check_webhook_receiver_settings
from webhook_receiver.models import WebhookDestination, WebhookSource
from webhook_receiver.outbound.signing_secrets import destination_secret_problem
from webhook_receiver.schemes import get_scheme
from webhook_receiver.schemes.base import SECRET_MIN_BYTES
from webhook_receiver.schemes.standard_keys import new_signing_key


def whsec(size: int) -> str:
    return "whsec_" + base64.b64encode(os.urandom(size)).decode()


def messages(settings, sources=None, **more) -> list:
    settings.WEBHOOK_RECEIVER = {
        **settings.WEBHOOK_RECEIVER,
        **({"SOURCES": sources} if sources is not None else {}),
        **more,
    }
    return [m for m in check_webhook_receiver_settings() if m.id.startswith("webhook_receiver.")]


def ids(found: list) -> list[str]:
    return [m.id for m in found]


# --- sources: W003 --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "secret_of"),
    [
        ("standard", whsec),
        ("stripe", lambda n: "s" * n),  # the secret's own bytes key the HMAC
        ("github", lambda n: "g" * n),
        ("github", lambda n: "é" * (n // 2) + "g" * (n % 2)),  # UTF-8 bytes, not characters
    ],
    ids=["standard", "stripe", "github", "github-utf8"],
)
def test_a_source_secret_under_24_bytes_is_warned_about_naming_the_source(
    settings, scheme, secret_of
):
    assert SECRET_MIN_BYTES == 24
    short, enough = secret_of(23), secret_of(24)
    assert get_scheme(scheme).secret_bytes(short) == 23
    assert get_scheme(scheme).secret_bytes(enough) == 24

    found = messages(settings, {"src": {"SCHEME": scheme, "SECRETS": [enough, short]}})
    assert ids(found) == ["webhook_receiver.W003"]
    (warning,) = found
    assert "'src'" in warning.msg and "#2" in warning.msg and "23 bytes" in warning.msg
    assert short not in warning.msg + str(warning.hint)

    assert messages(settings, {"src": {"SCHEME": scheme, "SECRETS": [enough]}}) == []


def test_a_malformed_standard_secret_is_an_error_not_also_a_warning(settings):
    found = messages(settings, {"src": {"SCHEME": "standard", "SECRETS": ["whsec_no!"]}})
    assert ids(found) == ["webhook_receiver.E002"]


# --- METRICS_TOKEN: W004 -------------------------------------------------------------------


def test_a_short_metrics_token_is_warned_about(settings):
    found = messages(settings, METRICS_TOKEN="t" * 23)
    assert ids(found) == ["webhook_receiver.W004"]
    assert "t" * 23 not in found[0].msg + str(found[0].hint)
    assert messages(settings, METRICS_TOKEN="t" * 24) == []
    assert messages(settings, METRICS_TOKEN=None) == []  # metrics off: nothing to guess


# --- destinations: refused -----------------------------------------------------------------


def test_the_rule_for_a_destination_secret():
    assert destination_secret_problem(whsec(24)) is None
    assert destination_secret_problem(whsec(64)) is None
    short = destination_secret_problem(whsec(23))
    assert short is not None and "23 bytes" in short and "24" in short
    for malformed in ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_no!", "whsec_é"):
        assert "whsec_ followed by base64" in (destination_secret_problem(malformed) or "")
    assert "holds 0 bytes" in (destination_secret_problem("whsec_") or "")
    # an Ed25519 signing key's length is fixed: well formed is enough
    assert destination_secret_problem(new_signing_key()) is None
    assert "Ed25519 seed" in (destination_secret_problem("whsk_anything") or "")


@given(st.text(max_size=200))
def test_the_rule_never_raises_nor_repeats_the_value(value):
    problem = destination_secret_problem(value)
    if problem is not None and len(value) > 6:
        assert value not in problem


@pytest.mark.django_db
def test_the_admin_form_refuses_a_short_destination_secret(admin_client):
    short = whsec(23)
    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"),
        form_data(new_secrets=f"{whsec(32)}\n{short}"),
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Line 2 holds 23 bytes of key material once decoded" in page
    assert short not in page
    assert not WebhookDestination.objects.exists()

    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"),
        form_data(new_secrets=whsec(24)),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert WebhookDestination.objects.get().name == "merchant-9"


@pytest.mark.django_db
def test_the_command_refuses_a_short_destination_secret():
    short = whsec(23)
    add = ["webhook_destination", "add", "cli", "--url", "https://cli.example/h"]
    with pytest.raises(CommandError, match=r"--secret #2 holds 23 bytes") as refused:
        call_command(*add, "--secret", whsec(24), "--secret", short, stdout=StringIO())
    assert short not in str(refused.value)
    assert not WebhookDestination.objects.exists()

    call_command(*add, "--secret", whsec(24), stdout=StringIO())
    assert WebhookDestination.objects.get().name == "cli"


# --- source records: one rule, GitHub's typed secrets warned of -----------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("scheme", "short", "enough"),
    [("standard", whsec(23), whsec(24)), ("stripe", "whsec_" + "s" * 17, "whsec_" + "s" * 18)],
    ids=["standard", "stripe"],
)
def test_a_record_refuses_a_short_secret_of_a_scheme_whose_senders_generate_them(
    admin_client, scheme, short, enough
):
    add = reverse("admin:webhook_receiver_webhooksource_add")
    refused = admin_client.post(add, form(slug="rec", scheme=scheme, new_secrets=short))
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "secret #1 holds 23 bytes of key material, fewer than 24" in page
    assert short not in page
    with pytest.raises(CommandError, match=r"secret #1 holds 23 bytes") as error:
        call_command("webhook_source", "add", "cli", "--scheme", scheme, "--secret", short)
    assert short not in str(error.value)
    assert not WebhookSource.objects.exists()

    saved = admin_client.post(add, form(slug="rec", scheme=scheme, new_secrets=enough))
    assert saved.status_code == 302
    assert WebhookSource.objects.get().slug == "rec"


@pytest.mark.django_db
def test_a_typed_github_secret_is_kept_with_a_warning_and_flagged_by_the_deploy_check(
    admin_client,
):
    typed = "Summer2024!"
    add = reverse("admin:webhook_receiver_webhooksource_add")
    saved = admin_client.post(
        add, form(slug="rec", scheme="github", new_secrets=typed), follow=True
    )
    page = saved.content.decode()
    assert WebhookSource.objects.get().slug == "rec"
    assert "Source rec: secret #1 holds 11 bytes of key material, fewer than 24" in page
    assert typed not in page

    err = StringIO()
    call_command(
        "webhook_source", "add", "cli", "--scheme", "github", "--secret", typed,
        stdout=StringIO(), stderr=err,
    )  # fmt: skip
    assert err.getvalue().startswith("warning: cli: secret #1 holds 11 bytes")
    assert typed not in err.getvalue()

    # manage.py check --deploy names both records, never their secret
    found = [
        m
        for m in checks.run_checks(include_deployment_checks=True, databases=["default"])
        if m.id == "webhook_receiver.W006"
    ]
    assert sorted(m.msg.split(" holds")[0] for m in found) == [
        "Secret #1 of source record 'cli'",
        "Secret #1 of source record 'rec'",
    ]
    assert all(typed not in m.msg + str(m.hint) for m in found)
