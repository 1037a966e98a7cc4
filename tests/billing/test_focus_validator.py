"""The FinOps Foundation's focus-validator on the FOCUS files the product writes (docs/exports.md,
"The official validator"): the newest release PyPI offers (2.2.1), every rule of the newest FOCUS
version it has rules for (1.2), with the applicability criteria and expected failures
docs/focus-validator-overrides.yaml names and argues. Two runs, as its CLI takes one file a run: one
over every CSV combined (an invoice with usage, idle, rounding, tax and a late-usage correction, the
invoice before it, a credit note, the fleet dataset of the closed month), one over the dataset's
Parquet file. Our own checks of the FOCUS 1.3 columns it has no rule for run on the same rows."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from billing.ledger.rollup import rollup_usage
from billing.models import Invoice, Location, LocationRate, Node, NodeLocation, RateCard, Tenant
from billing.scope import Scope
from billing.services.exports import FOCUS_COLUMNS, export_credit_note, export_invoice
from billing.services.exports.focus_dataset import PLATFORM_ACCOUNT, dataset_file_names, write_fleet_dataset
from billing.services.invoicing.close import close_period
from billing.services.invoicing.credit_notes import issue_credit_note
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch
from tests.focus_validator import (
    RULES_VERSION,
    VALIDATOR_VERSION,
    assert_focus_1_3_columns,
    assert_passes,
    config,
    model,
    overrides,
    run_validator,
    site_packages,
    write_focus_csv,
)

pytestmark = pytest.mark.django_db

EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
OCT, NOV = date(2026, 10, 1), date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


def test_the_validator_is_the_newest_release_and_its_newest_rules_are_focus_1_2():
    assert (site_packages() / f"focus_validator-{VALIDATOR_VERSION}.dist-info").is_dir()
    supported = re.search(r"Supported local versions: \[(.*)\]", run_validator("--supported-versions"))
    assert supported, "the validator names no local rule model"
    versions = {".".join(v.strip(" '\"").split(".")[:2]) for v in supported[1].split(",") if v.strip()}
    # When a release ships newer rules, this fails: move RULES_VERSION, the overrides and docs/exports.md to them.
    assert max(versions, key=lambda v: tuple(map(int, v.split(".")))) == RULES_VERSION
    # Each applicability criterion it knows is ours or argued not to be (a new one fails here), and each
    # overridden rule exists (a stale name would hide nothing, silently).
    criteria = config()["applicability_criteria"]
    assert not set(criteria["claimed"]) & set(criteria["not_ours"])
    assert set(criteria["claimed"]) | set(criteria["not_ours"]) == set(model()["ApplicabilityCriteria"])
    assert overrides() <= set(model()["ModelRules"])
    assert all(entry["reason"].strip() for entry in config()["overrides"])


def usage(post_batch, *, at: datetime, seq: int, seconds: int = 10) -> None:
    batch = make_batch(start=at, seq=seq, seconds=seconds, workloads=SHARED_GPU_WORKLOADS)
    batch["gpus"][0]["energy_j"] = 300.0 * seconds  # 300 W: the rows carry energy, its cost and CO2e
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())


def priced_energy() -> None:
    """The node in a location with an energy price and a CO2e factor (docs/billing.md, Energy)."""
    location = Location.objects.create(label="eu-west-dc1", created_at=clock.now())
    LocationRate.objects.create(location=location, effective_from=date(2020, 1, 1), price_per_kwh=Decimal("0.21"),
                                currency="USD", co2e_kg_per_kwh=Decimal("0.25"), created_at=clock.now())
    NodeLocation.objects.create(node=Node.objects.get_or_create(name="gpu-node-1")[0], location=location,
                                effective_from=date(2000, 1, 1), created_at=clock.now())


def csv_rows(content: bytes) -> list[list[str]]:
    reader = csv.reader(io.StringIO(content.decode("utf-8-sig")))
    assert next(reader) == list(FOCUS_COLUMNS)
    return list(reader)


def test_every_focus_file_we_write_passes_the_official_validator(post_batch, one_usd_per_gpu_second, tmp_path):
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(idle_policy="proportional")
    Tenant.objects.create(slug="acme", name="星河智算科技", tax_rate_pct=Decimal("20"))
    Tenant.objects.create(slug="globex", name="Globex")
    priced_energy()
    usage(post_batch, at=datetime(2026, 10, 20, 12, tzinfo=UTC), seq=1)
    close_period(month=OCT, now=datetime(2026, 11, 2, tzinfo=UTC))
    usage(post_batch, at=datetime(2026, 10, 31, 23, 59, 40, tzinfo=UTC), seq=2, seconds=20)  # late: a correction
    # Without the platform's idle the dataset would hold only what the invoices hold: keep some.
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(idle_policy="platform")
    usage(post_batch, at=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=3)
    RateCard.objects.filter(pk=one_usd_per_gpu_second.pk).update(idle_policy="proportional")
    usage(post_batch, at=datetime(2026, 11, 16, 12, tzinfo=UTC), seq=4)
    close_period(month=NOV, now=AFTER_NOV)

    november = Invoice.objects.get(tenant__slug="acme", period__month=NOV)
    note = issue_credit_note(invoice_number=november.number, amount_text="1.50", reason="GPU outage on 2026-11-20",
                             now=AFTER_NOV, actor_label="finance-1")
    files = [export_invoice(scope=EVERYONE, number=i.number, fmt="focus").content for i in Invoice.objects.all()]
    files.append(export_credit_note(scope=EVERYONE, number=note.number, fmt="focus").content)
    # The dataset as the daily run writes it after the close: the month's tenant rows are on its invoices.
    written = write_fleet_dataset(NOV, tmp_path / "dataset", now=AFTER_NOV, horizon=timedelta(days=45))
    csv_name, parquet_name = dataset_file_names(NOV)
    files.append((written.directory / csv_name).read_bytes())

    rows = [row for content in files for row in csv_rows(content)]
    column = {c: i for i, c in enumerate(FOCUS_COLUMNS)}
    kinds = {(r[column["ChargeCategory"]], r[column["ChargeClass"]]) for r in rows}
    # What the combined file holds, so a change that drops a kind of row cannot pass unseen.
    assert kinds == {("Usage", ""), ("Adjustment", ""), ("Tax", ""), ("Usage", "Correction"), ("Credit", "Correction"),
                     ("Tax", "Correction")}
    # The energy columns are filled where the rows have energy (usage and the platform's idle).
    assert {bool(r[column["x_EnergyCost"]]) and bool(r[column["x_CO2eKg"]]) for r in rows
            if r[column["x_EnergyKWh"]] not in ("", "0E-12")} == {True}
    platform = sum(r[column["BillingAccountId"]] == PLATFORM_ACCOUNT[0] for r in rows)
    assert platform > 0
    as_csv = assert_passes(write_focus_csv(tmp_path / "combined-focus.csv", FOCUS_COLUMNS, rows), platform_rows=platform)
    parquet = written.directory / parquet_name
    as_parquet = assert_passes(parquet, platform_rows=sum(
        a == PLATFORM_ACCOUNT[0] for a in pq.read_table(parquet).column("BillingAccountId").to_pylist()))
    # Every override is still needed by one of the runs: an entry the validator no longer fails is dropped.
    assert set(as_csv.failed) | set(as_parquet.failed) == overrides()
    # Our own checks: the dataset's InvoiceId per account, and the 1.3 columns no 1.2 rule knows.
    numbers = {i.tenant.slug: i.number for i in Invoice.objects.filter(period__month=NOV).select_related("tenant")}
    dataset_rows = csv_rows(files[-1])
    assert {(r[column["BillingAccountId"]], r[column["InvoiceId"]]) for r in dataset_rows} == {
        *numbers.items(), (PLATFORM_ACCOUNT[0], "")}
    assert_focus_1_3_columns([{c: (v or None) for c, v in zip(FOCUS_COLUMNS, r, strict=True)} for r in rows])
