"""The monthly FOCUS dataset of the whole fleet (docs/exports.md, "Fleet FOCUS dataset"): every
tenant's usage and idle and the idle the platform keeps, so the month's rows add up to the whole
card cost of every priced GPU-hour, written to `<directory>/<YYYY-MM>/` as CSV and Parquet with a
manifest.

It is the ledger's view, like a cloud's cost-and-usage report, not an invoice's: amounts at ledger
precision, no rounding or tax rows (each invoice has its own FOCUS file). A tenant's rows carry
the number of the issued invoice their month is billed on (FOCUS: InvoiceId MUST NOT be null for a
charge on an issued invoice), null until the month is closed; the platform's idle is on no invoice
and stays null. A month
keeps changing while ingest still accepts late usage for it, so the daily task rewrites every
month that can still change (`months_to_write`) and the manifest says when a month is final.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from billing.calendar import month_bounds, month_of, previous_month
from billing.ledger.exports import list_fleet_focus_ledger_rows, list_origin_costs, list_platform_idle
from billing.models import BillingPeriod, Invoice, Tenant
from billing.money import to_minor_units
from billing.services.exports.focus import (
    FOCUS_COLUMNS,
    TAG_PREFIX,
    common_columns,
    focus_cell,
    focus_csv,
    idle_row,
    platform_idle_row,
    usage_row,
)
from billing.services.exports.numbers import plain_decimal
from billing.services.invoicing import current_issuer

__all__ = ["FOCUS_VERSION", "MANIFEST", "METADATA", "PLATFORM_ACCOUNT", "DatasetFiles", "DatasetWritten",
           "build_dataset_files", "build_fleet_focus_rows",
           "dataset_file_names", "focus_metadata", "issued_invoice_numbers", "months_to_write", "write_changing_months", "write_fleet_dataset"]

FOCUS_VERSION = "1.3"
# The platform's own account: no tenant slug has a colon (Django slugs), so this never names one.
PLATFORM_ACCOUNT = ("vgpu-ledger:platform", "Platform (idle capacity no tenant pays)")
MANIFEST = "manifest.json"
# FOCUS's own metadata (FOCUS 1.x "Metadata": the data generator and the schema with its column
# definitions); the manifest stays for our bookkeeping (checksums, totals, final), which FOCUS's has no place for.
METADATA = "focus-metadata.json"
DATA_GENERATOR = "vGPU Ledger"
# When this schema (FOCUS_COLUMNS, their types) was defined. FOCUS asks for a new schema object, with a new
# SchemaId, whenever a column or type changes or the FOCUS version does: the SchemaId is derived from them,
# and this date moves with the change.
SCHEMA_CREATED = "2026-12-05T00:00:00Z"
_JSON_COLUMNS = frozenset({"AllocatedMethodDetails", "AllocatedTags", "SkuPriceDetails", "Tags"})
_TAG_COLUMNS = frozenset({"AllocatedTags", "Tags"})

_DECIMAL_COLUMNS = frozenset({"BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice",
                              "EffectiveCost", "ListCost", "ListUnitPrice", "PricingQuantity", "x_CO2eKg", "x_EnergyCost",
                              "x_EnergyKWh"})
_DATETIME_COLUMNS = frozenset({"BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart"})
# Exact in Parquet too: prices have 6 places, quantities 12, so ListCost (their product) up to 18;
# 20 integer digits are far beyond any month's cost.
_PARQUET_DECIMAL = pa.decimal128(38, 18)


def dataset_file_names(month: date) -> tuple[str, str]:
    """The CSV and Parquet file names of a month's dataset."""
    stem = f"vgpu-ledger-focus-{FOCUS_VERSION}-{month:%Y-%m}"
    return f"{stem}.csv", f"{stem}.parquet"


def build_fleet_focus_rows(month: date) -> list[dict[str, Any]]:
    """The month's FOCUS rows of the whole fleet, as typed values: per tenant, day, GPU and workload
    its usage (BilledCost = the ledger charge) and the idle spread onto it; per GPU-day the idle
    left to the platform. Σ BilledCost per currency = Σ card cost of the month's priced GPU-hours."""
    start, end = month_bounds(month)
    issuer = current_issuer().name
    names = dict(Tenant.objects.values_list("slug", "name"))
    ledger = list_fleet_focus_ledger_rows(start=start, end=end)
    origins = {o.key: (o.card_cost, o.metered_seconds)
               for o in list_origin_costs(start=start, end=end, gpus={r.gpu_uuid for r in ledger})}

    invoices = issued_invoice_numbers(month)

    def common(account: tuple[str, str], currency: str, invoice_id: str | None = None) -> dict[str, Any]:
        return common_columns(account=account, currency=currency, invoice_id=invoice_id, issuer=issuer,
                              billing=(start, end), frequency="Usage-Based")

    rows: list[dict[str, Any]] = []
    for r in ledger:
        base = {**common((r.tenant, names.get(r.tenant, r.tenant)), r.currency, invoices.get(r.tenant)),
                "x_GpuModel": r.gpu_model, "x_SlaTier": r.sla_tier}
        origin = origins.get(r.origin_key, (Decimal(0), Decimal(0)))
        rows.append(usage_row({**base, "x_InvoiceLineKind": "usage"}, r, r.charge, origin))
        if r.idle_share:
            rows.append(idle_row({**base, "x_InvoiceLineKind": "idle"}, r, r.idle_share, origin))
    rows.extend(platform_idle_row(common(PLATFORM_ACCOUNT, idle.currency), idle)
                for idle in list_platform_idle(start=start, end=end) if idle.idle)
    return rows


def issued_invoice_numbers(month: date) -> dict[str, str]:
    """Tenant slug -> the number of the month's issued (finalized) invoice. Only a closed period has
    them; a draft is not issued, so its rows stay null like an open month's. Usage that arrives after
    the close is billed as a correction on a later invoice, but its ledger row is still the month's and
    the month's charges are on this invoice, so the row names it (the dataset is the ledger's view)."""
    return dict(Invoice.objects.filter(period__month=month, status=Invoice.Status.FINALIZED)
                .values_list("tenant__slug", "number"))


def months_to_write(*, now: datetime, horizon: timedelta) -> list[date]:
    """The months whose dataset can still change: this month (to date) and every earlier month that
    ingest still accepts late usage for (its end lies within the late-usage horizon), oldest first."""
    month = month_of(now)
    months = [month]
    while True:
        previous = previous_month(month)
        if month_bounds(previous)[1] <= now - horizon:  # month_bounds(previous)[1] is `month`'s start
            break
        months.append(previous)
        month = previous
    return sorted(months)


@dataclass(frozen=True)
class DatasetWritten:
    """What one write left in the month's folder (`changed` is False when the files were already these)."""

    month: date
    directory: Path
    rows: int
    totals: dict[str, Decimal]  # Σ BilledCost per currency, at ledger precision
    final: bool
    changed: bool

    def summary(self) -> dict[str, object]:
        """JSON-ready, for a task's result and a command's output."""
        return {"month": f"{self.month:%Y-%m}", "directory": str(self.directory), "rows": self.rows,
                "billed_cost": {c: plain_decimal(t) for c, t in sorted(self.totals.items())},
                "final": self.final, "changed": self.changed}


def write_changing_months(directory: Path, *, now: datetime, horizon: timedelta) -> list[DatasetWritten]:
    """The daily run: the dataset of every month that can still change (months_to_write)."""
    return [write_fleet_dataset(month, directory, now=now, horizon=horizon)
            for month in months_to_write(now=now, horizon=horizon)]


@dataclass(frozen=True)
class DatasetFiles:
    """A month's dataset in memory: the CSV, the Parquet file and FOCUS's metadata, with what the
    manifest says of them (written to a folder by `write_fleet_dataset`, to object storage by
    billing.services.exports.delivery)."""

    month: date
    focus_rows: list[dict[str, Any]]
    csv_name: str
    csv: bytes
    parquet_name: str
    metadata: bytes
    totals: dict[str, Decimal]
    final: bool

    @property
    def rows(self) -> int:
        return len(self.focus_rows)

    @cached_property
    def parquet(self) -> bytes:
        """Built when first asked for (an unchanged month never needs it), from the CSV's own rows."""
        return _parquet(self.focus_rows)

    @property
    def csv_sha256(self) -> str:
        return hashlib.sha256(self.csv).hexdigest()

    def manifest(self, *, files: dict[str, dict[str, object]], written_at: datetime) -> bytes:
        """manifest.json: our bookkeeping of the month (checksums, rows, totals, whether final)."""
        manifest = {
            "focus_version": FOCUS_VERSION, "month": f"{self.month:%Y-%m}", "written_at": focus_cell(written_at),
            "final": self.final, "rows": self.rows, "files": files,
            "schema_id": focus_metadata()["Schemas"][0]["SchemaId"],
            "billed_cost": {c: plain_decimal(t) for c, t in sorted(self.totals.items())},
            "billed_cost_minor_units": {c: to_minor_units(t, c) for c, t in sorted(self.totals.items())},
        }
        return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def build_dataset_files(month: date, *, now: datetime, horizon: timedelta) -> DatasetFiles:
    """The month's dataset as bytes, from one read of the ledger."""
    rows = build_fleet_focus_rows(month)
    csv_name, parquet_name = dataset_file_names(month)
    return DatasetFiles(
        month=month, focus_rows=rows, csv_name=csv_name, csv=focus_csv(rows), parquet_name=parquet_name,
        metadata=(json.dumps(focus_metadata(), indent=2, sort_keys=True) + "\n").encode(),
        totals=_totals(rows), final=_is_final(month, now=now, horizon=horizon))


def write_fleet_dataset(month: date, directory: Path, *, now: datetime, horizon: timedelta) -> DatasetWritten:
    """Write the month's fleet dataset under `directory/YYYY-MM/`: the CSV, the Parquet file, then the
    manifest (their SHA-256, row count and totals), each through a temporary file renamed into place,
    so a reader sees a whole old file or a whole new one. Idempotent: when the CSV's checksum is the
    manifest's, only a changed `final` rewrites the manifest."""
    dataset = build_dataset_files(month, now=now, horizon=horizon)
    folder = directory / f"{month:%Y-%m}"
    folder.mkdir(parents=True, exist_ok=True)
    csv_name, parquet_name = dataset.csv_name, dataset.parquet_name
    final = dataset.final
    previous = _read_manifest(folder / MANIFEST)
    csv_sha = dataset.csv_sha256
    unchanged = (previous.get("files", {}).get(csv_name, {}).get("sha256") == csv_sha
                 and (folder / csv_name).exists() and (folder / parquet_name).exists())
    if _read_bytes(folder / METADATA) != dataset.metadata:
        unchanged = False  # a new schema object: write the data again beside it
    written = DatasetWritten(month=month, directory=folder, rows=dataset.rows, totals=dataset.totals, final=final,
                             changed=False)
    if unchanged and previous.get("final") == final:
        return written
    if unchanged:
        files = previous["files"]
    else:
        parquet_bytes = dataset.parquet
        _atomic_write(folder / csv_name, dataset.csv)
        _atomic_write(folder / parquet_name, parquet_bytes)
        _atomic_write(folder / METADATA, dataset.metadata)
        files = {csv_name: {"sha256": csv_sha, "bytes": len(dataset.csv)},
                 parquet_name: {"sha256": hashlib.sha256(parquet_bytes).hexdigest(), "bytes": len(parquet_bytes)}}
    _atomic_write(folder / MANIFEST, dataset.manifest(files=files, written_at=now))
    return DatasetWritten(month=month, directory=folder, rows=dataset.rows, totals=dataset.totals, final=final,
                          changed=True)


def _column_definition(column: str) -> dict[str, Any]:
    """One ColumnDefinition of FOCUS's schema metadata, as the Parquet file stores the column."""
    if column in _DECIMAL_COLUMNS:
        return {"ColumnName": column, "DataType": "DECIMAL", "NumericPrecision": _PARQUET_DECIMAL.precision,
                "NumberScale": _PARQUET_DECIMAL.scale}
    if column in _DATETIME_COLUMNS:
        return {"ColumnName": column, "DataType": "DATETIME"}
    if column in _JSON_COLUMNS:
        definition: dict[str, Any] = {"ColumnName": column, "DataType": "JSON", "StringEncoding": "UTF-8"}
        if column in _TAG_COLUMNS:
            definition["ProviderTagPrefixes"] = [TAG_PREFIX]
        return definition
    return {"ColumnName": column, "DataType": "STRING", "StringEncoding": "UTF-8"}


def focus_metadata() -> dict[str, Any]:
    """The dataset's FOCUS metadata: who generates it (DataGenerator) and its one schema (SchemaId,
    FocusVersion, CreationDate, ColumnDefinition). Deterministic, so a re-run rewrites nothing."""
    columns = [_column_definition(c) for c in FOCUS_COLUMNS]
    schema_id = hashlib.sha256(json.dumps([FOCUS_VERSION, columns], sort_keys=True).encode()).hexdigest()[:32]
    return {
        "DataGenerator": {"DataGenerator": DATA_GENERATOR},
        "Schemas": [{"SchemaId": schema_id, "FocusVersion": FOCUS_VERSION, "CreationDate": SCHEMA_CREATED,
                     "ColumnDefinition": columns}],
    }


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _totals(rows: list[dict[str, Any]]) -> dict[str, Decimal]:
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        totals[row["BillingCurrency"]] += row["BilledCost"]
    return dict(totals)


def _is_final(month: date, *, now: datetime, horizon: timedelta) -> bool:
    """Final once ingest refuses usage for the month (past the late-usage horizon) and its billing
    period is closed: nothing but an operator's rebuild_ledger can change it then."""
    end = month_bounds(month)[1]
    closed = BillingPeriod.objects.filter(month=month, status=BillingPeriod.Status.CLOSED).exists()
    return closed and end <= now - horizon


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _parquet(rows: list[dict[str, Any]]) -> bytes:
    """The same rows as Parquet: decimals exact (decimal128), instants as UTC timestamps, the rest
    (JSON columns included, as FOCUS's KeyValueFormat is text) as strings."""
    fields = []
    for column in FOCUS_COLUMNS:
        if column in _DECIMAL_COLUMNS:
            fields.append(pa.field(column, _PARQUET_DECIMAL))
        elif column in _DATETIME_COLUMNS:
            fields.append(pa.field(column, pa.timestamp("us", tz="UTC")))
        else:
            fields.append(pa.field(column, pa.string()))
    schema = pa.schema(fields)
    columns = {}
    for column in FOCUS_COLUMNS:
        values = [row[column] for row in rows]
        if column in _DECIMAL_COLUMNS or column in _DATETIME_COLUMNS:
            columns[column] = values
        else:
            columns[column] = [None if v is None else focus_cell(v) for v in values]
    table = pa.Table.from_pydict(columns, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _atomic_write(path: Path, content: bytes) -> None:
    """Write to a temporary file beside `path`, flush it to disk, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
