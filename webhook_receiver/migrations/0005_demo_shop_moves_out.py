"""The demo shop's models leave the reusable app.

Releases up to 0.1.0 shipped the demo commerce models (inventory ledger, order state)
inside webhook_receiver. They now belong to the host project (the demo keeps them in
``project/shop``). This migration removes them from webhook_receiver's state. In the
database it drops each of their tables only while it is empty; a table that holds rows
is left as it is, for the host to adopt (the demo shop's first migration renames it to
its own name) or to drop once nothing needs it. Nothing with data is ever dropped.
"""

from django.db import migrations

LEGACY_TABLES = ("webhook_receiver_inventoryledgerentry", "webhook_receiver_orderstate")


def drop_empty_legacy_tables(apps, schema_editor):
    connection = schema_editor.connection
    existing = set(connection.introspection.table_names())
    for table in LEGACY_TABLES:
        if table not in existing:
            continue
        quoted = schema_editor.quote_name(table)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quoted})")
            (has_rows,) = cursor.fetchone()
        if not has_rows:
            schema_editor.execute(f"DROP TABLE {quoted}")


def recreate_missing_legacy_tables(apps, schema_editor):
    existing = set(schema_editor.connection.introspection.table_names())
    for name in ("InventoryLedgerEntry", "OrderState"):
        model = apps.get_model("webhook_receiver", name)
        if model._meta.db_table not in existing:
            schema_editor.create_model(model)


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0004_admin_search_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="InventoryLedgerEntry"),
                migrations.DeleteModel(name="OrderState"),
            ],
            database_operations=[
                migrations.RunPython(drop_empty_legacy_tables, recreate_missing_legacy_tables),
            ],
        ),
    ]
