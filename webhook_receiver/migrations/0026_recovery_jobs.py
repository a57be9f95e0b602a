# Recovery jobs (outbound/recovery.py), and which one last sent a message again. The
# message's new column is null for every message there is: adding it rewrites no row.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('webhook_receiver', '0025_destination_tenant'),
    ]

    operations = [
        migrations.CreateModel(
            name='RecoveryJob',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('recover', 'Recover failed messages'), ('missing', 'Replay missing messages'), ('replay', 'Replay delivered messages')], max_length=16)),
                ('since', models.DateTimeField()),
                ('until', models.DateTimeField(blank=True, null=True)),
                ('event_types', models.JSONField(blank=True, default=list)),
                ('answer_classes', models.JSONField(blank=True, default=list)),
                ('ordering_key_prefix', models.CharField(blank=True, max_length=255)),
                ('matched_types', models.JSONField(blank=True, null=True)),
                ('rate', models.FloatField()),
                ('state', models.CharField(choices=[('running', 'Running'), ('done', 'Done'), ('cancelled', 'Cancelled')], max_length=16)),
                ('planned', models.PositiveIntegerField(default=0)),
                ('released', models.PositiveIntegerField(default=0)),
                ('max_id', models.BigIntegerField(default=0)),
                ('last_id', models.BigIntegerField(default=0)),
                ('credit', models.FloatField(default=0.0)),
                ('stepped_at', models.DateTimeField(blank=True, null=True)),
                ('live_waiting', models.PositiveIntegerField(blank=True, null=True)),
                ('created_by', models.CharField(max_length=150)),
                ('created_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('cancelled_by', models.CharField(blank=True, max_length=150)),
                ('destination', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='recovery_jobs', to='webhook_receiver.webhookdestination')),
            ],
            options={
                'verbose_name': 'recovery job',
                'verbose_name_plural': 'recovery jobs',
                'ordering': ['-id'],
                'permissions': [('cancel_recoveryjob', 'Can cancel recovery jobs')],
            },
        ),
        migrations.AddField(
            model_name='outboxmessage',
            name='recovery',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='messages', to='webhook_receiver.recoveryjob'),
        ),
        migrations.AddConstraint(
            model_name='recoveryjob',
            constraint=models.UniqueConstraint(condition=models.Q(('state', 'running')), fields=('destination',), name='webhook_recovery_one_running'),
        ),
    ]
