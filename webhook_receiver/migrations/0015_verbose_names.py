"""Every model names itself (verbose_name, verbose_name_plural) in words marked for
translation: the words Django derived from the class names before, but "rejection
tallies" (it wrote "tallys"). State only: nothing changes in the database.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0014_outboxmessage_metadata"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="deliveryattempt",
            options={
                "ordering": ["message", "number"],
                "verbose_name": "delivery attempt",
                "verbose_name_plural": "delivery attempts",
            },
        ),
        migrations.AlterModelOptions(
            name="failedevent",
            options={
                "ordering": ["-last_attempt_at"],
                "permissions": [
                    ("replay_failedevent", "Can replay failed events"),
                    ("discard_failedevent", "Can discard failed events"),
                ],
                "verbose_name": "failed event",
                "verbose_name_plural": "failed events",
            },
        ),
        migrations.AlterModelOptions(
            name="heartbeat",
            options={"verbose_name": "heartbeat", "verbose_name_plural": "heartbeats"},
        ),
        migrations.AlterModelOptions(
            name="outboxmessage",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_outboxmessage", "Can retry outbox messages now"),
                    ("discard_outboxmessage", "Can discard outbox messages"),
                ],
                "verbose_name": "outbox message",
                "verbose_name_plural": "outbox messages",
            },
        ),
        migrations.AlterModelOptions(
            name="reconciliationrun",
            options={
                "ordering": ["-started_at"],
                "verbose_name": "reconciliation run",
                "verbose_name_plural": "reconciliation runs",
            },
        ),
        migrations.AlterModelOptions(
            name="rejectiontally",
            options={
                "ordering": ["-minute"],
                "verbose_name": "rejection tally",
                "verbose_name_plural": "rejection tallies",
            },
        ),
        migrations.AlterModelOptions(
            name="repairitem",
            options={
                "ordering": ["-updated_at"],
                "permissions": [
                    ("replay_repairitem", "Can replay a failed event from a repair item"),
                    ("apply_repairitem", "Can fetch and apply a missing event from a repair item"),
                    (
                        "redeliver_repairitem",
                        "Can ask the sender to redeliver a repair item's event",
                    ),
                    ("resolve_repairitem", "Can resolve repair items"),
                ],
                "verbose_name": "repair item",
                "verbose_name_plural": "repair items",
            },
        ),
        migrations.AlterModelOptions(
            name="requestaudit",
            options={
                "ordering": ["-received_at"],
                "verbose_name": "request audit",
                "verbose_name_plural": "request audits",
            },
        ),
        migrations.AlterModelOptions(
            name="silencealert",
            options={
                "ordering": ["-opened_at"],
                "verbose_name": "silence alert",
                "verbose_name_plural": "silence alerts",
            },
        ),
        migrations.AlterModelOptions(
            name="webhookdestination",
            options={
                "ordering": ["name"],
                "verbose_name": "webhook destination",
                "verbose_name_plural": "webhook destinations",
            },
        ),
        migrations.AlterModelOptions(
            name="webhookreceipt",
            options={
                "ordering": ["-received_at"],
                "verbose_name": "webhook receipt",
                "verbose_name_plural": "webhook receipts",
            },
        ),
    ]
