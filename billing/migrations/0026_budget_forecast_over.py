# Forecast over budget: a warning beside the budget state, never a state, so the node policy and
# admission (which read `state` only) act as before; an enforced budget never carries it.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0025_node_speaks_for_itself'),
    ]

    operations = [
        migrations.AddField(
            model_name='budgetstatus',
            name='forecast_over_budget',
            field=models.BooleanField(default=False),
        ),
        migrations.AddConstraint(
            model_name='budgetstatus',
            constraint=models.CheckConstraint(condition=models.Q(('forecast_over_budget', True), ('state', 'enforced'), _negated=True), name='budget_status_forecast_over_not_enforced'),
        ),
    ]
