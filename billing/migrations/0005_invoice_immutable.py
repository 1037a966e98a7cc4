"""Finalized invoices and their lines are immutable, in the database.

A finalized invoice can be neither updated nor deleted; lines cannot be added to, changed
on or removed from a finalized invoice. Corrections are adjustment lines on a later invoice.
"""

from django.db import migrations

SQL = """
CREATE FUNCTION billing_invoice_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'finalized' THEN
        RAISE EXCEPTION 'invoice % is finalized and immutable; correct it with an adjustment on a later invoice',
            OLD.number USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER invoice_immutable BEFORE UPDATE OR DELETE ON billing_invoice
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_immutable();

CREATE FUNCTION billing_invoice_line_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    target bigint := CASE WHEN TG_OP = 'DELETE' THEN OLD.invoice_id ELSE NEW.invoice_id END;
BEGIN
    IF EXISTS (SELECT 1 FROM billing_invoice WHERE id = target AND status = 'finalized')
       OR (TG_OP = 'UPDATE' AND EXISTS (SELECT 1 FROM billing_invoice WHERE id = OLD.invoice_id AND status = 'finalized')) THEN
        RAISE EXCEPTION 'lines of finalized invoice % are immutable', target USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER invoice_line_immutable BEFORE INSERT OR UPDATE OR DELETE ON billing_invoiceline
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_line_immutable();
"""

REVERSE = """
DROP TRIGGER invoice_line_immutable ON billing_invoiceline;
DROP FUNCTION billing_invoice_line_immutable();
DROP TRIGGER invoice_immutable ON billing_invoice;
DROP FUNCTION billing_invoice_immutable();
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0004_invoices")]

    operations = [migrations.RunSQL(SQL, reverse_sql=REVERSE)]
