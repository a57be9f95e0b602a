"""``manage.py webhook_recover``: the dry run prints the count the job then plans, and
writes nothing; a job starts, lists with its progress, and cancels; what is refused
says why, as a command error."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.outbox import destination, message
from webhook_receiver.management.commands.webhook_recover import parse_moment
from webhook_receiver.models import MessageStatus, OutboxMessage, RecoveryJob
from webhook_receiver.outbound.recovery_run import recovery_step

pytestmark = pytest.mark.django_db


def recover(*args: str) -> str:
    out = StringIO()
    call_command("webhook_recover", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def merchant():
    dest = destination("merchant", rate_count=20)
    for n in range(7):
        message(dest, f"order:o{n}:paid:v1", status=MessageStatus.FAILED)
    return dest


def test_the_dry_run_prints_what_the_job_then_plans_and_sends_nothing(merchant):
    dry = recover("merchant", "--since", "2h", "--dry-run")

    assert dry.startswith("merchant: recover failed messages admitted since "), dry
    assert ": 7 message(s) would be sent, at 10/s (about 0 s); nothing was sent (dry run)" in dry
    assert "  order:o0:paid:v1 (order.paid, admitted " in dry
    assert "  … and 2 more" in dry
    assert not RecoveryJob.objects.exists()
    assert OutboxMessage.objects.filter(status=MessageStatus.FAILED).count() == 7

    started = recover("merchant", "--since", "2h")
    job = RecoveryJob.objects.get()
    assert started.startswith(f"started recovery #{job.pk} of merchant: 7 message(s) at 10/s")
    assert job.planned == 7 and job.created_by == "manage.py webhook_recover"


def test_a_job_lists_with_its_progress_and_cancels(merchant):
    recover("merchant", "--since", "2h", "--rate", "2")
    job = RecoveryJob.objects.get()
    recovery_step(job.pk, now=job.stepped_at + timedelta(seconds=1))
    OutboxMessage.objects.filter(recovery=job).update(status=MessageStatus.DELIVERED)

    listed = recover("--list", "merchant")
    cancelled = recover("--cancel", str(job.pk))

    assert listed.startswith(
        f"#{job.pk} merchant recover running: 2 of 7 released (2 delivered), at 2/s; "
        "started by manage.py webhook_recover at "
    ), listed
    assert cancelled.startswith(f"cancelled recovery #{job.pk}: it releases nothing more")
    after = recover("--list")
    assert "merchant recover cancelled: 2 of 7 released" in after
    assert after.endswith("; cancelled by manage.py webhook_recover\n")
    with pytest.raises(CommandError, match=rf"recovery #{job.pk} is not running"):
        recover("--cancel", str(job.pk))
    with pytest.raises(CommandError, match=r"no recovery job #999999"):
        recover("--cancel", "999999")
    assert recover("--list", "nobody") == "no recovery jobs of nobody\n"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["merchant", "--since", "40d"], r"merchant: refused: .* past merchant's replay horizon"),
        (["merchant", "--since", "yesterday"], r"'yesterday' is not a time: give an ISO 8601"),
        (["nobody", "--since", "2h"], r"no destination named 'nobody'"),
        (["merchant"], r"name the destination and give --since"),
        (["merchant", "--since", "2h", "--rate", "20"], r"below merchant's own, 20/s"),
    ],
)
def test_what_is_refused_says_why(merchant, args, why):
    with pytest.raises(CommandError, match=why):
        recover(*args)
    assert not RecoveryJob.objects.exists()


def test_a_time_is_iso_8601_or_a_span_before_now():
    now = timezone.now()
    assert parse_moment("90m", now) == now - timedelta(minutes=90)
    assert parse_moment("1d", now) == now - timedelta(days=1)
    assert parse_moment("2026-12-07T08:00Z", now).isoformat() == "2026-12-07T08:00:00+00:00"
    assert timezone.is_aware(parse_moment("2026-12-07T08:00", now))


@settings(max_examples=300)
@given(text=st.text(max_size=40) | st.from_regex(r"\A\s*\d{1,30}(\.\d{1,5})?\s*(m|min|h|d)\s*\Z"))
@example(text="99999999999d")
def test_any_time_given_is_a_moment_or_a_clear_error(text):
    now = timezone.now()
    try:
        moment = parse_moment(text, now)
    except CommandError as exc:
        assert "is not a time: give an ISO 8601 time" in str(exc) or (
            "is further back than a date can be" in str(exc)
        )
    else:
        assert timezone.is_aware(moment)
