"""Values from a request, made fit for their columns before anything stores them.

A verified sender can still send bytes a column refuses: a key longer than 255
characters, NUL (which PostgreSQL's text types cannot hold), a lone surrogate (which
UTF-8 cannot encode), a timestamp past year 9999. None of them may cost an event its
receipt or a request its audit record, so every value a request brings goes through
one of these functions on its way to the database. So does what the app's own peers
answer: a destination's reply to the relay, a sender's list for reconciliation.

A peer's headers are stored by one rule, ``redacted_headers``: which are secret, and
what replaces their values; the admin shows stored headers by the same rule
(``shown_headers``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..conf import app_settings

KEY_MAX_LENGTH = 255
DIGEST_PREFIX = "sha256:"
# what datetime (and so the database column) can hold: years 1970 to 9999
LATEST_TIMESTAMP = 253402300799


def escape(char: str) -> str:
    """One character in Python's notation: ``\\x00``, ``\\u202e``, ``\\U000e0041``."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unstorable(char: str) -> bool:
    """Control characters (NUL among them) and lone surrogates."""
    code = ord(char)
    return code < 0x20 or 0x7F <= code < 0xA0 or 0xD800 <= code < 0xE000


def text(value: str, max_length: int) -> str:
    """``value`` with control characters and lone surrogates escaped (``\\x00``), cut to
    ``max_length``: for values that are shown and searched, never compared for identity."""
    if value.isprintable() and len(value) <= max_length:  # the usual case, at C speed
        return value
    return "".join(escape(c) if _unstorable(c) else c for c in value)[:max_length]


def key(raw: str) -> str:
    """An event key as stored: the sender's own when it fits, else a digest of it.

    The digest (``sha256:`` and 64 hex digits) is the same for every redelivery of the
    same key, so deduplication still holds; the sender's original stays in the stored
    body or headers.
    """
    if len(raw) <= KEY_MAX_LENGTH and not any(_unstorable(c) for c in raw):
        return raw
    return DIGEST_PREFIX + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def moment(timestamp: int | None) -> datetime | None:
    """A signature timestamp as a datetime, or None when no column could hold it."""
    if timestamp is None or not 0 <= timestamp <= LATEST_TIMESTAMP:
        return None
    return datetime.fromtimestamp(timestamp, UTC)


# what a redacted header's value is stored (and shown) as
REDACTED = "[redacted]"


def headers(
    received: Mapping[str, str], *, leave_out: Iterable[str], redact: Iterable[str] = ()
) -> dict[str, str]:
    """The headers worth keeping, names and values made storable, ``leave_out`` (lower
    case names: credentials) left out, and the values of ``redact`` (lower case names:
    signatures) replaced by REDACTED, so that the record says they were there."""
    dropped, redacted = frozenset(leave_out), frozenset(redact)
    return {
        text(name, 200): REDACTED if name.lower() in redacted else text(value, 8192)
        for name, value in received.items()
        if name.lower() not in dropped
    }


def redacted_headers(
    received: Mapping[str, Any], *, keep_signatures: bool | None = None
) -> dict[str, Any]:
    """A peer's headers as they are stored, by the one rule for secret headers: names and
    values made storable (``headers``), the credentials of REDACTED_HEADERS left out,
    every scheme's signature headers REDACTED unless ``keep_signatures`` (None: as
    KEEP_SIGNATURE_HEADERS says)."""
    config = app_settings()
    if keep_signatures is None:
        keep_signatures = config.keep_signature_headers
    redact = () if keep_signatures else config.signature_headers
    return headers(received, leave_out=config.redacted_headers, redact=redact)


def shown_headers(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Stored headers as a page shows them, by the same rule: credentials and signatures
    REDACTED whatever the row holds (it may be older than the rule, or
    KEEP_SIGNATURE_HEADERS kept them), the rest as it is."""
    config = app_settings()
    hidden = config.signature_headers | config.redacted_headers
    return {
        name: REDACTED if str(name).lower() in hidden else value for name, value in stored.items()
    }


def _json_unstorable(char: str) -> bool:
    """What PostgreSQL's jsonb refuses in a string: NUL, and lone surrogates."""
    code = ord(char)
    return code == 0 or 0xD800 <= code < 0xE000


def is_json_storable(value: str) -> bool:
    """Whether a JSON column takes ``value`` as a string as it is: no NUL, no lone
    surrogate (what admission refuses in a producer's metadata, and json_value escapes in
    a peer's JSON)."""
    # isascii: the usual case, at C speed
    return "\x00" not in value and (value.isascii() or not any(map(_json_unstorable, value)))


# how deep JSON that someone must be told about may nest (json_problem): far below
# MAX_JSON_DEPTH, what a peer's JSON is cut to
JSON_PROBLEM_DEPTH = 32


def json_problem(value: Any) -> str | None:
    """Why ``value`` (JSON as parsed, or a producer's dict: from someone who must be told,
    the portal's API, admission's metadata) cannot be stored as it is in a JSON column,
    or None: a NUL or a lone surrogate in a string or key, a number JSON has not
    (NaN, infinity), a key that is not text, a value that is not JSON (a set, an
    object), nesting past JSON_PROBLEM_DEPTH levels. The refusing twin of json_value,
    which keeps a peer's JSON by escaping instead. Walked with a stack, not by recursion,
    whatever the caller's own depth."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > JSON_PROBLEM_DEPTH:
            return f"nested deeper than {JSON_PROBLEM_DEPTH} levels"
        if isinstance(node, str):
            if "\x00" in node:
                return "a NUL character cannot be stored"
            if not is_json_storable(node):
                return "a lone surrogate is not text"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return "a number out of range (NaN or infinity)"
        elif isinstance(node, dict):  # as json.dumps: not any Mapping
            for name in node:
                if not isinstance(name, str):
                    return f"a key must be text, not {type(name).__name__} ({name!r})"
            pending.extend((item, depth + 1) for item in (*node.keys(), *node.values()))
        elif isinstance(node, list | tuple):
            pending.extend((item, depth + 1) for item in node)
        elif not (node is None or isinstance(node, bool | int)):
            return f"not a JSON value: {type(node).__name__}"
    return None


def _json_text(value: str) -> str:
    if is_json_storable(value):
        return value
    return "".join(escape(c) if _json_unstorable(c) else c for c in value)


# Django's JSONField reads a column back with json.loads, which recurses: what is kept
# nests at most this deep, far below the interpreter's recursion limit, so that a page or
# a command reads it back however deep its own stack already is.
MAX_JSON_DEPTH = 100


def json_value(value: Any) -> Any:
    """A peer's JSON (a sender's record, what it says of an order) as a JSON column can
    store it: NUL and lone surrogates escaped (``\\x00``) in every string and key, and
    the numbers Python's parser takes but JSON has not (``Infinity``, ``NaN``, ``1e999``)
    as text, what nests deeper than MAX_JSON_DEPTH as a line saying so; everything else
    kept as it came. Walked with a stack of its own, not by recursion: a peer chooses how
    deep its JSON nests."""
    if not isinstance(value, dict | list | tuple):
        return _json_scalar(value)
    top: dict[str, Any] | list[Any] = {} if isinstance(value, dict) else []
    pending: list[tuple[Any, dict[str, Any] | list[Any], int]] = [(value, top, 1)]
    while pending:
        source, copy, depth = pending.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for name, item in items:
            child: Any
            if not isinstance(item, dict | list | tuple):
                child = _json_scalar(item)
            elif depth >= MAX_JSON_DEPTH:
                child = f"[nested deeper than {MAX_JSON_DEPTH} levels: not kept]"
            else:
                container: dict[str, Any] | list[Any] = {} if isinstance(item, dict) else []
                pending.append((item, container, depth + 1))  # filled in later
                child = container  # its place kept now
            if isinstance(copy, dict):
                copy[_json_text(str(name))] = child
            else:
                copy.append(child)
    return top


def _json_scalar(value: Any) -> Any:
    if isinstance(value, str):
        return _json_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # Infinity, -Infinity, NaN
    return value
