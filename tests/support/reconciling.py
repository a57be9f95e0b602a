"""Helpers for reconciliation tests: a source's RECONCILE block, a sender served locally."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def reconcile_with(settings, slug: str, **reconcile: Any) -> None:
    """Give source ``slug`` this RECONCILE block, for the test that calls it."""
    source = {**settings.WEBHOOK_RECEIVER["SOURCES"][slug], "RECONCILE": reconcile}
    sources = {**settings.WEBHOOK_RECEIVER["SOURCES"], slug: source}
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SOURCES": sources}


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a loopback port, in a thread; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
