"""The merchants of the relay's scale bench: one asyncio process listening on many loopback
ports, one merchant a port (``python -m tests.bench.relay_merchants --merchants N
[--black-holes B] [--answer-after S]``).

A merchant keeps its connections alive (HTTP/1.1) and answers each webhook 200 after
``--answer-after`` seconds (0.2 by default), recording its arrival: the CLOCK_MONOTONIC
time (which every process on the machine shares), the merchant's number and the
request's ``webhook-id``, so that the bench counts each key's arrivals and times each
message from its admission's commit. A black hole accepts the connection, reads what is
sent and never answers. No HTTP library: a request is parsed off the stream by hand, so
that the merchants cost less CPU than what they measure.

On start it prints one JSON line: its control port, then the merchants' ports and the
black holes'. The control port answers ``GET /count`` (arrivals so far, CPU seconds
spent) and ``GET /arrivals`` (every arrival since the last call, as ``[time, merchant,
key]``). SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import resource
import signal
import socket
import sys
import time
from typing import Any

from tests.support.wire import read_webhook

HOST = "127.0.0.1"
ANSWER = (
    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'
)
LISTEN_BACKLOG = 64


def raise_open_files() -> int:
    """This process's open-files limit raised to its hard limit; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class Book:
    """Every arrival since the last drain, and how many so far."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, int, str]] = []
        self.count = 0

    def arrive(self, merchant: int, key: str) -> None:
        self.pending.append((time.monotonic(), merchant, key))
        self.count += 1


class Merchant(asyncio.Protocol):
    """One connection to merchant ``number``: each request recorded as it is read, its
    answer written ``delay`` seconds later (never, for a black hole)."""

    __slots__ = ("book", "number", "delay", "hole", "transport", "buffer", "loop")

    def __init__(self, book: Book, number: int, delay: float, hole: bool) -> None:
        self.book = book
        self.number = number
        self.delay = delay
        self.hole = hole
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.hole:
            return  # read and dropped: no answer, ever
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            length = _header(head, b"content-length")
            total = end + 4 + (int(length) if length else 0)
            if len(buffer) < total:
                return
            del buffer[:total]
            key = _header(head, b"webhook-id")
            self.book.arrive(self.number, key.decode() if key else "")
            self.loop.call_later(self.delay, self._answer)

    def _answer(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(ANSWER)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


def _header(head: bytes, name: bytes) -> bytes:
    """The value of header ``name`` in a lowercased request head, or b""."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return b""
    start = at + len(name) + 3
    stop = head.find(b"\r\n", start)
    return head[start : stop if stop >= 0 else len(head)].strip()


async def _control(book: Book, reader: asyncio.StreamReader, writer: Any) -> None:
    try:
        while True:
            _, target, _ = await read_webhook(reader)
            if target == b"/arrivals":
                taken, book.pending = book.pending, []
                document: Any = {"arrivals": taken, "count": book.count}
            else:
                document = {"count": book.count, "cpu_s": time.process_time()}
            body = json.dumps(document).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


async def serve(merchants: int, holes: int, delay: float) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    book = Book()
    servers = []
    ports: list[int] = []
    hole_ports: list[int] = []
    for number in range(merchants + holes):
        hole = number >= merchants
        sock = _listening()
        servers.append(
            await loop.create_server(
                functools.partial(Merchant, book, number, delay, hole), sock=sock
            )
        )
        (hole_ports if hole else ports).append(sock.getsockname()[1])
    control = await asyncio.start_server(
        lambda r, w: _control(book, r, w), HOST, 0, backlog=LISTEN_BACKLOG
    )
    control_port = control.sockets[0].getsockname()[1]
    print(json.dumps({"control": control_port, "ports": ports, "holes": hole_ports}), flush=True)
    await stop.wait()
    for server in [*servers, control]:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--merchants", type=int, required=True)
    parser.add_argument("--black-holes", type=int, default=0)
    parser.add_argument("--answer-after", type=float, default=0.2)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops it, with SIGTERM
    limit = raise_open_files()
    # a listening socket a merchant, and a connection to each of its requests in flight
    needed = (args.merchants + args.black_holes) * 8 + 64
    if limit < needed:
        sys.exit(f"open files limited to {limit}; {needed} needed (ulimit -Hn)")
    asyncio.run(serve(args.merchants, args.black_holes, args.answer_after))


if __name__ == "__main__":
    main()
