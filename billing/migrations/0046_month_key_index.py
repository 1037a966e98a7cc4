"""Closing a day merges its rows into the month rows of the same workload and leaves the others
(billing.ledger.months): an index by node, month and a hash of the rest of a month row's group finds
the row a day's workload merges into in one probe. The node-GPU index stays: the day step replaces a
GPU-month's rows through it (a late batch into a closed day), reading those rows only; by node and
month it would read the node's every GPU, and the planner scanned the whole table instead."""

from django.db import migrations, models
from django.db.models import F, Func

HASHED = ("gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "gpu_model", "memory_mb",
          "sm_count")

# The group's columns joined (a NULL model or divisor as an empty part) and hashed to 64 bits: a collision
# costs a comparison, never a wrong merge (the merge compares every column of the group).
KEY_FUNCTION = """
CREATE FUNCTION billing_month_key(gpu_uuid varchar, tenant varchar, namespace varchar, pod varchar,
                                  container varchar, pod_uid varchar, sla_tier varchar, gpu_model varchar,
                                  memory_mb integer, sm_count integer) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(gpu_uuid || E'\\x1f' || tenant || E'\\x1f' || namespace || E'\\x1f' || pod || E'\\x1f'
                        || container || E'\\x1f' || pod_uid || E'\\x1f' || sla_tier || E'\\x1f'
                        || coalesce(gpu_model, E'\\x1e') || E'\\x1f' || coalesce(memory_mb::text, '')
                        || E'\\x1f' || coalesce(sm_count::text, ''), 0);
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0045_workload_last_day")]

    operations = [
        migrations.RunSQL(KEY_FUNCTION, reverse_sql="DROP FUNCTION billing_month_key"),
        migrations.AddIndex(
            model_name="usagemonth",
            index=models.Index(F("node"), F("month"), Func(*(F(c) for c in HASHED), function="billing_month_key",
                                                           output_field=models.BigIntegerField()),
                               name="usage_month_key_idx"),
        ),
    ]
