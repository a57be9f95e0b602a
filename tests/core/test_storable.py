"""Values from a request made storable (``core.storable``), fuzzed: whatever a peer
sent, what is stored fits its column and is never NUL, a control character or a lone
surrogate (PostgreSQL and UTF-8 refuse them); keys stay stable and distinct."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fuzzing import PURE, texts, unstorable
from webhook_receiver.core import storable


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


def test_a_json_value_nested_past_the_bound_keeps_the_bound_and_says_so():
    # given: a sender's record nesting 900 levels deep (Python parses it; reading it back
    # from a column at the bottom of a deep stack would not)
    deep: list = []
    innermost = deep
    for _ in range(899):
        innermost.append([])
        innermost = innermost[0]

    # when
    kept = storable.json_value({"data": deep})

    # then: MAX_JSON_DEPTH levels kept, the rest a line saying so; it reads back under a
    # stack as deep as the recursion limit allows less a page's and a command's frames
    depth, level = 0, kept
    while isinstance(level, dict | list) and level:
        level = next(iter(level.values())) if isinstance(level, dict) else level[0]
        depth += 1
    assert depth == storable.MAX_JSON_DEPTH
    assert level == f"[nested deeper than {storable.MAX_JSON_DEPTH} levels: not kept]"
    assert json.loads(json.dumps(kept)) == kept


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, 2.5, True, None, "é"]}, None),
        ({"a": "x\x00"}, "a NUL character cannot be stored"),
        ({"\ud800": 1}, "a lone surrogate is not text"),
        ([float("inf")], "a number out of range (NaN or infinity)"),
        ({"a": {1: "x"}}, "a key must be text, not int (1)"),
        ({"a": {"b", "c"}}, "not a JSON value: set"),
        ([[]] * 3, None),
    ],
)
def test_json_problem_names_what_a_json_column_would_not_store(value, problem):
    assert storable.json_problem(value) == problem


def test_json_problem_refuses_past_its_depth_without_recursing():
    # given: 32 levels are taken, one more is not; 100,000 are walked without recursion
    def nested(levels: int) -> list:
        value: list = []
        for _ in range(levels - 1):
            value = [value]
        return value

    assert storable.json_problem(nested(storable.JSON_PROBLEM_DEPTH)) is None
    too_deep = f"nested deeper than {storable.JSON_PROBLEM_DEPTH} levels"
    assert storable.json_problem(nested(storable.JSON_PROBLEM_DEPTH + 2)) == too_deep
    assert storable.json_problem(nested(100_000)) == too_deep


# JSON as a peer or a producer may hand it over: any text (NUL and lone surrogates
# included), any float (NaN and infinities included), keys that are not text, any nesting
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts("any", max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(texts("any", max_size=10) | st.integers(), inner, max_size=4)
    ),
    max_leaves=30,
)


@PURE
@given(value=json_like)
def test_what_json_problem_lets_through_a_json_column_stores_as_it_is(value):
    """Whatever json_problem passes encodes as strict JSON in UTF-8 with no NUL (what a
    PostgreSQL jsonb column takes as it is); whatever it refuses, it says why in words."""
    problem = storable.json_problem(value)
    if problem is None:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # no lone surrogate
        assert "\\u0000" not in text and "\x00" not in text
    else:
        assert isinstance(problem, str) and problem
