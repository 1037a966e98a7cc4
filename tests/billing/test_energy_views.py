"""kWh, energy cost and kg CO2e beside money on Explore (every level, its totals row, its CSV) and on
the finance dashboard's tenant table and its CSV (docs/billing.md, Energy): the figure tree's energy
figures, shown as the portal shows them, rows adding up to the total, "—" where unknown.

The small ledger is test_energy_prices': bert-1 drew 3 kWh (0.80 USD, 0.80 kg CO2e), llm-1 0.5 kWh
(0.05 USD, no CO2e factor at its location)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client

from billing.figures import PAGE_PLACES
from billing.models import NodeLocation
from billing.queries.explore import Explore, ExploreFilters, ExplorePath, get_explore
from billing.scope import FINANCE_GROUP
from tests.billing.test_energy_prices import admin_scope, ledger  # noqa: F401 - the fixture, shared
from tests.conftest import user_in

pytestmark = pytest.mark.django_db

# The tenants CSV's columns before energy was added: they keep their positions.
TENANT_CSV_BEFORE = ["tenant", "name", "charge", "idle_share", "total", "currency", "gpu_hours_equivalent",
                     "mem_used_gb_h", "sm_used_h", "workloads", "metered_gpu_hours"]
ENERGY = ["energy_kwh", "energy_cost", "co2e_kg"]


def bounds(day0: date) -> tuple[datetime, datetime]:
    start = datetime(day0.year, day0.month, day0.day, tzinfo=UTC)
    return start, start + timedelta(days=2)


def period(day0: date) -> dict[str, str]:
    return {"start": day0.isoformat(), "end": (day0 + timedelta(days=1)).isoformat()}  # the last day included


TOP = ExplorePath()


def levels(day0: date, path: ExplorePath = TOP) -> Iterator[Explore]:
    """Every level of the drill-down, from `path` down every row's link."""
    start, end = bounds(day0)
    result = get_explore(scope=admin_scope(), path=path, filters=ExploreFilters(), start=start, end=end,
                         places=PAGE_PLACES)
    yield result
    for row in result.rows:
        if row.down is not None:
            yield from levels(day0, row.down)


def energy(explore: Explore) -> dict[str, tuple[Decimal, Decimal | None, Decimal | None]]:
    return {r.key("pod") or r.name: (r.shown.energy_kwh, r.shown.energy_cost, r.shown.co2e_kg) for r in explore.rows}


def test_every_explore_level_shows_the_portals_energy_figures_and_they_add_up(ledger):  # noqa: F811 - the fixture
    seen = set()
    for explore in levels(ledger):
        seen.add(explore.level)
        rows = [r.shown for r in explore.rows]
        # Whatever the level, its rows are the whole tenant's energy (one tenant, no filters).
        if explore.level in ("tenant", "namespace", "controller"):
            assert sum((r.energy_kwh for r in rows), Decimal(0)) == Decimal("3.50"), explore.level
            assert sum((r.energy_cost or Decimal(0) for r in rows), Decimal(0)) == Decimal("0.85"), explore.level
        if explore.level == "pod":
            assert energy(explore) == {"bert-1": (Decimal("3.00"), Decimal("0.80"), Decimal("0.80")),
                                       "llm-1": (Decimal("0.50"), Decimal("0.05"), None)}
        if explore.level == "gpu":
            (row,) = explore.rows
            assert row.shown.energy_kwh in (Decimal("3.00"), Decimal("0.50"))
    assert seen == {"tenant", "namespace", "controller", "pod", "gpu"}
    tenant = next(levels(ledger))
    assert energy(tenant) == {"acme": (Decimal("3.50"), Decimal("0.85"), None)}  # llm-1's CO2e is unknown


def controller_path(day0: date) -> ExplorePath:
    """The path to acme's workloads (the pod level)."""
    pod_level = next(e for e in levels(day0) if e.level == "pod")
    return pod_level.path


def explore_csv(client: Client, day0: date, path: ExplorePath) -> tuple[list[str], dict[str, dict[str, str]]]:
    resp = client.get("/explore/", {**period(day0), **dict(path.steps()), "format": "csv"})
    assert resp.status_code == 200
    header, *rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    return header, {r[0]: dict(zip(header, r, strict=True)) for r in rows}


def test_explores_page_and_csv_show_kwh_energy_cost_and_co2e_with_a_total(client, ledger):  # noqa: F811 - the fixture
    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/explore/", period(ledger)).content.decode()
    row = re.search(r'<tr data-testid="explore-row" data-name="acme">.*?</tr>', html, re.S)
    assert row, html
    assert re.search(r'data-testid="explore-kwh" data-sum="explore-kwh">3\.50<', row[0]), row[0]
    assert re.search(r'data-testid="explore-energy-cost" data-sum="explore-energy-cost">0\.85 USD<', row[0]), row[0]
    # No CO2e factor for llm-1's location: a dash, and the column is not summed.
    assert re.search(r'data-testid="explore-co2e"><span title="[^"]+">—</span>', row[0]), row[0]
    assert re.search(r'data-testid="explore-kwh-total" data-sum-total="explore-kwh">3\.50<', html)
    assert re.search(r'data-testid="explore-energy-cost-total" data-sum-total="explore-energy-cost">0\.85 USD<', html)
    assert re.search(r'data-testid="explore-co2e-total">—<', html)
    assert 'data-testid="energy-cost-note"' in html

    header, by_name = explore_csv(client, ledger, TOP)
    assert header[-3:] == ENERGY
    assert [by_name["acme"][c] for c in ENERGY] == ["3.5000", "0.85", ""]
    assert [by_name["(total)"][c] for c in ENERGY] == ["3.5000", "0.85", ""]
    # The workloads' level: energy after the right-sizing columns, each row its own, the total theirs.
    header, by_name = explore_csv(client, ledger, controller_path(ledger))
    assert header[-3:] == ENERGY
    assert header.index("sm_suggestion_basis") < header.index("energy_kwh")
    bert, llm = (next(r for n, r in by_name.items() if n.startswith(pod)) for pod in ("bert-1", "llm-1"))
    assert [bert[c] for c in ENERGY] == ["3.0000", "0.80", "0.8000"]
    assert [llm[c] for c in ENERGY] == ["0.5000", "0.05", ""]
    assert [by_name["(total)"][c] for c in ENERGY] == ["3.5000", "0.85", ""]


def test_without_a_price_energy_cost_is_a_dash_on_explore_never_zero(client, ledger):  # noqa: F811 - the fixture
    NodeLocation.objects.filter(node__name="gpu-b").delete()
    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/explore/", {**period(ledger), **dict(controller_path(ledger).steps())}).content.decode()
    llm = re.search(r'<tr data-testid="explore-row" data-name="llm-1[^"]*">.*?</tr>', html, re.S)
    assert llm, html
    assert re.search(r'data-testid="explore-energy-cost"><span title="[^"]+">—</span>', llm[0]), llm[0]
    assert re.search(r'data-testid="explore-energy-cost-total">—<', html)
    assert re.search(r'data-testid="explore-kwh-total" data-sum-total="explore-kwh">3\.50<', html)


def test_the_finance_dashboards_tenant_table_and_csv_show_energy(client, ledger):  # noqa: F811 - the fixture
    client.force_login(user_in(FINANCE_GROUP))
    html = client.get("/finance/", period(ledger)).content.decode()
    assert re.search(r'data-testid="tenant-kwh" data-sum="tenant-kwh">3\.50<', html), html
    assert re.search(r'data-testid="tenant-energy-cost" data-sum="tenant-energy-cost">0\.85 USD<', html)
    assert re.search(r'data-testid="tenant-co2e"><span title="[^"]+">—</span>', html)
    assert re.search(r'data-testid="tenant-kwh-total" data-sum-total="tenant-kwh">3\.50<', html)
    assert re.search(r'data-testid="tenant-energy-cost-total" data-sum-total="tenant-energy-cost">0\.85 USD<', html)
    assert re.search(r'data-testid="tenant-co2e-total">—<', html)

    resp = client.get("/finance/", {**period(ledger), "format": "csv"})
    header, *rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    assert header == [*TENANT_CSV_BEFORE, *ENERGY]
    by_tenant = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert [by_tenant["acme"][c] for c in ENERGY] == ["3.5000", "0.85", ""]
    # The platform's idle energy is no tenant's: the idle row has none, the total is the tenants'.
    assert [by_tenant["(idle, platform)"][c] for c in ENERGY] == ["", "", ""]
    assert [by_tenant["(total)"][c] for c in ENERGY] == ["3.5000", "0.85", ""]


def test_a_tenant_member_reads_its_own_energy_on_the_dashboard(client, ledger):  # noqa: F811 - the fixture
    """A tenant-scoped reader's table and "Your cost" total row carry the same figures."""
    client.force_login(user_in(tenant="acme"))
    resp = client.get("/finance/", {**period(ledger), "format": "csv"})
    header, *rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    by_tenant = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert set(by_tenant) == {"acme", "(total)"}
    assert [by_tenant["(total)"][c] for c in ENERGY] == ["3.5000", "0.85", ""]
