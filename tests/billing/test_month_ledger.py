"""The month ledger (UsageMonth): derived from the day ledger exactly (Σ months = Σ days per month and
workload identity) by the rollup's day step, by closing days and by rebuild_days; and the
reads that take whole UTC months from it (the figure tree, the allocation API's groups, the
dashboard's per-pod summary) give what they give from days alone, to the last digit, for random
ledgers over a partial and a whole month, with and without energy, GPU rows and requests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Sum
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.ledger import allocation, months, reads, spend, totals
from billing.ledger import months as months_module
from billing.ledger import rollup as rollup_module
from billing.ledger.models import GpuDay, GpuHour, UsageDay, UsageHour, UsageMonth, WorkloadMeta
from billing.ledger.months import close_days
from billing.ledger.rollup import CLOSE_GRACE, rebuild_days, rollup_usage
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


# What billing_month_key (migration 0046) joins a month row's group with: names that contain it give
# two groups one key (pod "a" + SEP with container "side", pod "a" with container SEP + "side"), as
# does a model named NO_MODEL with a day that has no GPU row; closing a day must not add one into the other.
SEP, NO_MODEL = "\x1f", "\x1e"


@dataclass(frozen=True)
class Row:
    """One workload-hour on GPU `gpu` (of node gpu % 2; GPU-m3 has no GPU record),
    ledger units and odd quantities; `model`: its GPU-hour's (None: no GPU-hour row; the first row
    of a GPU-hour decides)."""

    gpu: int
    hour: datetime
    tenant: str
    pod: str
    container: str
    charge_units: int
    mem_mb_s: int
    sm_s: int
    energy_units: int
    model: str | None = "A100"


def _hours() -> st.SearchStrategy[datetime]:
    """Any hour from Feb 20 to the end of March, biased to the month's edges."""
    n = int((APRIL - FEB_20).total_seconds() // 3600)
    edge = int((MARCH - FEB_20).total_seconds() // 3600)
    return st.one_of(st.integers(0, n - 1), st.sampled_from((edge - 1, edge, n - 1))).map(
        lambda i: FEB_20 + timedelta(hours=i))


# (tenant, pod, container): few, so that a workload often has days on both sides of a close.
WORKLOADS = (("acme", "a", "main"), ("acme", "b", "side"), ("globex", "a", "main"), ("globex", "c", "side"),
             ("acme", "a" + SEP, "side"), ("acme", "a", SEP + "side"))


def _row(workload: tuple[str, str, str], **fields: Any) -> Row:
    return Row(tenant=workload[0], pod=workload[1], container=workload[2], **fields)


rows_st = st.lists(
    st.builds(_row, gpu=st.integers(0, 3), hour=_hours(), workload=st.sampled_from(WORKLOADS),
              charge_units=st.integers(0, 10**15), mem_mb_s=st.integers(0, 3 * 10**8), sm_s=st.integers(0, 400_000),
              energy_units=st.one_of(st.just(0), st.integers(1, 10**16)),
              model=st.sampled_from(("A100", "H100", NO_MODEL, None))),
    max_size=30, unique_by=lambda r: (r.gpu, r.hour, r.tenant, r.pod, r.container))


@st.composite
def runs_st(draw: st.DrawFn) -> list[Row]:
    """rows_st's rows, each repeated on some days before and after it (its model may change from day
    to day): workloads that run on several days, so that a close often meets their month rows."""
    rows = []
    for row in draw(rows_st):
        for days in draw(st.sets(st.integers(-20, 20), max_size=4)) | {0}:
            hour = row.hour + timedelta(days=days)
            if FEB_20 <= hour < APRIL:
                rows.append(replace(row, hour=hour, model=draw(st.sampled_from((row.model, row.model, "H100", None)))))
    return list({(r.gpu, r.hour, r.tenant, r.pod, r.container): r for r in rows}.values())


def _write(rows: list[Row], *, gpu_rows: bool) -> None:
    """Hand-written hour rows (and GPU-hours unless not `gpu_rows`), the day and month ledgers derived."""
    nodes = [Node.objects.get_or_create(name=f"month-node-{i}")[0] for i in range(2)]
    for i in range(3):  # not GPU-m3: no GPU record
        # As new in every example (a test may change a GPU's memory).
        Gpu.objects.update_or_create(uuid=f"GPU-m{i}", defaults={
            "node": nodes[i % 2], "model": "A100", "memory_mb": (40960, 81920, 12345)[i], "sm_count": (108, 7, 132)[i],
            "first_seen_at": FEB_20, "last_seen_at": APRIL})
    if gpu_rows:
        models: dict[tuple[int, datetime], str | None] = {}
        for r in rows:
            models.setdefault((r.gpu, r.hour), r.model)
        GpuHour.objects.bulk_create([
            GpuHour(gpu_uuid=f"GPU-m{gpu}", node=nodes[gpu % 2], gpu_model=model, hour=hour,
                    metered_seconds=3600, card_cost=UNIT, charged=0, idle_cost=UNIT, idle_allocated=0, currency="USD",
                    priced=True)
            for (gpu, hour), model in sorted(models.items()) if model is not None])
    UsageHour.objects.bulk_create([
        # "a" + SEP is another pod with a's uid: its group and a's can differ by where SEP falls only.
        UsageHour(gpu_uuid=f"GPU-m{r.gpu}", node=nodes[r.gpu % 2], tenant=r.tenant, namespace=f"{r.tenant}-ns",
                  pod=r.pod, container=r.container, pod_uid=f"uid-{r.pod.rstrip(SEP)}", sla_tier="gold", hour=r.hour,
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
        cur.execute(f"SELECT month, {', '.join(KEY)}, gpu_model, ctid::text, xmin::text "  # noqa: S608 - constant column names
                    "FROM billing_usagemonth")
        return {tuple(r[:-2]): (r[-2], r[-1]) for r in cur.fetchall()}


def _snapshot() -> list[tuple[Any, ...]]:
    # Sorted by repr: a NULL model does not compare with a value.
    return sorted((tuple(v for k, v in r.items() if k != "id") for r in UsageMonth.objects.values()), key=repr)


@hypothesis_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_st, gpu_rows=st.booleans())
def test_months_are_the_exact_sums_of_days_and_a_rebuild_agrees(db: Any, rows: list[Row], gpu_rows: bool) -> None:
    for model in (UsageMonth, UsageDay, GpuDay, UsageHour, GpuHour):
        model.objects.all().delete()
    _write(rows, gpu_rows=gpu_rows)
    assert _months() == _months_as_sums_of_days()
    assert UsageMonth.objects.count() == len(_months())
    derived = _snapshot()
    UsageMonth.objects.all().delete()
    with connection.cursor() as cur:
        months.rebuild_months(cur, lo=FEB_20, hi=APRIL, gpu_uuid=None)
    assert _snapshot() == derived
    if rows:  # one GPU's months again: the others' stay as they were
        rebuild_days(start=rows[0].hour, end=rows[0].hour + timedelta(hours=1), gpu_uuid=f"GPU-m{rows[0].gpu}")
        assert _snapshot() == derived


def _closed_by_rewriting(midnight: datetime) -> list[tuple[Any, ...]]:
    """The month rows that closing the days before `midnight` gave before close_days merged by
    workload: every month row of a month those days meet deleted and summed again with their day
    rows (the simplest correct close). Rolled back: the ledger is left as it was."""
    days = months._day_rows("WHERE d.day >= %(lo)s AND d.day < %(hi)s")
    rewrite = ("WITH gone AS (DELETE FROM billing_usagemonth WHERE month = %(month)s RETURNING *) "  # noqa: S608 - constant column names
               + months._insert(f"SELECT {', '.join(months._COLUMNS)} FROM gone UNION ALL {days}"))  # noqa: S608 - as above
    sid = transaction.savepoint()
    try:
        old = _closed_through()
        _set_closed_through(midnight)
        with connection.cursor() as cur:
            for month in (datetime(2026, 2, 1, tzinfo=UTC), MARCH):
                end = datetime(month.year, month.month + 1, 1, tzinfo=UTC)
                if month < midnight and end > old:
                    cur.execute(rewrite, {"month": month, "lo": max(old, month), "hi": min(midnight, end)})
        return _snapshot()
    finally:
        transaction.savepoint_rollback(sid)


def _close_through(midnight: datetime) -> None:
    """close_days up to `midnight`: the month rows it leaves are those the whole months rewritten
    leave, and a month row of a workload the closed days do not have is not rewritten."""
    old = _closed_through()
    expected = _closed_by_rewriting(midnight)
    before = _row_versions()
    assert close_days(now=midnight + timedelta(hours=5)) == (midnight - old).days
    assert _snapshot() == expected
    days: list[Mapping[str, Any]] = list(UsageDay.objects.filter(day__gte=old, day__lt=midnight).values())
    added = {(d["day"].replace(day=1), *(d[k] for k in KEY)) for d in days}
    untouched = {k: v for k, v in before.items() if k[:len(KEY) + 1] not in added}
    assert {k: v for k, v in _row_versions().items() if k in untouched} == untouched


@hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=runs_st(), gpu_rows=st.booleans(), closed=st.sampled_from((FEB_20 + timedelta(days=3), MARCH,
                                                                       MARCH + timedelta(days=15))),
       steps=st.sets(st.integers(1, 40), max_size=2), resize_at=st.sampled_from((None, 0, 1)))
def test_closing_days_merges_them_into_the_months_as_a_rebuild_would(
        db: Any, rows: list[Row], gpu_rows: bool, closed: datetime, steps: set[int], resize_at: int | None) -> None:
    """Months hold the days before `closed_through` only; closing more days (the rollup does it after
    midnight), one or many at a time, across a month's end, merges them into the month rows: what
    rewriting the whole months gave, and what deriving every month again gives. With `resize_at`,
    GPU-m1's memory and SMs change before that close, which changes no month row's group."""
    for model in (UsageMonth, UsageDay, GpuDay, UsageHour, GpuHour):
        model.objects.all().delete()
    _set_closed_through(closed)
    _write(rows, gpu_rows=gpu_rows)
    assert _months() == _months_as_sums_of_days()
    assert close_days(now=closed + timedelta(hours=23)) == 0  # the day in progress stays out
    midnights = sorted({min(closed + timedelta(days=n), APRIL) for n in steps} | {APRIL})
    for i, midnight in enumerate(midnights):
        if i == resize_at:
            Gpu.objects.filter(uuid="GPU-m1").update(memory_mb=54321, sm_count=13)
        _close_through(midnight)
    assert _closed_through() == APRIL
    assert close_days(now=APRIL) == 0  # never backwards
    merged = _snapshot()
    assert _months() == _months_as_sums_of_days()
    assert UsageMonth.objects.count() == len(_months())  # one row per group: none inserted twice
    rebuild_days(start=FEB_20, end=APRIL)
    assert _snapshot() == merged


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


def _month_keys() -> list[int]:
    """billing_month_key of every month row: what usage_month_key_idx finds a group by."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {months._month_key('u')} FROM billing_usagemonth u")  # noqa: S608 - constant column names
        return [r[0] for r in cur.fetchall()]


def test_groups_of_one_hash_are_told_apart_by_their_columns(db: Any) -> None:
    """Two pairs of groups that hash alike, each a month row and a day closed into it: pod "a" + SEP
    with container "side" and pod "a" with container SEP + "side" (GPU-m0), and a day with a GPU-hour
    of model NO_MODEL and one without a GPU-hour (GPU-m1, pod b). Neither is merged into the other."""
    closed = MARCH + timedelta(days=15)
    _set_closed_through(closed)
    _write([Row(0, MARCH + timedelta(days=1), "acme", "a" + SEP, "side", 10**12, 7, 11, 0),
            Row(0, MARCH + timedelta(days=19), "acme", "a", SEP + "side", 3 * 10**12, 7, 11, 0),
            Row(1, MARCH + timedelta(days=1), "acme", "b", "main", 5 * 10**12, 7, 11, 0, model=NO_MODEL),
            Row(1, MARCH + timedelta(days=19), "acme", "b", "main", 7 * 10**12, 7, 11, 0, model=None)], gpu_rows=True)
    assert close_days(now=APRIL) == (APRIL - closed).days
    assert UsageMonth.objects.count() == 4
    assert len(set(_month_keys())) == 2  # the premise: each pair shares its hash
    assert sorted(UsageMonth.objects.values_list("charge", flat=True)) == [n * 10**12 * UNIT for n in (1, 3, 5, 7)]
    assert _months() == _months_as_sums_of_days()
    merged = _snapshot()
    rebuild_days(start=FEB_20, end=APRIL)
    assert _snapshot() == merged


def test_a_group_without_model_merges_into_its_month_row(db: Any) -> None:
    """GPU-m3 has no GPU record and no GPU-hours: its month rows' model is NULL, and a NULL is no
    different from a NULL when the day's rows are matched with them (one row, summed)."""
    closed = MARCH + timedelta(days=15)
    _set_closed_through(closed)
    _write([Row(3, MARCH + timedelta(days=1), "acme", "a", "main", 10**12, 7, 11, 0, model=None),
            Row(3, MARCH + timedelta(days=19), "acme", "a", "main", 2 * 10**12, 7, 11, 0, model=None)], gpu_rows=True)
    assert close_days(now=APRIL) == (APRIL - closed).days
    month = UsageMonth.objects.get()
    assert (month.gpu_model, month.charge) == (None, 3 * 10**12 * UNIT)


def test_a_gpu_resized_between_closes_keeps_one_month_row_per_workload(db: Any) -> None:
    """A month row's group is the GPU, the workload and the model: the days closed after the GPU's
    memory and SMs changed merge into the row of the days before."""
    closed = MARCH + timedelta(days=15)
    _set_closed_through(closed)
    _write([Row(0, MARCH + timedelta(days=1), "acme", "a", "main", 10**12, 40960 * 3, 11, 0),
            Row(0, MARCH + timedelta(days=19), "acme", "a", "main", 10**12, 40960 * 3, 11, 0)], gpu_rows=True)
    Gpu.objects.filter(uuid="GPU-m0").update(memory_mb=81920, sm_count=7)
    expected = _closed_by_rewriting(APRIL)
    assert close_days(now=APRIL) == (APRIL - closed).days
    assert _snapshot() == expected
    assert UsageMonth.objects.get().charge == 2 * 10**12 * UNIT


def test_duplicate_month_rows_of_a_group_are_merged_whole(db: Any) -> None:
    """No writer leaves two month rows of one group, but were there two, a close that meets the group
    would sum both with the day, as rewriting the whole month did: none is left behind or counted twice."""
    closed = MARCH + timedelta(days=15)
    _set_closed_through(closed)
    _write([Row(0, MARCH + timedelta(days=1), "acme", "a", "main", 10**12, 7, 11, 0),
            Row(0, MARCH + timedelta(days=19), "acme", "a", "main", 10**12, 7, 11, 0)], gpu_rows=True)
    columns = ", ".join(months._COLUMNS)
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO billing_usagemonth ({columns}) SELECT {columns} FROM billing_usagemonth")  # noqa: S608 - constant column names
    expected = _closed_by_rewriting(APRIL)
    assert close_days(now=APRIL) == (APRIL - closed).days
    assert _snapshot() == expected
    assert UsageMonth.objects.get().charge == 3 * 10**12 * UNIT


def _month_rows_read(plan: Mapping[str, Any]) -> int:
    """From an EXPLAIN (ANALYZE, FORMAT JSON) plan: the month rows its scans of billing_usagemonth
    read, kept and filtered out."""
    read, stack = 0, [plan["Plan"]]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        if node.get("Relation Name") == "billing_usagemonth" and "Scan" in node["Node Type"]:
            read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
                     + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
    return read


def test_a_late_batch_replaces_its_workloads_month_rows_reading_its_gpu_months_rows_only(db: Any) -> None:
    """The day step re-derives the month rows of the workloads whose closed day rows it replaced (a
    batch later than the close): it reads that GPU-month's rows through usage_month_node_gpu_idx, not
    the node's other GPUs' nor the whole ledger (without the index, at 182k month rows, the planner
    read them all), and replaces the workload's row only; a GPU-day whose model changed has its whole
    GPU-month replaced."""
    _set_closed_through(APRIL)
    node = Node.objects.create(name="month-node-busy")
    with connection.cursor() as cur:
        # 8 GPUs x 100 pods x 2 months: a GPU-month is 100 of the node's 1,600 month rows.
        cur.execute(
            f"INSERT INTO billing_usagemonth ({', '.join(months._COLUMNS)}) "  # noqa: S608 - constant column names
            f"SELECT m, 'GPU-busy-' || g, %s, 'acme', 'acme-ns', 'pod-' || p, 'main', 'uid-' || p, 'gold', 'A100', "
            f"{', '.join(['1'] * len(SUMS))}, m, m, NULL, NULL "
            "FROM generate_series(0, 7) g, generate_series(0, 99) p, unnest(%s::timestamptz[]) m",
            [node.id, [datetime(2026, 2, 1, tzinfo=UTC), MARCH]])
        cur.execute("ANALYZE billing_usagemonth")
    plans = []

    def explain(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        if not sql.startswith("DELETE FROM billing_usagemonth"):
            return execute(sql, params, many, context)
        execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params, many, context)
        plans.append(context["cursor"].fetchone()[0][0])
        return None

    day = MARCH + timedelta(days=4)
    before = _row_versions()
    with connection.execute_wrapper(explain), connection.cursor() as cur:
        months.recompute_months(cur, [(node.id, "GPU-busy-3", day, "acme", "acme-ns", "pod-7", "main", "uid-7", "gold")])
    assert [_month_rows_read(p) for p in plans] == [100 + 1]  # the GPU-month's rows, then the one deleted by its ctid
    assert UsageMonth.objects.count() == 1599  # its row gone: it has no day rows to re-derive it from
    assert not UsageMonth.objects.filter(gpu_uuid="GPU-busy-3", month=MARCH, pod="pod-7").exists()
    after = _row_versions()
    assert {k: v for k, v in before.items() if k in after} == after  # no other row rewritten
    plans.clear()
    with connection.execute_wrapper(explain), connection.cursor() as cur:
        months.recompute_months(cur, [], [(node.id, "GPU-busy-3", day)])
    assert [_month_rows_read(p) for p in plans] == [99 + 99]
    assert UsageMonth.objects.count() == 1500
    assert not UsageMonth.objects.filter(gpu_uuid="GPU-busy-3", month=MARCH).exists()


def _late_batch_ledger(post_batch: Any, late_model: str | None) -> tuple[dict[tuple[Any, ...], tuple[str, str]], datetime]:
    """Two pods on one GPU yesterday, the day closed, then a late batch of one of them into it (of
    another GPU model where `late_model` is given): the month rows' versions before the late batch."""
    today = clock.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    yesterday = today - timedelta(days=1)
    two = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 400.0, "mem_granted": 600.0, "sm_used": 6.0,
            "sm_granted": 9.0},
           {"gpu": 0, "tenant": "beta", "pod": "gpt-2", "mem_used": 100.0, "mem_granted": 200.0, "sm_used": 2.0,
            "sm_granted": 3.0}]
    assert post_batch(make_batch(seq=1, start=yesterday + timedelta(hours=3), gpus=1, workloads=two)).status_code == 201
    cycle = max(clock.now(), today + CLOSE_GRACE)
    rollup_usage(now=cycle)
    assert _closed_through() == today
    assert UsageMonth.objects.count() == 2
    before = _row_versions()
    late = make_batch(seq=2, start=yesterday + timedelta(hours=5), gpus=1, workloads=two[:1])
    if late_model is not None:
        late["gpus"][0]["model"] = late_model
    assert post_batch(late).status_code == 201
    rollup_usage(now=cycle)
    return before, yesterday


def test_a_late_batch_into_a_closed_day_rewrites_its_own_workloads_month_row_only(post_batch: Any) -> None:
    before, _ = _late_batch_ledger(post_batch, None)
    assert _months() == _months_as_sums_of_days()
    after = _row_versions()
    assert [k[3] for k in before if before[k] != after.get(k)] == ["acme"]  # beta's month row untouched
    assert UsageMonth.objects.get(tenant="acme").seconds == Decimal(20)
    assert UsageMonth.objects.get(tenant="beta").seconds == Decimal(10)


def test_a_late_batch_that_changes_its_gpu_days_model_rewrites_the_gpu_month(post_batch: Any) -> None:
    """The GPU-day's model is in every month row's group of that day: the late batch's card sorts
    after the A100 (a GPU-day takes the greatest model of its hours), so every row of the GPU-month
    moves to the new model, the other pod's too."""
    before, yesterday = _late_batch_ledger(post_batch, "NVIDIA H100 80GB HBM3")
    assert GpuDay.objects.get(day=yesterday).gpu_model == "NVIDIA H100 80GB HBM3"
    assert _months() == _months_as_sums_of_days()
    assert set(UsageMonth.objects.values_list("tenant", "gpu_model")) == {("acme", "NVIDIA H100 80GB HBM3"),
                                                                          ("beta", "NVIDIA H100 80GB HBM3")}
    assert not before.keys() & _row_versions().keys()  # the A100 rows of both pods are gone


def test_the_rollup_keeps_the_month_rows_of_the_days_it_writes(post_batch: Any) -> None:
    base = clock.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
    workloads = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 400.0, "mem_granted": 600.0,
                  "sm_used": 6.0, "sm_granted": 9.0}]
    today = base + timedelta(days=2)
    cycle = max(clock.now(), today + CLOSE_GRACE)  # past the grace, at whatever hour the test runs
    for seq, offset in enumerate((timedelta(hours=1), timedelta(days=1, hours=3), timedelta(days=2)), start=1):
        post_batch(make_batch(seq=seq, start=base + offset, gpus=1, workloads=workloads))
        rollup_usage(now=cycle)
        assert _months() == _months_as_sums_of_days()
    assert _closed_through() == today
    assert UsageMonth.objects.exists()
    in_months = UsageMonth.objects.aggregate(s=Sum("seconds"))["s"]
    assert in_months == UsageDay.objects.filter(day__lt=today).aggregate(s=Sum("seconds"))["s"]
    rollup_usage(now=cycle + timedelta(days=1))  # the first cycle past tomorrow's grace closes today
    assert _closed_through() == today + timedelta(days=1)
    assert _months() == _months_as_sums_of_days()
    assert UsageMonth.objects.aggregate(s=Sum("seconds"))["s"] == UsageDay.objects.aggregate(s=Sum("seconds"))["s"]


def test_the_merge_probes_the_month_key_index_by_its_own_expression() -> None:
    """The probe hashes what the index hashes, in its order (a probe that differs from the index's
    expression finds nothing through it and scans the month ledger instead), and that is the month
    group but its month and node, the index's other columns."""
    index = next(i for i in UsageMonth._meta.indexes if i.name == "usage_month_key_idx")
    hashed = next(e for e in index.expressions if getattr(e, "extra", {}).get("function") == "billing_month_key")
    assert tuple(f.name for f in hashed.get_source_expressions()) == months_module._HASHED
    assert set(months_module._HASHED) == set(months_module._GROUP) - {"month", "node_id"}


def test_the_batch_that_ends_a_day_is_in_its_day_before_the_close(post_batch: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch of a day's last seconds arrives after midnight. Rolled up within the grace, it lands
    in its day before the day is closed, so the close merges it and no GPU-month is re-derived from
    days (after every midnight that was every GPU of the fleet)."""
    today = clock.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    _set_closed_through(today - timedelta(days=1))  # yesterday still open
    rederived: list[tuple[Any, ...]] = []
    real = months_module.recompute_months

    def recording(cur: Any, workload_days: list[tuple[Any, ...]], gpu_days: Any = ()) -> None:
        rederived.extend(d for d in [*workload_days, *gpu_days] if d[2] < _closed_through())
        real(cur, workload_days, gpu_days)

    monkeypatch.setattr(rollup_module, "recompute_months", recording)
    workloads = [{"gpu": 0, "tenant": "acme", "pod": "bert-1", "mem_used": 400.0, "mem_granted": 600.0,
                  "sm_used": 6.0, "sm_granted": 9.0}]
    post_batch(make_batch(seq=1, start=today - timedelta(hours=2), gpus=1, workloads=workloads))
    rollup_usage(now=today + CLOSE_GRACE / 2)
    assert _closed_through() == today - timedelta(days=1)
    post_batch(make_batch(seq=2, start=today - timedelta(seconds=10), gpus=1, workloads=workloads))
    rollup_usage(now=today + CLOSE_GRACE / 2)  # the day's last batch, within the grace: not closed yet
    assert _closed_through() == today - timedelta(days=1)
    rollup_usage(now=today + CLOSE_GRACE)  # past the grace: yesterday closed, with both batches
    assert _closed_through() == today
    assert rederived == []
    assert UsageMonth.objects.get().seconds == Decimal(20)
    assert _months() == _months_as_sums_of_days()


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
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) == (MARCH, APRIL)
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
    # The GPU's memory changed since its month rows were derived: no read divides by it.
    Gpu.objects.filter(uuid="GPU-m0").update(memory_mb=1)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) == (MARCH, APRIL)
    # A location's rate (or a node's location) starting inside the month: energy is priced by the date.
    location = Location.objects.create(label="mid-month", created_at=FEB_20)
    LocationRate.objects.create(location=location, effective_from=date(2026, 3, 1), currency="USD",
                                price_per_kwh=Decimal("0.2"), created_at=FEB_20)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) == (MARCH, APRIL)  # on the 1st: one rate all month
    LocationRate.objects.create(location=location, effective_from=date(2026, 3, 17), currency="USD",
                                price_per_kwh=Decimal("0.3"), created_at=FEB_20)
    assert reads.month_range(reads.DAYS, FEB_20, APRIL) is None


def _month_to_date(now: datetime) -> list[Any]:
    return spend.list_month_to_date_spends(tenants=["acme", "globex", "initech"], start=MARCH, now=now)


@hypothesis_settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=runs_st(), gpu_rows=st.booleans(),
       closed=st.sampled_from((MARCH, MARCH + timedelta(days=9), MARCH + timedelta(days=21), APRIL)),
       now=st.sampled_from((MARCH + timedelta(minutes=30), MARCH + timedelta(days=9, hours=5),
                            MARCH + timedelta(days=21, minutes=1), APRIL - timedelta(minutes=1))))
def test_the_month_to_date_from_month_rows_is_the_month_to_date_from_days(
        db: Any, rows: list[Row], gpu_rows: bool, closed: datetime, now: datetime) -> None:
    """Whether the close has reached `now`'s day or not yet (its grace), or has gone past it (a
    back-dated `now`, read from days): the same lines, to the Decimal's exponent."""
    for model in (UsageMonth, UsageDay, GpuDay, UsageHour, GpuHour):
        model.objects.all().delete()
    _set_closed_through(closed)
    _write(rows, gpu_rows=gpu_rows)
    from_months = _month_to_date(now)
    with pytest.MonkeyPatch.context() as days_only:
        days_only.setattr(spend, "_month_to_date", lambda _start, _now: False)
        from_days = _month_to_date(now)
    assert repr(from_months) == repr(from_days)


def test_the_month_to_date_reads_the_closed_days_from_the_month_rows(db: Any) -> None:
    _set_closed_through(MARCH + timedelta(days=10))
    _write([Row(0, MARCH + timedelta(days=2, hours=5), "acme", "a", "main", 10**12, 10**8, 1000, 0),
            Row(1, MARCH + timedelta(days=12, hours=5), "acme", "b", "side", 3 * 10**12, 10**8, 1000, 0),
            Row(0, MARCH + timedelta(days=14, hours=1), "acme", "a", "main", 5 * 10**12, 10**8, 1000, 0)],
           gpu_rows=True)
    now = MARCH + timedelta(days=14, hours=1, minutes=30)
    expected = _month_to_date(now)
    assert expected[0].charge == 9  # every hour up to now's, closed or not
    # The closed day's row gone, its month row holds it: the read does not take it from days.
    UsageDay.objects.filter(day__lt=MARCH + timedelta(days=10)).delete()
    assert _month_to_date(now) == expected
    # A `now` before the close is read from days, which no longer hold the 3rd.
    assert _month_to_date(MARCH + timedelta(days=5))[0].charge == 0
    # So is a `now` in a later month: March's rows would not hold April's closed days.
    assert spend._month_to_date(MARCH, MARCH + timedelta(days=14))
    assert not spend._month_to_date(MARCH, APRIL + timedelta(days=2))
    assert not spend._month_to_date(MARCH + timedelta(days=1), MARCH + timedelta(days=14))


@pytest.mark.django_db(transaction=True)
def test_the_migration_merges_the_month_rows_a_resize_split() -> None:
    """Before migration 0054 a month row's group held the GPU's memory and SMs, so a GPU resized
    within a month had a row per size for one workload: the migration leaves one row of that group,
    each sum the sum of theirs and the request known only where every row's was; other rows stay."""
    from django.db.migrations.executor import MigrationExecutor

    node = Node.objects.create(name="resized-node")
    columns = ("node_id", "gpu_uuid", "tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "month",
               "first_hour", "last_hour", "gpu_model", "memory_mb", "sm_count", *SUMS, "mem_requested_mb_s",
               "sm_requested_s", "mem_billed_card_s")

    def row(pod: str, memory_mb: int, charge: int, first: int, last: int, requested: int | None) -> list[Any]:
        sums = [Decimal(charge) if c == "charge" else Decimal(1) for c in SUMS]
        return [node.pk, "GPU-r", "acme", "acme-ns", pod, "main", f"uid-{pod}", "gold", MARCH,
                MARCH + timedelta(hours=first), MARCH + timedelta(hours=last), "A100", memory_mb, 108, *sums,
                None if requested is None else Decimal(requested), Decimal(5), Decimal(memory_mb)]

    executor = MigrationExecutor(connection)
    executor.migrate([("billing", "0053_day_peak_hour_means")])
    try:
        with connection.cursor() as cur:
            for values in (row("a", 40960, 3, 2, 30, 7), row("a", 81920, 4, 400, 500, 9), row("b", 40960, 5, 1, 2, None),
                           row("b", 81920, 6, 3, 4, 2), row("c", 40960, 7, 1, 1, 1)):
                cur.execute(f"INSERT INTO billing_usagemonth ({', '.join(columns)}) "  # noqa: S608 - constant column names
                            f"VALUES ({', '.join(['%s'] * len(columns))})", values)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    got = {m.pod: m for m in UsageMonth.objects.all()}
    assert sorted(got) == ["a", "b", "c"]
    a, b, c = got["a"], got["b"], got["c"]
    d = Decimal
    assert (a.charge, a.seconds, a.mem_requested_mb_s, a.sm_requested_s) == (d(7), d(2), d(16), d(10))
    assert (a.first_hour, a.last_hour) == (MARCH + timedelta(hours=2), MARCH + timedelta(hours=500))
    assert (b.charge, b.mem_requested_mb_s, b.sm_requested_s) == (d(11), None, d(10))
    assert (c.charge, c.mem_requested_mb_s) == (d(7), d(1))
    with connection.cursor() as cur:  # the group's hash over the group as it is now
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'usage_month_key_idx'")
        definition = cur.fetchone()[0]
    assert "gpu_model)" in definition
    assert "memory_mb" not in definition
