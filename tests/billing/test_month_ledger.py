"""The month ledger (UsageMonth): derived from the day ledger exactly (Σ months = Σ days per month and
workload identity) by the rollup's day step, by rebuild_days and by the migration's backfill; and the
reads that take whole UTC months from it (the figure tree, the allocation API's groups, the
dashboard's per-pod summary) give what they give from days alone, to the last digit, for random
ledgers over a partial and a whole month, with and without energy, GPU rows and requests."""

from __future__ import annotations

import importlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.ledger import allocation, reads, totals
from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour, UsageMonth, WorkloadMeta
from billing.ledger.months import close_days
from billing.ledger.rollup import rebuild_days, rollup_usage
from billing.models import Gpu, Location, LocationRate, Node, NodeLocation
from tests import clock
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

# February (a partial month in the reads below, from the 20th) and the whole of March 2026.
FEB_20 = datetime(2026, 2, 20, tzinfo=UTC)
MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL = datetime(2026, 4, 1, tzinfo=UTC)
UNIT = Decimal(1).scaleb(-12)
SUMS = ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "mem_billed_mb_s", "sm_used_s", "sm_granted_s", "sm_billed_s",
        "pcie_mb", "share_gpu_s", "charge", "idle_share", "energy_j")
KEY = ("node_id", "gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier")


@dataclass(frozen=True)
class Row:
    """One workload-hour on GPU `gpu` (of node gpu % 2), ledger units and odd quantities."""

    gpu: int
    hour: datetime
    tenant: str
    pod: str
    container: str
    charge_units: int
    mem_mb_s: int
    sm_s: int
    energy_units: int


def _hours() -> st.SearchStrategy[datetime]:
    """Any hour from Feb 20 to the end of March, biased to the month's edges."""
    n = int((APRIL - FEB_20).total_seconds() // 3600)
    edge = int((MARCH - FEB_20).total_seconds() // 3600)
    return st.one_of(st.integers(0, n - 1), st.sampled_from((edge - 1, edge, n - 1))).map(
        lambda i: FEB_20 + timedelta(hours=i))


rows_st = st.lists(
    st.builds(Row, gpu=st.integers(0, 2), hour=_hours(), tenant=st.sampled_from(("acme", "globex")),
              pod=st.sampled_from(("a", "b", "c")), container=st.sampled_from(("main", "side")),
              charge_units=st.integers(0, 10**15), mem_mb_s=st.integers(0, 3 * 10**8), sm_s=st.integers(0, 400_000),
              energy_units=st.one_of(st.just(0), st.integers(1, 10**16))),
    max_size=30, unique_by=lambda r: (r.gpu, r.hour, r.tenant, r.pod, r.container))


def _write(rows: list[Row], *, gpu_rows: bool) -> None:
    """Hand-written hour rows (and GPU-hours unless not `gpu_rows`), the day and month ledgers derived."""
    nodes = [Node.objects.get_or_create(name=f"month-node-{i}")[0] for i in range(2)]
    for i in range(3):
        # Memory and SMs that divide unevenly: each day's quotient is rounded to its own scale.
        Gpu.objects.get_or_create(uuid=f"GPU-m{i}", defaults={
            "node": nodes[i % 2], "model": "A100", "memory_mb": (40960, 81920, 12345)[i], "sm_count": (108, 7, 132)[i],
            "first_seen_at": FEB_20, "last_seen_at": APRIL})
    if gpu_rows:
        GpuHour.objects.bulk_create([
            GpuHour(gpu_uuid=f"GPU-m{gpu}", node=nodes[gpu % 2], gpu_model=("A100", "H100", "A100")[gpu], hour=hour,
                    metered_seconds=3600, card_cost=UNIT, charged=0, idle_cost=UNIT, idle_allocated=0, currency="USD",
                    priced=True)
            for gpu, hour in sorted({(r.gpu, r.hour) for r in rows})])
    UsageHour.objects.bulk_create([
        UsageHour(gpu_uuid=f"GPU-m{r.gpu}", node=nodes[r.gpu % 2], tenant=r.tenant, namespace=f"{r.tenant}-ns",
                  pod=r.pod, container=r.container, pod_uid=f"uid-{r.pod}", sla_tier="gold", hour=r.hour,
                  seconds=Decimal("3599.5"), mem_used_mb_s=Decimal(r.mem_mb_s) / 3, mem_granted_mb_s=r.mem_mb_s,
                  mem_billed_mb_s=Decimal(r.mem_mb_s) / 7, sm_used_s=Decimal(r.sm_s) / 3, sm_granted_s=r.sm_s,
                  sm_billed_s=Decimal(r.sm_s) / 11, pcie_mb=1, share_gpu_s=Decimal("0.3"), charge=r.charge_units * UNIT,
                  idle_share=r.charge_units // 3 * UNIT, energy_j=r.energy_units * UNIT)
        for r in rows])
    rebuild_days(start=FEB_20, end=APRIL)


def _closed_through() -> datetime:
    with connection.cursor() as cur:
        cur.execute("SELECT closed_through FROM billing_month_closed")
        return cur.fetchone()[0]


def _set_closed_through(at: datetime) -> None:
    """Say the month rows hold the days before `at` (the rows are derived afterwards, by _write)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE billing_month_closed SET closed_through = %s", [at])


def _months_as_sums_of_days() -> dict[tuple[Any, ...], dict[str, Any]]:
    """What the month rows must be: the closed day rows' sums per month and workload identity (and model)."""
    models = {(g.node_id, g.gpu_uuid, g.day): g.gpu_model for g in GpuDay.objects.all()}
    out: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: defaultdict(Decimal))
    # Rows as plain mappings: the columns are read by name from the lists above.
    days: list[Mapping[str, Any]] = list(UsageDay.objects.filter(day__lt=_closed_through()).values())
    for d in days:
        month = d["day"].replace(day=1)
        row = out[(month, *(d[k] for k in KEY), models.get((d["node_id"], d["gpu_uuid"], d["day"])))]
        for c in SUMS:
            row[c] += d[c]
        row["first_hour"] = min(row.get("first_hour") or d["first_hour"], d["first_hour"])
        row["last_hour"] = max(row.get("last_hour") or d["last_hour"], d["last_hour"])
    return {k: dict(v) for k, v in out.items()}


def _months() -> dict[tuple[Any, ...], dict[str, Any]]:
    months: list[Mapping[str, Any]] = list(UsageMonth.objects.values())
    return {(m["month"], *(m[k] for k in KEY), m["gpu_model"]): {c: m[c] for c in (*SUMS, "first_hour", "last_hour")}
            for m in months}


def _row_versions() -> dict[tuple[Any, ...], tuple[str, str]]:
    """Each month row's (ctid, xmin) by its group: a row rewritten gets a new one."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT month, {', '.join(KEY)}, gpu_model, ctid::text, xmin::text FROM billing_usagemonth")  # noqa: S608 - constant column names
        return {tuple(r[:-2]): (r[-2], r[-1]) for r in cur.fetchall()}


def _snapshot() -> list[tuple[Any, ...]]:
    return sorted(tuple(v for k, v in r.items() if k != "id") for r in UsageMonth.objects.values())


@hypothesis_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_st, gpu_rows=st.booleans())
def test_months_are_the_exact_sums_of_days_and_the_backfill_agrees(db: Any, rows: list[Row], gpu_rows: bool) -> None:
    for model in (UsageMonth, UsageDay, GpuDay, UsageHour, GpuHour):
        model.objects.all().delete()
    _write(rows, gpu_rows=gpu_rows)
    assert _months() == _months_as_sums_of_days()
    assert UsageMonth.objects.count() == len(_months())
    derived = _snapshot()
    UsageMonth.objects.all().delete()
    with connection.cursor() as cur:
        cur.execute(importlib.import_module("billing.migrations.0041_month_ledger").BACKFILL_USAGE_MONTHS)
    assert _snapshot() == derived
    if rows:  # one GPU's months again: the others' stay as they were
        rebuild_days(start=rows[0].hour, end=rows[0].hour + timedelta(hours=1), gpu_uuid=f"GPU-m{rows[0].gpu}")
        assert _snapshot() == derived


@hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_st, gpu_rows=st.booleans(), closed=st.sampled_from((FEB_20 + timedelta(days=3), MARCH,
                                                                     MARCH + timedelta(days=15))))
def test_closing_days_merges_them_into_the_months_as_a_rebuild_would(db: Any, rows: list[Row], gpu_rows: bool,
                                                                    closed: datetime) -> None:
    """Months hold the days before `closed_through` only; closing more days (the rollup does it after
    midnight) merges them into the month rows, and gives what deriving every month again gives."""
    for model in (UsageMonth, UsageDay, GpuDay, UsageHour, GpuHour):
        model.objects.all().delete()
    _set_closed_through(closed)
    _write(rows, gpu_rows=gpu_rows)
    assert _months() == _months_as_sums_of_days()
    assert close_days(now=closed + timedelta(hours=23)) == 0  # the day in progress stays out
    before = _row_versions()
    assert close_days(now=APRIL + timedelta(hours=5)) == (APRIL - closed).days
    # A month row no closed day adds to is left where it was, not rewritten (its tuple is the same).
    days: list[Mapping[str, Any]] = list(UsageDay.objects.filter(day__gte=closed).values())
    added = {(d["day"].replace(day=1), *(d[k] for k in KEY)) for d in days}
    untouched = {k: v for k, v in before.items() if k[:-1] not in added}
    assert {k: v for k, v in _row_versions().items() if k in untouched} == untouched
    assert _closed_through() == APRIL
    merged = _snapshot()
    assert _months() == _months_as_sums_of_days()
    rebuild_days(start=FEB_20, end=APRIL)
    assert _snapshot() == merged
    assert close_days(now=APRIL) == 0  # never backwards


def test_closing_a_day_rewrites_only_the_month_rows_of_its_workloads(db: Any) -> None:
    """Pod a ran on March 2 only, pod b on March 2 and 20: closing March 20 merges b's month row and
    leaves a's as it was (where pods churn, most of a month's rows are of pods long gone)."""
    closed = MARCH + timedelta(days=15)
    _set_closed_through(closed)
    charge = 10**12
    _write([Row(0, MARCH + timedelta(days=1), "acme", "a", "main", charge, 7, 11, 0),
            Row(0, MARCH + timedelta(days=1, hours=1), "acme", "b", "main", charge, 7, 11, 0),
            Row(0, MARCH + timedelta(days=19), "acme", "b", "main", charge, 7, 11, 0)], gpu_rows=True)
    before = _row_versions()
    assert close_days(now=APRIL) == (APRIL - closed).days
    after = _row_versions()
    pod_a, pod_b = (next(k for k in before if k[5] == pod) for pod in ("a", "b"))
    assert after[pod_a] == before[pod_a]
    assert after[pod_b] != before[pod_b]
    assert UsageMonth.objects.get(pod="b").charge == 2 * charge * UNIT
    assert _months() == _months_as_sums_of_days()


def test_the_rollup_keeps_the_month_rows_of_the_days_it_writes(post_batch: Any) -> None:
    base = clock.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
    workloads = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 400.0, "mem_granted": 600.0,
                  "sm_used": 6.0, "sm_granted": 9.0}]
    today = base + timedelta(days=2)
    for seq, offset in enumerate((timedelta(hours=1), timedelta(days=1, hours=3), timedelta(days=2)), start=1):
        post_batch(make_batch(seq=seq, start=base + offset, gpus=1, workloads=workloads))
        rollup_usage(now=clock.now())
        assert _months() == _months_as_sums_of_days()
    assert _closed_through() == today
    assert UsageMonth.objects.exists()
    in_months = UsageMonth.objects.aggregate(s=Sum("seconds"))["s"]
    assert in_months == UsageDay.objects.filter(day__lt=today).aggregate(s=Sum("seconds"))["s"]
    rollup_usage(now=clock.now() + timedelta(days=1))  # the first cycle after midnight closes today
    assert _closed_through() == today + timedelta(days=1)
    assert _months() == _months_as_sums_of_days()
    assert UsageMonth.objects.aggregate(s=Sum("seconds"))["s"] == UsageDay.objects.aggregate(s=Sum("seconds"))["s"]


# --- Reads: months and days against days alone --------------------------------------------------


def _reads() -> dict[str, Any]:
    """Every read that takes whole months from the month ledger, over Feb 20 - April 1 (a partial
    month and a whole one) and over March alone, by several groupings, sets and filters."""
    out: dict[str, Any] = {}
    for name, (start, end) in {"feb20-apr": (FEB_20, APRIL), "march": (MARCH, APRIL)}.items():
        for depth in (1, 6):
            out[f"{name} figures {depth}"] = sorted(
                allocation.list_figure_rows(start=start, end=end, depth=depth, filters={}, tenants=None).rows, key=repr)
        top = allocation.list_figure_rows(start=start, end=end, depth=4, filters={}, tenants={"acme"}, top_pods=2)
        out[f"{name} top pods"] = (sorted(top.rows, key=repr), top.pod_instances)
        for keys in (["namespace"], ["gpu_model", "sla_tier"], ["controller", "pod", "container"], ["label:app"]):
            for starts in (None, [start, MARCH] if start < MARCH else None, [start, start + timedelta(days=9)]):
                out[f"{name} groups {keys} {starts}"] = sorted(
                    allocation.list_usage_groups(start=start, end=end, starts=starts, keys=keys, filters={},
                                                 tenants=None, by_node=True), key=repr)
        out[f"{name} model filter"] = sorted(allocation.list_usage_groups(
            start=start, end=end, starts=None, keys=["pod"], filters={"gpu_model": ["H100"]}, tenants={"acme"},
            by_node=False), key=repr)
        for starts in (None, [start, MARCH] if start < MARCH else None, [start, start + timedelta(days=9)]):
            out[f"{name} idle {starts}"] = sorted(allocation.list_idle_rows(
                start=start, end=end, starts=starts, filters={}, by_node=True), key=repr)
        out[f"{name} idle of H100s"] = sorted(allocation.list_idle_rows(
            start=start, end=end, starts=None, filters={"gpu_model": ["H100"]}, by_node=False), key=repr)
        out[f"{name} line costs"] = sorted(totals.list_period_line_costs(
            periods=[(start, end), (MARCH, APRIL), (FEB_20, MARCH)], tenants={"acme"}), key=repr)
        summary = totals.summarise_workloads(start=start, end=end, tenants=None, top=3)
        out[f"{name} summary"] = (sorted(summary.tenants, key=repr), summary.top)
    return out


def _meta() -> None:
    """Requests for some containers (one malformed), a controller and a label for some pods."""
    for node in Node.objects.filter(name__startswith="month-node-"):
        for pod in ("a", "b"):
            WorkloadMeta.objects.create(
                node=node, namespace="acme-ns", pod=pod, pod_uid=f"uid-{pod}", controller_kind="Deployment",
                controller_name=f"ctl-{pod}", labels={"app": f"app-{pod}"},
                requests={"main": {"mem_mb": 3000, "sm": 12.5}, "side": {"mem_mb": "lots"}},
                first_seen=FEB_20, last_seen=APRIL)


@hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_st, gpu_rows=st.booleans(), energy=st.booleans(),
       closed=st.sampled_from((APRIL, MARCH, MARCH + timedelta(days=15))))
def test_reads_from_months_are_the_reads_from_days(db: Any, rows: list[Row], gpu_rows: bool, energy: bool,
                                                   closed: datetime) -> None:
    """Also while March is in progress for the month ledger (its rows hold the days before `closed`)."""
    for model in (UsageMonth, UsageDay, GpuDay, UsageHour, GpuHour, WorkloadMeta, NodeLocation, LocationRate):
        model.objects.all().delete()
    _set_closed_through(closed)
    _write(rows, gpu_rows=gpu_rows)
    _meta()
    if energy:  # one node's location priced from before the period, the other's never
        location = Location.objects.get_or_create(label="month-site", defaults={"created_at": FEB_20})[0]
        LocationRate.objects.create(location=location, effective_from=date(2026, 1, 1), currency="USD",
                                    price_per_kwh=Decimal("0.173"), co2e_kg_per_kwh=Decimal("0.41"), created_at=FEB_20)
        NodeLocation.objects.create(node=Node.objects.get(name="month-node-0"), location=location,
                                    effective_from=date(2026, 1, 1), created_at=FEB_20)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL, card_seconds=True) == (MARCH, APRIL)
    from_months = _reads()
    with pytest.MonkeyPatch.context() as days_only:
        days_only.setattr(reads, "month_range", lambda *args, **kwargs: None)
        from_days = _reads()
    assert from_months == from_days
    assert repr(from_months) == repr(from_days)  # the same Decimals, to their exponents


def test_a_month_is_read_from_days_where_a_month_row_cannot_stand_in_for_them(db: Any) -> None:
    _write([Row(0, MARCH + timedelta(hours=5), "acme", "a", "main", 10**12, 10**8, 1000, 0)], gpu_rows=True)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) == (MARCH, APRIL)
    assert reads.month_range(reads.HOURS, FEB_20, APRIL) is None
    assert reads.month_range(reads.DAYS, MARCH, APRIL - timedelta(days=1)) is None  # no whole month
    # Sets: only where every set begins on a month.
    assert reads.month_range(reads.DAYS, FEB_20, APRIL, starts=[FEB_20, MARCH]) == (MARCH, APRIL)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL, starts=[FEB_20, MARCH + timedelta(days=1)]) is None
    # The GPU's memory changed since its month rows were derived: card-seconds come from days.
    Gpu.objects.filter(uuid="GPU-m0").update(memory_mb=1)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) == (MARCH, APRIL)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL, card_seconds=True) is None
    # A location's rate (or a node's location) starting inside the month: energy is priced by the date.
    location = Location.objects.create(label="mid-month", created_at=FEB_20)
    LocationRate.objects.create(location=location, effective_from=date(2026, 3, 1), currency="USD",
                                price_per_kwh=Decimal("0.2"), created_at=FEB_20)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) == (MARCH, APRIL)  # on the 1st: one rate all month
    LocationRate.objects.create(location=location, effective_from=date(2026, 3, 17), currency="USD",
                                price_per_kwh=Decimal("0.3"), created_at=FEB_20)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) is None
