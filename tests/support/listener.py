"""Listening sockets for the tests.

``Listener``: a real listening socket that never accepts: what reached it stays in its
backlog, and ``connections()`` counts it. For the egress guard's tests: a refused address
must see no connection, open port or not.

``serve_each``: the other kind, the accept loop of the tests' small servers (the hostile
peer, the CONNECT proxy), a thread for each connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Listener:
    def __init__(self, family: int = socket.AF_INET, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:  # ::1 only: an IPv4 peer is the other listener's
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def connections(self) -> int:
        self.sock.setblocking(False)
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


@contextmanager
def listening(family: int = socket.AF_INET, host: str = "127.0.0.1") -> Iterator[Listener]:
    server = Listener(family, host)
    try:
        yield server
    finally:
        server.close()


def serve_each(
    sock: socket.socket,
    handle: Callable[[socket.socket], None],
    stopping: threading.Event,
    *,
    accepted: list[socket.socket] | None = None,
) -> threading.Thread:
    """Accept on ``sock`` until ``stopping`` is set or ``sock`` is closed, each connection
    handled by ``handle`` in a daemon thread of its own (and appended to ``accepted``, for
    the caller to close); the accepting thread, started."""

    def serve() -> None:
        while not stopping.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            if accepted is not None:
                accepted.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread
