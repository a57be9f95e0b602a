"""The noisy neighbours of the ``noisy_neighbours`` fault: merchants that misbehave
beside the run's merchant, each a real socket on loopback served by the orchestrator's
process (a thread per connection).

A black hole accepts the connection, reads the request and never answers: the relay
waits out its timeout, and the connection stays open until the relay gives up on it (or
the server stops). A failing one answers 503 at once. Nothing they receive counts for the
checks; the report says how many requests they took and how many they held at once.
"""

from __future__ import annotations

import base64
import secrets
import socket
import threading
from contextlib import suppress

from tests.support.peers import answer, read_request

POLL_SECONDS = 0.5  # how often a held connection looks whether the server is stopping
BUSY = answer(503, {"Content-Type": "application/json"}, b'{"error": "busy"}')


class BadMerchant:
    """One noisy neighbour: a black hole, or one that answers 503 (``fails``)."""

    def __init__(self, name: str, *, fails: bool) -> None:
        self.name = name
        self.fails = fails
        self.secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/hooks"
        self.requests = 0  # requests read in full
        self.in_flight = 0  # connections open with a request read and not answered
        self.most_in_flight = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopping = threading.Event()

    @property
    def kind(self) -> str:
        return "503" if self.fails else "black hole"

    def start(self) -> None:
        threading.Thread(target=self._serve, name=f"{self.name}-accept", daemon=True).start()

    def stop(self) -> None:
        """Stop accepting and close every connection held (the relay sees them cut)."""
        self._stopping.set()
        self._listener.close()
        with self._lock:
            held = list(self._open)
        for conn in held:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:  # the listener closed: stopping
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.add(conn)
        try:
            with conn, suppress(OSError):
                conn.settimeout(POLL_SECONDS)
                while self._read_request(conn):
                    with self._lock:
                        self.requests += 1
                    if self.fails:
                        conn.sendall(BUSY)
                        return
                    self._hold(conn)
                    return
        finally:
            with self._lock:
                self._open.discard(conn)

    def _hold(self, conn: socket.socket) -> None:
        """Never answer: wait until the relay closes the connection, or the server stops."""
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            while not self._stopping.is_set():
                try:
                    if not conn.recv(65536):
                        return  # the relay gave up on it
                except TimeoutError:
                    continue
        finally:
            with self._lock:
                self.in_flight -= 1

    def _read_request(self, conn: socket.socket) -> bool:
        """Read one request's head and body; False if the connection closed first."""
        _, whole = read_request(lambda: self._recv(conn))
        return whole

    def _recv(self, conn: socket.socket) -> bytes:
        while not self._stopping.is_set():
            try:
                return conn.recv(65536)
            except TimeoutError:
                continue
        return b""
