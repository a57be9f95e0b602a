"""Hypothesis strategies for what an unauthenticated peer may send: text from chosen
alphabets spliced with the fragments parsers trip on, numbers, signature headers good,
near and far, JSON values. Shared by the fuzz tests of the schemes, the storable values
and the endpoint."""

from __future__ import annotations

import base64
import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.settings import GITHUB_SECRET, SHOP_OLD_SECRET, SHOP_SECRET, STRIPE_SECRET
from webhook_receiver.schemes import sign

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
    *READS["standard"],
    "Stripe-Signature",
    "X-Hub-Signature-256",
    "X-GitHub-Delivery",
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


def unstorable(value: str) -> bool:
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or 0xD800 <= ord(c) < 0xE000 for c in value)
