# A node speaks only for itself: pod metadata is keyed by the node that reported it, and a node's
# tenant claims that the service's namespace mapping overrides are counted on the node.

from django.db import migrations, models
import django.db.models.deletion

# Each existing row goes to every node that metered the pod (its ledger rows and raw samples say
# which); a row no node's usage names joins nothing and is dropped (the next batch reports it again).
_BACKFILL = """
INSERT INTO billing_workloadmeta
    (node_id, namespace, pod, pod_uid, controller_kind, controller_name, labels, requests, first_seen, last_seen)
SELECT DISTINCT u.node_id, w.namespace, w.pod, w.pod_uid, w.controller_kind, w.controller_name, w.labels,
       w.requests, w.first_seen, w.last_seen
FROM billing_workloadmeta w
JOIN (SELECT node_id, namespace, pod, pod_uid FROM billing_usageday
      UNION SELECT node_id, namespace, pod, pod_uid FROM billing_usagehour
      UNION SELECT node_id, namespace, pod, pod_uid FROM billing_usageminute
      UNION SELECT node_id, namespace, pod, pod_uid FROM billing_raw_sample) u
  ON (u.namespace, u.pod, u.pod_uid) = (w.namespace, w.pod, w.pod_uid)
WHERE w.node_id IS NULL;
DELETE FROM billing_workloadmeta WHERE node_id IS NULL;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0023_gpu_models'),
    ]

    operations = [
        migrations.RemoveConstraint(model_name='workloadmeta', name='workload_meta_key'),
        migrations.AddField(
            model_name='workloadmeta',
            name='node',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+',
                                    to='billing.node'),
        ),
        migrations.RunSQL(_BACKFILL, migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='workloadmeta',
            name='node',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='billing.node'),
        ),
        migrations.AddConstraint(
            model_name='workloadmeta',
            constraint=models.UniqueConstraint(fields=('node', 'namespace', 'pod', 'pod_uid'),
                                               name='workload_meta_node_key'),
        ),
        migrations.AddField(
            model_name='node',
            name='tenant_claim_mismatches',
            field=models.PositiveBigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='node',
            name='last_tenant_claim_mismatch_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
