"""manage.py webhook_destination: idempotent add, update and disable."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from webhook_receiver.models import WebhookDestination

pytestmark = pytest.mark.django_db
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
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


def run(*args: str) -> str:
    out = StringIO()
    call_command("webhook_destination", *args, stdout=out)
    return out.getvalue()


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
        (["add", "new", "--url", "https://x.example/"], "--secret required"),
        (["update", "nobody", "--rate", "1/s"], "no destination named 'nobody'"),
        ([*ADD[:6], "--rate", "fast"], "like 10/s"),
        (["add", "bad", "--url", "https://x.example/", "--secret", "nope!"], "whsec_"),
        (["add", "bad", "--url", "not a url", "--secret", SECRET], "--url: refused by the egress"),
        (["add", "bad", "--url", "https://x y.example/", "--secret", SECRET], "Enter a valid URL"),
    ],
)
def test_mistakes_are_explained(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not WebhookDestination.objects.exclude(name="merchant-7").exists()
