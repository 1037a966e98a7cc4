"""The monthly FOCUS dataset of the whole fleet (docs/exports.md, "Fleet FOCUS dataset"): every
tenant's usage and idle and the platform's idle, Σ BilledCost = Σ card cost of the month's priced
GPU-hours; written as CSV, Parquet and a manifest, atomically and idempotently; the daily task, its
beat entry, the demo's folder and the export_focus_dataset command."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import logging
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from celery.schedules import crontab
from django.core.management import CommandError, call_command
from django.db import transaction
from django.db.models import Sum
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.calendar import month_bounds
from billing.ledger.models import GpuHour, UsageHour
from billing.ledger.rollup import rollup_usage
from billing.models import BillingPeriod, Invoice, Node, RateCard, Tenant
from billing.money import to_minor_units
from billing.services.exports import FOCUS_COLUMNS
from billing.services.exports.focus_dataset import (
    MANIFEST,
    METADATA,
    PLATFORM_ACCOUNT,
    build_fleet_focus_rows,
    dataset_file_names,
    months_to_write,
    write_fleet_dataset,
)
from billing.services.invoicing.close import close_period
from billing.tasks import write_focus_dataset
from tests import clock
from tests.conftest import SHARED_GPU_WORKLOADS, make_batch

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
NOV = date(2026, 11, 1)
AFTER_NOV = datetime(2026, 12, 2, tzinfo=UTC)
HORIZON = timedelta(days=45)
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture(autouse=True)
def _fixed_dates_stay_billable(settings):
    """These tests post usage on fixed past dates; keep them inside the late-usage horizon."""
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)


@pytest.fixture
def tenants(db):
    Tenant.objects.create(slug="acme", name="Acme")
    Tenant.objects.create(slug="globex", name="Globex")


@pytest.fixture
def november(post_batch, one_usd_per_gpu_second, tenants):
    """10 s on one A100 at 1 USD per GPU-second: acme's pod takes 10 % of the card, globex's 20 %."""
    batch = make_batch(start=datetime(2026, 11, 15, 12, tzinfo=UTC), seq=1, workloads=SHARED_GPU_WORKLOADS)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    return one_usd_per_gpu_second


def card_cost(month: date) -> dict[str, Decimal]:
    start, end = month_bounds(month)
    sums = (GpuHour.objects.filter(hour__gte=start, hour__lt=end, priced=True).values("currency")
            .annotate(total=Sum("card_cost")))
    return {s["currency"]: s["total"] for s in sums}


def billed_by_account(rows: list[dict[str, Any]]) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = {}
    for row in rows:
        key = (row["BillingAccountId"], row["SkuId"])
        out[key] = out.get(key, Decimal(0)) + row["BilledCost"]
    return out


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


# --- rows --------------------------------------------------------------------------------------


def test_the_fleet_rows_hold_every_tenant_and_the_platform_idle_and_add_up_to_the_whole_card(november):
    rows = build_fleet_focus_rows(NOV)
    assert billed_by_account(rows) == {
        ("acme", f"gpu-share:{A100}"): Decimal(1),
        ("globex", f"gpu-share:{A100}"): Decimal(2),
        # 70 % of the card idle under the platform policy: on no invoice, in the dataset.
        (PLATFORM_ACCOUNT[0], f"gpu-idle:{A100}"): Decimal(7),
    }
    assert sum(r["BilledCost"] for r in rows) == card_cost(NOV)["USD"] == Decimal(10)
    (platform,) = [r for r in rows if r["BillingAccountId"] == PLATFORM_ACCOUNT[0]]
    assert platform["AllocatedMethodId"] is None
    assert platform["SubAccountId"] is None
    assert (platform["ResourceId"], platform["SkuMeter"], platform["PricingQuantity"]) == (
        "GPU-gpu-node-1-0", "GPU Idle Capacity", Decimal("0.001944444444"))  # 7 s at 3600 per GPU-hour
    assert all(r["InvoiceId"] is None for r in rows)  # an open month: on no issued invoice yet
    assert {r["BillingPeriodStart"] for r in rows} == {datetime(2026, 11, 1, tzinfo=UTC)}


def test_under_the_proportional_policy_the_idle_is_the_tenants_and_the_platform_keeps_none(november):
    RateCard.objects.filter(pk=november.pk).update(idle_policy="proportional")
    from billing.ledger.rollup import rebuild_ledger

    rebuild_ledger(start=datetime(2026, 11, 15, tzinfo=UTC), end=datetime(2026, 11, 16, tzinfo=UTC))
    rows = build_fleet_focus_rows(NOV)
    by = billed_by_account(rows)
    assert PLATFORM_ACCOUNT[0] not in {account for account, _ in by}
    assert by[("acme", f"gpu-idle:{A100}")] + by[("globex", f"gpu-idle:{A100}")] == Decimal(7)
    assert sum(r["BilledCost"] for r in rows) == Decimal(10)


# --- files -------------------------------------------------------------------------------------


def test_the_dataset_is_a_csv_a_parquet_file_and_a_manifest_that_agree(november, tmp_path):
    written = write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV, horizon=HORIZON)
    folder = tmp_path / "2026-11"
    csv_name, parquet_name = dataset_file_names(NOV)
    assert sorted(p.name for p in folder.iterdir()) == sorted([csv_name, parquet_name, METADATA, MANIFEST])
    header, rows = read_csv(folder / csv_name)
    assert header == list(FOCUS_COLUMNS)
    assert len(rows) == written.rows == 3
    table = pq.read_table(folder / parquet_name)
    assert table.column_names == list(FOCUS_COLUMNS)
    assert table.num_rows == 3
    # The same values in both: Parquet's decimals are exact, its instants UTC.
    parquet_rows = table.to_pylist()
    for text_row, typed_row in zip(rows, parquet_rows, strict=True):
        assert Decimal(text_row["BilledCost"]) == typed_row["BilledCost"]
        assert Decimal(text_row["ListCost"]) == typed_row["ListCost"]
        assert text_row["ChargePeriodStart"] == typed_row["ChargePeriodStart"].strftime("%Y-%m-%dT%H:%M:%SZ")
        assert text_row["SkuPriceDetails"] == (typed_row["SkuPriceDetails"] or "")
    manifest = json.loads((folder / MANIFEST).read_text())
    for name in (csv_name, parquet_name):
        content = (folder / name).read_bytes()
        assert manifest["files"][name] == {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    assert (manifest["month"], manifest["rows"], manifest["focus_version"]) == ("2026-11", 3, "1.3")
    assert manifest["billed_cost"] == {"USD": "10"}
    assert manifest["billed_cost_minor_units"] == {"USD": 1000}
    assert manifest["final"] is False  # the month is not closed yet


def test_after_the_close_a_tenants_rows_carry_its_invoice_and_the_platforms_idle_stays_on_none(november, tmp_path):
    # FOCUS: InvoiceId MUST NOT be null for a charge on an issued invoice, MUST be null for one on none.
    close_period(month=NOV, now=AFTER_NOV)
    numbers = dict(Invoice.objects.filter(period__month=NOV, status=Invoice.Status.FINALIZED)
                   .values_list("tenant__slug", "number"))
    assert set(numbers) == {"acme", "globex"}
    write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV, horizon=HORIZON)
    _, rows = read_csv(tmp_path / "2026-11" / dataset_file_names(NOV)[0])
    assert {(r["BillingAccountId"], r["InvoiceId"]) for r in rows} == {
        ("acme", numbers["acme"]), ("globex", numbers["globex"]), (PLATFORM_ACCOUNT[0], "")}
    parquet = pq.read_table(tmp_path / "2026-11" / dataset_file_names(NOV)[1]).to_pylist()
    assert {(r["BillingAccountId"], r["InvoiceId"]) for r in parquet} == {
        ("acme", numbers["acme"]), ("globex", numbers["globex"]), (PLATFORM_ACCOUNT[0], None)}


def test_the_metadata_follows_focus_metadata_and_describes_every_column(november, tmp_path):
    write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV, horizon=HORIZON)
    folder = tmp_path / "2026-11"
    metadata = json.loads((folder / METADATA).read_text())
    assert metadata["DataGenerator"] == {"DataGenerator": "vGPU Ledger"}
    (schema,) = metadata["Schemas"]
    assert schema["FocusVersion"] == "1.3"
    assert re.fullmatch(r"[0-9a-f]{32}", schema["SchemaId"])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", schema["CreationDate"])
    definitions = {d["ColumnName"]: d for d in schema["ColumnDefinition"]}
    assert list(definitions) == list(FOCUS_COLUMNS)
    assert {c: d["DataType"] for c, d in definitions.items() if d["DataType"] != "STRING"} == {
        **dict.fromkeys(["BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
                         "ListCost", "ListUnitPrice", "PricingQuantity", "x_CO2eKg", "x_EnergyCost", "x_EnergyKWh"],
                        "DECIMAL"),
        **dict.fromkeys(["BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart"], "DATETIME"),
        **dict.fromkeys(["AllocatedMethodDetails", "AllocatedTags", "SkuPriceDetails", "Tags"], "JSON")}
    # The types are the Parquet file's: its decimals have the precision and scale the schema says.
    table = pq.read_table(folder / dataset_file_names(NOV)[1])
    billed = table.schema.field("BilledCost").type
    assert (definitions["BilledCost"]["NumericPrecision"], definitions["BilledCost"]["NumberScale"]) == (
        billed.precision, billed.scale)
    assert definitions["Tags"]["ProviderTagPrefixes"] == ["vgpu-ledger/"]
    # The manifest names the schema the data has.
    assert json.loads((folder / MANIFEST).read_text())["schema_id"] == schema["SchemaId"]


def test_a_rerun_changes_nothing_and_new_usage_rewrites_every_file(november, post_batch, tmp_path):
    first = write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV, horizon=HORIZON)
    folder = tmp_path / "2026-11"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}
    again = write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV + timedelta(days=1), horizon=HORIZON)
    assert first.changed
    assert not again.changed
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()} == before

    batch = make_batch(start=datetime(2026, 11, 20, tzinfo=UTC), seq=2, workloads=SHARED_GPU_WORKLOADS)
    assert post_batch(batch).status_code == 201
    rollup_usage(now=clock.now())
    later = write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV, horizon=HORIZON)
    assert later.changed
    assert later.totals == {"USD": Decimal(20)}
    # New data, the same schema: every file but the FOCUS metadata is rewritten.
    assert all((folder / name).read_bytes() != before[name][0] for name in before if name != METADATA)
    assert (folder / METADATA).read_bytes() == before[METADATA][0]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_a_month_is_final_once_it_is_closed_and_past_the_late_usage_horizon(november, tmp_path):
    close_period(month=NOV, now=AFTER_NOV)
    assert BillingPeriod.objects.get(month=NOV).status == BillingPeriod.Status.CLOSED
    within = write_fleet_dataset(NOV, tmp_path, now=AFTER_NOV, horizon=HORIZON)
    past = write_fleet_dataset(NOV, tmp_path, now=datetime(2026, 12, 1, tzinfo=UTC) + HORIZON, horizon=HORIZON)
    assert (within.final, past.final) == (False, True)
    assert past.changed  # only the manifest: the data is the same
    assert json.loads((tmp_path / "2026-11" / MANIFEST).read_text())["final"] is True


def test_an_empty_month_writes_a_header_only_dataset(db, tmp_path):
    written = write_fleet_dataset(date(2026, 3, 1), tmp_path, now=AFTER_NOV, horizon=HORIZON)
    assert written.rows == 0
    assert written.totals == {}
    header, rows = read_csv(tmp_path / "2026-03" / dataset_file_names(date(2026, 3, 1))[0])
    assert header == list(FOCUS_COLUMNS)
    assert rows == []


# --- which months ------------------------------------------------------------------------------


@pytest.mark.parametrize(("now", "months"), [
    (datetime(2026, 12, 2, 2, 30, tzinfo=UTC), ["2026-10", "2026-11", "2026-12"]),
    (datetime(2026, 12, 16, 2, 30, tzinfo=UTC), ["2026-11", "2026-12"]),
    (datetime(2027, 1, 1, 0, 0, tzinfo=UTC), ["2026-11", "2026-12", "2027-01"]),
    (datetime(2028, 3, 1, 0, 0, tzinfo=UTC), ["2028-01", "2028-02", "2028-03"]),
])
def test_the_daily_run_writes_this_month_and_every_month_still_taking_late_usage(now, months):
    assert [f"{m:%Y-%m}" for m in months_to_write(now=now, horizon=HORIZON)] == months


# Hypothesis takes naive bounds and attaches the zone itself.
@given(now=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),  # noqa: DTZ001 - naive bounds, as hypothesis takes them
                        timezones=st.just(UTC)),
       days=st.integers(0, 400))
def test_months_to_write_are_exactly_the_months_ending_after_the_horizon(now, days):
    horizon = timedelta(days=days)
    months = months_to_write(now=now, horizon=horizon)
    assert months[-1] == now.date().replace(day=1)
    assert all(month_bounds(m)[1] > now - horizon for m in months)
    before = (months[0] - timedelta(days=1)).replace(day=1)
    assert month_bounds(before)[1] <= now - horizon
    assert all((b - a).days in (28, 29, 30, 31) for a, b in itertools.pairwise(months))


# --- reconciliation, for any ledger ------------------------------------------------------------

UNIT = Decimal("1e-12")


def nonzero(totals: dict[str, Decimal]) -> dict[str, Decimal]:
    return {c: t for c, t in totals.items() if t}


workloads = st.lists(st.tuples(st.sampled_from(["acme", "globex", "initech"]), st.integers(0, 10**15),
                               st.integers(0, 10**12)), min_size=0, max_size=3)
gpu_hours = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 29 * 24), st.integers(0, 10**15), workloads,
                               st.booleans()), min_size=0, max_size=12, unique_by=lambda h: (h[0], h[1]))


def write_hours(hours: list[tuple[int, int, int, list[tuple[str, int, int]], bool]]) -> None:
    """Hour rows as the rollup leaves them: card cost = Σ charges + idle, the idle spread onto the
    workloads (idle_allocated) up to all of it, the rest the platform's; GPU 2 is priced in EUR."""
    node = Node.objects.get_or_create(name="gpu-node-1")[0]
    start = datetime(2026, 11, 1, tzinfo=UTC)
    gpus, usage = [], []
    for gpu, hour_index, idle_units, its_workloads, spread in hours:
        hour = start + timedelta(hours=hour_index)
        charges = [c for _, c, _ in its_workloads]
        shares = [min(s, idle_units) for _, _, s in its_workloads] if spread else [0] * len(its_workloads)
        if sum(shares) > idle_units:
            shares = [0] * len(shares)
        gpus.append(GpuHour(gpu_uuid=f"GPU-{gpu}", node=node, gpu_model=A100, hour=hour, metered_seconds=3600,
                            card_cost=(sum(charges) + idle_units) * UNIT, charged=sum(charges) * UNIT,
                            idle_cost=idle_units * UNIT, idle_allocated=sum(shares) * UNIT,
                            currency="EUR" if gpu == 2 else "USD", priced=True))
        for i, ((tenant, charge, _), share) in enumerate(zip(its_workloads, shares, strict=True)):
            usage.append(UsageHour(
                gpu_uuid=f"GPU-{gpu}", node=node, tenant=tenant, namespace=f"{tenant}-ns", pod=f"p{i}",
                container="main", pod_uid=f"uid-{i}", sla_tier="gold", hour=hour, seconds=3600, mem_used_mb_s=1,
                mem_granted_mb_s=1, mem_billed_mb_s=1, sm_used_s=1, sm_granted_s=1, sm_billed_s=1, pcie_mb=0,
                share_gpu_s=1, charge=charge * UNIT, idle_share=share * UNIT))
    GpuHour.objects.bulk_create(gpus)
    UsageHour.objects.bulk_create(usage)


@hypothesis_settings(max_examples=40, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(hours=gpu_hours)
def test_the_dataset_adds_up_to_the_card_cost_of_every_gpu_hour_in_each_currency(one_usd_per_gpu_second, hours,
                                                                                 tmp_path_factory):
    with transaction.atomic():  # each example in a savepoint rolled back: examples share the database
        write_hours(hours)
        expected = card_cost(NOV)
        written = write_fleet_dataset(NOV, tmp_path_factory.mktemp("focus"), now=AFTER_NOV, horizon=HORIZON)
        _, rows = read_csv(written.directory / dataset_file_names(NOV)[0])
        from_file: dict[str, Decimal] = {}
        for row in rows:
            currency = row["BillingCurrency"]
            from_file[currency] = from_file.get(currency, Decimal(0)) + Decimal(row["BilledCost"])
        # Exact at ledger precision, in the rows and in the file as written; so also after the one
        # rounding to the currency's minor unit (half to even, billing.money.to_minor_units).
        assert nonzero(written.totals) == nonzero(from_file) == nonzero(expected)
        assert {c: to_minor_units(t, c) for c, t in nonzero(from_file).items()} == {
            c: to_minor_units(t, c) for c, t in nonzero(expected).items()}
        transaction.set_rollback(True)


# --- the task, its schedule, the demo and the command ------------------------------------------


def test_the_task_is_off_and_says_so_without_a_folder(db, settings, caplog):
    settings.VGPU_FOCUS_DATASET_DIR = ""
    with caplog.at_level(logging.INFO, logger="billing.tasks"):
        assert write_focus_dataset() == []
    assert "VGPU_FOCUS_DATASET_DIR is not set" in caplog.text


def test_the_task_writes_every_month_that_can_still_change(november, settings, tmp_path, time_machine):
    time_machine.move_to(datetime(2026, 12, 2, 2, 30, tzinfo=UTC), tick=False)
    settings.VGPU_FOCUS_DATASET_DIR = str(tmp_path)
    settings.VGPU_LATE_USAGE_HORIZON = HORIZON
    result = write_focus_dataset()
    assert [(r["month"], r["rows"], r["billed_cost"]) for r in result] == [
        ("2026-10", 0, {}), ("2026-11", 3, {"USD": "10"}), ("2026-12", 0, {})]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2026-10", "2026-11", "2026-12"]


def test_beat_runs_the_task_daily_after_the_close_and_the_demo_sets_a_folder(settings):
    from config.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["write-focus-dataset"]
    assert entry["task"] == "billing.tasks.write_focus_dataset"
    assert entry["task"] in app.tasks
    assert entry["schedule"] == crontab(hour="2", minute="30")
    close = settings.CELERY_BEAT_SCHEDULE["close-previous-month"]["schedule"]
    assert close == crontab(day_of_month="2", hour="1", minute="0")  # the close runs before it on the 2nd
    demo = (ROOT / "config" / "demo.py").read_text()
    assert 'env.setdefault("VGPU_FOCUS_DATASET_DIR", str(DEMO_DIR / "focus"))' in demo
    assert re.search(r'env.setdefault\("VGPU_FOCUS_DATASET_EVERY_S", "\d+"\)', demo)


def test_the_command_writes_a_month_by_hand(november, tmp_path, settings):
    settings.VGPU_FOCUS_DATASET_DIR = ""
    out = io.StringIO()
    call_command("export_focus_dataset", "2026-11", "--dir", str(tmp_path), stdout=out)
    assert "2026-11: 3 rows, billed cost 10 USD (may still change)" in out.getvalue()
    assert (tmp_path / "2026-11" / MANIFEST).exists()
    settings.VGPU_FOCUS_DATASET_DIR = str(tmp_path / "configured")
    call_command("export_focus_dataset", "2026-11", stdout=io.StringIO())
    assert (tmp_path / "configured" / "2026-11" / dataset_file_names(NOV)[1]).exists()


@pytest.mark.parametrize(("args", "message"), [
    (["2026/11", "--dir", "DIR"], "month '2026/11' must look like YYYY-MM"),
    (["2026-11"], "no folder: pass --dir or set VGPU_FOCUS_DATASET_DIR"),
])
def test_the_command_refuses_bad_arguments_with_the_reason(db, settings, tmp_path, args, message):
    settings.VGPU_FOCUS_DATASET_DIR = ""
    args = [str(tmp_path) if a == "DIR" else a for a in args]
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("export_focus_dataset", *args)
    assert list(tmp_path.iterdir()) == []
