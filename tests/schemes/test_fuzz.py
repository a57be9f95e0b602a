"""Fuzzing the signature schemes: whatever the headers (all of unicode, huge numbers,
lists of entries), verify() answers with a VerifiedMessage or a documented rejection (a
``RejectedRequest``), never another error; and headers a scheme does not read change
nothing. Pure: no database."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fuzzing import PURE, READS, SECRETS, fuzzed_headers, near_misses, requests
from webhook_receiver.exceptions import RejectedRequest
from webhook_receiver.schemes import VerifiedMessage, sign, verify


@pytest.mark.parametrize("scheme", sorted(SECRETS))
@PURE
@given(data=st.data())
def test_verify_returns_a_message_or_raises_a_rejection(scheme, data):
    """Whatever the headers (all of unicode, huge numbers, lists of entries), verify()
    answers with a VerifiedMessage or a documented rejection: never another error."""
    # given: a body and headers, signed or not, then fuzzed
    headers, body = data.draw(st.one_of(requests(scheme, "any"), near_misses(scheme, "any")))

    # when
    try:
        message = verify(
            scheme=scheme,
            secrets=SECRETS[scheme],
            headers=headers,
            body=body,
            tolerance_seconds=300,
        )
    except RejectedRequest:
        return

    # then: anything but a rejection failed the test above; a message is well-formed
    assert isinstance(message, VerifiedMessage)
    assert message.scheme == scheme


@pytest.mark.parametrize("scheme", sorted(SECRETS))
@PURE
@given(
    body=st.binary(max_size=2048),
    message_id=st.text(min_size=1, max_size=300),
    junk=fuzzed_headers("any"),
)
def test_a_signed_request_verifies_whatever_other_headers_it_carries(
    scheme, body, message_id, junk
):
    """Headers a scheme does not read change nothing: a sender's proxies add their own."""
    # given: a correct signature, and junk under every name the scheme does not read
    timestamp = int(time.time())
    headers = sign(
        scheme=scheme,
        secret=SECRETS[scheme][-1],
        body=body,
        message_id=message_id,
        timestamp=timestamp,
    )
    headers |= {name: value for name, value in junk.items() if name.lower() not in READS[scheme]}

    # when
    message = verify(
        scheme=scheme, secrets=SECRETS[scheme], headers=headers, body=body, tolerance_seconds=300
    )

    # then
    assert message.scheme == scheme
    assert message.message_id == (None if scheme == "stripe" else message_id)
    assert message.timestamp == (None if scheme == "github" else timestamp)
