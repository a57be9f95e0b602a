"""Destination signing secrets encrypted at rest (outbox/encryption.py).

Forwards, each destination's secrets are encrypted under the first key of
WEBHOOK_RECEIVER['SECRET_ENCRYPTION_KEYS'] (a secret already encrypted is left as it
is), then the field becomes an EncryptedSecretsField: the column stays a JSON list, of
tokens now, so there is no schema change. Backwards, they are decrypted again. A
database with secrets and no key set stops here, saying which setting to set.
Destinations are few: one short transaction does them all.
"""

from django.db import migrations

import webhook_receiver.core.encryption
from webhook_receiver.core.encryption import is_token, secrets_decrypt, secrets_encrypt


def encrypt(apps, schema_editor):
    # the historical model's field is still a plain JSONField: it reads what is stored
    WebhookDestination = apps.get_model("webhook_receiver", "WebhookDestination")
    for dest in WebhookDestination.objects.only("id", "secrets").order_by("id"):
        plain = [s for s in dest.secrets or [] if not is_token(s)]
        if plain:
            tokens = iter(secrets_encrypt(plain))
            dest.secrets = [s if is_token(s) else next(tokens) for s in dest.secrets]
            dest.save(update_fields=["secrets"])


def decrypt(apps, schema_editor):
    WebhookDestination = apps.get_model("webhook_receiver", "WebhookDestination")
    for dest in WebhookDestination.objects.only("id", "secrets").order_by("id"):
        tokens = [s for s in dest.secrets or [] if is_token(s)]
        if tokens:
            secrets = iter(secrets_decrypt(tokens))
            dest.secrets = [next(secrets) if is_token(s) else s for s in dest.secrets]
            dest.save(update_fields=["secrets"])


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0009_outbox"),
    ]

    operations = [
        migrations.RunPython(encrypt, decrypt),
        migrations.AlterField(
            model_name="webhookdestination",
            name="secrets",
            field=webhook_receiver.core.encryption.EncryptedSecretsField(default=list),
        ),
    ]
