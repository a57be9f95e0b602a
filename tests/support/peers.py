"""A hostile peer on loopback, for the relay's destinations and reconciliation's senders:
a raw socket server that answers each request with whatever bytes a script gives, each
chunk after its delay (a header line every few seconds, a body byte at a time, a NUL, a
charset no codec reads), then closes the connection."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from tests.support.listener import serve_each

# an answer: (seconds to wait, bytes to send) in turn
Chunks = Iterable[tuple[float, bytes]]


@dataclass
class Peer:
    url: str
    requests: list[bytes] = field(default_factory=list)
    # bytes of the answers actually written (a client that stops reading stops them)
    written: int = 0


Headers = dict[str, str] | list[tuple[str, str]]


@dataclass(frozen=True)
class Request:
    """What a script reads of a request: its path, query (each name's first value) and
    headers (names lower-cased)."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]


def answer(status: int, headers: Headers, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer, its Content-Length counted; header values as given."""
    return answer_head(status, headers, len(body)) + body


def answer_head(status: int, headers: Headers, length: int) -> bytes:
    """An answer's status line and headers, announcing a body of ``length`` bytes."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers)
    lines = [f"HTTP/1.1 {status} Whatever".encode()]
    lines += [f"{name}: ".encode() + _raw(value) for name, value in pairs]
    lines += [f"content-length: {length}".encode(), b"connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def dripping(length: int) -> Callable[[bytes], Chunks]:
    """A script: a 200 whose JSON body of ``length`` spaces comes a byte every 0.2 s."""
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"

    def drip(request: bytes) -> Chunks:
        yield 0, head.encode()
        for _ in range(length):
            yield 0.2, b" "

    return drip


def parsed(request: bytes) -> Request:
    """A request as ``hostile_peer`` hands it to a script, read."""
    line, *fields = request.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    target = urlsplit(line.split(" ")[1])
    headers = {}
    for field_line in fields:
        name, _, value = field_line.partition(":")
        headers[name.strip().lower()] = value.strip()
    query = {name: values[0] for name, values in parse_qs(target.query).items()}
    return Request(target.path, query, headers)


def _raw(value: str) -> bytes:
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


@contextmanager
def hostile_peer(script: Callable[[bytes], Chunks], *, path: str = "/hooks") -> Iterator[Peer]:
    """Serve ``script(request) -> chunks`` on a loopback port, a thread per request."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    peer = Peer(url=f"http://127.0.0.1:{sock.getsockname()[1]}{path}")
    stopping = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn, suppress(OSError):
            request = _read_request(conn)
            peer.requests.append(request)
            for delay, data in script(request):
                if stopping.wait(delay):
                    return
                conn.sendall(data)
                peer.written += len(data)

    serve_each(sock, handle, stopping)
    try:
        yield peer
    finally:
        stopping.set()
        sock.close()


def _read_request(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    data, _ = read_request(lambda: conn.recv(65536))
    return data


def read_request(recv: Callable[[], bytes]) -> tuple[bytes, bool]:
    """One HTTP/1.1 request's head and body, by its Content-Length, from ``recv`` (b"":
    the connection closed); and whether it came whole before it closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = recv()
        if not chunk:
            return data, False
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    while len(body) < length:
        chunk = recv()
        if not chunk:
            return head + b"\r\n\r\n" + body, False
        body += chunk
    return head + b"\r\n\r\n" + body, True


def trickled(lines: Iterable[bytes], *, every: float, then: bytes = b"") -> Chunks:
    """Each of ``lines`` after ``every`` seconds, then ``then``."""
    for line in lines:
        yield every, line
    yield 0.0, then


def timed(action: Callable[[], object]) -> tuple[object, float]:
    began = time.monotonic()
    result = action()
    return result, time.monotonic() - began
