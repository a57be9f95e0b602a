"""manage.py webhook_relay

Run this process's outbox relay until SIGTERM or SIGINT (docs/sending.md, "The relay:
one process, one loop"): every destination with a message due is relayed on one event
loop, with RELAY_DATABASE_CONNECTIONS database connections whatever their number.
Run one per machine; every limit lives in the database, so relays on several machines
share each destination's limits exactly.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ...outbound.relay.process import process_name, relay_serve
from ...watch.relays import (
    RELAY_HEARTBEAT_SECONDS,
    relay_heartbeat_forget,
    relay_heartbeat_record,
)


class Command(BaseCommand):
    help = (
        "Relay the outbox: send every due message to its destination under its limits, "
        "record each answer, until SIGTERM or SIGINT (then finish what is in flight)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        name = process_name()
        relay_serve(
            heartbeat=lambda: relay_heartbeat_record(name),
            heartbeat_seconds=RELAY_HEARTBEAT_SECONDS,
            farewell=lambda: relay_heartbeat_forget(name),
        )
