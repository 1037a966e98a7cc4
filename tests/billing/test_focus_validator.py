"""The FinOps Foundation's focus-validator on the FOCUS files the product writes (docs/exports.md,
"The official validator"): the newest release PyPI offers (1.0.0), on the newest rule set it ships
(FOCUS 1.0), with only the rules docs/focus-validator-overrides.yaml names and docs/exports.md argues
left out (and, on Parquet, its eight decimal-type rules: tests/focus_validator.py). One run over
every file combined (an invoice with usage, idle, rounding, tax and a late-usage correction, the
invoice before it, a credit note, the fleet dataset), one over the dataset's Parquet file."""

from __future__ import annotations

import csv
import io
import subprocess
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing.ledger.rollup import rollup_usage
from billing.models import Invoice, RateCard, Tenant
from billing.scope import Scope
from billing.services.credit_notes import issue_credit_note
from billing.services.exports import FOCUS_COLUMNS, export_credit_note, export_invoice
from billing.services.exports.focus_dataset import dataset_file_names, write_fleet_dataset
from billing.services.invoicing import close_period
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch
from tests.focus_validator import (
    PARQUET_DECIMAL_RULES,
    RULES_VERSION,
    VALIDATOR_VERSION,
    VENV,
    assert_passes,
    overrides,
    shipped_rules,
    site_packages,
    validate,
    write_focus_csv,
)

pytestmark = pytest.mark.django_db

EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
OCT, NOV = date(2026, 10, 1), date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


def test_the_validator_is_the_newest_release_and_its_newest_rules_are_focus_1_0():
    assert (site_packages() / f"focus_validator-{VALIDATOR_VERSION}.dist-info").is_dir()
    supported = subprocess.run([str(VENV / "bin" / "focus-validator"), "--supported-versions"], cwd=site_packages(),
                               check=True, capture_output=True, text=True, timeout=120).stdout.split()
    # When a release ships newer rules, this fails: move RULES_VERSION and docs/exports.md to them.
    assert max((v for v in supported if "preview" not in v), key=lambda v: tuple(map(int, v.split(".")))) == RULES_VERSION
    # Each rule we leave out exists in that rule set (a stale override would hide nothing, silently).
    assert overrides() | PARQUET_DECIMAL_RULES <= shipped_rules()


def usage(post_batch, *, at: datetime, seq: int, seconds: int = 10) -> None:
    assert post_batch(make_batch(start=at, seq=seq, seconds=seconds, workloads=SHARED_GPU_WORKLOADS)).status_code == 201
    rollup_usage(now=clock.now())


def csv_rows(content: bytes) -> list[list[str]]:
    reader = csv.reader(io.StringIO(content.decode("utf-8")))
    assert next(reader) == list(FOCUS_COLUMNS)
    return list(reader)


def test_every_focus_file_we_write_passes_the_official_validator(post_batch, one_usd_per_gpu_second, tmp_path):
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(idle_policy="proportional")
    Tenant.objects.create(slug="acme", name="星河智算科技", tax_rate_pct=Decimal("20"))
    Tenant.objects.create(slug="globex", name="Globex")
    usage(post_batch, at=datetime(2026, 10, 20, 12, tzinfo=UTC), seq=1)
    close_period(month=OCT, now=datetime(2026, 11, 2, tzinfo=UTC))
    usage(post_batch, at=datetime(2026, 10, 31, 23, 59, 40, tzinfo=UTC), seq=2, seconds=20)  # late: a correction
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=3)
    close_period(month=NOV, now=AFTER_NOV)
    # Without the platform's idle the dataset would hold only what the invoices hold: keep some.
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(idle_policy="platform")
    usage(post_batch, at=datetime(2026, 11, 20, 12, tzinfo=UTC), seq=4)

    november = Invoice.objects.get(tenant__slug="acme", period__month=NOV)
    note = issue_credit_note(invoice_number=november.number, amount_text="1.50", reason="GPU outage on 2026-11-20",
                             now=AFTER_NOV, actor_label="finance-1")
    files = [export_invoice(scope=EVERYONE, number=i.number, fmt="focus").content for i in Invoice.objects.all()]
    files.append(export_credit_note(scope=EVERYONE, number=note.number, fmt="focus").content)
    written = write_fleet_dataset(NOV, tmp_path / "dataset", now=AFTER_NOV, horizon=timedelta(days=45))
    csv_name, parquet_name = dataset_file_names(NOV)
    files.append((written.directory / csv_name).read_bytes())

    rows = [row for content in files for row in csv_rows(content)]
    kinds = {(r[FOCUS_COLUMNS.index("ChargeCategory")], r[FOCUS_COLUMNS.index("ChargeClass")]) for r in rows}
    # What the combined file holds, so a change that drops a kind of row cannot pass unseen.
    assert kinds == {("Usage", ""), ("Adjustment", ""), ("Tax", ""), ("Usage", "Correction"), ("Credit", "Correction"),
                     ("Tax", "Correction")}
    assert "vgpu-ledger:platform" in {r[FOCUS_COLUMNS.index("BillingAccountId")] for r in rows}
    assert_passes(write_focus_csv(tmp_path / "combined-focus.csv", FOCUS_COLUMNS, rows), tmp_path)
    # As we run it, the validator does catch a broken file: one BilledCost left empty.
    rows[0][FOCUS_COLUMNS.index("BilledCost")] = ""
    broken = write_focus_csv(tmp_path / "broken-focus.csv", FOCUS_COLUMNS, rows)
    assert set(validate(broken, tmp_path).failed) == {"BilledCost_NotNull"}
    assert_passes(written.directory / parquet_name, tmp_path, expected_failures=frozenset(PARQUET_DECIMAL_RULES))
