"""Unit tests of ``webhook_receiver.schemes.verify``: pure functions, no database.

Signatures are produced by signers the app did not write (the ``standardwebhooks``
library, and the Stripe and GitHub algorithms as published), so a test passes only if
the app agrees with the outside world, not merely with itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from standardwebhooks import Webhook

from tests.settings import GITHUB_SECRET, SHOP_OLD_SECRET, SHOP_SECRET, STRIPE_SECRET
from tests.support.signing import standard_headers, stripe_headers
from tests.support.verifying import TOLERANCE, verify_scheme
from webhook_receiver import schemes
from webhook_receiver.exceptions import (
    InvalidSignature,
    MalformedSignatureHeaders,
    MissingSignatureHeaders,
    TimestampOutOfTolerance,
)
from webhook_receiver.schemes import VerifiedMessage

BODY = b'{"type":"inventory.reserved","data":{"order_id":"ord_1","version":1}}'
SECRETS = (SHOP_OLD_SECRET, SHOP_SECRET)


def verify_standard(headers, body=BODY, *, secrets=SECRETS, now=None):
    return verify_scheme("standard", headers, body, secrets, now)


def verify_stripe(headers, body, *, secrets=(STRIPE_SECRET,), now=None):
    return verify_scheme("stripe", headers, body, secrets, now)


def verify_github(headers, body, *, secrets=(GITHUB_SECRET,), now=None):
    return verify_scheme("github", headers, body, secrets, now)


def library_signature(body: bytes, msg_id: str, timestamp: int, secret: str) -> str:
    """One 'v1,<base64>' entry, as the standardwebhooks library signs it."""
    return standard_headers(body, msg_id=msg_id, timestamp=timestamp, secret=secret)[
        "webhook-signature"
    ]


# --- Standard Webhooks ---------------------------------------------------------------


def test_standard_valid_signature_returns_the_message_id_and_timestamp():
    # given
    headers = standard_headers(BODY, msg_id="msg_valid", timestamp=1_700_000_000)

    # when
    message = verify_standard(headers, now=1_700_000_000)

    # then
    assert message == VerifiedMessage(
        scheme="standard", message_id="msg_valid", timestamp=1_700_000_000, secret_index=1
    )


@pytest.mark.parametrize("secret", [SHOP_OLD_SECRET, SHOP_SECRET], ids=["old", "new"])
def test_standard_rotation_accepts_a_signature_by_either_configured_secret(secret):
    headers = standard_headers(BODY, secret=secret)

    message = verify_standard(headers)

    assert message.message_id == headers["webhook-id"]
    # and it says which secret verified it (its position among the configured ones)
    assert message.secret_index == SECRETS.index(secret)


def test_standard_several_signatures_where_only_the_last_matches():
    # given: two signatures by secrets we do not hold, then one by ours
    ts, msg_id = int(time.time()), "msg_multi"
    foreign = [
        library_signature(BODY, msg_id, ts, "whsec_" + base64.b64encode(b"a" * 24).decode()),
        library_signature(BODY, msg_id, ts, "whsec_" + base64.b64encode(b"b" * 24).decode()),
    ]
    ours = library_signature(BODY, msg_id, ts, SHOP_SECRET)
    headers = standard_headers(BODY, msg_id=msg_id, timestamp=ts)
    headers["webhook-signature"] = " ".join([*foreign, ours])

    # when / then
    assert verify_standard(headers).message_id == msg_id
    # and without ours, the same foreign signatures are refused
    headers["webhook-signature"] = " ".join(foreign)
    with pytest.raises(InvalidSignature):
        verify_standard(headers)


def test_standard_a_v1a_entry_is_ignored():
    headers = standard_headers(BODY)
    valid = headers["webhook-signature"]
    # an asymmetric v1a entry (no public key of the source's verifies it) in front of the
    # valid v1 entry
    v1a = "v1a," + base64.b64encode(b"\x00" * 64).decode()
    headers["webhook-signature"] = f"{v1a} {valid}"

    assert verify_standard(headers).message_id == headers["webhook-id"]


def test_standard_a_v1a_entry_carrying_a_valid_v1_digest_does_not_count():
    # given: the correct HMAC, but labelled with another version
    headers = standard_headers(BODY)
    headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v1a,", 1)

    # then: there is no v1 entry, and a v1a entry is an Ed25519 signature or nothing
    with pytest.raises(InvalidSignature):
        verify_standard(headers)


def test_standard_tampered_body_is_an_invalid_signature():
    headers = standard_headers(BODY)
    tampered = bytearray(BODY)
    tampered[BODY.index(b"1")] = ord("2")  # one byte: version 1 -> 2

    with pytest.raises(InvalidSignature):
        verify_standard(headers, bytes(tampered))


def test_standard_wrong_secret_is_an_invalid_signature():
    stranger = "whsec_" + base64.b64encode(b"not-our-secret-at-all-24").decode()
    headers = standard_headers(BODY, secret=stranger)

    with pytest.raises(InvalidSignature):
        verify_standard(headers)


def test_standard_a_secret_that_is_not_configured_is_refused_even_if_valid_elsewhere():
    # given: signed with the old secret, but only the new one is configured
    headers = standard_headers(BODY, secret=SHOP_OLD_SECRET)

    with pytest.raises(InvalidSignature):
        verify_standard(headers, secrets=(SHOP_SECRET,))


@pytest.mark.parametrize(
    "transform", [str.upper, str.title, str.lower], ids=["upper", "title", "lower"]
)
def test_standard_header_names_in_any_case(transform):
    signed = standard_headers(BODY, msg_id="msg_any_case", timestamp=1_700_000_000)
    headers = {transform(name): value for name, value in signed.items()}

    assert verify_standard(headers, now=1_700_000_000) == VerifiedMessage(
        scheme="standard", message_id="msg_any_case", timestamp=1_700_000_000, secret_index=1
    )


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_standard_each_missing_header_is_reported(missing):
    headers = standard_headers(BODY)
    del headers[missing]

    with pytest.raises(MissingSignatureHeaders) as excinfo:
        verify_standard(headers)
    assert missing in str(excinfo.value)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_standard_an_empty_header_counts_as_missing(missing):
    headers = standard_headers(BODY)
    headers[missing] = ""

    with pytest.raises(MissingSignatureHeaders):
        verify_standard(headers)


@pytest.mark.parametrize("timestamp", ["abc", "1700000000.5", "-1700000000", "1e9", "١٧٠٠"])
def test_standard_non_integer_timestamp_is_malformed(timestamp):
    headers = standard_headers(BODY)
    headers["webhook-timestamp"] = timestamp

    with pytest.raises(MalformedSignatureHeaders):
        verify_standard(headers)


@pytest.mark.parametrize("signature", ["garbage", "v2,abc", "v1b,abc v0,abc", "   "])
def test_standard_no_v1_nor_v1a_entry_is_malformed(signature):
    headers = standard_headers(BODY)
    headers["webhook-signature"] = signature

    with pytest.raises(MalformedSignatureHeaders):
        verify_standard(headers)


@pytest.mark.parametrize(
    "encoded", ["!!!not-base64!!!", "abc", "v1,"], ids=["symbols", "bad-padding", "nested"]
)
def test_standard_undecodable_base64_is_an_invalid_signature(encoded):
    headers = standard_headers(BODY)
    headers["webhook-signature"] = f"v1,{encoded}"

    with pytest.raises(InvalidSignature):
        verify_standard(headers)


def test_standard_empty_v1_signature_is_an_invalid_signature():
    headers = standard_headers(BODY)
    headers["webhook-signature"] = "v1,"

    with pytest.raises(InvalidSignature):
        verify_standard(headers)


@pytest.mark.parametrize("offset", [-(TOLERANCE + 1), TOLERANCE + 1, -86_400, 86_400])
def test_standard_timestamp_outside_tolerance_is_refused(offset):
    # given: a genuine signature whose timestamp is `offset` seconds away from now
    now = 1_700_000_000
    headers = standard_headers(BODY, timestamp=now + offset)

    with pytest.raises(TimestampOutOfTolerance):
        verify_standard(headers, now=now)


@pytest.mark.parametrize("offset", [-TOLERANCE, TOLERANCE, 0])
def test_standard_timestamp_exactly_at_the_tolerance_boundary_is_accepted(offset):
    now = 1_700_000_000
    headers = standard_headers(BODY, timestamp=now + offset)

    assert verify_standard(headers, now=now).timestamp == now + offset


def test_standard_fractional_now_just_past_the_boundary_is_refused():
    now = 1_700_000_000
    headers = standard_headers(BODY, timestamp=now)

    with pytest.raises(TimestampOutOfTolerance):
        verify_standard(headers, now=now + TOLERANCE + 0.001)


def test_standard_signature_is_checked_before_the_timestamp():
    # an old request with a bad signature is invalid, not merely stale
    now = 1_700_000_000
    headers = standard_headers(BODY, timestamp=now - 10 * TOLERANCE)

    with pytest.raises(InvalidSignature):
        verify_standard(headers, BODY + b" ", now=now)


def test_standard_unpadded_secret_is_accepted():
    # given: a 23-byte key, whose base64 ends with one '=', shown without it
    key = bytes(range(23))
    padded = base64.b64encode(key).decode()
    assert padded.endswith("=") and not padded.endswith("==")
    unpadded = "whsec_" + padded.rstrip("=")
    headers = standard_headers(BODY, secret=unpadded)  # the library adds padding itself

    # when / then: the app accepts the unpadded secret, and agrees with the padded one
    assert verify_standard(headers, secrets=(unpadded,)).message_id == headers["webhook-id"]
    assert verify_standard(headers, secrets=("whsec_" + padded,)).message_id is not None
    assert schemes.standard_secret_key(unpadded) == key


def test_standard_signature_covers_the_raw_bytes_not_the_parsed_json():
    # given: a body with unusual whitespace and key order, signed as sent
    raw = b'{ "data" : {"version":1,   "order_id":"ord_9"},\n\t"type":"order.paid" }'
    headers = standard_headers(raw)

    # then: the raw bytes verify
    assert verify_standard(headers, raw).message_id == headers["webhook-id"]
    # and the same JSON, re-serialised (equal as data, different as bytes), does not
    reserialised = json.dumps(json.loads(raw)).encode()
    assert json.loads(reserialised) == json.loads(raw)
    with pytest.raises(InvalidSignature):
        verify_standard(headers, reserialised)


def test_standard_non_ascii_body_is_signed_as_utf8_bytes():
    raw = '{"type":"note","data":{"text":"Zürich — 東京"}}'.encode()
    headers = standard_headers(raw)

    assert verify_standard(headers, raw).message_id == headers["webhook-id"]


# --- the app's own signer, checked by an independent verifier -------------------------


def test_app_signer_output_verifies_with_the_standardwebhooks_library():
    # given
    ts = int(time.time())
    headers = schemes.sign(
        scheme="standard", secret=SHOP_SECRET, body=BODY, message_id="msg_cross", timestamp=ts
    )

    # when: an independent implementation verifies it
    payload = Webhook(SHOP_SECRET).verify(BODY, headers)

    # then
    assert payload == json.loads(BODY)
    assert headers["webhook-id"] == "msg_cross"
    assert headers["webhook-timestamp"] == str(ts)


def test_app_signer_and_library_signer_produce_the_same_signature():
    ts = 1_700_000_000
    ours = schemes.sign(
        scheme="standard", secret=SHOP_SECRET, body=BODY, message_id="msg_same", timestamp=ts
    )
    theirs = standard_headers(BODY, msg_id="msg_same", timestamp=ts)

    assert ours == theirs


def test_app_signer_stripe_and_github_round_trip_through_verify():
    ts = int(time.time())
    stripe = schemes.sign(
        scheme="stripe", secret=STRIPE_SECRET, body=BODY, message_id="evt_1", timestamp=ts
    )
    github = schemes.sign(
        scheme="github", secret=GITHUB_SECRET, body=BODY, message_id="d-1", timestamp=ts
    )

    assert stripe == stripe_headers(BODY, timestamp=ts)
    assert verify_stripe(stripe, BODY).timestamp == ts
    assert verify_github(github, BODY).message_id == "d-1"


# --- Stripe --------------------------------------------------------------------------

STRIPE_VECTOR_SECRET = "whsec_test_secret"
STRIPE_VECTOR_T = 1_700_000_000
STRIPE_VECTOR_PAYLOAD = b'{"id":"evt_1","type":"ping"}'
# HMAC-SHA256("whsec_test_secret", '1700000000.{"id":"evt_1","type":"ping"}'), hex;
# computed once and cross-checked with `openssl dgst -sha256 -hmac`.
STRIPE_VECTOR_V1 = "74a11abdd08483d064a2a1571e7881b084c522f9f3ccd0b800ec8c74aba47fc2"


def test_stripe_published_algorithm_matches_the_pinned_vector():
    # the published algorithm: HMAC_SHA256(secret, f"{t}.{payload}"), hex
    computed = hmac.new(
        STRIPE_VECTOR_SECRET.encode(),
        f"{STRIPE_VECTOR_T}.{STRIPE_VECTOR_PAYLOAD.decode()}".encode(),
        hashlib.sha256,
    ).hexdigest()

    assert computed == STRIPE_VECTOR_V1


def test_stripe_known_vector_verifies():
    headers = {"Stripe-Signature": f"t={STRIPE_VECTOR_T},v1={STRIPE_VECTOR_V1}"}

    message = verify_stripe(
        headers, STRIPE_VECTOR_PAYLOAD, secrets=(STRIPE_VECTOR_SECRET,), now=STRIPE_VECTOR_T
    )

    assert message == VerifiedMessage(
        scheme="stripe", message_id=None, timestamp=STRIPE_VECTOR_T, secret_index=0
    )


def test_stripe_known_vector_with_another_timestamp_is_invalid():
    # the timestamp is part of the signed string
    headers = {"Stripe-Signature": f"t={STRIPE_VECTOR_T + 1},v1={STRIPE_VECTOR_V1}"}

    with pytest.raises(InvalidSignature):
        verify_stripe(
            headers, STRIPE_VECTOR_PAYLOAD, secrets=(STRIPE_VECTOR_SECRET,), now=STRIPE_VECTOR_T
        )


def test_stripe_several_v1_entries_where_one_matches():
    # given: as during a Stripe secret roll, several v1 entries, plus a v0
    good = stripe_headers(STRIPE_VECTOR_PAYLOAD, timestamp=STRIPE_VECTOR_T)["Stripe-Signature"]
    good_v1 = good.split("v1=")[1]
    header = f"t={STRIPE_VECTOR_T},v1={'0' * 64},v1={good_v1},v1={'f' * 64},v0={'a' * 64}"

    message = verify_stripe(
        {"Stripe-Signature": header}, STRIPE_VECTOR_PAYLOAD, now=STRIPE_VECTOR_T
    )

    assert message.timestamp == STRIPE_VECTOR_T


def test_stripe_spaces_after_commas_are_tolerated():
    good = stripe_headers(STRIPE_VECTOR_PAYLOAD, timestamp=STRIPE_VECTOR_T)["Stripe-Signature"]
    spaced = good.replace(",", ", ")

    assert (
        verify_stripe(
            {"stripe-signature": spaced}, STRIPE_VECTOR_PAYLOAD, now=STRIPE_VECTOR_T
        ).timestamp
        == STRIPE_VECTOR_T
    )


def test_stripe_only_v1_entries_that_do_not_match_is_invalid():
    header = f"t={STRIPE_VECTOR_T},v1={'0' * 64},v1={'1' * 64}"

    with pytest.raises(InvalidSignature):
        verify_stripe({"Stripe-Signature": header}, STRIPE_VECTOR_PAYLOAD, now=STRIPE_VECTOR_T)


def test_stripe_a_v0_entry_alone_is_malformed():
    # v0 is Stripe's test-mode scheme; even the correct digest under v0 does not count
    v0 = hmac.new(
        STRIPE_SECRET.encode(), f"{STRIPE_VECTOR_T}.".encode() + BODY, hashlib.sha256
    ).hexdigest()
    headers = {"Stripe-Signature": f"t={STRIPE_VECTOR_T},v0={v0}"}

    with pytest.raises(MalformedSignatureHeaders):
        verify_stripe(headers, BODY, now=STRIPE_VECTOR_T)


def test_stripe_missing_t_is_malformed():
    good = stripe_headers(BODY, timestamp=STRIPE_VECTOR_T)["Stripe-Signature"]
    without_t = good.split(",", 1)[1]
    assert without_t.startswith("v1=")

    with pytest.raises(MalformedSignatureHeaders):
        verify_stripe({"Stripe-Signature": without_t}, BODY, now=STRIPE_VECTOR_T)


def test_stripe_non_integer_t_is_malformed():
    headers = {"Stripe-Signature": f"t=soon,v1={'0' * 64}"}

    with pytest.raises(MalformedSignatureHeaders):
        verify_stripe(headers, BODY)


def test_stripe_missing_header_is_reported():
    with pytest.raises(MissingSignatureHeaders):
        verify_stripe({"Content-Type": "application/json"}, BODY)


def test_stripe_tampered_body_is_invalid():
    headers = stripe_headers(BODY, timestamp=STRIPE_VECTOR_T)

    with pytest.raises(InvalidSignature):
        verify_stripe(headers, BODY.replace(b"ord_1", b"ord_2"), now=STRIPE_VECTOR_T)


@pytest.mark.parametrize(
    ("offset", "accepted"),
    [(-TOLERANCE, True), (TOLERANCE, True), (-(TOLERANCE + 1), False), (TOLERANCE + 1, False)],
)
def test_stripe_tolerance_applies(offset, accepted):
    now = 1_700_000_000
    headers = stripe_headers(BODY, timestamp=now + offset)

    if accepted:
        assert verify_stripe(headers, BODY, now=now).timestamp == now + offset
    else:
        with pytest.raises(TimestampOutOfTolerance):
            verify_stripe(headers, BODY, now=now)


# --- GitHub --------------------------------------------------------------------------

GITHUB_VECTOR_PAYLOAD = b"Hello, World!"
GITHUB_VECTOR_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_published_vector_verifies():
    # the example from GitHub's "Validating webhook deliveries" documentation
    headers = {
        "X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE,
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
    }

    message = verify_github(headers, GITHUB_VECTOR_PAYLOAD, secrets=("It's a Secret to Everybody",))

    assert message == VerifiedMessage(
        scheme="github",
        message_id="72d3162e-cc78-11e3-81ab-4c9367dc0958",
        timestamp=None,
        body_sha256=hashlib.sha256(GITHUB_VECTOR_PAYLOAD).hexdigest(),
        secret_index=0,
    )


@pytest.mark.parametrize("now", [0, 1_700_000_000, 4_000_000_000])
def test_github_has_no_timestamp_so_any_now_passes(now):
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}

    message = verify_github(headers, GITHUB_VECTOR_PAYLOAD, now=now)

    assert message.timestamp is None
    assert message.message_id is None  # no X-GitHub-Delivery header sent


def test_github_wrong_prefix_is_malformed():
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE.replace("sha256=", "sha1=")}

    with pytest.raises(MalformedSignatureHeaders):
        verify_github(headers, GITHUB_VECTOR_PAYLOAD)


@pytest.mark.parametrize("value", ["sha256=", "757107ea0eb2509fc211221cce984b8a", "sha256"])
def test_github_unparseable_signature_is_malformed(value):
    with pytest.raises(MalformedSignatureHeaders):
        verify_github({"X-Hub-Signature-256": value}, GITHUB_VECTOR_PAYLOAD)


def test_github_only_the_legacy_sha1_header_is_missing_the_sha256_one():
    legacy = hmac.new(GITHUB_SECRET.encode(), GITHUB_VECTOR_PAYLOAD, hashlib.sha1).hexdigest()

    with pytest.raises(MissingSignatureHeaders):
        verify_github({"X-Hub-Signature": f"sha1={legacy}"}, GITHUB_VECTOR_PAYLOAD)


def test_github_tampered_body_is_invalid():
    headers = {"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}

    with pytest.raises(InvalidSignature):
        verify_github(headers, b"Hello, World?")


def test_github_header_names_in_any_case():
    headers = {
        "x-hub-signature-256": GITHUB_VECTOR_SIGNATURE,
        "X-GITHUB-DELIVERY": "delivery-1",
    }

    assert verify_github(headers, GITHUB_VECTOR_PAYLOAD).message_id == "delivery-1"


# --- constant-time comparison --------------------------------------------------------


@pytest.fixture
def compare_calls(monkeypatch):
    """Record every hmac.compare_digest call the verifier makes."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(schemes.base.hmac, "compare_digest", counting)
    return calls


def test_every_secret_is_compared_with_every_signature_without_early_exit(compare_calls):
    # given: 2 secrets and 3 signatures, the very first pair matching
    ts, msg_id = int(time.time()), "msg_ct"
    first = library_signature(BODY, msg_id, ts, SHOP_OLD_SECRET)
    others = [
        "v1," + base64.b64encode(b"\x01" * 32).decode(),
        "v1," + base64.b64encode(b"\x02" * 32).decode(),
    ]
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join([first, *others]),
    }

    # when
    message = verify_standard(headers, secrets=(SHOP_OLD_SECRET, SHOP_SECRET))

    # then: accepted, and all 2 x 3 pairs were compared with compare_digest
    assert message.message_id == msg_id
    assert len(compare_calls) == 6
    assert sum(a == b for a, b in compare_calls) == 1
    assert compare_calls[0][0] == compare_calls[0][1]  # the first pair is the match


def test_a_refused_signature_is_also_compared_in_constant_time(compare_calls):
    headers = {"Stripe-Signature": f"t={STRIPE_VECTOR_T},v1={'0' * 64},v1={'1' * 64}"}

    with pytest.raises(InvalidSignature):
        verify_stripe(
            headers, STRIPE_VECTOR_PAYLOAD, secrets=("s1", "s2", "s3"), now=STRIPE_VECTOR_T
        )

    assert len(compare_calls) == 6


def test_github_comparison_goes_through_compare_digest(compare_calls):
    verify_github({"X-Hub-Signature-256": GITHUB_VECTOR_SIGNATURE}, GITHUB_VECTOR_PAYLOAD)

    assert compare_calls == [(GITHUB_VECTOR_SIGNATURE[len("sha256=") :].encode(),) * 2]
