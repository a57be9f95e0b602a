"""The settings a run uses: the host's own WEBHOOK_RECEIVER (its bounds and retry policy
are what is evaluated), with the simulated sender as the one source, the evaluation's
handler for its events, silence notices as signals, a key for the destinations'
secrets, a cache that behaves as a shared one; and beat's schedule as the scenario's
(beat_schedule), which the status's thresholds read."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import current_app
from django.conf import settings
from django.test.utils import override_settings

from .inputs import Scenario

SENDER = "eval-sender"
EVENT_TYPE = "eval.order.paid"


def _digest(*parts: object) -> bytes:
    return hashlib.sha256(":".join(map(str, parts)).encode()).digest()


def sender_secret(seed: int, name: str) -> str:
    """A Standard Webhooks secret for the sender or a merchant, made from the seed."""
    return "whsec_" + base64.b64encode(_digest("secret", seed, name)[:24]).decode()


@contextmanager
def eval_settings(scenario: Scenario, seed: int) -> Iterator[None]:
    host: dict[str, Any] = dict(getattr(settings, "WEBHOOK_RECEIVER", {}))
    silence = scenario.inbound.silence_after if scenario.inbound else None
    ours = {
        **host,
        "SOURCES": {
            SENDER: {
                "SCHEME": "standard",
                "SECRETS": [sender_secret(seed, SENDER)],
                "SILENCE_AFTER_SECONDS": int(silence) if silence else None,
            }
        },
        "HANDLERS": {EVENT_TYPE: "webhook_receiver.evaluation.world.apply_effect"},
        "NOTIFIERS": ["signal"],
        "SECRET_ENCRYPTION_KEYS": [base64.urlsafe_b64encode(_digest("fernet", seed)).decode()],
        "OPS_DESTINATION": None,
        # what the status's pickup reads (watch/pickup.py): the run's relays poll so
        "RELAY_POLL_SECONDS": scenario.relay.poll,
        "STATE_COMPARISON": None,
        "TRACE_EFFECTS": None,
        # the scenarios' order events are the harness's traffic, not the host's catalog
        "CATALOG_CHECK": "off",
    }
    caches = {
        "default": {
            "BACKEND": "webhook_receiver.evaluation.world.SharedMemoryCache",
            "LOCATION": "webhook-eval",
        }
    }
    with override_settings(WEBHOOK_RECEIVER=ours, CACHES=caches):
        yield


@contextmanager
def beat_schedule(schedule: dict[str, Any]) -> Iterator[None]:
    """Celery's beat_schedule set to ``schedule`` for a while (its Settings restore what
    was there by assignment, not by deleting a key)."""
    conf = current_app.conf
    before = conf.beat_schedule
    conf.beat_schedule = schedule
    try:
        yield
    finally:
        conf.beat_schedule = before
