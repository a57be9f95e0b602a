"""A secret's fingerprint is keyed by the server's SECRET_KEY: it names a secret without
being an oracle for it. Whoever reads the audit records (view-only staff) once cracked a
hand-picked secret in a few hundred offline guesses against an unkeyed SHA-256; the
same guesses find nothing now. Migration 0022 rewrites the fingerprints stored before,
and clears those of secrets no longer in use."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from tests.settings import SHOP_SECRET
from tests.sources.conftest import ACME_SECRET
from tests.support.http import post
from tests.support.signing import reserved, standard_headers
from webhook_receiver.core.fingerprints import secret_fingerprint
from webhook_receiver.models import RequestAudit
from webhook_receiver.sources.operations import source_add

HAND_PICKED = "Summer2024!"
# what an attacker tries: a wordlist with the secret in it
GUESSES = [f"{word}{year}{mark}" for word in ("Spring", "Summer", "Autumn", "Winter")
           for year in range(2015, 2030) for mark in ("", "!", "?", "#")]  # fmt: skip


def unkeyed(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


def test_a_fingerprint_is_no_oracle_without_the_server_key(settings):
    shown = secret_fingerprint(HAND_PICKED)

    # the offline attack that worked on an unkeyed fingerprint finds nothing...
    assert HAND_PICKED in GUESSES and unkeyed(HAND_PICKED) != shown
    assert [g for g in GUESSES if unkeyed(g) == shown] == []
    # ...and the same secret under another server key has another fingerprint
    assert len(shown) == 16 and int(shown, 16) >= 0
    settings.SECRET_KEY = "another server key, " + "x" * 40
    assert secret_fingerprint(HAND_PICKED) != shown
    # stable for one key: a rotation's records keep naming the same secret
    assert secret_fingerprint(HAND_PICKED) == secret_fingerprint(HAND_PICKED)


@pytest.mark.django_db
def test_the_audit_record_names_the_secret_by_its_keyed_fingerprint(client):
    body = reserved("ord_fp", ("SKU-A", 1))
    assert post(client, "shop", body, standard_headers(body, secret=SHOP_SECRET)).status_code == 200
    stored = RequestAudit.objects.get().secret_fingerprint
    assert stored == secret_fingerprint(SHOP_SECRET) != unkeyed(SHOP_SECRET)


def migrate(target: str | None = None) -> None:
    """To ``target``, or (None) to the latest: what the tests after this one expect."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    if target is None:
        executor.migrate(executor.loader.graph.leaf_nodes())
    else:
        executor.migrate([("webhook_receiver", target)])


def audit(fingerprint: str | None) -> int:
    return RequestAudit.objects.create(
        source="shop",
        result="applied",
        response_status=200,
        received_at=timezone.now(),
        secret_fingerprint=fingerprint,
    ).pk


@pytest.mark.django_db(transaction=True)
def test_the_migration_rewrites_stored_fingerprints_and_clears_the_rest():
    # given: audit records as the release before wrote them, for the settings' secret,
    # a record's secret, and a secret no source has any more
    source_add(slug="acme", scheme="standard", secrets=[ACME_SECRET])
    migrate("0021_outbox_in_flight_and_failed_indexes")
    try:
        shop = audit(unkeyed(SHOP_SECRET))
        acme = audit(unkeyed(ACME_SECRET))
        gone = audit(unkeyed("whsec_" + b"a removed secret".hex()))
        refused = audit(None)

        # when
        migrate("0022_secret_fingerprints_keyed")
    finally:
        migrate()  # today's schema, for the model and the tests after this one

    # then
    after = dict(RequestAudit.objects.values_list("pk", "secret_fingerprint"))
    assert after == {
        shop: secret_fingerprint(SHOP_SECRET),
        acme: secret_fingerprint(ACME_SECRET),
        gone: None,
        refused: None,
    }
