"""A real listening socket that never accepts: what reached it stays in its backlog, and
``connections()`` counts it. For the egress guard's tests: a refused address must see no
connection, open port or not."""

from __future__ import annotations

import socket
from collections.abc import Iterator
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
