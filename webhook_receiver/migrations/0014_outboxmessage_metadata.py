"""Outbox messages keep a small JSON object of metadata beside their payload (how a
model-made payload was made: a prompt's version, token usage), outside their identity.

Existing messages get an empty object. On PostgreSQL 11 and newer the column is added
with its default without rewriting the table.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0013_repair_item_subject"),
    ]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="metadata",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
