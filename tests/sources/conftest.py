"""Source records as tests make them, and a clock the records' snapshot reads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from webhook_receiver.sources.lookup import records
from webhook_receiver.sources.operations import source_add

# two Standard Webhooks secrets of the record "acme": the one in use, and its successor
ACME_SECRET = "whsec_YWNtZSdzIGZpcnN0IHNpZ25pbmcgc2VjcmV0"
ACME_NEW_SECRET = "whsec_YWNtZSdzIHNlY29uZCBzaWduaW5nIHNlY3JldA"


class Clock:
    """The snapshot's clock, moved by hand: the TTL without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Iterator[Clock]:
    original = records.clock
    records.clock = fake = Clock()
    yield fake
    records.clock = original


@pytest.fixture
def acme(db):
    """The record source "acme" (standard scheme, one secret), enabled."""
    return source_add(slug="acme", scheme="standard", secrets=[ACME_SECRET])
