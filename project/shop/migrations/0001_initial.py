"""The shop's models, adopted from webhook_receiver or created.

Up to 0.1.0 these models lived in webhook_receiver, whose migration 0005 drops their
tables when empty and leaves them when they hold rows. Here a table left behind is
renamed to the shop's own name, rows, indexes and constraints included; a missing one
is created. The schema is the same either way.
"""

from django.db import migrations, models

LEGACY_TABLES = {
    "InventoryLedgerEntry": "webhook_receiver_inventoryledgerentry",
    "OrderState": "webhook_receiver_orderstate",
}


def adopt_or_create(apps, schema_editor):
    existing = set(schema_editor.connection.introspection.table_names())
    for name, legacy in LEGACY_TABLES.items():
        model = apps.get_model("shop", name)
        if legacy in existing:
            schema_editor.alter_db_table(model, legacy, model._meta.db_table)
        else:
            schema_editor.create_model(model)


def give_back(apps, schema_editor):
    for name, legacy in LEGACY_TABLES.items():
        model = apps.get_model("shop", name)
        schema_editor.alter_db_table(model, model._meta.db_table, legacy)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        # runs after webhook_receiver has let go of the legacy tables
        ("webhook_receiver", "0005_demo_shop_moves_out"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="InventoryLedgerEntry",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("order_id", models.CharField(max_length=100)),
                        ("sku", models.CharField(max_length=100)),
                        ("delta", models.IntegerField()),
                        ("reason", models.CharField(max_length=64)),
                        ("event_key", models.CharField(max_length=255)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        "verbose_name_plural": "inventory ledger entries",
                        "ordering": ["-id"],
                        "indexes": [
                            models.Index(fields=["order_id"], name="webhook_ledger_order"),
                            models.Index(fields=["sku"], name="webhook_ledger_sku"),
                            models.Index(fields=["event_key"], name="webhook_ledger_event_key"),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="OrderState",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("order_id", models.CharField(max_length=100)),
                        ("status", models.CharField(choices=[("paid", "Paid"), ("cancelled", "Cancelled"), ("fulfilled", "Fulfilled")], max_length=16)),
                        ("version", models.BigIntegerField()),
                        ("event_key", models.CharField(max_length=255)),
                        ("updated_at", models.DateTimeField()),
                    ],
                    options={
                        "ordering": ["order_id"],
                        "indexes": [models.Index(fields=["event_key"], name="webhook_order_state_event_key")],
                        "constraints": [models.UniqueConstraint(fields=("order_id",), name="webhook_order_state_order")],
                    },
                ),
            ],
        ),
        # after the state has the models, so that the function can use them
        migrations.RunPython(adopt_or_create, give_back),
    ]
