# What grouping needs from the agents (docs/protocol.md, optional batch fields).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0020_invoice_finance_fields'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='cluster',
            field=models.CharField(blank=True, db_default='', default='', max_length=253),
        ),
        migrations.CreateModel(
            name='WorkloadMeta',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('namespace', models.CharField(max_length=253)),
                ('pod', models.CharField(max_length=253)),
                ('pod_uid', models.CharField(max_length=64)),
                ('controller_kind', models.CharField(blank=True, default='', max_length=63)),
                ('controller_name', models.CharField(blank=True, default='', max_length=253)),
                ('labels', models.JSONField(default=dict)),
                ('requests', models.JSONField(default=dict)),
                ('first_seen', models.DateTimeField()),
                ('last_seen', models.DateTimeField()),
            ],
            options={
                'indexes': [models.Index(fields=['controller_kind', 'controller_name'], name='workload_meta_controller_idx')],
                'constraints': [models.UniqueConstraint(fields=('namespace', 'pod', 'pod_uid'), name='workload_meta_key')],
            },
        ),
    ]
