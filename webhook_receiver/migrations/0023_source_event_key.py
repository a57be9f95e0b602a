# A source record's event key (sources/records.py: record_event_key). The records that
# exist keep the key they had, their delivery id: a redelivery of an event received
# before the upgrade must find its receipt under the same key, or it would be applied a
# second time. New records take the scheme's choice (GitHub: the signed body).

from django.db import migrations, models

CHOICES = [
    ("", "the scheme's choice (GitHub: the signed body; others: the delivery id)"),
    ("delivery_id", "the delivery id the sender sends"),
    ("signed_body", "the signed body's SHA-256 (GitHub: a body sent again is a duplicate)"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("webhook_receiver", "0022_secret_fingerprints_keyed"),
    ]

    operations = [
        # the rows there are: as they were keyed
        migrations.AddField(
            model_name="webhooksource",
            name="event_key",
            field=models.CharField(
                blank=True, choices=CHOICES, default="delivery_id", max_length=32
            ),
        ),
        # the rows to come: the scheme's choice
        migrations.AlterField(
            model_name="webhooksource",
            name="event_key",
            field=models.CharField(blank=True, choices=CHOICES, default="", max_length=32),
        ),
    ]
