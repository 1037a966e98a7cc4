"""The FinOps Foundation's focus-validator on the FOCUS files the product writes (docs/exports.md,
"The official validator"): the newest release PyPI offers (1.0.0), on the newest rule set it ships
(FOCUS 1.0), with only the rules docs/focus-validator-overrides.yaml names and docs/exports.md argues
left out (and, on Parquet, its eight decimal-type rules, below). One run over every file combined (an invoice with usage, idle, rounding, tax and a late-usage
correction, the invoice before it, a credit note, the fleet dataset), one over the dataset's Parquet.

The validator lives in its own environment (`make focus-validator`: .venv-focus-validator), because
it pins numpy<2 and pytz<2024; FOCUS_VALIDATOR_VENV points elsewhere."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from billing.ledger.rollup import rollup_usage
from billing.models import Invoice, RateCard, Tenant
from billing.scope import Scope
from billing.services.credit_notes import issue_credit_note
from billing.services.exports import FOCUS_COLUMNS, export_credit_note, export_invoice
from billing.services.exports.focus_dataset import dataset_file_names, write_fleet_dataset
from billing.services.invoicing import close_period
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FOCUS_VALIDATOR_VENV", ROOT / ".venv-focus-validator"))
OVERRIDES = ROOT / "docs" / "focus-validator-overrides.yaml"
# The Decimal columns of FOCUS 1.0 that we write. Our Parquet keeps them exact, DECIMAL(38, 18); pandas
# reads those as Python Decimals (dtype object) and the validator calls a column decimal only when it is
# float64, so on Parquet these eight rules fail whatever the values (the same rows pass them as CSV).
# Its override file cannot skip a data-type rule (the type stays on the column), so the test excludes
# them itself, for Parquet only (docs/exports.md, "The official validator").
PARQUET_DECIMAL_RULES = {f"{c}_IsDecimal" for c in ("BilledCost", "ConsumedQuantity", "ContractedCost",
                                                     "ContractedUnitPrice", "EffectiveCost", "ListCost",
                                                     "ListUnitPrice", "PricingQuantity")}
VALIDATOR_VERSION = "1.0.0"
RULES_VERSION = "1.0"  # the newest FOCUS version focus-validator 1.0.0 has rules for
EVERYONE = Scope(tenants=None, is_finance=True, is_admin=True)
OCT, NOV = date(2026, 10, 1), date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


def site_packages() -> Path:
    found = sorted(VENV.glob("lib/python3*/site-packages/focus_validator"))
    if not found or not (VENV / "bin" / "focus-validator").exists():
        pytest.fail(f"focus-validator is not installed in {VENV}: run `make focus-validator`")
    return found[0].parent


@dataclass(frozen=True)
class Verdict:
    passed: set[str]
    failed: dict[str, str]  # rule id -> the validator's description
    skipped: set[str]
    errored: dict[str, str]


def validate(data_file: Path, tmp_path: Path) -> Verdict:
    """One run of the real validator, its JUnit report read back (it exits 0 whatever it finds). It
    runs from its site-packages folder: it opens its ISO 4217 list by a path relative to the working
    directory, so anywhere else BillingCurrency_IsCurrencyCode fails on any file."""
    report = tmp_path / f"{data_file.name}.xml"
    subprocess.run([str(VENV / "bin" / "focus-validator"), "--data-file", str(data_file), "--validate-version",
                    RULES_VERSION, "--override-file", str(OVERRIDES), "--output-type", "unittest",
                    "--output-destination", str(report)],
                   cwd=site_packages(), check=True, capture_output=True, timeout=120)
    verdict = Verdict(set(), {}, set(), {})
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - the validator's report of our file
        rule = case.attrib["name"].split(" :: ")[0]
        if (failure := case.find("failure")) is not None:
            verdict.failed[rule] = failure.attrib.get("message", "")
        elif (error := case.find("error")) is not None:
            verdict.errored[rule] = error.attrib.get("message", "")
        elif case.find("skipped") is not None:
            verdict.skipped.add(rule)
        else:
            verdict.passed.add(rule)
    return verdict


def console_report(data_file: Path) -> str:
    """The validator's own text report (rows and example values), for a failure's message."""
    done = subprocess.run([str(VENV / "bin" / "focus-validator"), "--data-file", str(data_file),
                           "--validate-version", RULES_VERSION, "--override-file", str(OVERRIDES)],
                          cwd=site_packages(), capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def shipped_rules() -> set[str]:
    return {p.stem for p in (site_packages() / "focus_validator" / "rules" / "version_sets" / RULES_VERSION).glob("*.yaml")}


def overrides() -> set[str]:
    return set(yaml.safe_load(OVERRIDES.read_text())["overrides"])


def assert_passes(data_file: Path, tmp_path: Path, *, expected_failures: frozenset[str] = frozenset()) -> None:
    verdict = validate(data_file, tmp_path)
    failed = set(verdict.failed)
    assert failed == expected_failures and not verdict.errored, (verdict.failed, verdict.errored,
                                                                 console_report(data_file))
    # Every shipped rule ran and passed, but the ones we argue against, which it skipped.
    assert verdict.skipped == overrides()
    assert verdict.passed | verdict.skipped | failed == shipped_rules()


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
    combined = tmp_path / "combined-focus.csv"
    with combined.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(FOCUS_COLUMNS)
        writer.writerows(rows)

    assert_passes(combined, tmp_path)
    # As we run it, the validator does catch a broken file: one BilledCost left empty.
    broken = tmp_path / "broken-focus.csv"
    rows[0][FOCUS_COLUMNS.index("BilledCost")] = ""
    with broken.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, lineterminator="\n").writerows([FOCUS_COLUMNS, *rows])
    assert set(validate(broken, tmp_path).failed) == {"BilledCost_NotNull"}
    assert_passes(written.directory / parquet_name, tmp_path, expected_failures=frozenset(PARQUET_DECIMAL_RULES))
