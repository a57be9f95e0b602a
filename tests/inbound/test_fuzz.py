"""Fuzzing every parser an unauthenticated request reaches: the signature schemes, the
values made storable, the body reader, and the endpoint itself. Nothing may escape but a
documented rejection (a ``RejectedRequest``), no request may get a 5xx, and every
request that reaches the view leaves exactly one audit record (or, for a refusal beyond
the audit bound, one count in its minute's rejection tally)."""

from __future__ import annotations

import base64
import io
import ipaddress
import json
import time
from types import SimpleNamespace
from urllib.parse import quote

import pytest
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.settings import (
    GITHUB_SECRET,
    SHOP_OLD_SECRET,
    SHOP_SECRET,
    STRIPE_SECRET,
    WEBHOOK_RECEIVER,
)
from tests.support.signing import as_meta
from webhook_receiver.core import storable
from webhook_receiver.exceptions import PayloadTooLarge, RejectedRequest
from webhook_receiver.inbound.audit import client_address
from webhook_receiver.inbound.receive import read_limited_body
from webhook_receiver.inbound.views import _content_length
from webhook_receiver.models import RejectionTally, RequestAudit
from webhook_receiver.schemes import VerifiedMessage, sign, verify

PURE = settings(max_examples=200, deadline=None)
THROUGH_THE_DATABASE = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SECRETS = {
    "standard": (SHOP_OLD_SECRET, SHOP_SECRET),
    "stripe": (STRIPE_SECRET,),
    "github": (GITHUB_SECRET,),
}
# the headers each scheme reads (lower case, as verify() hands them on)
READS = {
    "standard": (
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "svix-id",
        "svix-timestamp",
        "svix-signature",
    ),
    "stripe": ("stripe-signature",),
    "github": ("x-hub-signature-256", "x-github-delivery"),
}
SIGNATURE_HEADERS = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "Stripe-Signature",
    "X-Hub-Signature-256",
    "X-GitHub-Delivery",
]
SOURCES = {slug: options["SCHEME"] for slug, options in WEBHOOK_RECEIVER["SOURCES"].items()}
SECRET_OF = {
    "shop": SHOP_SECRET,
    "keyed": SHOP_SECRET,
    "small": SHOP_SECRET,
    "stripe": STRIPE_SECRET,
    "github": GITHUB_SECRET,
}
DOCUMENTED_STATUSES = {200, 202, 400, 401, 404, 413}
SHOP_TYPES = [
    "inventory.reserved",
    "inventory.released",
    "order.paid",
    "order.cancelled",
    "order.fulfilled",
]


# --- strategies --------------------------------------------------------------------------


# characters and fragments the parsers split on or choke on, drawn on purpose
NASTY = [
    "\x00",
    "\n",
    "\r",
    "\t",
    "\x7f",
    "\x85",
    "\xa0",
    "\xe9",
    "\ud800",
    "\udfff",
    "\u2028",
    "\ufeff",
    "\u0665",  # ARABIC-INDIC DIGIT FIVE: isdigit(), and int() takes it
    "\xb2",  # SUPERSCRIPT TWO: isdigit(), and int() refuses it
    ",",
    " ",
    "=",
    "v1",
    "v1,",
    "t=",
    "v1=",
    "sha256=",
    "whsec_",
]
# Alphabets, by name: all of unicode, lone surrogates included (st.text() leaves them
# out by default); what a WSGI (or ASGI) server can hand Django as a header value, each
# byte decoded as latin-1, NUL and control characters included (PEP 3333); and a path
# segment's, which cannot hold "/".
ALPHABETS = {
    "any": (st.characters(codec=None), NASTY),
    "latin1": (st.characters(max_codepoint=0xFF), [n for n in NASTY if max(map(ord, n)) <= 0xFF]),
    "segment": (st.characters(codec=None, exclude_characters="/"), NASTY),
}
LATIN1 = ALPHABETS["latin1"][0]
DIGITS = "0123456789"
# fixed once: a strategy's bounds must not move between the examples of one test
NOW = int(time.time())


def texts(alphabet: str, *, max_size: int = 40) -> st.SearchStrategy[str]:
    """Text from one of the ``ALPHABETS``, often spliced with the fragments parsers trip on."""
    chars, nasty = ALPHABETS[alphabet]
    return st.one_of(
        st.text(chars, max_size=max_size),
        st.lists(st.sampled_from(nasty) | st.text(chars, max_size=6), max_size=max_size // 4).map(
            "".join
        ),
    )


def numbers() -> st.SearchStrategy[str]:
    """Digit strings: around now, around the 32-digit cut-off, and absurdly long."""
    return st.one_of(
        st.integers(min_value=NOW - 1000, max_value=NOW + 1000).map(str),
        st.text(DIGITS, min_size=1, max_size=40),
        st.integers(min_value=0, max_value=10_000).map(lambda n: "9" * n),
        # around the 4300 digits past which int() refuses a string
        st.integers(min_value=4290, max_value=4310).map(lambda n: "1" + "0" * n),
        st.integers(min_value=-(10**20), max_value=-1).map(str),
    )


def signature_lists(alphabet: str) -> st.SearchStrategy[str]:
    """``v1,<base64>`` (Standard Webhooks), ``t=..,v1=<hex>`` (Stripe) and
    ``sha256=<hex>`` (GitHub) entries, good-looking or not, joined as senders and
    servers join them."""
    base64ish = st.binary(max_size=48).map(lambda b: base64.b64encode(b).decode()) | texts(
        alphabet, max_size=60
    )
    hexish = st.binary(max_size=40).map(bytes.hex) | texts(alphabet, max_size=70)
    entry = st.one_of(
        st.tuples(
            st.sampled_from(["v1", "v1", "v1a", "v2", "v", ""]) | texts(alphabet, max_size=4),
            base64ish,
        ).map(",".join),
        st.tuples(
            st.sampled_from(["t", "v1", "v0", "sha256", "sha1", ""]) | texts(alphabet, max_size=4),
            hexish | numbers(),
        ).map("=".join),
    )
    separators = st.sampled_from([" ", ",", ", ", "  ", "\t", "", " , "])
    return st.tuples(st.lists(entry, max_size=6), separators).map(lambda t: t[1].join(t[0]))


def header_values(alphabet: str) -> st.SearchStrategy[str]:
    return st.one_of(texts(alphabet), numbers(), signature_lists(alphabet))


def header_names(alphabet: str, *, extra: tuple[str, ...] = ()):
    known = st.sampled_from(SIGNATURE_HEADERS + list(extra))
    return st.one_of(
        known,
        known.map(str.upper),
        known.map(str.lower),
        st.text(ALPHABETS[alphabet][0], min_size=1, max_size=20),
    )


def fuzzed_headers(alphabet: str, *, extra: tuple[str, ...] = ()):
    return st.dictionaries(header_names(alphabet, extra=extra), header_values(alphabet), max_size=8)


@st.composite
def spliced(draw, value: str, alphabet: str) -> str:
    """``value`` with a stretch of it replaced by fuzz: near misses of a good header.
    (Positions are sampled, not drawn as integers, which would favour the start.)"""
    start = draw(st.sampled_from(range(len(value) + 1)))
    end = draw(st.sampled_from(range(start, min(len(value), start + 8) + 1)))
    return value[:start] + draw(texts(alphabet, max_size=8).filter(bool)) + value[end:]


@st.composite
def requests(draw, scheme: str, alphabet: str, *, extra_names=()):
    """A body and its headers: nothing, or a signature (good, by a stranger's secret, or
    over an absurd timestamp); then any of its headers changed, and fuzz laid over every
    name the schemes read and others."""
    body = draw(st.binary(max_size=2048))
    headers: dict[str, str] = {}
    start = draw(st.sampled_from(["signed", "stranger", "any time", "nothing"]))
    if start != "nothing":
        secret = SECRETS[scheme][-1]
        if start == "stranger":
            secret = {"standard": "whsec_" + base64.b64encode(b"x" * 24).decode()}.get(
                scheme, "not the secret"
            )
        timestamp = NOW
        if start == "any time":
            timestamp = draw(st.integers(min_value=0, max_value=10**40))
        message_id = draw(st.text(LATIN1, min_size=1, max_size=300))
        headers = sign(
            scheme=scheme, secret=secret, body=body, message_id=message_id, timestamp=timestamp
        )
    for name in sorted(headers):
        change = draw(st.sampled_from(["keep", "keep", "drop", "splice", "append", "replace"]))
        if change == "drop":
            del headers[name]
        elif change != "keep":
            headers[name] = draw(_changed(headers[name], change, alphabet))
    own = st.sampled_from(READS[scheme]).flatmap(lambda n: st.sampled_from([n, n.upper()]))
    headers.update(draw(st.dictionaries(own, header_values(alphabet), max_size=3)))
    headers.update(draw(fuzzed_headers(alphabet, extra=extra_names)))
    return headers, body


@st.composite
def near_misses(draw, scheme: str, alphabet: str, *, secret: str | None = None):
    """A good signature with one of its headers spliced, given a second entry, replaced
    or dropped, and junk under names no scheme reads: the input that gets furthest into
    the parsers before it is refused."""
    body = draw(st.binary(max_size=2048))
    message_id = draw(st.text(LATIN1, min_size=1, max_size=300))
    headers = sign(
        scheme=scheme,
        secret=secret or SECRETS[scheme][-1],
        body=body,
        message_id=message_id,
        timestamp=NOW,
    )
    name = draw(st.sampled_from(sorted(headers)))
    change = draw(st.sampled_from(["splice", "splice", "append", "append", "replace", "drop"]))
    if change == "drop":
        del headers[name]
    else:
        headers[name] = draw(_changed(headers[name], change, alphabet))
    reads = {n.lower() for n in SIGNATURE_HEADERS}
    junk = draw(fuzzed_headers(alphabet))
    headers |= {n: v for n, v in junk.items() if n.lower() not in reads}
    return headers, body


def _changed(value: str, change: str, alphabet: str) -> st.SearchStrategy[str]:
    if change == "splice":
        return spliced(value, alphabet)
    if change == "append":
        return appended(value, alphabet)
    return header_values(alphabet)


@st.composite
def appended(draw, value: str, alphabet: str) -> str:
    """``value`` and a second header line, joined as the server joins repeated headers."""
    return value + draw(st.sampled_from([",", ", ", " "])) + draw(signature_lists(alphabet))


def json_values(alphabet: str):
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        texts(alphabet, max_size=30),
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(texts(alphabet, max_size=10), inner, max_size=4)
        ),
        max_leaves=12,
    )


@st.composite
def event_bodies(draw) -> bytes:
    """JSON-ish bodies a verified sender might send: shop events with arbitrary data,
    arbitrary JSON, JSON whose strings are not even UTF-8, and raw bytes."""
    kind = draw(st.sampled_from(["event", "json", "raw"]))
    if kind == "raw":
        return draw(st.binary(max_size=2048))
    values = json_values("any")
    if kind == "event":
        line = st.fixed_dictionaries({}, optional={"sku": values, "quantity": values})
        data = st.fixed_dictionaries(
            {},
            optional={
                "order_id": values,
                "id": values,
                "version": values | st.integers(min_value=0, max_value=2**64),
                "lines": st.lists(line | values, max_size=3) | values,
            },
        )
        value = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "type": st.sampled_from(SHOP_TYPES) | values,
                    "id": values,
                    "data": data | values,
                },
            )
        )
    else:
        value = draw(values)
    ensure_ascii = draw(st.booleans())
    # without ensure_ascii, a lone surrogate becomes bytes that are not UTF-8 at all
    return json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


def quoted_slugs() -> st.SearchStrategy[str]:
    """A source slug as it appears in the path: any text or bytes without "/" (which
    the route refuses before the view), percent-encoded, surrogates as their bytes."""
    as_text = texts("segment", max_size=120).map(lambda slug: slug.encode("utf-8", "surrogatepass"))
    as_bytes = st.binary(max_size=60).filter(lambda raw: b"/" not in raw)
    slugs = st.one_of(as_text, as_bytes, st.sampled_from(sorted(SOURCES)).map(str.encode))
    return slugs.filter(bool).map(lambda raw: quote(raw, safe=""))


def request_meta(body: bytes) -> st.SearchStrategy[dict[str, object]]:
    """What the server adds beside the headers. The input is a stream that ends where
    the body ends (as a server's does once the client stops sending), so that a lying
    Content-Length meets the end of the data, not the test client's own assertion."""
    junk_lengths = st.one_of(
        st.just(""),
        numbers(),
        st.sampled_from(["-1", "+5", " 5 ", "1_0", "0x10", "1e3", "\u0665", "\xb2", "5\x00"]),
        texts("latin1", max_size=12),
    )
    # the honest length, mostly: the signature headers are what is fuzzed most
    content_lengths = st.integers(min_value=0, max_value=2).flatmap(
        lambda n: st.just(str(len(body))) if n else junk_lengths
    )
    content_types = st.sampled_from(
        [
            "application/json",
            "multipart/form-data; boundary=xyz",
            "application/x-www-form-urlencoded",
            "text/plain; charset=no-such-charset",
            "",
        ]
    ) | texts("latin1", max_size=40)
    return st.fixed_dictionaries(
        {
            "CONTENT_LENGTH": content_lengths,
            "CONTENT_TYPE": content_types,
            "wsgi.input": st.just(body).map(io.BytesIO),
        },
        optional={
            "wsgi.input_terminated": st.booleans(),
            "REMOTE_ADDR": st.sampled_from(["127.0.0.1", "::1", "fe80::1%eth0", ""])
            | texts("latin1", max_size=40),
        },
    )


def post(client, path: str, body: bytes, headers: dict[str, str], meta: dict[str, object]):
    """POST as a server hands the request to Django. A Host header is left out: Django
    refuses a host outside ALLOWED_HOSTS with a 400 before any URL is resolved, which is
    the host project's gate, not this app's."""
    extra = {key: value for key, value in as_meta(headers).items() if key != "HTTP_HOST"}
    return client.post(path, data=body, content_type="application/json", **extra, **meta)


def on_record() -> tuple[int, int]:
    """Audit records, and refusals beyond REJECTED_AUDIT_PER_MINUTE that only their
    minute's tally counts (examples share the test's transaction, and its minutes)."""
    unrecorded = RejectionTally.objects.aggregate(n=Sum("unrecorded"))["n"] or 0
    return RequestAudit.objects.count(), unrecorded


def assert_one_new_audit_record(before: tuple[int, int], answer) -> None:
    """Exactly one request more on record than ``before``: a record that holds the
    status the sender got, or a refusal counted beyond the audit bound."""
    records, unrecorded = on_record()
    assert (records - before[0], unrecorded - before[1]) in {(1, 0), (0, 1)}
    if records > before[0]:
        assert RequestAudit.objects.latest("id").response_status == answer.status_code
    else:
        assert 400 <= answer.status_code < 500


def unstorable(value: str) -> bool:
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in value)


# --- signatures: pure, no database ------------------------------------------------------


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


# --- storable values, the body reader, the Content-Length reader: pure -----------------


@PURE
@given(value=texts("any", max_size=400), max_length=st.integers(min_value=0, max_value=300))
def test_storable_text_is_storable_and_bounded(value, max_length):
    """Text shown in the admin can hold anything a request sent, yet never NUL, a control
    character or a lone surrogate (PostgreSQL and UTF-8 refuse them)."""
    stored = storable.text(value, max_length)

    assert len(stored) <= max_length
    assert not unstorable(stored)
    stored.encode("utf-8")  # a lone surrogate would raise here
    if not unstorable(value) and len(value) <= max_length:
        assert stored == value


@PURE
@given(raw=texts("any", max_size=400) | st.text(max_size=300))
def test_storable_key_is_bounded_stable_and_keeps_keys_that_fit(raw):
    """An event key is compared for identity: the same key must always store the same,
    and one that fits the column must be stored as sent."""
    stored = storable.key(raw)

    assert len(stored) <= storable.KEY_MAX_LENGTH
    assert not unstorable(stored)
    assert storable.key(raw) == stored
    if len(raw) <= storable.KEY_MAX_LENGTH and not unstorable(raw):
        assert stored == raw
    else:
        assert stored.startswith(storable.DIGEST_PREFIX)


@PURE
@given(first=st.text(max_size=300), second=st.text(max_size=300))
def test_storable_keys_of_different_events_differ(first, second):
    """Two events must never share a key by being made storable (deduplication)."""
    if first != second:
        assert storable.key(first) != storable.key(second)


@PURE
@given(timestamp=st.none() | st.integers() | st.integers(min_value=-(10**40), max_value=10**40))
def test_storable_moment_never_raises(timestamp):
    """A signed timestamp past year 9999 (or before 1970) is kept out of the column."""
    moment = storable.moment(timestamp)

    if timestamp is not None and 0 <= timestamp <= storable.LATEST_TIMESTAMP:
        assert moment is not None
        assert moment.timestamp() == timestamp
    else:
        assert moment is None


@PURE
@given(
    received=st.dictionaries(texts("any", max_size=300), texts("any", max_size=400)),
    leave_out=st.sets(st.sampled_from(["cookie", "authorization", "x-api-key"])),
)
def test_storable_headers_are_storable_and_leave_credentials_out(received, leave_out):
    """What a verified request's headers are stored as: every name and value fit for a
    JSON column, credentials dropped."""
    stored = storable.headers(received, leave_out=leave_out)

    for name, value in stored.items():
        assert len(name) <= 200 and len(value) <= 8192
        assert not unstorable(name) and not unstorable(value)
    kept = [name for name in received if name.lower() not in leave_out]
    assert len(stored) <= len(kept)


@PURE
@given(value=st.none() | texts("any") | st.ip_addresses().map(str))
def test_a_remote_address_is_an_address_or_nothing(value):
    """REMOTE_ADDR can be anything a server passes on: inet accepts what is kept."""
    address = client_address(value)

    assert address is None or str(ipaddress.ip_address(address)) == address


class _Trickle(io.RawIOBase):
    """A stream that hands out its data a few bytes at a time, as a socket does."""

    def __init__(self, data: bytes, steps: list[int]) -> None:
        self._data, self._steps = data, steps or [1]
        self._pos = self._turn = 0

    def read(self, size: int = -1) -> bytes:
        step = self._steps[self._turn % len(self._steps)]
        self._turn += 1
        size = step if size is None or size < 0 else min(size, step)
        chunk = self._data[self._pos : self._pos + size]
        self._pos += len(chunk)
        return chunk


@PURE
@given(
    data=st.binary(max_size=4096),
    steps=st.lists(st.integers(min_value=1, max_value=5000), max_size=5),
    content_length=st.none() | st.integers(min_value=0, max_value=10**18),
    limit=st.integers(min_value=0, max_value=4096),
    no_stream=st.booleans(),
)
def test_the_body_reader_reads_within_the_limit_or_refuses(
    data, steps, content_length, limit, no_stream
):
    """The size limit holds whatever the sender announced: refused from Content-Length
    first, else while reading, and never with more than the limit read."""
    stream = None if no_stream else _Trickle(data, steps)
    try:
        body = read_limited_body(stream, content_length, limit)
    except PayloadTooLarge:
        announced_too_much = content_length is not None and content_length > limit
        assert announced_too_much or (stream is not None and len(data) > limit)
        return
    assert body == (b"" if stream is None else data)
    assert len(body) <= limit


@PURE
@given(raw=st.none() | numbers() | texts("any", max_size=30))
def test_content_length_is_a_bounded_number_or_nothing(raw):
    """Content-Length is read from META as the server passed it, junk included."""
    length = _content_length(SimpleNamespace(META={} if raw is None else {"CONTENT_LENGTH": raw}))

    assert length is None or 0 <= length <= 10**18
    if raw and raw.isascii() and raw.isdigit() and len(raw) <= 18:
        assert length == int(raw)


# --- through HTTP: no 5xx, one audit record per request ---------------------------------


@pytest.mark.django_db
@THROUGH_THE_DATABASE
@given(path_slug=quoted_slugs(), body=st.binary(max_size=2048), headers=fuzzed_headers("latin1"))
def test_any_source_slug_is_answered_below_500_and_audited(client, path_slug, body, headers):
    """The slug is the first thing read from a request, before anything is known about
    it: NUL, surrogates' bytes, control characters, 300 bytes of UTF-8."""
    # given
    before = on_record()

    # when
    answer = post(client, f"/webhooks/{path_slug}/", body, headers, {})

    # then: unknown slugs are 404s, and each is on record (source escaped, cut to 100)
    assert answer.status_code in DOCUMENTED_STATUSES, (answer.status_code, answer.content)
    assert_one_new_audit_record(before, answer)


@pytest.mark.django_db
@settings(THROUGH_THE_DATABASE, max_examples=100)
@given(data=st.data(), source=st.sampled_from(sorted(SOURCES)))
def test_any_request_to_a_source_is_answered_below_500_and_audited(client, data, source):
    """Fuzzed signature headers (as a server decodes them: latin-1), bodies, and what the
    server passes beside them (Content-Length, Content-Type, REMOTE_ADDR)."""
    # given: a request to a configured source, signed or not, then fuzzed
    headers, body = data.draw(
        requests(
            SOURCES[source],
            "latin1",
            extra_names=("Content-Length", "Content-Type", "Transfer-Encoding", "Cookie"),
        )
    )
    meta = data.draw(request_meta(body))
    before = on_record()

    # when
    answer = post(client, f"/webhooks/{source}/", body, headers, meta)

    # then
    assert answer.status_code in DOCUMENTED_STATUSES, (answer.status_code, answer.content)
    assert_one_new_audit_record(before, answer)


@pytest.mark.django_db
@pytest.mark.parametrize("source", ["shop", "stripe", "github"])
# more examples than the others: the edits that matter are a few among many
@settings(THROUGH_THE_DATABASE, max_examples=150)
@given(data=st.data())
def test_a_near_miss_of_a_good_signature_is_answered_below_500_and_audited(client, source, data):
    """One header of an authentic request edited, as a server hands it on (latin-1): the
    request that gets furthest through the parsers without being authentic."""
    # given
    headers, body = data.draw(near_misses(SOURCES[source], "latin1", secret=SECRET_OF[source]))
    before = on_record()

    # when
    answer = post(client, f"/webhooks/{source}/", body, headers, {})

    # then
    assert answer.status_code in DOCUMENTED_STATUSES, (answer.status_code, answer.content)
    assert_one_new_audit_record(before, answer)


@pytest.mark.django_db
@THROUGH_THE_DATABASE
@given(
    source=st.sampled_from(["shop", "keyed", "stripe", "github"]),
    body=event_bodies(),
    message_id=st.text(LATIN1, min_size=1, max_size=300),
    github_event=st.sampled_from(SHOP_TYPES) | st.text(LATIN1, max_size=40),
    junk=fuzzed_headers("latin1"),
)
def test_a_verified_request_is_applied_or_held_whatever_its_body(
    client, source, body, message_id, github_event, junk
):
    """Once verified, the body is parsed and handled: whatever it holds, the event is
    applied, ignored, a duplicate (200) or held as a failed event (202), never a 5xx."""
    # given: an authentic delivery of an arbitrary body, with junk headers beside
    scheme = SOURCES[source]
    headers = {name: value for name, value in junk.items() if name.lower() not in READS[scheme]}
    headers["X-GitHub-Event"] = github_event
    headers |= sign(
        scheme=scheme,
        secret=SECRET_OF[source],
        body=body,
        message_id=message_id,
        timestamp=int(time.time()),
    )
    before = on_record()

    # when
    answer = post(client, f"/webhooks/{source}/", body, headers, {})

    # then
    assert answer.status_code in {200, 202}, (answer.status_code, answer.content)
    assert_one_new_audit_record(before, answer)


# --- /metrics/ and the relay's reading of Retry-After -------------------------------------


@pytest.mark.django_db
@THROUGH_THE_DATABASE
@given(
    authorization=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
)
def test_any_authorization_header_on_metrics_is_a_401_or_the_scrape(
    client, settings, authorization
):
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "METRICS_TOKEN": "fuzz-token"}
    response = client.get("/metrics/", HTTP_AUTHORIZATION=authorization)
    expected = (
        200
        if authorization.partition(" ")[2].strip() == "fuzz-token"
        and (authorization.partition(" ")[0].lower() == "bearer")
        else 401
    )
    assert response.status_code == expected


@PURE
@given(value=st.none() | st.text(max_size=80) | st.integers(-(10**12), 10**12).map(str))
def test_any_retry_after_reads_as_capped_seconds_or_none(value):
    from django.utils import timezone

    from webhook_receiver.core.peer_http import parse_retry_after

    seconds = parse_retry_after(value, now=timezone.now(), cap=300)
    assert seconds is None or 0 <= seconds <= 300
