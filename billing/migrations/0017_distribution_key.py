"""The distribution key (docs/scaling.md): every ledger key leads with the node.

BatchGpu gets its batch's node (backfilled; the immutability trigger of migration 0003 is lifted
for that one UPDATE only), and the hour and day ledgers' unique keys and GPU indexes gain the
node, so a GPU moved to another node inside a window has one row per node, and the ledger can be
distributed by node (Citus) with the rollup sharded by node and no cross-shard write.

The minute tables are migration 0018's (partitioned by minute, retention). Reversing this
migration puts the old keys back; that fails, as it must, once some GPU has rows of two nodes
for one hour or day, since the old keys cannot hold them.
"""

import django.db.models.deletion
from django.db import migrations, models

BACKFILL_BATCH_GPU_NODE = """
ALTER TABLE billing_batchgpu DISABLE TRIGGER batch_gpu_immutable;
UPDATE billing_batchgpu g SET node_id = b.node_id FROM billing_usagebatch b WHERE b.id = g.batch_id;
ALTER TABLE billing_batchgpu ENABLE TRIGGER batch_gpu_immutable;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0016_node_name_kubernetes"),
    ]

    operations = [
        migrations.AddField(
            model_name="batchgpu",
            name="node",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                    to="billing.node"),
        ),
        migrations.RunSQL(BACKFILL_BATCH_GPU_NODE, reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(
            model_name="batchgpu",
            name="node",
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                    to="billing.node"),
        ),
        migrations.RemoveConstraint(model_name="batchgpu", name="batch_gpu_unique"),
        migrations.AddConstraint(
            model_name="batchgpu",
            constraint=models.UniqueConstraint(fields=("node", "batch", "gpu_uuid"), name="batch_gpu_node_unique"),
        ),
        migrations.AddIndex(
            model_name="batchgpu",
            index=models.Index(fields=["node", "gpu_uuid", "window_end"], name="batch_gpu_node_end_idx"),
        ),
        migrations.RemoveConstraint(model_name="gpuhour", name="gpu_hour_unique"),
        migrations.AddConstraint(
            model_name="gpuhour",
            constraint=models.UniqueConstraint(fields=("node", "gpu_uuid", "hour"), name="gpu_hour_node_unique"),
        ),
        migrations.RemoveConstraint(model_name="gpuday", name="gpu_day_unique"),
        migrations.AddConstraint(
            model_name="gpuday",
            constraint=models.UniqueConstraint(fields=("node", "gpu_uuid", "day"), name="gpu_day_node_unique"),
        ),
        migrations.RemoveIndex(model_name="usagehour", name="usage_hour_gpu_idx"),
        migrations.AddIndex(
            model_name="usagehour",
            index=models.Index(fields=["node", "gpu_uuid", "hour"], name="usage_hour_node_gpu_idx"),
        ),
        migrations.RemoveIndex(model_name="usageday", name="usage_day_gpu_idx"),
        migrations.AddIndex(
            model_name="usageday",
            index=models.Index(fields=["node", "gpu_uuid", "day"], name="usage_day_node_gpu_idx"),
        ),
        migrations.AddIndex(
            model_name="usagebatch",
            index=models.Index(condition=models.Q(("quarantined_at__isnull", True), ("rolled_up_at__isnull", True)),
                               fields=["node", "id"], name="usage_batch_node_pending_idx"),
        ),
    ]
