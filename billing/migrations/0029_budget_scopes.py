# Budgets by namespace and label beside the tenant's own: one budget per scope, a label budget only
# notifies (docs/enforcement.md, Budgets by namespace and label). Existing budgets are tenant budgets.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0028_commitments'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='budget',
            options={'ordering': ['tenant__slug', 'scope', 'namespace', 'label_key', 'label_value']},
        ),
        migrations.AddField(
            model_name='budget',
            name='label_key',
            field=models.CharField(blank=True, max_length=317),
        ),
        migrations.AddField(
            model_name='budget',
            name='label_value',
            field=models.CharField(blank=True, max_length=63),
        ),
        migrations.AddField(
            model_name='budget',
            name='namespace',
            field=models.CharField(blank=True, max_length=63),
        ),
        migrations.AddField(
            model_name='budget',
            name='scope',
            field=models.CharField(choices=[('tenant', 'tenant'), ('namespace', 'namespace'), ('label', 'label')], default='tenant', max_length=10),
        ),
        migrations.AlterField(
            model_name='budget',
            name='hard_action',
            field=models.CharField(choices=[('throttle', 'throttle'), ('block', 'block new GPU pods'), ('evict-best-effort', 'evict best-effort pods'), ('notify', 'notify only')], default='throttle', max_length=20),
        ),
        migrations.AlterField(
            model_name='budget',
            name='tenant',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='billing.tenant'),
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.UniqueConstraint(condition=models.Q(('scope', 'tenant')), fields=('tenant',), name='budget_one_per_tenant'),
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.UniqueConstraint(condition=models.Q(('scope', 'namespace')), fields=('tenant', 'namespace'), name='budget_one_per_namespace'),
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.UniqueConstraint(condition=models.Q(('scope', 'label')), fields=('tenant', 'label_key', 'label_value'), name='budget_one_per_label'),
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('label_key', ''), ('label_value', ''), ('namespace', ''), ('scope', 'tenant')), models.Q(('label_key', ''), ('label_value', ''), ('scope', 'namespace'), models.Q(('namespace', ''), _negated=True)), models.Q(('namespace', ''), ('scope', 'label'), models.Q(('label_key', ''), _negated=True)), _connector='OR'), name='budget_scope_fields'),
        ),
        migrations.AddConstraint(
            model_name='budget',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('scope', 'label'), _negated=True), ('hard_action', 'notify'), _connector='OR'), name='budget_label_notifies_only'),
        ),
    ]
