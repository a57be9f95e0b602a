"""Which of a source's secrets verified its requests lately: during a rotation, the old
secret can go once it has stopped verifying anything.

Read from the audit records (each names its secret by fingerprint), within their
retention (AUDIT_RETENTION_DAYS): "never" means none of the records kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ..core.fingerprints import secret_fingerprint
from ..inbound.models import RequestAudit


def secrets_last_verified(slug: str, secrets: Iterable[str]) -> dict[str, datetime]:
    """Fingerprint -> the last time that secret verified a request to ``slug`` (a
    fingerprint with none is absent). One short query per secret: the newest record
    first, along the audit's time index."""
    found: dict[str, datetime] = {}
    for fingerprint in dict.fromkeys(secret_fingerprint(s) for s in secrets):
        last = (
            RequestAudit.objects.filter(source=slug, secret_fingerprint=fingerprint)
            .order_by("-received_at")
            .values_list("received_at", flat=True)
            .first()
        )
        if last is not None:
            found[fingerprint] = last
    return found
