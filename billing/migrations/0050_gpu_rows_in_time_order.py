"""The GPU-hour and GPU-day rows rewritten in time order, after migration 0049's backfill committed.

The backfill wrote a new version of every row, in the order of its join, and left the old ones dead:
the GPU rows of a day were scattered over twice the table, and every read of GPU rows by time (the
platform's idle, the invoice totals, the fleet view) read most of its pages. CLUSTER rewrites each table
in its time index's order, as the rollup had written them, without the dead versions (it runs here, in
a transaction of its own, because in the backfill's transaction those versions are not dead yet: the
table kept its doubled size). On the 1,000-GPU bench (a month, 736k GPU-hours): 4 s; the table back
from 268 to 134 MB, and the idle statement of a week's hourly sets 0.20-0.31 s scattered, 0.13-0.19 s
in order (docs/benchmarks.md). CLUSTER holds an exclusive lock on each table while it runs; the
rollup waits for it, as it waits for the backfill.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0049_card_share"),
    ]

    operations = [
        migrations.RunSQL("CLUSTER billing_gpuhour USING gpu_hour_hour_idx", migrations.RunSQL.noop),
        migrations.RunSQL("CLUSTER billing_gpuday USING gpu_day_day_idx", migrations.RunSQL.noop),
    ]
