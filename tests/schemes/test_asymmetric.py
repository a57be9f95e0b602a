"""Standard Webhooks ``v1a``: Ed25519 signatures by ``whsk_`` signing keys, verified with
``whpk_`` public keys. Pure: no database.

The app's Ed25519 (``cryptography``) is checked against an implementation it did not
write: RFC 8032's algorithm in plain Python (tests/support/ed25519_rfc8032.py), the RFC's
own test vector, and the signature the Standard Webhooks reference library publishes.
"""

from __future__ import annotations

import base64
import shlex
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from hypothesis import given
from hypothesis import strategies as st

from tests.settings import SHOP_SECRET
from tests.support import ed25519_rfc8032 as rfc8032
from tests.support.fuzzing import PURE
from tests.support.signing import standard_headers
from tests.support.verifying import verify_scheme
from webhook_receiver.checks import check_webhook_receiver_settings
from webhook_receiver.exceptions import (
    InvalidSignature,
    MalformedSignatureHeaders,
    RejectedRequest,
)
from webhook_receiver.outbound.signing_secrets import destination_secret_problem
from webhook_receiver.schemes import sign
from webhook_receiver.schemes import standard_keys as keys

BODY = b'{"type":"order.paid","data":{"order_id":"ord_1","version":1}}'
seeds = st.binary(min_size=32, max_size=32)


def signing_key_of(seed: bytes) -> str:
    return "whsk_" + base64.b64encode(seed).decode()


def public_key_of(public: bytes) -> str:
    return "whpk_" + base64.b64encode(public).decode()


def signed(secret: str, body: bytes = BODY, message_id: str = "msg_1", timestamp: int = 0):
    timestamp = timestamp or int(time.time())
    return sign(
        scheme="standard", secret=secret, body=body, message_id=message_id, timestamp=timestamp
    )


def verify_standard(headers, secrets, body=BODY, now=None):
    return verify_scheme("standard", headers, body, secrets, now)


def presented(headers: dict[str, str]) -> bytes:
    version, encoded = headers["webhook-signature"].split(",", 1)
    assert version == "v1a"
    return base64.b64decode(encoded)


# --- published vectors --------------------------------------------------------------------


RFC8032_TEST_1 = {
    # RFC 8032, section 7.1, TEST 1 (the empty message)
    "seed": "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
    "public": "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
    "signature": "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bac"
    "c61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
}


def test_rfc8032_test_1_holds_for_ours_and_for_the_reference():
    seed = bytes.fromhex(RFC8032_TEST_1["seed"])
    public = bytes.fromhex(RFC8032_TEST_1["public"])
    signature = bytes.fromhex(RFC8032_TEST_1["signature"])
    secret = signing_key_of(seed)

    assert keys.public_key_of(secret) == public_key_of(public)
    assert keys.sign(secret, b"") == signature
    assert keys.verify(public_key_of(public), b"", signature)
    # the reference agrees with the RFC: it is a fair judge of the tests below
    assert rfc8032.public_key(seed) == public
    assert rfc8032.sign(seed, b"") == signature
    assert rfc8032.verify(public, b"", signature)


def test_the_standard_webhooks_reference_librarys_v1a_signature():
    # From standard-webhooks/standard-webhooks, libraries/go/webhook_asymmetric_test.go
    # (TestAsymmetricWebhookSign, commit 5fb2ce9369bd9533ed635c0c84f8d7b0dac3a5bf): the Go
    # library's key takes the base64 seed with or without whsk_; ours requires the prefix.
    secret = "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk="
    body = b'{"test": 2432232314}'
    headers = sign(
        scheme="standard",
        secret=secret,
        body=body,
        message_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
        timestamp=1614265330,
    )

    assert headers["webhook-signature"] == (
        "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag=="
    )
    message = verify_standard(headers, (keys.public_key_of(secret),), body=body, now=1614265330)
    assert message.message_id == "msg_p5jXN8AQM9LWM0D4loKWxJek"


# --- against the reference ----------------------------------------------------------------


@PURE
@given(seed=seeds, body=st.binary(max_size=512), message_id=st.text(min_size=1, max_size=80))
def test_the_reference_verifies_our_signature(seed, body, message_id):
    timestamp = int(time.time())
    headers = signed(signing_key_of(seed), body, message_id, timestamp)

    content = f"{message_id}.{timestamp}.".encode("utf-8", "surrogatepass") + body
    assert rfc8032.verify(rfc8032.public_key(seed), content, presented(headers))


@PURE
@given(seed=seeds, body=st.binary(max_size=512), message_id=st.text(min_size=1, max_size=80))
def test_we_verify_the_references_signature(seed, body, message_id):
    timestamp = int(time.time())
    content = f"{message_id}.{timestamp}.".encode("utf-8", "surrogatepass") + body
    signature = base64.b64encode(rfc8032.sign(seed, content)).decode()
    headers = {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1a,{signature}",
    }

    message = verify_standard(headers, (public_key_of(rfc8032.public_key(seed)),), body=body)

    assert message.message_id == message_id


# --- keys ---------------------------------------------------------------------------------


@PURE
@given(seed=seeds)
def test_random_keys_round_trip(seed):
    secret = signing_key_of(seed)
    public = keys.public_key_of(secret)

    assert public == public_key_of(rfc8032.public_key(seed))
    assert verify_standard(signed(secret), (public,)).scheme == "standard"
    # the 64-byte form (seed, then public key) is the same key; unpadded base64 is accepted
    long_form = signing_key_of(seed + rfc8032.public_key(seed))
    assert (
        keys.sign(long_form, b"m") == keys.sign(secret, b"m") == keys.sign(secret.rstrip("="), b"m")
    )


def test_new_signing_keys_are_random_seeds_whose_public_key_verifies():
    first, second = keys.new_signing_key(), keys.new_signing_key()

    assert first != second
    assert len(base64.b64decode(first.removeprefix("whsk_"))) == 32
    assert verify_standard(signed(first), (keys.public_key_of(first),)).scheme == "standard"
    assert keys.public_keys_of([SHOP_SECRET, first, second]) == [
        keys.public_key_of(first),
        keys.public_key_of(second),
    ]


@pytest.mark.parametrize(
    "secret",
    [
        "whsk_",
        "whsk_not base64!",
        "whsk_" + base64.b64encode(b"x" * 31).decode(),
        "whsk_" + base64.b64encode(b"x" * 33).decode(),
        # a 64-byte form whose public half is not the seed's
        "whsk_" + base64.b64encode(b"x" * 64).decode(),
    ],
)
def test_a_malformed_signing_key_is_refused(secret):
    with pytest.raises(ValueError):
        keys.signing_key(secret)
    assert destination_secret_problem(secret) == "is not 'whsk_' + base64 of a 32-byte Ed25519 seed"


def test_a_public_key_cannot_sign_nor_be_a_destinations_secret():
    public = keys.public_key_of(keys.new_signing_key())

    with pytest.raises(ValueError, match="cannot sign"):
        signed(public)
    assert "cannot sign" in destination_secret_problem(public)
    assert destination_secret_problem(SHOP_SECRET) is None
    assert destination_secret_problem(keys.new_signing_key()) is None
    assert destination_secret_problem("sk_live_abc") is not None


# --- verification -------------------------------------------------------------------------


SIGNER = signing_key_of(bytes(range(32)))
PUBLIC = keys.public_key_of(SIGNER)


@PURE
@given(
    part=st.sampled_from(["body", "webhook-id", "webhook-timestamp"]),
    change=st.binary(min_size=1, max_size=16),
)
def test_a_tampered_body_id_or_timestamp_never_verifies(part, change):
    now = int(time.time())
    headers = signed(SIGNER, timestamp=now)
    body = BODY
    if part == "body":
        body = BODY + change
    elif part == "webhook-id":
        headers["webhook-id"] += change.hex()
    else:  # still within the tolerance: only the signature can refuse it
        headers["webhook-timestamp"] = str(now - 1 - change[0] % 60)

    with pytest.raises(InvalidSignature):
        verify_standard(headers, (PUBLIC, SHOP_SECRET), body=body)


def test_a_source_with_both_kinds_verifies_either_signature():
    secrets = (SHOP_SECRET, PUBLIC)
    both = signed(SIGNER)
    both["webhook-signature"] += (
        " "
        + standard_headers(
            BODY,
            msg_id=both["webhook-id"],
            timestamp=int(both["webhook-timestamp"]),
        )["webhook-signature"]
    )

    assert verify_standard(standard_headers(BODY, msg_id="msg_1"), secrets).message_id == "msg_1"
    assert verify_standard(signed(SIGNER), secrets).message_id == "msg_1"
    assert verify_standard(both, secrets).message_id == "msg_1"
    # each kind only against its own: a v1a by a key the source was not given fails
    with pytest.raises(InvalidSignature):
        verify_standard(signed(SIGNER), (SHOP_SECRET,))
    with pytest.raises(InvalidSignature):
        verify_standard(standard_headers(BODY), (PUBLIC,))
    with pytest.raises(InvalidSignature):
        verify_standard(signed(keys.new_signing_key()), secrets)


def test_a_signing_key_among_a_sources_secrets_verifies_nothing():
    # the source should hold the public key; the check (below) says so
    with pytest.raises(InvalidSignature):
        verify_standard(signed(SIGNER), (SIGNER,))


@pytest.mark.parametrize(
    "value",
    [
        "v1a,",
        "v1a,AAAA",  # decodes, but is no 64-byte signature
        "v1a,not*base64",
        "v1a," + base64.b64encode(bytes(64)).decode(),
    ],
)
def test_a_malformed_v1a_signature_matches_nothing(value):
    headers = {**signed(SIGNER), "webhook-signature": value}

    with pytest.raises(InvalidSignature):
        verify_standard(headers, (PUBLIC,))


def test_more_v1a_entries_than_any_sender_sends_are_malformed():
    # each would cost an Ed25519 verification per public key: a header of them is work
    # an unauthenticated peer could make the receiver do
    good = signed(SIGNER)
    junk = "v1a," + base64.b64encode(keys.sign(SIGNER, b"another message")).decode()
    at_most = " ".join([junk] * (keys.MAX_SIGNATURES - 1) + [good["webhook-signature"]])
    too_many = f"{junk} {at_most}"

    assert verify_standard({**good, "webhook-signature": at_most}, (PUBLIC,)).message_id
    with pytest.raises(MalformedSignatureHeaders, match="more than 16 'v1a' entries"):
        verify_standard({**good, "webhook-signature": too_many}, (PUBLIC,))


def test_a_header_with_neither_version_is_malformed():
    headers = {**signed(SIGNER), "webhook-signature": "v2,abc"}

    with pytest.raises(MalformedSignatureHeaders, match="'v1a,<base64>'"):
        verify_standard(headers, (PUBLIC,))


@PURE
@given(
    value=st.lists(
        st.tuples(st.sampled_from(["v1a", "v1", "v2"]), st.text(max_size=100)), max_size=4
    ).map(lambda entries: " ".join(f"{v},{s}" for v, s in entries))
)
def test_any_signature_header_is_verified_or_rejected(value):
    headers = {**signed(SIGNER), "webhook-signature": value}
    try:
        verify_standard(headers, (PUBLIC, SHOP_SECRET))
    except RejectedRequest:
        return
    raise AssertionError("an unsigned header verified")


# --- the system check ---------------------------------------------------------------------


def with_source_secrets(settings, *secrets: str) -> None:
    sources = {"keyed": {"SCHEME": "standard", "SECRETS": list(secrets)}}
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}


def e002(settings) -> list[str]:
    return [m.msg for m in check_webhook_receiver_settings() if m.id == "webhook_receiver.E002"]


def test_public_keys_beside_a_secret_are_a_valid_source(settings):
    with_source_secrets(settings, SHOP_SECRET, PUBLIC, PUBLIC.rstrip("="))

    assert e002(settings) == []


def test_a_malformed_public_key_or_a_signing_key_is_a_system_check_error(settings):
    with_source_secrets(
        settings, "whpk_" + base64.b64encode(bytes(31)).decode(), SIGNER, "whpk_***"
    )

    assert e002(settings) == [
        "Secret #1 of source 'keyed' is not 'whpk_' + base64 of a 32-byte Ed25519 public key.",
        "Secret #2 of source 'keyed' is a private signing key (whsk_): give the source the "
        "sender's public key (whpk_), and keep the signing key with the sender.",
        "Secret #3 of source 'keyed' is not 'whpk_' + base64 of a 32-byte Ed25519 public key.",
    ]


# --- the demo's send_test_webhook -----------------------------------------------------------


def test_send_test_webhook_signs_with_a_given_signing_key_never_with_a_public_key(settings):
    with_source_secrets(settings, PUBLIC)

    with pytest.raises(CommandError, match="public keys \\(whpk_\\) only verify"):
        call_command("send_test_webhook", "--source", "keyed", "--print-curl", stdout=StringIO())
    out = StringIO()
    call_command(
        "send_test_webhook", "--source", "keyed", "--secret", SIGNER, "--print-curl", stdout=out
    )

    words = shlex.split(out.getvalue())
    headers = dict(words[n + 1].split(": ", 1) for n, w in enumerate(words) if w == "-H")
    body = words[words.index("--data-binary") + 1].encode()
    assert headers["webhook-signature"].startswith("v1a,")
    assert verify_standard(headers, (PUBLIC,), body=body).scheme == "standard"
