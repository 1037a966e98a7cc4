"""Each day row's highest hourly means of memory and SMs (UsageDay.peak_hour_mean_mb and _sm), which
the portal's right-sizing reads instead of the day's hours where a container ran on one GPU and SLA
tier all day (billing.ledger.billed_basis.list_container_use; docs/architecture.md, "Right-sizing
reads the day rows' peak hours").

The backfill derives them from the hour rows as the rollup does (the expression is
billing.ledger.rollup's `_DAY_PEAKS`, written out: a migration keeps the SQL it ran). Days whose
hours retention already pruned keep NULL, which the read takes for "not stored": it reads their
hours, of which there are none, as it did before. On the 1,000-GPU bench (a month: 4.3M hour rows,
218k day rows) it took 22 s; the rollup waits for it.
"""

from django.db import migrations

import billing.ledger.models

_KEY = ("node_id", "gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")

BACKFILL = (
    "UPDATE billing_usageday d SET peak_hour_mean_mb = h.mb, peak_hour_mean_sm = h.sm FROM ("
    f"SELECT {', '.join(_KEY)}, date_trunc('day', hour, 'UTC') AS day, "
    "max(mem_used_mb_s / nullif(seconds, 0)) AS mb, max(sm_used_s / nullif(seconds, 0)) AS sm "
    f"FROM billing_usagehour GROUP BY {', '.join(_KEY)}, date_trunc('day', hour, 'UTC')) h "
    f"WHERE {' AND '.join(f'd.{k} = h.{k}' for k in (*_KEY, 'day'))}"
)


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0052_usage_rows_in_time_order"),
    ]

    operations = [
        *(migrations.AddField(model_name="usageday", name=name,
                              field=billing.ledger.models.ExactDecimalField(decimal_places=40, max_digits=1000,
                                                                            null=True))
          for name in ("peak_hour_mean_mb", "peak_hour_mean_sm")),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
    ]
