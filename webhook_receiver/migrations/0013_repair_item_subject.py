"""Repair items name the business object they concern as a subject, as receipts do,
rather than an order id: the app speaks of subjects; an order is one kind (the demo's).

The column keeps its values; its index is built again under its new name (repair items
are few: a run's findings, not traffic).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0012_rejection_tally"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="repairitem", name="webhook_repair_order"),
        migrations.RenameField(model_name="repairitem", old_name="order_id", new_name="subject"),
        migrations.AlterField(
            model_name="repairitem",
            name="subject",
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.AddIndex(
            model_name="repairitem",
            index=models.Index(fields=["subject"], name="webhook_repair_subject"),
        ),
    ]
