"""The hour rows rewritten in time order, after migration 0051's backfill committed (as migration
0050 did for the GPU rows, for the same reason: the backfill left a dead version of every row it
wrote, scattered the live ones over twice the table, and every read of hours by time reads its
pages). CLUSTER holds an exclusive lock on the table while it runs; the rollup waits for it.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0051_requests_stored_in_hours"),
    ]

    operations = [
        migrations.RunSQL("CLUSTER billing_usagehour USING usage_hour_tenant_idx", migrations.RunSQL.noop),
    ]
