"""Where the counters are read from: this process's registry, or the files of every
process under multiprocess mode; a relay process's own exporter, for the counters it
keeps (the outbox's delivery time, attempts and terminal messages); and a Celery
worker's, for what its pool processes count (a retry's outcome)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)


_process_collector: Collector | None = None


def process_collector() -> Collector:
    """The counters and histogram of every web process: the files of multiprocess mode
    when ``PROMETHEUS_MULTIPROC_DIR`` is set, else this process's default registry."""
    global _process_collector
    if _process_collector is None:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            _process_collector = registry
        else:
            _process_collector = REGISTRY
    return _process_collector


def worker_metrics_serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve what a Celery worker's pool processes count (an inbound retry's outcome) at
    ``http://addr:port/metrics``, for Prometheus.

    Call it once in the worker's main process, before its pool starts (Celery's
    ``worker_init`` signal; the demo's project/celery.py does with CELERY_METRICS_PORT).
    ``PROMETHEUS_MULTIPROC_DIR`` must name a directory of the worker's own, set before
    the worker starts: each pool process writes its counters there and a scrape sums
    them. It is emptied here, as a fresh server's must be. Like most exporters it asks
    for no token: bind it to an address only Prometheus reaches.
    """
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        raise ImproperlyConfigured(
            "Serving a worker's metrics needs PROMETHEUS_MULTIPROC_DIR: set it to an "
            "empty directory of the worker's own before the worker starts."
        )
    Path(directory).mkdir(parents=True, exist_ok=True)
    for stale in Path(directory).glob("*.db"):
        stale.unlink()
    start_http_server(port, addr=addr, registry=process_collector())
    logger.info("serving the worker's metrics at http://%s:%s/metrics", addr, port)


def relay_metrics_serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve what this relay process counts (the outbox's delivery time, attempts and
    terminal messages) at ``http://addr:port/metrics``, for Prometheus
    (``manage.py webhook_relay --metrics-port``). A relay sharing the web server's
    ``PROMETHEUS_MULTIPROC_DIR`` (one host) is counted by ``/metrics/`` already; this
    is for a relay on a machine of its own. Like most exporters it asks for no token:
    bind it to an address only Prometheus reaches."""
    start_http_server(port, addr=addr, registry=process_collector())
    logger.info("serving the relay's metrics at http://%s:%s/metrics", addr, port)
