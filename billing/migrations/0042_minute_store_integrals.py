"""The minute ledger becomes the store of the integrals: the rollup adds each batch's integral rows
into it and deletes them from billing_raw_sample, which keeps only the rows of batches not rolled up
(pending or quarantined: an inbox). A usage minute then needs the billed maxima too, which only the
raw rows held until now (its mem_billed_mb_s / sm_billed_s are what the rate card billed, by basis).

Existing minutes get their maxima from the raw rows of the rolled-up, not quarantined batches, exactly
as the rollup summed them (a row from before wire protocol v2 has no maximum: greatest(used, granted)
of the row is it). A minute whose raw rows retention already dropped can be neither re-priced nor
reached by a late batch, so its maxima are never read: it gets its billed figures. Then the raw rows
that are now in the store are deleted.

The reverse drops the two columns but cannot bring the deleted raw rows back: the rolled-up batches'
integrals then live only in the minute rows, and a rebuild over them would price them as empty.
"""

from decimal import Decimal

from django.db import migrations, models

MAXIMA = """
UPDATE billing_usageminute SET mem_max_mb_s = mem_billed_mb_s, sm_max_s = sm_billed_s;
UPDATE billing_usageminute m SET mem_max_mb_s = r.mem_max, sm_max_s = r.sm_max
FROM (
    SELECT s.node_id, s.gpu_uuid, date_trunc('minute', s.start) AS minute, s.tenant, s.namespace, s.pod,
           s.container, s.pod_uid, s.sla_tier,
           sum(coalesce(s.mem_billed_mb_s, greatest(s.mem_used_mb_s, s.mem_granted_mb_s))::numeric) AS mem_max,
           sum(coalesce(s.sm_billed_s, greatest(s.sm_used_s, s.sm_granted_s))::numeric) AS sm_max
    FROM billing_raw_sample s JOIN billing_usagebatch b ON b.id = s.batch_id
    WHERE b.rolled_up_at IS NOT NULL AND b.quarantined_at IS NULL
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
) r
WHERE m.node_id = r.node_id AND m.gpu_uuid = r.gpu_uuid AND m.minute = r.minute AND m.tenant = r.tenant
    AND m.namespace = r.namespace AND m.pod = r.pod AND m.container = r.container AND m.pod_uid = r.pod_uid
    AND m.sla_tier = r.sla_tier;
DELETE FROM billing_raw_sample s USING billing_usagebatch b
WHERE b.id = s.batch_id AND b.rolled_up_at IS NOT NULL AND b.quarantined_at IS NULL;
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0041_month_ledger")]

    operations = [
        migrations.AddField("usageminute", "mem_max_mb_s",
                            models.DecimalField(max_digits=30, decimal_places=10, default=Decimal(0),
                                                db_default=Decimal(0))),
        migrations.AddField("usageminute", "sm_max_s",
                            models.DecimalField(max_digits=30, decimal_places=10, default=Decimal(0),
                                                db_default=Decimal(0))),
        migrations.RunSQL(MAXIMA, reverse_sql=migrations.RunSQL.noop),
    ]
