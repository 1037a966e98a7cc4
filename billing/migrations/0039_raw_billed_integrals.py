# The stored rows become integrals per batch, workload, GPU and minute (wire protocol v2, docs/protocol.md):
# the billed maximum, Σ per-second max(used, granted), is summed on the node and stored as its own column,
# because Σ max is not max of the Σs. Rows stored before have NULL: each was one sample, whose billed
# maximum the rollup takes as greatest(used, granted) of the row, as it always did. Nullable without a
# default, so adding them rewrites no partition.

from django.db import migrations

ADD = """
ALTER TABLE billing_raw_sample
    ADD COLUMN mem_billed_mb_s double precision CHECK (mem_billed_mb_s >= 0),
    ADD COLUMN sm_billed_s double precision CHECK (sm_billed_s >= 0);
"""
DROP = "ALTER TABLE billing_raw_sample DROP COLUMN mem_billed_mb_s, DROP COLUMN sm_billed_s;"


class Migration(migrations.Migration):
    dependencies = [("billing", "0038_sla_tier_miss_targets")]

    operations = [migrations.RunSQL(ADD, reverse_sql=DROP)]
