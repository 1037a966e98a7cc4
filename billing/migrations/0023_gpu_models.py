# Approved GPU model names (billing.models.GpuModel, docs/billing.md "Approved GPU models"):
# only an approved name may be priced by a rate card. Every model an existing rate card names is
# approved here, so nothing priced today loses its price or its place in the rate-card form.

from django.db import migrations, models
from django.utils import timezone


def approve_priced_models(apps, schema_editor):  # type: ignore[no-untyped-def]  # RunPython passes the historical apps and the schema editor
    GpuModel = apps.get_model("billing", "GpuModel")
    RateCard = apps.get_model("billing", "RateCard")
    now = timezone.now()
    for name in sorted(set(RateCard.objects.values_list("gpu_model", flat=True))):
        GpuModel.objects.get_or_create(name=name, defaults={
            "approved_at": now, "approved_by": "migration 0023",
            "note": "a rate card named this model when approved models were introduced"})


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0022_api_tokens'),
    ]

    operations = [
        migrations.CreateModel(
            name='GpuModel',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=96, unique=True)),
                ('approved_at', models.DateTimeField()),
                ('approved_by', models.CharField(max_length=150)),
                ('note', models.CharField(blank=True, max_length=500)),
                ('retired_at', models.DateTimeField(blank=True, null=True)),
                ('retired_by', models.CharField(blank=True, max_length=150)),
                ('retire_reason', models.TextField(blank=True)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.RunPython(approve_priced_models, migrations.RunPython.noop),
    ]
