"""A workload's last day (billing.ledger.models.Workload.last_day), so that retention can delete the
workloads whose minutes are all dropped. Workloads already stored take the day of this migration: they
are kept one minute retention longer than they might be, never shorter."""

import django.db.models.functions.comparison
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0044_slim_batch_gpus'),
    ]

    operations = [
        migrations.AddField(
            model_name='workload',
            name='last_day',
            field=models.DateField(db_default=django.db.models.functions.comparison.Cast(django.db.models.functions.datetime.Now(), models.DateField())),
        ),
        migrations.AddIndex(
            model_name='workload',
            index=models.Index(fields=['last_day'], name='workload_last_day_idx'),
        ),
    ]
