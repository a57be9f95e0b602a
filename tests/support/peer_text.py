"""A peer's text that reads differently from what is stored: a spoofed event type (a
right-to-left override), every invisible character the display rule names and a few
others, JSON nested as deep as one likes; and the check that shown text holds none."""

from __future__ import annotations

from webhook_receiver.presentation import display

# "refund.issinued.ok" to the eye: the override reverses "deunissi" on screen
SPOOFED_TYPE = "refund.\u202edeunissi\u202c.ok"
# every character the rule names, and a few of the other invisible ones
NAMED = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
OTHER_INVISIBLE = "\u200b\u200d\u2060\ufeff\u00ad\u2028\u2029\U000e0041\x1b\x7f\x85"


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def assert_no_invisible(text: str) -> None:
    found = sorted({f"U+{ord(c):04X}" for c in text if display.INVISIBLE.match(c)})
    assert not found, found
