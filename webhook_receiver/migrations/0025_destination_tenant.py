# Whose a destination is (outbound/tenancy.py): empty for every destination there is, a
# single-shop host's. The column's default is the database's too, so adding it rewrites
# no row; its index is built as the column is added.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0024_destination_filter"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdestination",
            name="tenant",
            field=models.CharField(
                blank=True, db_default="", db_index=True, default="", max_length=100
            ),
        ),
    ]
