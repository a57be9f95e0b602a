"""Posting to the webhook endpoint through Django's test client, and what a request leaves."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from project.shop.models import InventoryLedgerEntry, OrderState
from tests.support.signing import as_meta, reserved, standard_headers
from webhook_receiver.models import RequestAudit, WebhookReceipt


def post(client, source: str, body: bytes, headers: dict[str, str], **extra):
    """POST ``body`` to ``/webhooks/<source>/`` with ``headers`` as a sender sends them."""
    return client.post(
        f"/webhooks/{source}/",
        data=body,
        content_type="application/json",
        **as_meta(headers),
        **extra,
    )


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def assert_nothing_applied() -> None:
    assert not WebhookReceipt.objects.exists()
    assert not InventoryLedgerEntry.objects.exists()
    assert not OrderState.objects.exists()


def only_audit() -> RequestAudit:
    audits = list(RequestAudit.objects.all())
    assert len(audits) == 1, audits
    return audits[0]


@dataclass(frozen=True)
class Case:
    """One request of a table: how it is signed and sent, and the answer it must get."""

    status: int
    error: str
    verification: str
    body: bytes = field(default_factory=lambda: reserved("ord_1", ("SKU-1", 1)))
    sign: Callable[[bytes], dict[str, str]] = standard_headers
    source: str = "shop"
    has_detail: bool = False
    # False when the request is refused before its body is read
    body_read: bool = True
    result: str | None = None  # defaults to `error`
