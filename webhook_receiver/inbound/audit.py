"""The audit trail: one record per request, the tallies that bound a flood of refused
ones, the client's address, and their retention.

A verified request always gets its record. A refused one is counted in its minute's
``RejectionTally`` (per source and reason) and gets a record of its own only while that
tally holds fewer than ``REJECTED_AUDIT_PER_MINUTE`` requests: a flood of bad requests
costs a row a minute per source and reason, and the counts stay exact.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from ..conf import TrustedProxies, app_settings
from ..core import bounds, sql, storable
from ..core.retention import delete_in_batches
from ..sources.lookup import source_known
from . import metrics, queries
from .models import RejectionTally, RequestAudit, Verification

logger = logging.getLogger(__name__)


@dataclass
class AuditDraft:
    """What is known about a request so far; written once, when its answer is known."""

    source: str
    received_at: datetime
    remote_addr: str | None = None
    verification: str = Verification.VERIFIED
    message_id: str = ""
    event_key: str = ""
    signature_timestamp: int | None = None
    body_sha256: str = ""
    body_size: int | None = None
    # the fingerprint of the secret that verified it (core/fingerprints.py), never a secret
    secret_fingerprint: str | None = None

    def __post_init__(self) -> None:
        self.remote_addr = client_address(self.remote_addr)

    def set_body(self, body: bytes) -> None:
        self.body_sha256 = hashlib.sha256(body).hexdigest()
        self.body_size = len(body)

    def record(self, *, result: str, response_status: int) -> None:
        """Write the record on its own (a captured failure, a 503, a claim on SQLite)."""
        row = self.row(result=result, response_status=response_status)
        with connection.cursor() as cursor:
            cursor.execute(queries.INSERT_AUDIT, sql.adapt(row, RequestAudit))

    def record_refusal(self, *, response_status: int) -> bool:
        """Count this refused request (``verification`` holds its code) in its minute's
        tally, and write its record if it is among the first REJECTED_AUDIT_PER_MINUTE
        of that tally. Returns whether the record was written."""
        config = app_settings()
        reason = self.verification
        row = {
            **self.row(result=reason, response_status=response_status),
            "minute": self.received_at.astimezone(UTC).replace(second=0, microsecond=0),
            # every slug that is not a source (or a disabled one) shares one tally: any
            # URL makes one
            "tally_source": self.source if source_known(self.source) else "",
            "reason": reason,
            "keep": config.rejected_audit_per_minute,
        }
        params = sql.adapt(row, RequestAudit, RejectionTally)
        if connection.vendor == "postgresql":
            # relaxed only in a transaction of its own: a caller's keeps its durability
            relax = not connection.in_atomic_block
            statement = queries.RECORD_REFUSAL_RELAXED if relax else queries.RECORD_REFUSAL
            # bounded as a delivery's first statement is: a locked audit table must not
            # hold a worker for every refusal of a flood
            params |= bounds.configured_bounds()
            with connection.cursor() as cursor:
                bounds.execute_bounded(cursor, statement, params)
                recorded = cursor.rowcount == 1
        else:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(queries.TALLY_REFUSAL_SQLITE, params)
                recorded = bool(cursor.fetchone()[0])
                if recorded:
                    cursor.execute(queries.INSERT_AUDIT, params)
        if not recorded:
            metrics.refusal_unrecorded(self.source, reason)
        return recorded

    def row(self, *, result: str, response_status: int) -> dict[str, Any]:
        """The audit record's columns, by field name."""
        # everything here may come from an unauthenticated request: made storable
        return {
            "source": storable.text(self.source, 100),
            "message_id": storable.text(self.message_id, 255),
            "event_key": storable.text(self.event_key, 255),
            "signature_timestamp": storable.moment(self.signature_timestamp),
            **self.claim_values(),
            "result": result,
            "response_status": response_status,
        }

    def claim_values(self) -> dict[str, Any]:
        """The columns the claim's statements add to the event's own (source, event key,
        message id, signature timestamp) when they write this record."""
        return {
            "verification": self.verification,
            "body_sha256": self.body_sha256,
            "body_size": self.body_size,
            "remote_addr": self.remote_addr,
            "received_at": self.received_at,
            "secret_fingerprint": self.secret_fingerprint,
        }

    def record_best_effort(
        self, *, result: str, response_status: int
    ) -> tuple[bool, DatabaseError | None]:
        """Record (a refused request: count, and record within the bound), but never let a
        broken database hide the answer being given. Returns whether a record was written,
        and the database's error instead of raising it: the caller logs the record's
        fields (``log_fields``) in its place."""
        try:
            if self.verification == Verification.VERIFIED:
                self.record(result=result, response_status=response_status)
                return True, None
            return self.record_refusal(response_status=response_status), None
        except DatabaseError as exc:
            return False, exc

    def log_fields(self, *, result: str, response_status: int) -> dict[str, Any]:
        """The record's fields for a log line that stands in for it."""
        row = self.row(result=result, response_status=response_status)
        row["received_at"] = self.received_at.isoformat()
        row["signature_timestamp"] = self.signature_timestamp
        return row


@functools.lru_cache(maxsize=1024)  # the same few proxies and senders, request after request
def client_address(value: str | None) -> str | None:
    """``REMOTE_ADDR`` as an IP address the database accepts, or None.

    A server on a Unix socket may pass an empty or made-up value, and an IPv6 address may
    carry a zone (``fe80::1%eth0``) that PostgreSQL's inet type refuses: neither may cost
    the request its audit record.
    """
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.split("%", 1)[0]))
    except ValueError:
        return None


# X-Forwarded-For entries read at most, from the right: more proxies than any deployment
# has, so that a header of thousands of entries costs no more than this
MAX_FORWARDED_HOPS = 16


def request_client_address(meta: Mapping[str, Any]) -> str | None:
    """The client's address of a request (its WSGI environ), for its audit record:
    ``REMOTE_ADDR``, or behind ``TRUSTED_PROXIES``, what they say in X-Forwarded-For."""
    proxies = app_settings().trusted_proxies
    remote_addr = meta.get("REMOTE_ADDR")
    if proxies is None:  # the header is anyone's to write: never read it
        return client_address(remote_addr)
    return forwarded_client_address(remote_addr, meta.get("HTTP_X_FORWARDED_FOR"), proxies)


def forwarded_client_address(
    remote_addr: str | None, forwarded_for: str | None, proxies: TrustedProxies
) -> str | None:
    """The rightmost hop that is not a trusted proxy.

    The chain is read from the nearest peer (``REMOTE_ADDR``) outwards, through
    X-Forwarded-For from its right end: each trusted proxy vouches for the address it
    appended, the next hop's. The first hop that is not trusted is the client, and
    nothing to its left is read (the client wrote it). An entry missing or malformed
    where a trusted proxy should have written one ends the chain at the last address
    known: a header never costs the request its record, nor lets a client choose the
    address recorded. Behind a Unix socket there is no REMOTE_ADDR: a count of proxies
    still reads the header (the socket's peer is the nearest proxy), networks cannot.
    """
    address = client_address(remote_addr)
    if not forwarded_for:
        return address
    entries = forwarded_for.rsplit(",", MAX_FORWARDED_HOPS)[::-1][:MAX_FORWARDED_HOPS]
    for hop, entry in enumerate(entries):
        if not proxies.trusts(hop, address):
            break
        forwarded = client_address(_without_port(entry.strip()))
        if forwarded is None:
            break
        address = forwarded
    return address


def _without_port(entry: str) -> str:
    """'203.0.113.7:4711' and '[2001:db8::1]:4711' as their addresses (some proxies add
    the port); anything else as it is."""
    if entry.startswith("["):
        return entry[1:].partition("]")[0]
    if entry.count(":") == 1:
        return entry.partition(":")[0]
    return entry


def purge_audit_records(*, now: datetime | None = None, max_batches: int = 1000) -> int:
    """Delete audit records and rejection tallies older than the retention period, in
    bounded batches; return how many rows went."""
    config = app_settings()
    cutoff = (now or timezone.now()) - config.audit_retention
    return sum(
        delete_in_batches(rows, batch_size=config.purge_batch_size, max_batches=max_batches)
        for rows in (
            RequestAudit.objects.filter(received_at__lt=cutoff),
            RejectionTally.objects.filter(minute__lt=cutoff),
        )
    )
