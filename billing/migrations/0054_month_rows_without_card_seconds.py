"""Month rows lose the card-seconds (MB·s ÷ the GPU's memory, SM·s ÷ its SMs, summed per day) and
the memory and SM count they were divided by: no read takes them from month rows (the portal's
"why this costs what it does" divides day and hour rows per rate card, billing.ledger.billed_basis).
About 62 bytes of a month row of ~490.

The memory and SMs were part of a month row's group, so a GPU resized within a month had a row per
size for one workload: those rows are merged first, each sum the sum of theirs (exact numerics, as
closing a day merges it), a request known only where every row's is. The group's hash, which
usage_month_key_idx finds a month row by (migration 0046), is then taken over the group without
them. It reads every month row twice (the merge's grouping and the index's build) under the table's
lock: 2.6 s for the 1,000-GPU bench's 38,061 month rows; closing days waits for it."""

import importlib

from django.db import migrations, models

GROUP = ("month", "node_id", "gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "gpu_model")
SUMS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s", "sm_billed_s",
        "pcie_mb", "share_gpu_s", "charge", "idle_share", "energy_j")
REQUESTED = ("mem_requested_mb_s", "sm_requested_s")

MERGE_RESIZED = (
    f"WITH split AS (SELECT {', '.join(GROUP)} FROM billing_usagemonth GROUP BY {', '.join(GROUP)} HAVING count(*) > 1), "
    "gone AS (DELETE FROM billing_usagemonth u USING split k WHERE "
    # Every column of the group is NOT NULL but the model (NULL: no GPU row that day).
    + " AND ".join(f"u.{c} = k.{c}" for c in GROUP if c != "gpu_model")
    + " AND u.gpu_model IS NOT DISTINCT FROM k.gpu_model RETURNING u.*) "
    f"INSERT INTO billing_usagemonth ({', '.join((*GROUP, *SUMS, 'first_hour', 'last_hour', *REQUESTED))}) "
    f"SELECT {', '.join(GROUP)}, {', '.join(f'sum({c})' for c in SUMS)}, min(first_hour), max(last_hour), "
    + ", ".join(f"CASE WHEN bool_and({c} IS NOT NULL) THEN sum({c}) END" for c in REQUESTED)
    + f" FROM gone GROUP BY {', '.join(GROUP)}"
)

HASHED = ("gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "gpu_model")
_OLD_ARGS = "varchar, varchar, varchar, varchar, varchar, varchar, varchar, varchar, integer, integer"
_NEW_ARGS = "varchar, varchar, varchar, varchar, varchar, varchar, varchar, varchar"

# As migration 0046's, without the two divisors: the group's columns joined (a NULL model as its own
# mark) and hashed to 64 bits; a collision costs a comparison, never a wrong merge.
KEY_FUNCTION = f"""
DROP FUNCTION billing_month_key({_OLD_ARGS});
CREATE FUNCTION billing_month_key(gpu_uuid varchar, tenant varchar, namespace varchar, pod varchar,
                                  container varchar, pod_uid varchar, sla_tier varchar, gpu_model varchar)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(gpu_uuid || E'\\x1f' || tenant || E'\\x1f' || namespace || E'\\x1f' || pod || E'\\x1f'
                        || container || E'\\x1f' || pod_uid || E'\\x1f' || sla_tier || E'\\x1f'
                        || coalesce(gpu_model, E'\\x1e'), 0);
"""

# Back: 0046's function, of the group with the divisors.
OLD_KEY_FUNCTION = (f"DROP FUNCTION billing_month_key({_NEW_ARGS});"
                    + importlib.import_module("billing.migrations.0046_month_key_index").KEY_FUNCTION)


class Migration(migrations.Migration):
    dependencies = [("billing", "0053_day_peak_hour_means")]

    operations = [
        migrations.RemoveIndex(model_name="usagemonth", name="usage_month_key_idx"),
        # The merge's foreign-key checks now, not at commit: the columns are dropped in this transaction.
        migrations.RunSQL(f"SET CONSTRAINTS ALL IMMEDIATE; {MERGE_RESIZED}", reverse_sql=migrations.RunSQL.noop),
        *(migrations.RemoveField(model_name="usagemonth", name=name)
          for name in ("mem_billed_card_s", "mem_used_card_s", "sm_billed_card_s", "sm_used_card_s", "memory_mb",
                       "sm_count")),
        migrations.RunSQL(KEY_FUNCTION, reverse_sql=OLD_KEY_FUNCTION),
        migrations.AddIndex(
            model_name="usagemonth",
            index=models.Index(models.F("node"), models.F("month"),
                               models.Func(*(models.F(c) for c in HASHED), function="billing_month_key",
                                           output_field=models.BigIntegerField()),
                               name="usage_month_key_idx"),
        ),
    ]
