"""manage.py webhook_relay [--metrics-port PORT] [--metrics-addr ADDR]

Run this process's outbox relay until SIGTERM or SIGINT (docs/sending.md, "The relay:
one process, one loop"): every destination with a message due is relayed on one event
loop, with RELAY_DATABASE_CONNECTIONS database connections whatever their number.
Run one per machine; every limit lives in the database, so relays on several machines
share each destination's limits exactly. ``--metrics-port`` serves its counters for
Prometheus (a relay on a machine without the web server's metrics directory).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ...outbound.relay.process import process_name, relay_serve
from ...watch.metrics import relay_metrics_serve
from ...watch.relays import (
    RELAY_HEARTBEAT_SECONDS,
    record_relay_heartbeat,
    relay_heartbeat_forget,
)


class Command(BaseCommand):
    help = (
        "Relay the outbox: send every due message to its destination under its limits, "
        "record each answer, until SIGTERM or SIGINT (then finish what is in flight)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--metrics-port",
            type=int,
            metavar="PORT",
            help="serve this relay's counters for Prometheus at http://ADDR:PORT/metrics",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            metavar="ADDR",
            help="the address the counters are served on (default 127.0.0.1: bind it to "
            "one only Prometheus reaches; the exporter asks for no token)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["metrics_port"]:
            relay_metrics_serve(options["metrics_port"], addr=options["metrics_addr"])
        name = process_name()
        relay_serve(
            heartbeat=lambda: record_relay_heartbeat(name),
            heartbeat_seconds=RELAY_HEARTBEAT_SECONDS,
            farewell=lambda: relay_heartbeat_forget(name),
        )
