"""Scraping /metrics/ in tests: the token the tests configure, the scrape parsed with
prometheus-client's own parser into samples, and what changed between two scrapes (the
default registry is the process's, shared by every test in it)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "metrics-token-for-tests"
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def metrics_on(settings) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "METRICS_TOKEN": TOKEN}


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(client) -> Samples:
    response = client.get("/metrics/", **AUTH)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return parse(response.content.decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def delta(before: Samples, after: Samples, name: str) -> dict[frozenset, float]:
    """What changed between two scrapes: the default registry is the process's, shared
    by every test in it."""
    changed = {}
    for labels, v in series(after, name).items():
        d = v - before.get((name, labels), 0.0)
        if d:
            changed[labels] = d
    return changed


def labels(**pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset(pairs.items())
