"""The merchant's endpoint the outbox relays to: a minimal HTTP/1.1 server (asyncio,
keep-alive) in a process of its own, so that it never competes with the runner for the
GIL. Each POST is held for ``delay`` seconds (a merchant's own work), then answered 200.

It records, for every request, its arrival time (CLOCK_MONOTONIC, comparable with the
runner's), its ``webhook-id`` and how many requests were in flight once it arrived, and
the most ever in flight at once. ``GET /stats`` answers all of it as JSON.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import signal
import socket
import time
from dataclasses import dataclass
from http.client import HTTPConnection
from typing import Any

from tests.support.wire import read_webhook

HOST = "127.0.0.1"
OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'


class _State:
    def __init__(self) -> None:
        self.arrivals: list[tuple[float, str, int]] = []  # (time, key, in flight then)
        self.in_flight = 0
        self.most_in_flight = 0

    def stats(self) -> dict[str, Any]:
        return {
            "arrivals": self.arrivals,
            "most_in_flight": self.most_in_flight,
            "cpu_s": time.process_time(),
        }


async def _serve_connection(state: _State, delay: float, reader, writer) -> None:
    try:
        while True:
            method, _, key = await read_webhook(reader)
            if method != b"POST":
                body = json.dumps(state.stats()).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                continue
            state.in_flight += 1
            state.most_in_flight = max(state.most_in_flight, state.in_flight)
            state.arrivals.append((time.monotonic(), key, state.in_flight))
            try:
                if delay:
                    await asyncio.sleep(delay)
            finally:
                state.in_flight -= 1
            writer.write(OK)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _main(sock: socket.socket, delay: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner stops it, with SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    state = _State()

    async def serve() -> None:
        server = await asyncio.start_server(
            lambda r, w: _serve_connection(state, delay, r, w), sock=sock, backlog=256
        )
        await server.serve_forever()

    asyncio.run(serve())


@dataclass
class Arrival:
    at: float
    key: str
    in_flight: int


class Merchant:
    """The merchant's process (a context manager), and the runner's view of it."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.sock = socket.socket()
        self.sock.bind((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}/hooks"
        self.process = mp.get_context("fork").Process(
            target=_main, args=(self.sock, delay), daemon=True
        )

    def __enter__(self) -> Merchant:
        self.sock.listen(256)
        self.process.start()
        self.sock.close()  # the child holds it now
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)

    def stats(self) -> tuple[list[Arrival], int, float]:
        """Every arrival so far, the most in flight at once, the merchant's CPU seconds."""
        conn = HTTPConnection(HOST, self.port, timeout=10)
        try:
            conn.request("GET", "/stats")
            document = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        arrivals = [Arrival(*item) for item in document["arrivals"]]
        return arrivals, document["most_in_flight"], document["cpu_s"]
