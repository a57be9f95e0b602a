"""Reading a peer's HTTP answers (``network.peer_http``): Retry-After as seconds or an HTTP
date, capped; anything else is no number at all."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fuzzing import PURE
from webhook_receiver.network.peer_http import parse_retry_after


def test_retry_after_reads_seconds_and_http_dates_and_is_capped():
    now = timezone.now()
    assert parse_retry_after("12", now=now, cap=300) == 12
    assert parse_retry_after("9999", now=now, cap=300) == 300
    date = (now + timedelta(seconds=60)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert 58 <= parse_retry_after(date, now=now, cap=300) <= 60
    assert parse_retry_after("soon", now=now, cap=300) is None
    assert parse_retry_after(None, now=now, cap=300) is None


@PURE
@given(value=st.none() | st.text(max_size=80) | st.integers(-(10**12), 10**12).map(str))
def test_any_retry_after_reads_as_capped_seconds_or_none(value):
    seconds = parse_retry_after(value, now=timezone.now(), cap=300)
    assert seconds is None or 0 <= seconds <= 300
