"""The figure tree's read (billing.ledger.allocation.list_figure_rows) sums the period's usage per leaf
first and per level from the leaves, and the dashboard reads only the pods its top workloads are
apportioned among. Both give the figures of the one-pass read they replace, to the last digit:

- every row of every depth equals the one-pass GROUPING SETS statement's (kept below as the
  reference), over the day ledger and the hour ledger, for every tenant or some;
- with `top_pods` the tenants, their lines, their counts of pod instances and the top pods' shown
  figures are those of the whole tree;
- the tenant portal listing its costliest few workloads (which reads only those) lists them, counts
  them and charts them per day as the portal reading every workload (its CSV) does.

On random ledgers: pods on two nodes and several GPUs, two containers, two tiers and GPU models,
controllers and requests known (for one container or both, one written two ways), unknown or
malformed, energy priced at one location (the CO2e factor sometimes unknown, the rate changing
mid-month) and not at the other node; checked again after late usage lands and after the month is
re-priced (its hours' charges rewritten, the days re-derived)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.figures import LEVELS, FigureNode, FigureRow, FigureTree, build_tree
from billing.ledger.allocation import FigureRows, list_figure_rows
from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.ledger.rollup import rebuild_days
from billing.models import Gpu, Location, LocationRate, Node, NodeLocation, Tenant
from billing.queries import portal
from billing.queries.portal import get_tenant_portal
from billing.scope import Scope

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 1, tzinfo=UTC)
DAYS = 4
UNIT = Decimal(1).scaleb(-12)
MODELS = ("A100", "H100")
# Sizes whose quotients do not terminate, so a sum of quotients differs from a quotient of sums.
GPU_SIZES = ((81559, 132), (81920, 108), (40537, 98))
_SETTINGS = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass(frozen=True)
class Row:
    gpu: int  # GPUs 0 and 1 on node-a (priced energy), 2 on node-b (none)
    hour: int  # hours from START
    tenant: str
    namespace: str
    pod: str
    instance: int
    container: str
    tier: str
    charge: int  # ledger units
    idle: int
    energy: int


def _rows(max_size: int, hours: int = DAYS * 24) -> st.SearchStrategy[list[Row]]:
    amount = st.integers(0, 10**15)
    row = st.builds(
        Row, gpu=st.integers(0, 2), hour=st.integers(0, hours - 1), tenant=st.sampled_from(("acme", "globex")),
        namespace=st.sampled_from(("prod", "dev")), pod=st.sampled_from(("bert", "llm", "vit")),
        instance=st.integers(0, 1), container=st.sampled_from(("main", "side")), tier=st.sampled_from(("gold", "bronze")),
        charge=amount, idle=st.one_of(st.just(0), amount), energy=st.one_of(st.just(0), st.integers(1, 10**9)),
    )
    return st.lists(row, max_size=max_size,
                    unique_by=lambda r: (r.gpu, r.hour, r.tenant, r.namespace, r.pod, r.instance, r.container, r.tier))


@dataclass(frozen=True)
class Ledger:
    rows: list[Row]
    late: list[Row]
    metas: dict[tuple[str, str, str, int], tuple[str, Any]]  # (node, namespace, pod, instance) -> kind, requests
    co2_known: bool


@st.composite
def ledgers(draw: st.DrawFn) -> Ledger:
    metas = {}
    namespaces = [f"{t}-{n}" for t in ("acme", "globex") for n in ("prod", "dev")]
    for key in draw(st.sets(st.tuples(st.sampled_from(("node-a", "node-b")), st.sampled_from(namespaces),
                                      st.sampled_from(("bert", "llm", "vit")), st.integers(0, 1)), max_size=12)):
        # The read takes each distinct document's numbers once: the same request written as 8192.0
        # (an equal document) and a document of two containers, or not an object, are read alike.
        requests = draw(st.sampled_from(({"main": {"mem_mb": 8192, "sm": 20}}, {"main": {"mem_mb": "lots"}}, {},
                                         {"main": {"mem_mb": 8192.0, "sm": 20}, "side": {"mem_mb": 1024, "sm": 7}},
                                         ["main"])))
        metas[key] = (draw(st.sampled_from(("Deployment", "StatefulSet", ""))), requests)
    return Ledger(draw(_rows(40)), draw(_rows(8)), metas, draw(st.booleans()))


def _fleet(ledger: Ledger) -> list[Gpu]:
    Tenant.objects.create(slug="acme", name="Acme")
    Tenant.objects.create(slug="globex", name="环球科技")
    nodes = [Node.objects.create(name="node-a"), Node.objects.create(name="node-b")]
    gpus = [Gpu.objects.create(uuid=f"GPU-{i}", node=nodes[0 if i < 2 else 1], model=MODELS[i % 2], memory_mb=mem,
                               sm_count=sms, first_seen_at=START, last_seen_at=START)
            for i, (mem, sms) in enumerate(GPU_SIZES)]
    where = Location.objects.create(label="dc", created_at=START)
    NodeLocation.objects.create(node=nodes[0], location=where, effective_from=date(2026, 1, 1), created_at=START)
    co2 = Decimal("0.4") if ledger.co2_known else None
    for since, price in ((date(2026, 1, 1), Decimal("0.21")), (date(2026, 3, 3), Decimal("0.3333"))):
        LocationRate.objects.create(location=where, effective_from=since, price_per_kwh=price, currency="USD",
                                    co2e_kg_per_kwh=co2, created_at=START)
    for (node, namespace, pod, instance), (kind, requests) in ledger.metas.items():
        WorkloadMeta.objects.create(node=Node.objects.get(name=node), namespace=namespace, pod=pod,
                                    pod_uid=f"{pod}-{instance}", controller_kind=kind,
                                    controller_name=pod if kind else "", requests=requests,
                                    first_seen=START, last_seen=START)
    return gpus


def _write(gpus: list[Gpu], rows: list[Row]) -> None:
    """The hour rows as the rollup leaves them (GPU rows included), then the days derived."""
    for r in rows:
        gpu, hour = gpus[r.gpu], START + timedelta(hours=r.hour)
        GpuHour.objects.get_or_create(
            node=gpu.node, gpu_uuid=gpu.uuid, hour=hour,
            defaults={"gpu_model": gpu.model, "metered_seconds": 3600, "card_cost": 1, "charged": 0, "idle_cost": 1,
                      "idle_allocated": 0, "currency": "USD", "priced": True})
    UsageHour.objects.bulk_create([UsageHour(
        gpu_uuid=gpus[r.gpu].uuid, node=gpus[r.gpu].node, tenant=r.tenant, namespace=f"{r.tenant}-{r.namespace}",
        pod=r.pod, container=r.container, pod_uid=f"{r.pod}-{r.instance}", sla_tier=r.tier,
        hour=START + timedelta(hours=r.hour), seconds=3600, mem_used_mb_s=r.charge % 9973, mem_granted_mb_s=8192 * 3600,
        mem_billed_mb_s=8192 * 3600, sm_used_s=r.idle % 7919, sm_granted_s=20 * 3600, sm_billed_s=20 * 3600, pcie_mb=0,
        share_gpu_s=r.charge * UNIT, charge=r.charge * UNIT, idle_share=r.idle * UNIT, energy_j=r.energy * UNIT,
    ) for r in rows])
    rebuild_days(start=START, end=START + timedelta(days=DAYS))


def _reprice() -> None:
    """A rate card changed: the rollup re-prices the hours (here every charge doubled), the days follow."""
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {UsageHour._meta.db_table} SET charge = charge * 2, idle_share = idle_share * 3")  # noqa: S608 - the model's table
    rebuild_days(start=START, end=START + timedelta(days=DAYS))


# The read before this change: one GROUPING SETS pass over the usage rows (the reference).
def _one_pass_rows(*, start: datetime, end: datetime, depth: int, tenants: list[str] | None) -> list[FigureRow]:
    from billing.figures import FIGURE_LEVELS
    from billing.ledger import allocation as a
    from billing.ledger.energy import co2e_sql, energy_cost_sql, energy_rate_join
    from billing.ledger.requests import requested_sql

    ledger = a.set_ledger(start, end, None)
    params: dict[str, Any] = {"start": start, "end": end, "tenants": tenants}
    path = ["tenant", *(k for level in FIGURE_LEVELS[:depth] for k in (("node", "gpu") if level == "gpu" else (level,)))]
    columns = ["tenant", "gpu_model", "sla_tier", *path[1:]]
    expr = {k: a._FIGURE_KEY_SQL[k] for k in columns} | {"gpu_model": "coalesce(g.gpu_model, '')"}
    sets: list[tuple[str, ...]] = [("tenant", "gpu_model", "sla_tier")]
    sets += [tuple(path[: i + 1]) for i in range(1, len(path)) if path[i] != "node"]
    grouping_sets = ", ".join("(" + ", ".join(expr[k] for k in one) + ")" for one in sets)
    mem_req, sm_req = requested_sql("mem_mb"), requested_sql("sm")
    sql = (
        f"SELECT GROUPING({', '.join(expr[k] for k in columns)}) AS mask, "
        + ", ".join(f"({expr[k]})::text AS k_{i}" for i, k in enumerate(columns)) + ", "
        'array_agg(DISTINCT u.container COLLATE "C" ORDER BY u.container COLLATE "C") AS containers, '
        'array_agg(DISTINCT u.sla_tier COLLATE "C" ORDER BY u.sla_tier COLLATE "C") AS sla_tiers, '
        f"min(u.{ledger.first_hour}) AS first_hour, max(u.{ledger.last_hour}) AS last_hour, "
        "sum(u.seconds) AS seconds, sum(u.share_gpu_s) AS share_gpu_s, sum(u.charge) AS charge, "
        "sum(u.idle_share) AS idle_share, sum(u.mem_used_mb_s) AS mem_used_mb_s, "
        "sum(u.mem_granted_mb_s) AS mem_granted_mb_s, sum(u.sm_used_s) AS sm_used_s, sum(u.sm_granted_s) AS sm_granted_s, "
        f"CASE WHEN bool_and({mem_req} IS NOT NULL) THEN sum({mem_req}) END AS mem_requested_mb_s, "
        f"CASE WHEN bool_and({sm_req} IS NOT NULL) THEN sum({sm_req}) END AS sm_requested_s, "
        "sum(u.energy_j) AS energy_j, "
        f"{energy_cost_sql()} AS energy_cost_jp, {co2e_sql()} AS co2e_jkg "
        f"FROM {ledger.usage_table} u JOIN {a._NODE} n ON n.id = u.node_id{energy_rate_join('u', ledger.at)}"
        f"LEFT JOIN {ledger.gpu_table} g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.{ledger.at} = u.{ledger.at} "
        f"AND g.{ledger.at} >= %(start)s AND g.{ledger.at} < %(end)s "
        f"LEFT JOIN {a._META} m ON m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod "
        "AND m.pod_uid = u.pod_uid "
        f"WHERE u.{ledger.at} >= %(start)s AND u.{ledger.at} < %(end)s "
        "AND (%(tenants)s::text[] IS NULL OR u.tenant = ANY(%(tenants)s::text[])) "
        f"GROUP BY GROUPING SETS ({grouping_sets})"
    )
    width = len(columns)
    levels = {sum(1 << (width - 1 - i) for i, k in enumerate(columns) if k not in one): n for n, one in enumerate(sets)}
    with connection.cursor() as cur:
        cur.execute(sql, params)
        names = [c[0] for c in cur.description]
        out = []
        for raw in cur.fetchall():
            row = dict(zip(names, raw, strict=True))
            level = levels[row.pop("mask")]
            keys = tuple(row.pop(f"k_{i}") for i in range(width))
            out.append(FigureRow(level=level, keys=tuple(v for v, k in zip(keys, columns, strict=True) if k in sets[level]),
                                 **{**row, "containers": tuple(row["containers"]), "sla_tiers": tuple(row["sla_tiers"])}))
    return out


def _sorted(rows: list[FigureRow]) -> list[FigureRow]:
    return sorted(rows, key=lambda r: (r.level, r.keys))


# Whole days (the day ledger) and a window of hours (the hour ledger, energy rate changing inside it).
PERIODS = ((START, START + timedelta(days=DAYS)), (START + timedelta(hours=5), START + timedelta(days=3, hours=7)))


def _check(period: tuple[datetime, datetime]) -> None:
    start, end = period
    for tenants in (None, ["globex"]):
        for depth in range(1, len(LEVELS)):
            got = list_figure_rows(start=start, end=end, depth=depth, filters={}, tenants=tenants)
            assert _sorted(got.rows) == _sorted(_one_pass_rows(start=start, end=end, depth=depth, tenants=tenants))
            assert got.pod_instances == {}
        whole = build_tree(_one_pass_rows(start=start, end=end, depth=LEVELS.index("pod_uid"), tenants=tenants),
                           currency="USD", places=2)
        for top in (0, 1, 3, 50):
            _check_top(whole, list_figure_rows(start=start, end=end, depth=LEVELS.index("pod_uid"), filters={},
                                               tenants=tenants, top_pods=top), top)


def _check_portal(period: tuple[datetime, datetime]) -> None:
    start, end = period
    # A chart of two series: one workload and the others', which the few listed do not hold.
    with mock.patch.object(portal, "CHART_SERIES", 2):
        for slug in ("acme", "globex"):
            _check_portal_of(slug, start, end)


def _check_portal_of(slug: str, start: datetime, end: datetime) -> None:
    scope = Scope(tenants=frozenset({slug}), is_finance=False, is_admin=False)
    every = get_tenant_portal(scope=scope, slug=slug, start=start, end=end, now=end, reasons=False, trends=False)
    for limit in (1, 2, 100):
        listed = get_tenant_portal(scope=scope, slug=slug, start=start, end=end, now=end, workload_limit=limit,
                                   reasons=False, trends=False)
        assert listed.workloads == every.workloads[:limit]
        assert (listed.workload_count, listed.daily, listed.period_cost) == (
            every.workload_count, every.daily, every.period_cost)


def _check_top(whole: FigureTree, read: FigureRows, top: int) -> None:
    """The pruned tree shows what the whole tree shows of tenants and of the top pods."""
    tree = build_tree(read.rows, currency="USD", places=2)
    assert tree.roots.keys() == whole.roots.keys()
    for slug, root in whole.roots.items():
        assert tree.lines[slug] == whole.lines[slug]
        assert tree.shown(tree.roots[slug]) == whole.shown(root)
        assert read.pod_instances.get(slug, 0) == len(whole.nodes("pod_uid", {"tenant": slug}))
        # What the portal's chart relies on: the pod instances' figures add up to their tenant's, so
        # the workloads not listed show the tenant's figure less the listed ones'.
        assert sum((whole.shown(n).cost for n in whole.nodes("pod_uid", {"tenant": slug})), Decimal(0)) == \
            whole.shown(root).cost
    def rank(n: FigureNode) -> tuple[Decimal, tuple[str, ...]]:
        return (-n.exact.cost, n.keys)

    expected = sorted(whole.nodes("pod_uid"), key=rank)[:top]
    got = sorted(tree.nodes("pod_uid"), key=rank)[:top]
    assert [n.keys for n in got] == [n.keys for n in expected]
    for mine, theirs in zip(got, expected, strict=True):
        assert (tree.shown(mine), mine.sla_tiers, mine.exact) == (whole.shown(theirs), theirs.sla_tiers, theirs.exact)


@_SETTINGS
@given(ledger=ledgers(), period=st.sampled_from(PERIODS))
def test_the_two_step_read_and_the_pruned_tree_give_the_one_pass_figures(ledger: Ledger,
                                                                         period: tuple[datetime, datetime]) -> None:
    with transaction.atomic():  # each example rolled back: examples share the test's database
        gpus = _fleet(ledger)
        _write(gpus, ledger.rows)
        _check(period)
        _write(gpus, ledger.late)  # late usage lands in hours already read
        _check(period)
        _reprice()
        _check(period)
        _check_portal(period)
        transaction.set_rollback(True)


def test_top_pods_needs_the_tree_down_to_pod_instances(db: Any) -> None:
    with pytest.raises(ValueError, match="pod instances"):
        list_figure_rows(start=START, end=START + timedelta(days=1), depth=LEVELS.index("pod"), filters={},
                         tenants=None, top_pods=10)
