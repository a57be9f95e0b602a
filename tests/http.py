"""Posting to the webhook endpoint through Django's test client."""

from __future__ import annotations

from tests.signing import as_meta


def post(client, source: str, body: bytes, headers: dict[str, str], **extra):
    """POST ``body`` to ``/webhooks/<source>/`` with ``headers`` as a sender sends them."""
    return client.post(
        f"/webhooks/{source}/",
        data=body,
        content_type="application/json",
        **as_meta(headers),
        **extra,
    )
