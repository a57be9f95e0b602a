"""The load generator: pre-signed requests sent from client processes over loopback.

Client processes are forked from the runner, never from gunicorn, and each opens one
connection per request (gunicorn's sync workers close it after every response). They
pull request indexes from a shared counter, so a slow response never leaves a client
idle while work remains (a closed loop with ``concurrency`` requests in flight).

Requests go out as pre-built bytes over a plain socket rather than through
http.client: the clients share the server's 2 cores, and http.client's header
handling took twice the CPU per request (about 0.5 ms, not 0.25), taken from the server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import multiprocessing as mp
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier
from typing import Any

from .common import SHOP_SECRET

MAX_ERROR_SAMPLES = 5
REQUEST_TIMEOUT_SECONDS = 30

# one client's share: (first start, last end, latencies in ms, errors, error samples)
ClientResult = tuple[float, float, list[float], int, list[str]]


@dataclass(frozen=True)
class PreparedRequest:
    path: str
    wire: bytes  # the whole HTTP/1.1 request, ready to send
    expected_status: str  # the "status" (or, for a refusal, the "error") the answer carries
    expected_code: bytes = b"200"  # the HTTP status


@dataclass
class PhaseResult:
    latencies_ms: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)


# --- request preparation -------------------------------------------------------------


def _hmac_key(secret: str) -> bytes:
    encoded = secret.removeprefix("whsec_")
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


_KEY = _hmac_key(SHOP_SECRET)


def standard_headers(msg_id: str, body: bytes, timestamp: int) -> dict[str, str]:
    """Standard Webhooks headers, signed as the specification spells it out."""
    mac = hmac.new(_KEY, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


def event_bodies(count: int, tag: str) -> list[bytes]:
    """``inventory.reserved`` events with two lines each, unique per ``tag``."""
    now = int(time.time())
    return [
        json.dumps(
            {
                "type": "inventory.reserved",
                "timestamp": now,
                "data": {
                    "order_id": f"ord-{tag}-{i}",
                    "version": 1,
                    "lines": [
                        {"sku": f"sku-{i % 97}", "quantity": 1},
                        {"sku": f"sku-{(i + 1) % 97}", "quantity": 2},
                    ],
                },
            }
        ).encode()
        for i in range(count)
    ]


def http_request(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def unknown_slugs(host: str, count: int, body: bytes) -> list[PreparedRequest]:
    """``count`` POSTs of ``body``, each to a made-up slug of its own: 404 for each."""
    requests = []
    for _ in range(count):
        path = f"/webhooks/{secrets.token_hex(6)}/"
        wire = http_request(host, path, body, {"Content-Type": "application/json"})
        requests.append(PreparedRequest(path, wire, "unknown_source", b"404"))
    return requests


def signed_requests(
    *, host: str, path: str, bodies: Sequence[bytes], msg_prefix: str, expected_status: str
) -> list[PreparedRequest]:
    """Sign ``bodies`` now, so the timestamps are fresh when the phase starts.

    Re-signing the same bodies with the same prefix gives a redelivery: same message
    ids (the event keys), new timestamps, as a sender's retry would.
    """
    timestamp = int(time.time())
    return [
        PreparedRequest(
            path=path,
            wire=http_request(
                host, path, body, standard_headers(f"{msg_prefix}_{i}", body, timestamp)
            ),
            expected_status=expected_status,
        )
        for i, body in enumerate(bodies)
    ]


# --- the load phase ------------------------------------------------------------------


def run_phase(
    host: str, port: int, requests: Sequence[PreparedRequest], concurrency: int
) -> PhaseResult:
    """Send every request once with ``concurrency`` client processes; time the whole."""
    ctx = mp.get_context("fork")  # children inherit ``requests``: no pickling of bodies
    counter = ctx.Value("q", 0)
    barrier = ctx.Barrier(concurrency + 1)
    results: Queue[ClientResult] = ctx.Queue()
    clients = [
        ctx.Process(
            target=_client,
            args=(host, port, requests, counter, barrier, results),
            daemon=True,
        )
        for _ in range(concurrency)
    ]
    for client in clients:
        client.start()
    try:
        barrier.wait()  # every client is forked and ready: start together
        parts = [results.get(timeout=600) for _ in clients]
    finally:
        for client in clients:
            client.join(timeout=5)
            if client.is_alive():
                client.terminate()
    return _merge(parts)


def _merge(parts: list[ClientResult]) -> PhaseResult:
    result = PhaseResult()
    starts = [start for start, _, latencies, _, _ in parts if latencies]
    ends = [end for _, end, latencies, _, _ in parts if latencies]
    result.elapsed_s = max(ends) - min(starts) if starts else 0.0
    for _, _, latencies, errors, samples in parts:
        result.latencies_ms.extend(latencies)
        result.errors += errors
        room = MAX_ERROR_SAMPLES - len(result.error_samples)
        result.error_samples.extend(samples[:room])
    return result


def _client(
    host: str,
    port: int,
    requests: Sequence[PreparedRequest],
    counter: Synchronized[int],
    barrier: Barrier,
    results: Queue[ClientResult],
) -> None:
    try:
        barrier.wait()
        results.put(_client_loop(host, port, requests, counter))
    except KeyboardInterrupt:
        pass  # the runner was interrupted too and reports it; no traceback per client
    except Exception as exc:  # report, rather than leave the runner waiting for a result
        results.put((0.0, 0.0, [], 1, [f"client failed: {type(exc).__name__}: {exc}"]))


def _client_loop(
    host: str, port: int, requests: Sequence[PreparedRequest], counter: Synchronized[int]
) -> ClientResult:
    latencies: list[float] = []
    errors, samples = 0, []
    first = last = 0.0
    while True:
        with counter.get_lock():
            index = counter.value
            counter.value = index + 1
        if index >= len(requests):
            break
        started = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        problem = _send(host, port, requests[index])
        last = time.perf_counter()
        first = first or started
        latencies.append((last - started) * 1000)
        if problem is not None:
            errors += 1
            if len(samples) < MAX_ERROR_SAMPLES:
                samples.append(problem)
    return first, last, latencies, errors, samples


def _send(host: str, port: int, request: PreparedRequest) -> str | None:
    """Send one request; return None if it got the expected answer, else what went wrong."""
    try:
        with socket.create_connection((host, port), timeout=REQUEST_TIMEOUT_SECONDS) as sock:
            sock.sendall(request.wire)
            chunks = []
            while chunk := sock.recv(65536):  # the server closes after its answer
                chunks.append(chunk)
    except OSError as exc:
        return f"{request.path}: {type(exc).__name__}: {exc}"
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    if (
        status_line[9:12] != request.expected_code
        or _answer_status(body) != request.expected_status
    ):
        return (
            f"{request.path}: {status_line.decode('latin-1')!r}, expected status "
            f"{request.expected_status!r}, got {body[:200]!r}"
        )
    return None


def _answer_status(data: bytes) -> Any:
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    return answer.get("status", answer.get("error"))
