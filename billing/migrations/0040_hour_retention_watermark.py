# The hour ledger is pruned past VGPU_HOUR_RETENTION_DAYS (billing.ledger.retention): its watermark,
# the instant before which hour rows may be gone, is a third kind of retention watermark.

from django.db import migrations

ALLOW_HOUR = """
ALTER TABLE billing_ledger_retention DROP CONSTRAINT billing_ledger_retention_kind_check;
ALTER TABLE billing_ledger_retention ADD CONSTRAINT billing_ledger_retention_kind_check
    CHECK (kind IN ('raw', 'minute', 'hour'));
"""
ONLY_RAW_AND_MINUTE = """
DELETE FROM billing_ledger_retention WHERE kind = 'hour';
ALTER TABLE billing_ledger_retention DROP CONSTRAINT billing_ledger_retention_kind_check;
ALTER TABLE billing_ledger_retention ADD CONSTRAINT billing_ledger_retention_kind_check
    CHECK (kind IN ('raw', 'minute'));
"""


class Migration(migrations.Migration):
    dependencies = [("billing", "0039_raw_billed_integrals")]

    operations = [migrations.RunSQL(ALLOW_HOUR, reverse_sql=ONLY_RAW_AND_MINUTE)]
