"""A small HTTP CONNECT proxy on loopback, in threads over real sockets, for the egress
proxy's tests: it opens tunnels to the targets it allows, and otherwise refuses them
(403, or 407 as smokescreen does), asks for credentials (407), stays silent, drops the
connection, or answers CONNECT with whatever bytes a test gives.

Every CONNECT is recorded: its target and headers (Proxy-Authorization among them).
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from tests.support.listener import serve_each

ALLOW, DENY, HANG, DROP, RAW = "allow", "deny", "hang", "drop", "raw"


@dataclass
class Connect:
    target: str
    headers: dict[str, str]


@dataclass
class ConnectProxy:
    host: str
    port: int
    # what it does with a CONNECT: ALLOW (a tunnel, to a target in ``allowed`` if that
    # is set), DENY (``deny_status``), HANG, DROP, or RAW (``raw`` sent as the answer)
    mode: str = ALLOW
    allowed: set[str] | None = None
    deny_status: int = 407
    # (user, password) it requires, 407 otherwise
    credentials: tuple[str, str] | None = None
    raw: bytes = b""
    # RAW: close once ``raw`` is sent (else hold the connection open)
    close_after_raw: bool = True
    # RAW: seconds between its bytes (0: all at once)
    trickle: float = 0.0
    connects: list[Connect] = field(default_factory=list)
    tunnelled: int = 0

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}{self.host}:{self.port}"

    def targets(self) -> list[str]:
        return [c.target for c in self.connects]


def _read_head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _refusal(status: int, reason: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\n{extra}Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with suppress(OSError):
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextmanager
def connect_proxy(**options) -> Iterator[ConnectProxy]:
    """Serve a ConnectProxy (its fields as ``options``) on a loopback port."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    proxy = ConnectProxy(host="127.0.0.1", port=sock.getsockname()[1], **options)
    stopping = threading.Event()
    open_sockets: list[socket.socket] = []

    def handle(conn: socket.socket) -> None:
        with conn, suppress(OSError):
            head = _read_head(conn)
            lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            target = rest.rsplit(" ", 1)[0]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            proxy.connects.append(Connect(target, headers))
            if proxy.mode == DROP:
                return
            if proxy.mode == HANG:
                stopping.wait()
                return
            if proxy.mode == RAW:
                if not proxy.trickle:
                    conn.sendall(proxy.raw)
                for byte in proxy.raw if proxy.trickle else b"":
                    if stopping.wait(proxy.trickle):
                        return
                    conn.sendall(bytes([byte]))
                if not proxy.close_after_raw:
                    stopping.wait()
                return
            if proxy.credentials is not None:
                pair = ":".join(proxy.credentials).encode()
                expected = "Basic " + base64.b64encode(pair).decode()
                if headers.get("proxy-authorization") != expected:
                    conn.sendall(
                        _refusal(
                            407,
                            "Proxy Authentication Required",
                            b"",
                            'Proxy-Authenticate: Basic realm="egress"\r\n',
                        )
                    )
                    return
            if method != "CONNECT":
                conn.sendall(_refusal(405, "Method Not Allowed", b"CONNECT only"))
                return
            denied = proxy.mode == DENY or (
                proxy.allowed is not None and target not in proxy.allowed
            )
            if denied:
                body = f"Egress proxy rejected connection to {target}: denied by rule".encode()
                conn.sendall(_refusal(proxy.deny_status, "Request Rejected by Proxy", body))
                return
            host, _, port = target.rpartition(":")
            try:
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
            except OSError:
                conn.sendall(_refusal(502, "Bad Gateway", b"no connection to the target"))
                return
            upstream.settimeout(None)
            open_sockets.append(upstream)
            proxy.tunnelled += 1
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
            back.start()
            _pipe(conn, upstream)
            back.join(timeout=10)
            upstream.close()

    thread = serve_each(sock, handle, stopping, accepted=open_sockets)
    try:
        yield proxy
    finally:
        stopping.set()
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the accept, which close alone does not
        sock.close()
        for s in open_sockets:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                s.close()
        thread.join(timeout=5)
