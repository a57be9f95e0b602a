"""A webhook request read off an asyncio stream, for the fast merchants of the relay's
bench and the multi-node run: no HTTP library, so that the merchant costs less CPU
than what it measures."""

from __future__ import annotations

import asyncio


async def read_webhook(reader: asyncio.StreamReader) -> tuple[bytes, bytes, str]:
    """The next request on the connection, its body read and dropped: (method, target,
    its ``webhook-id``). Raises IncompleteReadError once the peer closes."""
    head = await reader.readuntil(b"\r\n\r\n")
    request_line, *lines = head[:-4].split(b"\r\n")
    method, target, _ = request_line.split(b" ", 2)
    length, key = 0, ""
    for line in lines:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"webhook-id":
            key = value.strip().decode()
    if length:
        await reader.readexactly(length)
    return method, target, key
