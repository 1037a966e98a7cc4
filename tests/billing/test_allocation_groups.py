"""The allocation API's groups read as OpenCost reads them, figure by figure: for random ledgers,
keys, steps and windows (hours, and whole days from the day ledger), every allocation of
`allocation_sets` equals the same allocation summed in Python from the hour rows and the workload
metadata, to the last digit (the reads build rows and allocations by position, groups of one row
without a running sum: docs/architecture.md, "Per-pod allocation reads")."""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger import allocation as ledger
from billing.ledger import energy
from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.ledger.rollup import rebuild_days
from billing.models import Location, LocationRate, Node, NodeLocation
from billing.queries.allocation import UNALLOCATED, CostAllocation, Window, allocation_sets
from billing.queries.snapshot import one_snapshot
from billing.scope import Scope

pytestmark = pytest.mark.django_db

D = Decimal
FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)
START = datetime(2026, 5, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
NO_ENERGY = D(0).scaleb(-12)  # Σ joules (12 places) × 0
# The keys computed below from a row and its metadata (the ledger's SQL computes them its own way).
KEYS = ("cluster", "node", "namespace", "controller", "pod", "container", "tenant", "sla_tier", "gpu")
SUMS = ("seconds", "share_gpu_s", "charge", "idle_share", "mem_used_mb_s", "mem_granted_mb_s", "sm_used_s",
        "sm_granted_s", "energy_j")
# What each pod's containers asked for: a number, a malformed value, or nothing.
REQUESTS = {"p1": {"main": {"mem_mb": 4096, "sm": 12.5}, "side": {"mem_mb": 512, "sm": 3}},
            "p2": {"main": {"mem_mb": "lots", "sm": 20}}, "p3": {}}


@dataclass(frozen=True)
class Use:
    gpu: int
    hour: int
    tenant: str
    pod: str
    container: str
    tier: str
    units: tuple[int, ...]  # one per SUMS field, in 10^-6


_use = st.builds(Use, gpu=st.integers(0, 2), hour=st.integers(0, 47), tenant=st.sampled_from(("acme", "globex")),
                 pod=st.sampled_from(("p1", "p2", "p3", "p4")), container=st.sampled_from(("main", "side")),
                 tier=st.sampled_from(("gold", "silver")),
                 units=st.tuples(*(st.integers(0, 10**12) for _ in SUMS)))


def _write(uses: list[Use]) -> list[tuple[Node, str]]:
    nodes = [Node.objects.create(name="grp-east", cluster="east"), Node.objects.create(name="grp-none")]
    gpus = [(nodes[0], "GPU-g0"), (nodes[0], "GPU-g1"), (nodes[1], "GPU-g2")]
    for node in nodes:
        for pod, requests in REQUESTS.items():
            WorkloadMeta.objects.create(node=node, namespace=f"ns-{pod}", pod=pod, pod_uid=f"uid-{pod}",
                                        controller_kind="Deployment" if pod != "p3" else "", controller_name=f"c-{pod}",
                                        requests=requests, first_seen=START, last_seen=START)
    cards = set()
    for u in uses:
        node, uuid = gpus[u.gpu]
        UsageHour.objects.create(
            gpu_uuid=uuid, node=node, tenant=u.tenant, namespace=f"ns-{u.pod}", pod=u.pod, container=u.container,
            pod_uid=f"uid-{u.pod}", sla_tier=u.tier, hour=START + u.hour * HOUR, mem_billed_mb_s=D(0), sm_billed_s=D(0),
            pcie_mb=D(0), **{f: D(n).scaleb(-6) for f, n in zip(SUMS, u.units, strict=True)})
        cards.add((u.gpu, u.hour))
    for gpu, hour in cards:
        node, uuid = gpus[gpu]
        GpuHour.objects.create(gpu_uuid=uuid, node=node, gpu_model="A100", hour=START + hour * HOUR,
                               metered_seconds=D(3600), card_cost=D(2), charged=D(1), idle_cost=D(1),
                               idle_allocated=D(0), currency="USD", priced=True)
    rebuild_days(start=START, end=START + timedelta(days=2))
    return gpus


def _key(row: UsageHour, key: str) -> str:
    meta = WorkloadMeta.objects.filter(node=row.node, namespace=row.namespace, pod=row.pod,
                                       pod_uid=row.pod_uid).first()
    if key == "controller":
        if meta is None or not meta.controller_name:
            return UNALLOCATED
        return meta.controller_name if not meta.controller_kind else f"{meta.controller_kind.lower()}:{meta.controller_name}"
    if key == "cluster":
        return row.node.cluster or UNALLOCATED
    if key == "node":
        return str(row.node.name)
    if key == "gpu":
        return str(row.gpu_uuid)
    return str(getattr(row, {"tier": "sla_tier"}.get(key, key)))


def _requested(row: UsageHour, field: str) -> Decimal | None:
    meta = WorkloadMeta.objects.filter(node=row.node, namespace=row.namespace, pod=row.pod,
                                       pod_uid=row.pod_uid).first()
    value = None if meta is None else meta.requests.get(row.container, {}).get(field)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return D(str(value)) * row.seconds


def _expected(window: Window, starts: list[datetime], keys: list[str]) -> list[dict[str, dict[str, Any]]]:
    """Each set's allocations summed in Python from the hour rows: the figures the read gives."""
    groups: list[dict[tuple[str, ...], dict[str, Any]]] = [defaultdict(dict) for _ in starts]
    ends = [*starts[1:], window.end]
    for row in UsageHour.objects.filter(hour__gte=window.start, hour__lt=window.end).select_related("node"):
        i = max(j for j, s in enumerate(starts) if s <= row.hour)
        g = groups[i][tuple(_key(row, k) for k in keys)]
        g["first"] = min(g.get("first", row.hour), row.hour)
        g["last"] = max(g.get("last", row.hour), row.hour)
        for f in SUMS:
            g[f] = g.get(f, D(0)) + getattr(row, f)
        for f, field in (("mem_requested_mb_s", "mem_mb"), ("sm_requested_s", "sm")):
            part = _requested(row, field)
            g[f] = None if part is None or g.get(f, D(0)) is None else g.get(f, D(0)) + part
    out = []
    for i, one in enumerate(groups):
        figures = {}
        for k, g in one.items():
            start, end = max(starts[i], g["first"]), min(ends[i], g["last"] + HOUR)
            figures["/".join(k)] = {
                "properties": dict(zip(keys, k, strict=True)), "start": start, "end": end,
                "minutes": D(int((end - start).total_seconds())) / 60, "gpu_hours": g["share_gpu_s"] / 3600,
                "gpu_cost": g["charge"], "shared_idle_cost": g["idle_share"],
                "total_cost": g["charge"] + g["idle_share"], "currency": "USD", "is_idle": False,
                "mem_requested_mb_s": g["mem_requested_mb_s"], "sm_requested_s": g["sm_requested_s"],
                # No node has a location: energy without a price is unknown; none at all, joules × 0.
                "energy_cost_jp": None if g["energy_j"] else NO_ENERGY, "co2e_jkg": None if g["energy_j"] else NO_ENERGY,
                **{f: g[f] for f in ("seconds", "mem_used_mb_s", "mem_granted_mb_s", "sm_used_s", "sm_granted_s",
                                     "energy_j")},
            }
        out.append(figures)
    return out


def _figures(a: CostAllocation) -> dict[str, Any]:
    return {f: getattr(a, f) for f in ("is_idle", "properties", "start", "end", "minutes", "gpu_hours", "gpu_cost",
                                       "shared_idle_cost", "total_cost", "currency", "mem_requested_mb_s",
                                       "sm_requested_s", "energy_cost_jp", "co2e_jkg", "seconds", "mem_used_mb_s",
                                       "mem_granted_mb_s", "sm_used_s", "sm_granted_s", "energy_j")}


def _digits(value: Any) -> Any:
    """A figure to compare to the last digit: a Decimal's sign, digits and exponent alike."""
    return value.as_tuple() if isinstance(value, Decimal) else value


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(uses=st.lists(_use, max_size=14, unique_by=lambda u: (u.gpu, u.hour, u.tenant, u.pod, u.container, u.tier)),
       keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
       step_h=st.sampled_from([None, 1, 5, 24]), whole_days=st.booleans(), offset_h=st.integers(1, 3))
def test_allocations_are_the_hour_rows_summed(db: Any, uses: list[Use], keys: list[str], step_h: int | None,
                                              whole_days: bool, offset_h: int) -> None:
    with transaction.atomic():
        _write(uses)
        window = (Window(START, START + timedelta(days=2)) if whole_days
                  else Window(START + offset_h * HOUR, START + timedelta(days=2) - offset_h * HOUR))
        step = None if step_h is None else timedelta(hours=step_h)
        sets = allocation_sets(FINANCE, window=window, aggregate=keys, step=step)
        starts = ([window.start] if step is None
                  else [window.start + i * step for i in range(-(-(window.end - window.start) // step))])
        expected = _expected(window, starts, keys)
        assert len(sets) == len(expected)
        for got, want in zip(sets, expected, strict=True):
            assert list(got) == sorted(want, key=lambda name: tuple(want[name]["properties"].values()))
            for name, allocation in got.items():
                figures = _figures(allocation)
                assert {f: _digits(v) for f, v in figures.items()} == {f: _digits(v) for f, v in want[name].items()}
        # In parts (read side by side for a per-pod answer): each group in exactly one part.
        groups_of = functools.partial(ledger.list_usage_groups, start=window.start, end=window.end, starts=None,
                                      keys=keys, filters={}, tenants=None, by_node=False)
        at_once = groups_of()
        for count in (2, 4):
            parts = [groups_of(part=(i, count)) for i in range(count)]
            assert Counter(row for part in parts for row in part) == Counter(at_once)
            assert sum(len({row.keys for row in part}) for part in parts) == len({row.keys for row in at_once})
        # Without quantities (OpenCost's summary): the same allocations, every figure it reads alike to
        # the last digit, and the memory, requests and energy it does not read as zeros and unknowns.
        lean = allocation_sets(FINANCE, window=window, aggregate=keys, step=step, quantities=False)
        unread = {"mem_used_mb_s": D(0), "mem_granted_mb_s": D(0), "mem_requested_mb_s": None, "sm_requested_s": None,
                  "energy_j": D(0), "energy_cost_jp": D(0), "co2e_jkg": D(0)}
        for got, whole in zip(lean, sets, strict=True):
            assert list(got) == list(whole)
            for name, allocation in got.items():
                expected_lean = {**_figures(whole[name]), **unread}
                assert {f: _digits(v) for f, v in _figures(allocation).items()} == {
                    f: _digits(v) for f, v in expected_lean.items()}
        # As floats (the allocation API's JSON numbers): each figure the double nearest the exact one,
        # energy's exact as before, and GPU-hours the GPU-seconds' double over 3,600; with shared idle
        # (split by the exact charges) the costs exact too.
        shared = allocation_sets(FINANCE, window=window, aggregate=keys, step=step, share_idle=True)
        for quantities, share in ((True, False), (False, False), (True, True)):
            exact = shared if share else sets if quantities else lean
            floats = allocation_sets(FINANCE, window=window, aggregate=keys, step=step, quantities=quantities,
                                     floats=True, share_idle=share)
            for got, whole in zip(floats, exact, strict=True):
                assert list(got) == list(whole)
                read = [f for f in FLOAT_FIGURES if (quantities or f not in unread) and not (share and f in COSTS)]
                for name, allocation in got.items():
                    wanted = _figures(whole[name])
                    wanted |= {f: float(v) for f, v in wanted.items() if f in read and v is not None}
                    wanted["gpu_hours"] = float(whole[name].gpu_hours * 3600) / 3600
                    figures = _figures(allocation)
                    assert all(type(figures[f]) is float for f in read if wanted[f] is not None)
                    assert {f: _digits(v) for f, v in figures.items()} == {f: _digits(v) for f, v in wanted.items()}
        transaction.set_rollback(True)


# An allocation's costs: exact with shared idle, whose parts are split by the exact charges.
COSTS = ("gpu_cost", "shared_idle_cost", "total_cost")
# What allocation_sets gives as floats with `floats` (energy stays exact: its cost is rounded first).
FLOAT_FIGURES = ("minutes", "gpu_hours", "gpu_cost", "shared_idle_cost", "total_cost", "mem_requested_mb_s",
                 "sm_requested_s", "seconds", "mem_used_mb_s", "mem_granted_mb_s", "sm_used_s", "sm_granted_s")


@pytest.mark.django_db(transaction=True)
def test_a_per_pod_answer_read_in_two_parts_side_by_side_is_the_answer_read_at_once(settings: Any) -> None:
    """Committed rows: per pod, inside one snapshot with a side thread free, the groups are read in two
    halves on two connections (billing.queries.allocation._groups_in_parts), and the sets are the same,
    to the last digit, with and without shared idle per node."""
    uses = [Use(gpu=g, hour=h, tenant=t, pod=p, container=c, tier="gold", units=tuple(range(1 + g + h, 10 + g + h)))
            for g in range(3) for h in (0, 5, 30) for t, p in (("acme", "p1"), ("globex", "p2"), ("acme", "p4"))
            for c in ("main", "side")]
    _write(uses)
    window = Window(START, START + timedelta(days=2))
    for keys, share in ((["pod"], False), (["namespace", "pod", "container"], True)):
        answers = []
        for threads in (2, 0):
            settings.VGPU_PAGE_READ_THREADS = threads
            statements: list[str] = []

            def noted(run: Any, sql: str, *args: Any, seen: list[str] = statements) -> Any:
                seen.append(sql)
                return run(sql, *args)

            with one_snapshot(), connection.execute_wrapper(noted):
                answers.append(allocation_sets(FINANCE, window=window, aggregate=keys, floats=True,
                                               share_idle=share, idle_by_node=share))
            # This connection reads one half (a hash of the pod, on its own) and a side connection the other.
            assert sum("hashtext" in sql for sql in statements) == (1 if threads else 0), keys
        beside, at_once = answers
        assert [list(one) for one in beside] == [list(one) for one in at_once]
        assert [[_figures(a) for a in one.values()] for one in beside] == [[_figures(a) for a in one.values()]
                                                                          for one in at_once]
        assert sum(len(one) for one in beside) >= 3


def _joined_as_the_subquery(usage: str, at: str, within: dict[str, Any], found: Any) -> str:
    """billing.ledger.energy's join of a window's ranges, as the subquery that finds every range
    instead of the arrays of those that meet the window."""
    return energy._range_join(usage, at, f"({energy._RATES_BY_NODE}) er")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(uses=st.lists(_use, min_size=1, max_size=10, unique_by=lambda u: (u.gpu, u.hour, u.tenant, u.pod, u.container, u.tier)),
       tariffs=st.lists(st.integers(-3, 3), min_size=1, max_size=4, unique=True), moved=st.integers(-2, 2),
       whole_days=st.booleans(), offset_h=st.integers(1, 20), step_h=st.sampled_from([None, 1, 24]),
       blank=st.integers(-1, 3))
def test_a_windows_rates_as_classes_or_joined_give_the_figures_of_every_rate(
        db: Any, monkeypatch: pytest.MonkeyPatch, uses: list[Use], tariffs: list[int], moved: int, whole_days: bool,
        offset_h: int, step_h: int | None, blank: int) -> None:
    """A read prices energy with only the rate ranges that meet its window's dates, read first: as
    classes summed per class (billing.ledger.energy.window_energy), or joined as arrays where the
    classes are too many. Tariffs and a node's move before, inside and after the window, a tariff
    without a price (east) or a factor (west), and every figure the same all three ways and as with
    every range joined as the subquery that finds them, to the last digit."""
    # One use in every window, on the node that moves: its energy is priced whatever else is drawn.
    drawn = [u for u in uses if (u.gpu, u.hour) != (0, 30)]
    with transaction.atomic():
        gpus = _write([*drawn, Use(gpu=0, hour=30, tenant="acme", pod="p1", container="main", tier="gold",
                                   units=(3_600_000_000,) * len(SUMS))])
        east, west = (Location.objects.create(label=label, created_at=START) for label in ("east", "west"))
        for i, day in enumerate(sorted(tariffs)):
            for n, location in enumerate((east, west)):
                LocationRate.objects.create(location=location, effective_from=START.date() + timedelta(days=day),
                                            price_per_kwh=None if (i, n) == (blank, 0) else D(f"0.1{i}{n}"),
                                            currency="USD", created_at=START,
                                            co2e_kg_per_kwh=None if (i, n) == (blank, 1) else D(f"0.3{i}{n}"))
        node = gpus[0][0]
        NodeLocation.objects.create(node=node, location=east, effective_from=START.date() - timedelta(days=9),
                                    created_at=START)
        NodeLocation.objects.create(node=node, location=west, effective_from=START.date() + timedelta(days=moved),
                                    created_at=START)
        window = (Window(START, START + timedelta(days=2)) if whole_days
                  else Window(START + offset_h * HOUR, START + timedelta(days=2) - HOUR))
        step = None if step_h is None else timedelta(hours=step_h)
        for keys in (["pod"], ["namespace", "node"]):
            def read(keys: list[str] = keys) -> list[list[dict[str, Any]]]:
                sets = allocation_sets(FINANCE, window=window, aggregate=keys, step=step, include_idle=True)
                return [[{f: _digits(v) for f, v in _figures(a).items()} for a in one.values()] for one in sets]

            as_classes = read()
            monkeypatch.setattr(energy, "_MAX_CLASSES", -1)  # no classes: the ranges joined as arrays
            joined = read()
            monkeypatch.setattr(energy, "_IN_WINDOW", "")
            every_range = read()
            # And the ranges joined as the subquery that finds them, not read first as arrays.
            monkeypatch.setattr(energy, "_arrays_join", _joined_as_the_subquery)
            as_subquery = read()
            monkeypatch.undo()
            assert as_classes == joined == every_range == as_subquery
            assert any(a["energy_j"] != (0, (0,), -12) for one in as_classes for a in one)
        transaction.set_rollback(True)


def _plan(sql: str, params: Any) -> str:
    """The plan of a captured statement with Postgres told to run every statement it can on a
    parallel worker (`debug_parallel_query`, `force_parallel_mode` before Postgres 16): a plan that
    starts with a Gather may run on workers whole; a part only the statement's own process may run
    keeps it off them. On the few rows of a test, the planner would choose no parallel plan else."""
    with connection.cursor() as cur:
        cur.execute("SHOW server_version_num")
        (version,) = cur.fetchone()
        mode = "debug_parallel_query" if int(version) >= 160000 else "force_parallel_mode"
        cur.execute(f"SET LOCAL {mode} = on")
        cur.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cur.fetchall())


def test_a_window_read_of_priced_energy_may_run_on_parallel_workers(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A window read prices energy by rate classes, or joins its rate ranges as arrays, never as the
    subquery of window functions that finds them, which kept the join and the aggregation on the
    statement's own process (a week's hourly sets at 1,000 GPUs had no parallel plan;
    docs/benchmarks.md, "Energy rate ranges joined as arrays")."""
    with transaction.atomic():
        gpus = _write([Use(gpu=g, hour=h, tenant="acme", pod=f"p{g}", container="main", tier="gold",
                           units=(3_600_000_000,) * len(SUMS)) for g in range(2) for h in range(3)])
        site = Location.objects.create(label="east", created_at=START)
        LocationRate.objects.create(location=site, effective_from=START.date() - timedelta(days=3), currency="USD",
                                    price_per_kwh=D("0.12"), co2e_kg_per_kwh=D("0.3"), created_at=START)
        NodeLocation.objects.create(node=gpus[0][0], location=site, effective_from=START.date() - timedelta(days=3),
                                    created_at=START)

        def plan_of_the_read() -> str:
            captured: list[tuple[str, Any]] = []

            def keep(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
                if "set_index" in sql:
                    captured.append((sql, params))
                return execute(sql, params, many, context)

            with connection.execute_wrapper(keep):
                ledger.list_usage_groups(start=START, end=START + timedelta(hours=3), starts=None, keys=["namespace"],
                                         filters={}, tenants=None, by_node=False, rates=True)
            (sql, params), = captured
            return _plan(sql, params)

        as_classes = plan_of_the_read()
        assert as_classes.startswith("Gather")
        assert "er.node_id" not in as_classes  # no join to the rate ranges
        monkeypatch.setattr(energy, "_MAX_CLASSES", -1)
        joined = plan_of_the_read()
        assert joined.startswith("Gather")
        assert "er.node_id" in joined
        monkeypatch.setattr(energy, "_arrays_join", _joined_as_the_subquery)
        assert not plan_of_the_read().startswith("Gather")  # what the arrays changed
        transaction.set_rollback(True)
