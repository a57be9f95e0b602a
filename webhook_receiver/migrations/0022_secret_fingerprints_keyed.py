"""The audit records' secret fingerprints, keyed by the server's SECRET_KEY
(core/fingerprints.py).

An unkeyed fingerprint (the first 16 hex digits of the secret's SHA-256) let whoever
reads the audit records test guesses of a secret offline. Forwards, one statement
rewrites each stored fingerprint of a secret the sources have now (the settings', and
each record's that a key decrypts) to its keyed one, and clears every other (a secret
removed, or unreadable now): a fingerprint left unkeyed would stay an oracle for its
secret. One pass over the table, whatever the number of secrets. Backwards, nothing:
the unkeyed fingerprints are not written again.
"""

import hashlib
import json

from django.core.exceptions import ImproperlyConfigured
from django.db import migrations
from django.db.models import Case, CharField, Value, When

from webhook_receiver.core.fingerprints import secret_fingerprint
from webhook_receiver.core.encryption import SecretsUnreadable, secrets_decrypt


def _unkeyed(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _secrets_now(connection) -> set[str]:
    from webhook_receiver.conf import app_settings

    found: set[str] = set()
    try:
        for source in app_settings().sources.values():
            found.update(source.secrets)
    except ImproperlyConfigured:
        pass  # settings that do not read: their fingerprints are cleared
    # the column as stored (the model's field would decrypt, and raise, on a record no
    # key reads): each record apart
    with connection.cursor() as cursor:
        cursor.execute("SELECT secrets FROM webhook_receiver_webhooksource")
        rows = [row[0] for row in cursor.fetchall()]
    for stored in rows:
        values = json.loads(stored) if isinstance(stored, str) else stored
        try:
            found.update(secrets_decrypt(values or []))
        except SecretsUnreadable:
            continue
    return found


def keyed(apps, schema_editor):
    RequestAudit = apps.get_model("webhook_receiver", "RequestAudit")
    renamed = [
        When(secret_fingerprint=_unkeyed(secret), then=Value(secret_fingerprint(secret)))
        for secret in sorted(_secrets_now(schema_editor.connection))
    ]
    RequestAudit.objects.exclude(secret_fingerprint=None).update(
        secret_fingerprint=Case(*renamed, default=None, output_field=CharField())
    )


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0021_outbox_in_flight_and_failed_indexes"),
    ]

    operations = [
        migrations.RunPython(keyed, migrations.RunPython.noop, elidable=True),
    ]
