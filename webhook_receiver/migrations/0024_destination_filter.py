# A destination's filter (outbound/filters.py): null for every destination there is, which
# keeps sending it every event it subscribes to.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0023_source_event_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookdestination",
            name="filter",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
