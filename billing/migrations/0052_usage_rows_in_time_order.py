"""The hour, day and month rows rewritten in time order, after migration 0051's backfill committed
(as migration 0050 did for the GPU rows, for the same reason: the backfill left a dead version of
every row it wrote, scattered the live ones over twice the table, and every read of them by time
reads its pages). CLUSTER holds an exclusive lock on each table while it runs; the rollup waits.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0051_requests_stored"),
    ]

    operations = [
        migrations.RunSQL("CLUSTER billing_usagehour USING usage_hour_tenant_idx", migrations.RunSQL.noop),
        migrations.RunSQL("CLUSTER billing_usageday USING usage_day_tenant_idx", migrations.RunSQL.noop),
        migrations.RunSQL("CLUSTER billing_usagemonth USING usage_month_tenant_idx", migrations.RunSQL.noop),
    ]
