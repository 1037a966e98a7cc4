"""The requested figures stored in the hour rows, and the metadata's flag for the pods whose
figures are behind their requests (billing.ledger.requests; docs/architecture.md, "Requests stored
in hours").

The backfill gives every existing hour row the figures a read's join to the requests gives it now
(the expression is billing.ledger.requests.requested_sql's, written out: a migration keeps the SQL
it ran), so every metadata row starts with its flag cleared. Rows whose pod has no metadata, or whose
metadata requests nothing, keep NULL: unknown, as the join gives them. Rows written through the ORM
later start flagged (the field's default), rows the ingest writes say what they are.

The backfill rewrites every hour row whose pod requested something; migration 0052 puts the table
back in time order without the old versions. On the 1,000-GPU bench (a month, 3.7M hour rows) both
took about two minutes together (docs/benchmarks.md); the rollup waits for them.
"""

import django.db.models
from django.db import migrations

import billing.ledger.models

_REQUESTED = (
    "CASE WHEN jsonb_typeof(m.requests -> u.container -> '{field}') = 'number' "
    "THEN (m.requests -> u.container -> '{field}')::text::numeric * u.seconds END"
)
BACKFILL = (
    f"UPDATE billing_usagehour u SET mem_requested_mb_s = {_REQUESTED.format(field='mem_mb')}, "
    f"sm_requested_s = {_REQUESTED.format(field='sm')} FROM billing_workloadmeta m "
    "WHERE m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod AND m.pod_uid = u.pod_uid "
    "AND jsonb_typeof(m.requests -> u.container) = 'object'"
)


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0050_gpu_rows_in_time_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagehour",
            name="mem_requested_mb_s",
            field=billing.ledger.models.ExactDecimalField(decimal_places=40, max_digits=1000, null=True),
        ),
        migrations.AddField(
            model_name="usagehour",
            name="sm_requested_s",
            field=billing.ledger.models.ExactDecimalField(decimal_places=40, max_digits=1000, null=True),
        ),
        # False for the rows there are (the backfill below stores their figures), then true for the
        # rows the ORM makes from here on.
        migrations.AddField(
            model_name="workloadmeta",
            name="requests_changed",
            field=django.db.models.BooleanField(default=False),
        ),
        migrations.AlterField(
            model_name="workloadmeta",
            name="requests_changed",
            field=django.db.models.BooleanField(default=True),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.AddIndex(
            model_name="workloadmeta",
            index=django.db.models.Index(condition=django.db.models.Q(requests_changed=True), fields=["node"],
                                         name="workload_meta_changed_idx"),
        ),
    ]
