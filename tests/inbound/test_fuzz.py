"""Fuzzing what an unauthenticated request reaches in the inbound path: the body reader,
the Content-Length reader, and the endpoint itself. Nothing may escape but a documented
rejection, no request may get a 5xx, and every request that reaches the view leaves
exactly one audit record (or, for a refusal beyond the audit bound, one count in its
minute's rejection tally). The schemes' own fuzzing: tests/schemes/test_fuzz.py; the
values made storable: tests/core/test_storable.py."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace
from urllib.parse import quote

import pytest
from django.db.models import Sum
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.settings import GITHUB_SECRET, SHOP_SECRET, STRIPE_SECRET, WEBHOOK_RECEIVER
from tests.support.fuzzing import (
    LATIN1,
    PURE,
    READS,
    THROUGH_THE_DATABASE,
    fuzzed_headers,
    json_values,
    near_misses,
    numbers,
    requests,
    texts,
)
from tests.support.signing import as_meta
from webhook_receiver.exceptions import PayloadTooLarge
from webhook_receiver.inbound.receive import read_limited_body
from webhook_receiver.inbound.views import _content_length
from webhook_receiver.models import RejectionTally, RequestAudit
from webhook_receiver.schemes import sign

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


# --- the body reader, the Content-Length reader: pure ------------------------------------


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
