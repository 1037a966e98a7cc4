"""The requested figures stored in the hour, day and month rows, and the metadata's flag for the
pods whose figures are behind their requests (billing.ledger.requests; docs/architecture.md,
"Requests stored in the ledger rows").

The backfill gives every existing row the figures a read's join to the requests gives it now (the
expression is billing.ledger.requests.requested_sql's, written out: a migration keeps the SQL it
ran): the request times the row's seconds, which for a day or month row is the sum of its hours'
figures to the last digit (numeric products are exact, and its seconds are its hours' sum). So every
metadata row starts with its flag cleared. Rows whose pod has no metadata, or whose metadata requests
nothing of the container, keep NULL: unknown, as the join gives them. Rows written through the ORM
later start flagged (the field's default); rows the ingest writes say what they are.

The backfill rewrites every row whose pod requested something; migration 0052 puts the tables back
in time order without the old versions. On the 1,000-GPU bench (a month: 4.3M hour rows) they took
a few minutes together (docs/benchmarks.md); the rollup waits for them.
"""

import django.db.models
from django.db import migrations

import billing.ledger.models

_REQUESTED = (
    "CASE WHEN jsonb_typeof(m.requests -> u.container -> '{field}') = 'number' "
    "THEN (m.requests -> u.container -> '{field}')::text::numeric * u.seconds END"
)


def backfill(table: str) -> str:
    return (
        f"UPDATE {table} u SET mem_requested_mb_s = {_REQUESTED.format(field='mem_mb')}, "
        f"sm_requested_s = {_REQUESTED.format(field='sm')} FROM billing_workloadmeta m "
        "WHERE m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod AND m.pod_uid = u.pod_uid "
        "AND jsonb_typeof(m.requests -> u.container) = 'object'"
    )


TABLES = ("billing_usagehour", "billing_usageday", "billing_usagemonth")


def _requested_fields() -> list[migrations.AddField]:
    return [
        migrations.AddField(model_name=model, name=name,
                            field=billing.ledger.models.ExactDecimalField(decimal_places=40, max_digits=1000, null=True))
        for model in ("usagehour", "usageday", "usagemonth") for name in ("mem_requested_mb_s", "sm_requested_s")
    ]


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0050_gpu_rows_in_time_order"),
    ]

    operations = [
        *_requested_fields(),
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
        *(migrations.RunSQL(backfill(table), migrations.RunSQL.noop) for table in TABLES),
        migrations.AddIndex(
            model_name="workloadmeta",
            index=django.db.models.Index(condition=django.db.models.Q(requests_changed=True), fields=["node"],
                                         name="workload_meta_changed_idx"),
        ),
    ]
