"""manage.py webhook_destination: idempotent add, update and disable."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from tests.support.outbox import SECRET
from tests.support.outbox import destination_command as run
from webhook_receiver.models import WebhookDestination
from webhook_receiver.schemes.standard_keys import is_signing_key, new_signing_key, public_key_of

pytestmark = pytest.mark.django_db
ADD = [
    "add",
    "merchant-7",
    "--url",
    "https://merchant.example/hooks",
    "--secret",
    SECRET,
    "--rate",
    "10/s",
    "--concurrency",
    "4",
    "--events",
    "order.paid,order.cancelled",
]


def test_add_twice_is_one_destination_and_says_unchanged():
    assert run(*ADD).startswith("added merchant-7: enabled, https://merchant.example/hooks")
    assert run(*ADD).startswith("unchanged merchant-7")

    destination = WebhookDestination.objects.get()
    assert destination.event_types == ["order.paid", "order.cancelled"]
    assert (destination.rate_count, destination.rate_seconds, destination.burst) == (10, 1.0, 10)
    assert destination.max_in_flight == 4
    assert destination.secrets == [SECRET]


def test_update_changes_only_what_is_given_and_disable_stops_it():
    run(*ADD)
    assert "updated merchant-7 (burst, rate_count, rate_seconds)" in run(
        "update", "merchant-7", "--rate", "600/m"
    )
    assert "DISABLED" in run("disable", "merchant-7")

    destination = WebhookDestination.objects.get()
    assert (destination.rate_count, destination.rate_seconds) == (600, 60.0)
    assert destination.url == "https://merchant.example/hooks"
    assert not destination.enabled


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "new", "--url", "https://x.example/"], "--secret or --signing-key required"),
        (["update", "nobody", "--rate", "1/s"], "no destination named 'nobody'"),
        ([*ADD[:6], "--rate", "fast"], "like 10/s"),
        (["add", "bad", "--url", "https://x.example/", "--secret", "nope!"], "whsec_"),
        (["add", "bad", "--url", "not a url", "--secret", SECRET], "--url: refused by the egress"),
        (["add", "bad", "--url", "https://x y.example/", "--secret", SECRET], "Enter a valid URL"),
        (
            ["add", "bad", "--url", "https://x.example/", "--secret", SECRET, "--secret", "whsk_x"],
            "--secret #2 is not 'whsk_' \\+ base64 of a 32-byte Ed25519 seed",
        ),
        (
            [
                *["add", "bad", "--url", "https://x.example/", "--secret"],
                public_key_of(new_signing_key()),
            ],
            "--secret #1 is a public key \\(whpk_\\), which cannot sign",
        ),
    ],
)
def test_mistakes_are_explained(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not WebhookDestination.objects.exclude(name="merchant-7").exists()


def test_a_signing_key_is_generated_once_by_add_and_its_public_key_printed():
    # when: added with a generated signing key, then added again (a deploy script)
    first = run("add", "merchant-8", "--url", "https://m8.example/h", "--signing-key")
    again = run("add", "merchant-8", "--url", "https://m8.example/h", "--signing-key")

    # then: one key, whose public key was printed; the signing key never is
    (key,) = WebhookDestination.objects.get(name="merchant-8").secrets
    assert is_signing_key(key)
    assert (
        f"give the merchant its public key, to verify v1a signatures with: {public_key_of(key)}"
        in first
    )
    assert again.startswith("unchanged merchant-8") and "new signing key" not in again
    assert f"public key {public_key_of(key)}" in again
    assert key not in first + again and key.removeprefix("whsk_") not in first + again


def test_update_with_a_signing_key_starts_a_rotation_beside_the_current_secrets():
    run(*ADD)

    out = run("update", "merchant-7", "--signing-key")

    new, old = WebhookDestination.objects.get().secrets
    assert is_signing_key(new) and old == SECRET
    assert out.startswith("updated merchant-7 (secrets)")
    assert f"with: {public_key_of(new)}" in out


def test_a_given_signing_key_is_kept_as_given():
    key = new_signing_key()

    run("add", "merchant-8", "--url", "https://m8.example/h", "--secret", key, "--signing-key")

    assert WebhookDestination.objects.get().secrets == [key]
