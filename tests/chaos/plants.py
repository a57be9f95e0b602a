"""Defects to plant in the real processes of a chaos run, so that a team can watch it fail:
``python -m tests.chaos --plant NAME`` gives every process it starts ``CHAOS_PLANT=NAME``;
the run's settings (``settings.py``) then install ``PlantedDefect``, whose ``ready()``
patches the app at start-up, in gunicorn's workers, the relay and the Celery worker alike. Each
plant names the check that must catch it; a run that does not is reported as such.

Test code: the app itself has no switch for any of these. ``test_plants.py`` checks that
each patch does what it says without servers; ``test_planted_defects.py`` that the checks
catch the state each leaves.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.apps import AppConfig

from tests.chaos.checks import INBOUND_ONCE, OUTBOUND_ONCE

ENV = "CHAOS_PLANT"
LOST_ONE_IN = 20  # lost-message: about one order move in this many sends nothing

# setattr for the run; pytest's monkeypatch.setattr in the tests, which undoes it
Patch = Callable[[Any, str, Any], None]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plant:
    name: str
    defect: str  # what it does, for the run's log and report
    caught_by: str  # the check that must fail
    apply: Callable[[Patch], None]


def _double_effect(patch: Patch) -> None:
    from webhook_receiver.inbound import claim

    claimed = claim._claim

    def claim_as_if_won(cursor: Any, params: Any, *, audited: bool) -> Any:
        found = claimed(cursor, params, audited=audited)
        if found.receipt_id is not None:
            return found
        # the defect: the key was taken, and the handler runs all the same; receipt id 0
        # is no row, so the first delivery's receipt stays as it is
        return replace(found, receipt_id=0, stored_outcome=None)

    patch(claim, "_claim", claim_as_if_won)


def _delivered_without_effect(patch: Patch) -> None:
    from webhook_receiver.outbound.models import MessageStatus
    from webhook_receiver.outbound.relay import policy
    from webhook_receiver.outbound.relay import round as relay_round

    judged = relay_round.decide

    def decide(dest: Any, sent: Any, now: Any) -> policy.Decision:
        if sent.status_code == 500:  # the defect: taken for a 2xx
            return policy.Decision(
                MessageStatus.DELIVERED, None, spends_budget=False, breaker_failure=False
            )
        return judged(dest, sent, now)

    patch(relay_round, "decide", decide)


def _out_of_order(patch: Patch) -> None:
    from webhook_receiver.outbound import queries

    # the claim's eligibility without its ordering-key clause: an order's newer move goes
    # while an older one waits for its retry
    eligible = queries.ELIGIBLE_IDS
    start = eligible.index("AND (m.ordering_key = ''")
    end = eligible.index("ORDER BY m.id")
    patch(queries, "ELIGIBLE_IDS", eligible[:start] + eligible[end:])


def _lost_message(patch: Patch) -> None:
    from project.shop import handlers
    from webhook_receiver.outbound.admission import Admission

    admit = handlers.enqueue_webhook

    def admit_most(destination: Any, event_type: str, key: str, payload: Any, **kwargs: Any):
        if zlib.crc32(key.encode()) % LOST_ONE_IN == 0:  # the defect: never written
            return Admission(destination=getattr(destination, "name", destination), key=key,
                             created=False)  # fmt: skip
        return admit(destination, event_type, key, payload, **kwargs)

    patch(handlers, "enqueue_webhook", admit_most)


PLANTS = {
    plant.name: plant
    for plant in (
        Plant(
            "double-effect",
            "the inbound claim ignores whether its insert won: a duplicate applies its "
            "effect again",
            INBOUND_ONCE,
            _double_effect,
        ),
        Plant(
            "delivered-without-effect",
            "the relay counts a 500 as delivered",
            OUTBOUND_ONCE,
            _delivered_without_effect,
        ),
        Plant(
            "out-of-order",
            "the relay ignores ordering keys: an order's moves may reach the merchant out of "
            "version order",
            OUTBOUND_ONCE,
            _out_of_order,
        ),
        Plant(
            "lost-message",
            f"about one order move in {LOST_ONE_IN} is applied without its outbox message",
            OUTBOUND_ONCE,
            _lost_message,
        ),
    )
}


class PlantedDefect(AppConfig):
    """Installed by the run's settings when ``CHAOS_PLANT`` is set: plants that defect
    once every app is ready (the modules it patches are loaded)."""

    name = "tests.chaos"
    label = "chaos_planted_defect"

    def ready(self) -> None:
        plant = PLANTS[os.environ[ENV]]
        plant.apply(setattr)
        logger.warning("chaos: defect planted in this process: %s (%s)", plant.name, plant.defect)
