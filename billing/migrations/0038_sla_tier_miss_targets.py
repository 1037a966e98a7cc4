"""Miss targets per SLA tier and resource. Every tier starts at allocator.risk's defaults: the
seeded tiers (gold, silver, bronze, best-effort) at their own, any other at DEFAULT_MISS_TARGET,
read from allocator.risk so the service and the agents start from one statement of risk."""

from typing import Any

from django.db import migrations, models

from allocator.risk import DEFAULT_MISS_TARGET
from billing.models.tenancy import MISS_TARGET_PLACES, default_miss_targets, miss_target_decimal


def per_tier_defaults(apps: Any, schema_editor: Any) -> None:
    SlaTier = apps.get_model("billing", "SlaTier")
    for tier in SlaTier.objects.all():
        SlaTier.objects.filter(pk=tier.pk).update(**default_miss_targets(tier.slug))


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0037_node_location_energy_prices'),
    ]

    operations = [
        migrations.AddField(
            model_name='slatier',
            name='miss_target_memory',
            field=models.DecimalField(decimal_places=MISS_TARGET_PLACES, max_digits=MISS_TARGET_PLACES + 1,
                                      default=miss_target_decimal(DEFAULT_MISS_TARGET.memory)),
        ),
        migrations.AddField(
            model_name='slatier',
            name='miss_target_sm',
            field=models.DecimalField(decimal_places=MISS_TARGET_PLACES, max_digits=MISS_TARGET_PLACES + 1,
                                      default=miss_target_decimal(DEFAULT_MISS_TARGET.sm)),
        ),
        migrations.AddConstraint(
            model_name='slatier',
            constraint=models.CheckConstraint(condition=models.Q(('miss_target_memory__gt', 0), ('miss_target_memory__lt', 1)), name='sla_tier_miss_target_memory_share'),
        ),
        migrations.AddConstraint(
            model_name='slatier',
            constraint=models.CheckConstraint(condition=models.Q(('miss_target_sm__gt', 0), ('miss_target_sm__lt', 1)), name='sla_tier_miss_target_sm_share'),
        ),
        migrations.RunPython(per_tier_defaults, migrations.RunPython.noop),
    ]
