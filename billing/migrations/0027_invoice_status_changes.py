"""Invoice payment status: an append-only record beside the invoice, which is immutable once
finalized (migration 0005). A recorded change can be neither updated nor deleted, and is recorded
on a finalized invoice only."""

import django.db.models.deletion
from django.db import migrations, models

APPEND_ONLY = """
CREATE FUNCTION billing_invoice_status_change_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NOT EXISTS (SELECT 1 FROM billing_invoice WHERE id = NEW.invoice_id AND status = 'finalized') THEN
            RAISE EXCEPTION 'a payment status is recorded on a finalized invoice only (invoice id %)', NEW.invoice_id
                USING ERRCODE = 'restrict_violation';
        END IF;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'invoice status change % is append-only; record what happened next instead', OLD.id
        USING ERRCODE = 'restrict_violation';
END $$;
CREATE TRIGGER invoice_status_change_append_only BEFORE INSERT OR UPDATE OR DELETE ON billing_invoicestatuschange
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_status_change_append_only();
"""
MUTABLE = """
DROP TRIGGER invoice_status_change_append_only ON billing_invoicestatuschange;
DROP FUNCTION billing_invoice_status_change_append_only();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0026_budget_forecast_over'),
    ]

    operations = [
        migrations.CreateModel(
            name='InvoiceStatusChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(choices=[('sent', 'sent'), ('paid', 'paid'), ('payment_reversed', 'payment reversed')], max_length=20)),
                ('on_date', models.DateField()),
                ('note', models.CharField(blank=True, max_length=200)),
                ('recorded_at', models.DateTimeField()),
                ('recorded_by', models.CharField(max_length=150)),
                ('invoice', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='status_changes', to='billing.invoice')),
            ],
            options={
                'ordering': ['recorded_at', 'id'],
            },
        ),
        migrations.RunSQL(APPEND_ONLY, reverse_sql=MUTABLE),
    ]
