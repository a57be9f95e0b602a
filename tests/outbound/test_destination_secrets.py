"""Destination signing secrets encrypted at rest: the column never holds a secret, a key
rotation keeps every delivery verifying, a wrong or missing key is a clear error (never a
delivery sent unsigned), and the migration encrypts the rows an older release stored.

Deliveries go to a real HTTP receiver on loopback (tests/support/receiver.py) and are verified
there with the standardwebhooks library; the column is read with raw SQL.
"""

from __future__ import annotations

import base64
import json
import logging
from io import StringIO

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.core import checks, serializers
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import TestCase
from django.urls import reverse
from standardwebhooks import Webhook

from tests.settings import SECRET_ENCRYPTION_KEY
from tests.support import ed25519_rfc8032 as rfc8032
from webhook_receiver.checks import check_destination_secrets, check_destination_secrets_readable
from webhook_receiver.core.encryption import SecretsUnreadable
from webhook_receiver.models import OutboxMessage, WebhookDestination
from webhook_receiver.outbound import enqueue_webhook
from webhook_receiver.outbound.relay.process import relay_destination
from webhook_receiver.schemes import verify
from webhook_receiver.schemes.standard_keys import new_signing_key, public_key_of
from webhook_receiver.watch.heartbeat import record_heartbeat
from webhook_receiver.watch.relays import record_relay_heartbeat  # noqa: E402

pytestmark = pytest.mark.django_db

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OLD_SECRET = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
NEW_KEY = Fernet.generate_key().decode()
OTHER_KEY = Fernet.generate_key().decode()
PAYLOAD = {"type": "order.paid", "data": {"order_id": "ord_1"}}


def with_keys(settings, *keys: str) -> None:
    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "SECRET_ENCRYPTION_KEYS": list(keys)}


def stored(name: str = "merchant") -> list[str]:
    """The secrets column as the database holds it: raw SQL, no field in between."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT secrets FROM webhook_receiver_webhookdestination WHERE name = %s", [name]
        )
        (value,) = cursor.fetchone()
    return json.loads(value) if isinstance(value, str) else value


def destination(url: str, secrets=(OLD_SECRET, SECRET)) -> WebhookDestination:
    return WebhookDestination.objects.create(
        name="merchant", url=url, secrets=list(secrets), event_types=["order.paid"]
    )


def admit(dest: WebhookDestination, key: str) -> None:
    with TestCase.captureOnCommitCallbacks(execute=False), transaction.atomic():
        enqueue_webhook(dest, "order.paid", key, PAYLOAD)


def delivered_and_verified(receiver, key: str, secret: str = SECRET) -> None:
    request = next(r for r in receiver.received if r.headers.get("webhook-id") == key)
    assert Webhook(secret).verify(request.body, request.headers) == PAYLOAD
    assert OutboxMessage.objects.get(key=key).status == "delivered"


# --- at rest ------------------------------------------------------------------------------


def add_by_command() -> None:
    """The destination "cli", added with its secret by ``manage.py webhook_destination``."""
    call_command(
        "webhook_destination", "add", "cli", "--url", "https://cli.example/h",
        "--secret", SECRET, stdout=StringIO(),
    )  # fmt: skip


def test_the_column_holds_tokens_never_a_secret(receiver):
    destination(receiver.url)

    column = stored()
    assert len(column) == 2
    assert all(token.startswith("gAAAAA") for token in column)
    assert not any(s in json.dumps(column) for s in (SECRET, OLD_SECRET, SECRET[6:]))
    # each token is its secret under the configured key; the model reads the secrets
    box = Fernet(SECRET_ENCRYPTION_KEY)
    assert [box.decrypt(t.encode()).decode() for t in column] == [OLD_SECRET, SECRET]
    assert WebhookDestination.objects.get().secrets == [OLD_SECRET, SECRET]


def test_the_command_and_the_admin_store_tokens(admin_client):
    add_by_command()
    assert SECRET not in json.dumps(stored("cli"))

    fields = {
        "name": "form",
        "url": "https://form.example/h",
        "enabled": "on",
        "event_types": "order.paid",
        "rate_count": 10,
        "rate_seconds": 1,
        "burst": 10,
        "max_in_flight": 4,
        "timeout_seconds": 10,
        "max_attempts": 12,
        "backoff_base_seconds": 2,
        "backoff_cap_seconds": 3600,
        "retry_after_cap_seconds": 300,
        "breaker_threshold": 10,
        "breaker_cooldown_seconds": 60,
        "replay_horizon_days": 30,
        "new_secrets": SECRET,
    }
    response = admin_client.post(reverse("admin:webhook_receiver_webhookdestination_add"), fields)
    assert response.status_code == 302, response.content[:2000]
    assert SECRET not in json.dumps(stored("form"))
    assert WebhookDestination.objects.get(name="form").secrets == [SECRET]


def test_a_signing_key_is_encrypted_and_signs_v1a_beside_v1(receiver):
    # given: a destination signing with an Ed25519 key and a shared secret
    key = new_signing_key()
    dest = destination(receiver.url, secrets=(key, SECRET))
    assert not any(part in json.dumps(stored()) for part in (key, key.removeprefix("whsk_")))

    # when
    admit(dest, "both")
    relay_destination(destination_id=dest.pk)

    # then: one signature of each version; each verifies on its own
    delivered_and_verified(receiver, "both")  # v1, by the standardwebhooks library
    (request,) = receiver.received
    versions = [entry.split(",")[0] for entry in request.headers["webhook-signature"].split()]
    assert versions == ["v1a", "v1"]
    message = verify(
        scheme="standard",
        secrets=[public_key_of(key)],
        headers=request.headers,
        body=request.body,
        tolerance_seconds=300,
    )
    assert message.message_id == "both"
    # and by RFC 8032's algorithm, which knows nothing of the app
    v1a = request.headers["webhook-signature"].split()[0].removeprefix("v1a,")
    content = f"both.{request.headers['webhook-timestamp']}.".encode() + request.body
    public = base64.b64decode(public_key_of(key).removeprefix("whpk_"))
    assert rfc8032.verify(public, content, base64.b64decode(v1a))


def test_a_dump_of_the_table_holds_tokens_and_loads_back(receiver):
    destination(receiver.url)

    dumped = serializers.serialize("json", WebhookDestination.objects.all())
    assert SECRET not in dumped and OLD_SECRET not in dumped
    WebhookDestination.objects.all().delete()
    for obj in serializers.deserialize("json", dumped):
        obj.save()
    assert WebhookDestination.objects.get().secrets == [OLD_SECRET, SECRET]


# --- rotation -----------------------------------------------------------------------------


def test_a_key_rotation_keeps_every_delivery_verifying(receiver, settings):
    # given: secrets encrypted under the old key, and a delivery that verifies
    dest = destination(receiver.url)
    admit(dest, "before")
    relay_destination(destination_id=dest.pk)
    delivered_and_verified(receiver, "before")

    # when: a new key is put first; the old one still decrypts
    with_keys(settings, NEW_KEY, SECRET_ENCRYPTION_KEY)
    admit(dest, "during")
    relay_destination(destination_id=dest.pk)
    delivered_and_verified(receiver, "during")
    # every secret is encrypted again under the new key
    out = StringIO()
    call_command("webhook_destination", "reencrypt", stdout=out)
    assert "re-encrypted the secrets of 1 destination(s)" in out.getvalue()
    for token in stored():
        Fernet(NEW_KEY).decrypt(token.encode())  # the new key alone reads them
        with pytest.raises(InvalidToken):
            Fernet(SECRET_ENCRYPTION_KEY).decrypt(token.encode())

    # then: the old key is removed, and deliveries verify as before, with both secrets
    with_keys(settings, NEW_KEY)
    admit(dest, "after")
    relay_destination(destination_id=dest.pk)
    delivered_and_verified(receiver, "after")
    delivered_and_verified(receiver, "after", secret=OLD_SECRET)


def test_reencrypt_writes_the_secrets_alone(receiver, settings):
    dest = destination(receiver.url)
    WebhookDestination.objects.filter(pk=dest.pk).update(tokens=3.5, consecutive_failures=2)
    with_keys(settings, NEW_KEY, SECRET_ENCRYPTION_KEY)

    call_command("webhook_destination", "reencrypt", stdout=StringIO())

    dest.refresh_from_db()
    assert (dest.tokens, dest.consecutive_failures) == (3.5, 2)  # the relay's state kept
    with pytest.raises(CommandError):
        call_command("webhook_destination", "reencrypt", "merchant", stdout=StringIO())


# --- a wrong or missing key ---------------------------------------------------------------


@pytest.mark.parametrize("keys", [[OTHER_KEY], []], ids=["wrong key", "no key"])
def test_without_the_key_the_relay_stops_before_sending_anything(receiver, settings, keys, caplog):
    # given: a message waiting, and keys that cannot read its destination's secrets
    dest = destination(receiver.url)
    admit(dest, "waiting")
    with_keys(settings, *keys)

    # when
    with caplog.at_level(logging.ERROR, logger="webhook_receiver"):
        relay_destination(destination_id=dest.pk)

    # then: one clear line, naming the setting
    (line,) = [r.getMessage() for r in caplog.records if r.name.startswith("webhook_receiver")]
    assert "is not relayed (secrets unreadable" in line and "SECRET_ENCRYPTION_KEYS" in line

    # nothing was sent, signed or not, and the message is as it was
    assert receiver.received == []
    message = OutboxMessage.objects.get()
    assert (message.status, message.attempts) == ("pending", 0)


def test_without_the_key_a_destination_with_secrets_cannot_be_saved(settings):
    with_keys(settings)
    empty = r"SECRET_ENCRYPTION_KEYS'\] is empty"
    with pytest.raises(SecretsUnreadable, match=empty), transaction.atomic():
        destination("https://merchant.example/h")
    with pytest.raises(CommandError, match=r"SECRET_ENCRYPTION_KEYS"):
        add_by_command()
    assert not WebhookDestination.objects.exists()


def test_the_admin_form_says_a_key_is_needed(admin_client, settings):
    with_keys(settings)
    response = admin_client.post(
        reverse("admin:webhook_receiver_webhookdestination_add"),
        {"name": "form", "url": "https://form.example/h", "new_secrets": SECRET},
    )
    assert response.status_code == 200
    assert "SECRET_ENCRYPTION_KEYS" in response.content.decode()
    assert not WebhookDestination.objects.exists()


def test_a_wrong_key_leaves_the_status_pages_answering(receiver, settings, admin_client):
    destination(receiver.url)
    with_keys(settings, OTHER_KEY)

    overview = admin_client.get(reverse("admin:webhook_receiver_sourceoverview_changelist"))
    assert overview.status_code == 200 and "merchant" in overview.content.decode()
    messages = admin_client.get(reverse("admin:webhook_receiver_outboxmessage_changelist"))
    assert messages.status_code == 200
    out = StringIO()
    record_heartbeat()  # beat and a relay run: what is judged is the destination
    record_relay_heartbeat("relay test 1")
    with pytest.raises(SystemExit) as exit:  # the destination needs attention: exit 1
        call_command("webhook_status", stdout=out)
    assert exit.value.code == 1
    assert "merchant" in out.getvalue() and "secrets unreadable" in out.getvalue()


def test_a_key_that_is_not_a_fernet_key_is_named_by_its_position_never_shown(settings):
    from webhook_receiver.conf import app_settings
    from webhook_receiver.core.encryption import secrets_decrypt, secrets_encrypt

    tokens = secrets_encrypt(["whsec_" + "a" * 40], keys=[NEW_KEY])
    with_keys(settings, NEW_KEY, "not-a-key-at-all")

    # the settings still read (every request would fail otherwise)...
    assert app_settings().secret_encryption_keys == (NEW_KEY, "not-a-key-at-all")
    # ...the system check names the key by its position...
    found = [m for m in checks.run_checks() if m.id == "webhook_receiver.E011"]
    assert [m.msg.split(":")[1].strip() for m in found] == [
        "key #2 is not a Fernet key (32 bytes in url-safe base64)"
    ]
    # ...and the stored secrets are unreadable, saying why, until it is fixed
    with pytest.raises(SecretsUnreadable) as error:
        secrets_decrypt(tokens)
    assert error.value.state == (
        "secrets unreadable: key #2 of SECRET_ENCRYPTION_KEYS is malformed"
    )
    with pytest.raises(SecretsUnreadable):
        secrets_encrypt(["whsec_" + "b" * 40])
    for said in (*[m.msg for m in found], str(error.value), error.value.state):
        assert "not-a-key-at-all" not in said


# --- the system check (a database check: migrate and check --database run it) -----------


def put_plain_row(secrets: list[str]) -> None:
    """A destination as the release before the encryption stored it, at that release's
    schema (migrated back to 0009_outbox): its own columns, secrets in plain text."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO webhook_receiver_webhookdestination (name, url, secrets, event_types,
                rate_count, rate_seconds, burst, max_in_flight, timeout_seconds, max_attempts,
                backoff_base_seconds, backoff_cap_seconds, retry_after_cap_seconds,
                breaker_threshold, breaker_cooldown_seconds, enabled, replay_horizon_days,
                tokens, consecutive_failures, created_at, updated_at)
            VALUES ('legacy', 'https://legacy.example/h', %s, '[]', 10, 1, 10, 4, 10, 12, 2,
                3600, 300, 10, 60, %s, 30, 0, 0, %s, %s)
            """,
            [json.dumps(secrets), True, "2026-11-01T00:00:00+00:00", "2026-11-01T00:00:00+00:00"],
        )


def plain_row_today(secrets: list[str]) -> None:
    """A destination of today's schema whose secrets column holds plain text, as a row
    the encrypting migration never saw would (written through the model, then the
    column overwritten with raw SQL)."""
    WebhookDestination.objects.create(name="legacy", url="https://legacy.example/h")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_receiver_webhookdestination SET secrets = %s WHERE name = 'legacy'",
            [json.dumps(secrets)],
        )


def ids(problems: list[checks.CheckMessage]) -> list[str]:
    return [p.id for p in problems]


def test_the_check_names_what_is_wrong(receiver, settings):
    assert check_destination_secrets(databases=["default"]) == []
    destination(receiver.url)
    assert check_destination_secrets(databases=["default"]) == []

    # a wrong key is E010, a deploy check (tests/outbound/test_unreadable_secrets.py): it
    # shows where it matters and does not stop migrate
    with_keys(settings, OTHER_KEY)
    assert check_destination_secrets(databases=["default"]) == []
    assert ids(check_destination_secrets_readable(databases=["default"])) == [
        "webhook_receiver.E010"
    ]

    with_keys(settings)
    assert ids(check_destination_secrets(databases=["default"])) == ["webhook_receiver.E008"]
    # Django runs it only when asked for a database
    assert check_destination_secrets(databases=None) == []


def test_the_check_sees_rows_not_yet_encrypted(settings):
    plain_row_today([SECRET])
    assert ids(check_destination_secrets(databases=["default"])) == ["webhook_receiver.W002"]
    with_keys(settings)
    assert ids(check_destination_secrets(databases=["default"])) == ["webhook_receiver.E008"]


# --- the migration ------------------------------------------------------------------------


def migrate(target: str | None = None) -> None:
    """Migrate the app to ``target``, or to its latest migration."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    if target is None:
        (target,) = [
            name for app, name in executor.loader.graph.leaf_nodes() if app == "webhook_receiver"
        ]
    executor.migrate([("webhook_receiver", target)])


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_rows_stored_before_and_back():
    # given: a destination stored by the release before, its secrets in plain text
    migrate("0009_outbox")
    put_plain_row([OLD_SECRET, SECRET])

    try:
        # when
        migrate("0010_destination_secrets_encrypted")

        # then: tokens in the column
        column = stored("legacy")
        assert all(t.startswith("gAAAAA") for t in column) and SECRET not in json.dumps(column)
        # and back: the secrets in plain text again, as the release before reads them
        migrate("0009_outbox")
        assert stored("legacy") == [OLD_SECRET, SECRET]
    finally:
        migrate()  # today's schema, for the model and the tests after this one
    # the secrets through today's model
    assert WebhookDestination.objects.get(name="legacy").secrets == [OLD_SECRET, SECRET]


@pytest.mark.django_db(transaction=True)
def test_the_migration_stops_when_no_key_is_set(settings):
    migrate("0009_outbox")
    put_plain_row([SECRET])
    with_keys(settings)
    try:
        with pytest.raises(SecretsUnreadable, match=r"SECRET_ENCRYPTION_KEYS"):
            migrate("0010_destination_secrets_encrypted")
        assert stored("legacy") == [SECRET]  # nothing half done
    finally:
        with_keys(settings, SECRET_ENCRYPTION_KEY)
        migrate()


def test_a_rotations_outgoing_secrets_are_encrypted_reencrypted_and_checked_too(settings):
    from datetime import timedelta

    from webhook_receiver.outbound.endpoints import secret_rotate
    from webhook_receiver.outbound.selectors import destinations_unreadable
    from webhook_receiver.outbound.tenancy import EVERY_TENANT

    dest = WebhookDestination.objects.create(
        name="merchant", url="https://m.example/", secrets=[SECRET]
    )
    secret_rotate(scope=EVERY_TENANT, destination=dest, overlap=timedelta(hours=1), by="ops")
    with connection.cursor() as cursor:
        cursor.execute("SELECT retiring_secrets FROM webhook_receiver_webhookdestination")
        (column,) = cursor.fetchone()
    retiring = json.loads(column) if isinstance(column, str) else column
    assert SECRET not in str(retiring) and len(retiring) == 1

    # a key rotation: reencrypt writes them under the new key as well
    with_keys(settings, NEW_KEY, SECRET_ENCRYPTION_KEY)
    call_command("webhook_destination", "reencrypt", stdout=StringIO())
    with_keys(settings, NEW_KEY)
    dest.refresh_from_db()
    assert dest.retiring_secrets == [SECRET] and destinations_unreadable() == []

    # a key that reads neither column: the row is named, not raised
    with_keys(settings, OTHER_KEY)
    assert [name for _, name, _ in destinations_unreadable()] == ["merchant"]
