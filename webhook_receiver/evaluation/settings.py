"""The settings a run uses: the host's own WEBHOOK_RECEIVER (its bounds and retry policy
are what is evaluated), with the simulated sender as the one source, the evaluation's
handler for its events, silence notices as signals, a key for the destinations'
secrets, and a cache that behaves as a shared one."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
        "DESTINATION_SECRET_KEYS": [base64.urlsafe_b64encode(_digest("fernet", seed)).decode()],
        "OPS_DESTINATION": None,
        "STATE_COMPARISON": None,
        "TRACE_EFFECTS": None,
    }
    caches = {
        "default": {
            "BACKEND": "webhook_receiver.evaluation.world.SharedMemoryCache",
            "LOCATION": "webhook-eval",
        }
    }
    with override_settings(WEBHOOK_RECEIVER=ours, CACHES=caches):
        yield
