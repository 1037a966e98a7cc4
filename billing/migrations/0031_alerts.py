# Alerts beyond budgets: rules, the alerts they raised, and the crossing flags of level conditions (docs/alerts.md).

import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0030_export_destinations'),
    ]

    operations = [
        migrations.CreateModel(
            name='AlertRule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('kind', models.CharField(choices=[('spend_anomaly', 'spend anomaly'), ('idle_share', 'idle share'), ('over_granting', 'over-granting')], max_length=20)),
                ('group_by', models.CharField(choices=[('tenant', 'per tenant'), ('namespace', 'per namespace'), ('fleet', 'the whole fleet'), ('node', 'per node'), ('controller', 'per workload (controller)')], max_length=12)),
                ('granularity', models.CharField(choices=[('hour', 'hour'), ('day', 'day')], default='hour', max_length=4)),
                ('baseline_weeks', models.PositiveSmallIntegerField(default=4)),
                ('threshold', models.DecimalField(decimal_places=3, max_digits=8)),
                ('min_amount', models.DecimalField(decimal_places=2, default=Decimal('0'), max_digits=14)),
                ('currency', models.CharField(default='USD', max_length=3)),
                ('window_hours', models.PositiveIntegerField(default=24)),
                ('resource', models.CharField(choices=[('memory', 'GPU memory'), ('sm', 'SMs')], default='memory', max_length=6)),
                ('notify_emails', models.TextField(blank=True)),
                ('webhook_url', models.URLField(blank=True, max_length=500)),
                ('webhook_secret', models.CharField(blank=True, max_length=200)),
                ('slack_webhook_url', models.URLField(blank=True, max_length=500)),
                ('enabled', models.BooleanField(default=True)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('tenant', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='alert_rules', to='billing.tenant')),
            ],
            options={
                'ordering': ['name', 'pk'],
            },
        ),
        migrations.CreateModel(
            name='AlertEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('spend_anomaly', 'spend anomaly'), ('idle_share', 'idle share'), ('over_granting', 'over-granting')], max_length=20)),
                ('key', models.CharField(max_length=600)),
                ('period_start', models.DateTimeField()),
                ('period_end', models.DateTimeField()),
                ('value', models.DecimalField(decimal_places=12, max_digits=30)),
                ('baseline', models.DecimalField(decimal_places=12, max_digits=30, null=True)),
                ('score', models.DecimalField(decimal_places=3, max_digits=14, null=True)),
                ('currency', models.CharField(blank=True, max_length=3)),
                ('details', models.JSONField(default=dict)),
                ('explore_path', models.CharField(max_length=2000)),
                ('fired_at', models.DateTimeField()),
                ('email_sent_at', models.DateTimeField(blank=True, null=True)),
                ('webhook_sent_at', models.DateTimeField(blank=True, null=True)),
                ('slack_sent_at', models.DateTimeField(blank=True, null=True)),
                ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='billing.alertrule')),
            ],
            options={
                'ordering': ['-fired_at', '-pk'],
            },
        ),
        migrations.CreateModel(
            name='AlertState',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=600)),
                ('firing', models.BooleanField(default=False)),
                ('value', models.DecimalField(decimal_places=12, default=Decimal('0'), max_digits=30)),
                ('evaluated_at', models.DateTimeField()),
                ('changed_at', models.DateTimeField()),
                ('rule', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='states', to='billing.alertrule')),
            ],
            options={
                'ordering': ['rule_id', 'key'],
            },
        ),
        migrations.AddConstraint(
            model_name='alertrule',
            constraint=models.CheckConstraint(condition=models.Q(('threshold__gt', 0)), name='alert_rule_threshold_positive'),
        ),
        migrations.AddConstraint(
            model_name='alertrule',
            constraint=models.CheckConstraint(condition=models.Q(('min_amount__gte', 0)), name='alert_rule_min_amount_not_negative'),
        ),
        migrations.AddConstraint(
            model_name='alertrule',
            constraint=models.CheckConstraint(condition=models.Q(('baseline_weeks__gte', 3), ('baseline_weeks__lte', 12)), name='alert_rule_baseline_weeks_3_12'),
        ),
        migrations.AddConstraint(
            model_name='alertrule',
            constraint=models.CheckConstraint(condition=models.Q(('window_hours__gte', 1), ('window_hours__lte', 744)), name='alert_rule_window_1h_31d'),
        ),
        migrations.AddIndex(
            model_name='alertevent',
            index=models.Index(fields=['fired_at'], name='alert_event_fired_idx'),
        ),
        migrations.AddConstraint(
            model_name='alertevent',
            constraint=models.UniqueConstraint(condition=models.Q(('kind', 'spend_anomaly')), fields=('rule', 'key', 'period_start'), name='alert_event_anomaly_once'),
        ),
        migrations.AddConstraint(
            model_name='alertstate',
            constraint=models.UniqueConstraint(fields=('rule', 'key'), name='alert_state_rule_key_unique'),
        ),
    ]
