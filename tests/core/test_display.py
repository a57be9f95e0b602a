"""How a peer's text is shown (``presentation.display``): bidirectional controls and invisible
characters as escapes, the rule checked against Python's own Unicode tables and fuzzed;
stored JSON printed whole however deep it nests. (The pages, commands and hooks that use
it: tests/admin/test_peer_text_display.py.)"""

from __future__ import annotations

import json
import sys
import unicodedata
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.peer_text import NAMED, OTHER_INVISIBLE, SPOOFED_TYPE, assert_no_invisible, deep
from webhook_receiver.presentation import display

# --- the rule --------------------------------------------------------------------------


def test_the_spoofed_event_type_reads_as_it_is_stored():
    assert display.visible(SPOOFED_TYPE) == "refund.\\u202edeunissi\\u202c.ok"


@pytest.mark.parametrize("char", NAMED + OTHER_INVISIBLE)
def test_each_invisible_character_is_shown_as_its_escape(char):
    shown = display.visible(f"a{char}b")
    assert shown.startswith("a\\") and shown.endswith("b")
    assert char not in shown


def test_the_rule_covers_every_format_control_and_separator_character():
    """Whatever Python's Unicode tables say is a format (Cf), control (Cc), line or
    paragraph separator (Zl, Zp) or surrogate (Cs) character is neutralised, newline and
    tab aside; nothing else is, but for characters these tables do not know yet (the
    rule follows a newer Unicode)."""
    neutralised = {"Cf", "Cc", "Zl", "Zp", "Cs"}
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        category = unicodedata.category(char)
        expected = category in neutralised and char not in "\n\t"
        matched = bool(display.INVISIBLE.match(char))
        assert matched == expected or (matched and category == "Cn"), f"U+{code:04X}"


@given(st.text())
def test_shown_text_holds_no_invisible_character_and_keeps_every_visible_one(text):
    shown = display.visible(text)
    assert_no_invisible(shown)
    # every other character is kept, in its order
    rest = iter(shown)
    assert all(char in rest for char in display.INVISIBLE.sub("", text))


def test_ordinary_text_is_unchanged():
    for text in ("order.paid", "Größe 42 · 注文 👩", "line one\nline two\tend"):
        assert display.visible(text) == text


# --- stored JSON, however deep ---------------------------------------------------------


def test_json_nested_deeper_than_python_recurses_is_shown_as_it_came():
    raw = ('{"type": "x", "data": ' + deep(100_000) + "}").encode()
    assert display.body_text(raw) == raw.decode()


def test_a_value_nested_deeper_than_the_encoder_recurses_is_printed_in_full():
    value: list = [{"b": 1, "a": "\u202e"}]
    for _ in range(sys.getrecursionlimit() + 10):
        value = [value]
    depth = sys.getrecursionlimit() + 11
    assert display.json_text(value) == "[" * depth + '{"a": "\u202e", "b": 1}' + "]" * depth


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_the_flat_printer_writes_what_json_writes(value):
    assert display._flat_json(value) == json.dumps(value, sort_keys=True, ensure_ascii=False)


# --- url_masked ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://m.example/hook?token=abc", "https://m.example/hook?token=…"),
        ("https://m.example/hook?token=abc&v=2", "https://m.example/hook?token=…&v=…"),
        ("https://m.example/hook?abc123", "https://m.example/hook?…"),
        ("https://m.example/hook?a=&b=1", "https://m.example/hook?a=&b=…"),
        ("https://m.example/hook#secret", "https://m.example/hook#…"),
        ("https://m.example/h?k=v#f", "https://m.example/h?k=…#…"),
        ("https://shop:pw@m.example/h", "https://***@m.example/h"),
        ("https://tok_live_123@m.example/h", "https://***@m.example/h"),
        ("https://m.example/hook", "https://m.example/hook"),
        ("https://m.example/a@b/c?x=1", "https://m.example/a@b/c?x=…"),
        ("http://[::1]:8000/h?t=1", "http://[::1]:8000/h?t=…"),
        ("https://m.example/hook?", "https://m.example/hook?"),
        ("", ""),
    ],
)
def test_url_masked(url, shown):
    assert display.url_masked(url) == shown


_token = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.~%", min_size=8, max_size=40)


@given(st.lists(st.tuples(st.text("abcdefgh", min_size=1, max_size=6), _token), max_size=5))
def test_url_masked_shows_no_query_value_and_keeps_the_rest(pairs):
    base = "https://merchant.example/hooks/v1"
    query = "&".join(f"{name}={value}" for name, value in pairs)
    url = f"{base}?{query}" if pairs else base

    shown = display.url_masked(url)

    assert shown.startswith(base)
    shown_query = shown[len(base) :]
    for name, value in pairs:
        assert value not in shown_query
        assert f"{name}=…" in shown_query


@given(st.text(max_size=80))
def test_url_masked_answers_for_any_text(text):
    assert isinstance(display.url_masked(text), str)


# --- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "at_a_glance", "measured"),
    [
        (0, "0 s", "0 s"),
        (0.25, "0 s", "0.25 s"),
        (4.2, "4 s", "4.2 s"),
        (45, "45 s", "45 s"),
        (59.96, "59 s", "1 min"),
        (67, "1 min", "1 min 07 s"),
        (600, "10 min", "10 min"),
        (3600, "1 h 00 min", "1 h"),
        (7500, "2 h 05 min", "2 h 05 min"),
        (3 * 86400, "3 d 0 h", "3 d"),
        (3 * 86400 + 4 * 3600, "3 d 4 h", "3 d 4 h"),
    ],
)
def test_a_duration_in_words_at_a_glance_and_measured(seconds, at_a_glance, measured):
    delta = timedelta(seconds=seconds)
    assert display.duration_text(delta) == at_a_glance
    assert display.duration_text(delta, precise=True) == measured


def test_how_long_ago_and_how_long_until():
    assert display.ago_text(timedelta(seconds=42)) == "42 s ago"
    assert display.ago_text(timedelta(hours=2, minutes=5)) == "2 h 05 min ago"
    assert display.ago_text(timedelta(minutes=-20)) == "in 20 min"
