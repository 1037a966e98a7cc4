# Unit prices on invoice lines (docs/billing.md, Unit prices): the price per GPU-hour the close states
# on each usage line and the rates that priced it, stored with the line so an issued invoice never
# changes when rate cards do. Adding the columns rewrites no row, so the immutability trigger of
# migration 0005 is not fired; lines finalized before this show no unit price.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0032_energy'),
    ]

    operations = [
        migrations.AddField(
            model_name='invoiceline',
            name='unit_price',
            field=models.DecimalField(blank=True, decimal_places=6, max_digits=24, null=True),
        ),
        migrations.AddField(
            model_name='invoiceline',
            name='rates',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
