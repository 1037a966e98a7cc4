"""The portal's cost panel and the periods page read cheaper than they did, with the same figures.

- The panel's billed basis (billing.ledger.billed_basis.list_billed_basis_rows) reads closed days from
  the day ledger and the rest from hours; read from hours alone it is the same, to the ledger unit.
- Its right-sizing (list_container_use) reads the listed workloads' hours through their day rows;
  every hour of those workloads is found: the sums and the peak hours are those of the hour rows.
- The periods page's attributed GPU-hours come from the month's invoice lines summed in one read of
  the day ledger; they are what the month's figure tree shows.

On the random ledgers of tests/billing/test_spend_equivalence.py (GPUs of several models, tenants and
tiers, priced, unpriced and partly priced hours, rate cards changing mid-month and mid-day, `now`
anywhere in the month), with pods on several GPUs in one hour."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.calendar import month_bounds
from billing.ledger import spend
from billing.ledger.billed_basis import list_billed_basis_rows, list_container_use
from billing.ledger.models import UsageDay, UsageHour, WorkloadMeta
from billing.models import Gpu, Node
from billing.queries.figures import get_figure_tree
from billing.queries.periods import list_billing_periods
from billing.scope import Scope
from tests.billing import test_spend_equivalence as random_ledgers
from tests.conftest import with_day

pytestmark = pytest.mark.django_db

FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)
# Sizes whose quotients do not terminate, so a sum divided once differs from a sum of quotients.
GPU_SIZES = ((81559, 132), (81920, 108), (40537, 98))
_SETTINGS = settings(max_examples=40, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _write(ledger: random_ledgers.Ledger) -> None:
    # The other test's own writers of a random ledger, shared on purpose.
    random_ledgers._cards(ledger)
    random_ledgers._write(ledger, ledger.rows)
    node = Node.objects.get(name="gpu-node-1")
    start, _end = month_bounds(ledger.month)
    for i, model in enumerate(ledger.models):
        memory_mb, sm_count = GPU_SIZES[i]
        Gpu.objects.create(uuid=f"GPU-{i}", node=node, model=model, memory_mb=memory_mb, sm_count=sm_count,
                           first_seen_at=start, last_seen_at=start)


def _keys(tenant: str) -> list[tuple[str, str, str]]:
    return sorted(set(UsageHour.objects.filter(tenant=tenant).values_list("namespace", "pod", "pod_uid")))


def _check_panel(ledger: random_ledgers.Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(ledger)
    start, end = month_bounds(ledger.month)
    for tenant in random_ledgers.TENANTS:
        keys = _keys(tenant)
        read = sorted(list_billed_basis_rows(tenant=tenant, start=start, end=end, now=ledger.now, workloads=keys),
                      key=repr)
        with monkeypatch.context() as m:  # every day from its hours
            m.setattr(spend, "closed_days", lambda start, end, now: None)
            from_hours = sorted(list_billed_basis_rows(tenant=tenant, start=start, end=end, now=ledger.now,
                                                       workloads=keys), key=repr)
        assert read == from_hours, tenant
        assert {(r.namespace, r.pod, r.pod_uid) for r in read} == set(keys)
        # Right-sizing: each container's sums and peak hour, from the hour rows themselves, over whole
        # days (the days of a pod on one GPU and tier read from their rows) and over a period that
        # begins and ends inside a day (those days read from their hours).
        for lo, hi in ((start, end), (start + timedelta(hours=5), end - timedelta(hours=7))):
            expected = _container_use_from_hours(tenant, lo, hi)
            for listed in (keys, keys[:1]):
                rows = list_container_use(tenant=tenant, start=lo, end=hi, workloads=listed)
                # The peak is a quotient: Postgres' and Python's last digits differ, not the hour it comes from.
                got = {(r.namespace, r.pod, r.pod_uid, r.container): (r.seconds, r.mem_used_mb_s,
                                                                      round(r.peak_hour_mean_mb, 15), r.sm_granted_s)
                       for r in rows}
                assert got == {k: v for k, v in expected.items() if k[:3] in listed}, tenant
                # The days' stored peaks and sums are what their hours give, every figure to its exponent.
                with transaction.atomic():
                    UsageDay.objects.update(peak_hour_mean_mb=None, peak_hour_mean_sm=None)
                    without_peaks = list_container_use(tenant=tenant, start=lo, end=hi, workloads=listed)
                    transaction.set_rollback(True)
                assert sorted(map(repr, rows)) == sorted(map(repr, without_peaks)), tenant


def _container_use_from_hours(tenant: str, start: datetime, end: datetime) -> dict[tuple[str, ...], tuple[Any, ...]]:
    per_hour: dict[tuple[str, ...], dict[datetime, list[Decimal]]] = defaultdict(dict)
    for u in UsageHour.objects.filter(tenant=tenant, hour__gte=start, hour__lt=end):
        sums = per_hour[(u.namespace, u.pod, u.pod_uid, u.container)].setdefault(u.hour, [Decimal(0)] * 3)
        for i, value in enumerate((u.seconds, u.mem_used_mb_s, u.sm_granted_s)):
            sums[i] += value
    out = {}
    for key, hours in per_hour.items():
        seconds = sum((s for s, _m, _g in hours.values()), Decimal(0))
        mem = sum((m for _s, m, _g in hours.values()), Decimal(0))
        granted = sum((g for _s, _m, g in hours.values()), Decimal(0))
        peak = max((m / s for s, m, _g in hours.values() if s), default=Decimal(0))
        out[key] = (seconds, mem, round(peak, 15), granted)
    return out


@_SETTINGS
@given(ledger=random_ledgers.ledgers())
def test_the_panel_reads_days_as_their_hours_and_finds_every_hour_of_the_listed_workloads(
        ledger: random_ledgers.Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    with transaction.atomic():  # each example rolled back: examples share the test's database
        _check_panel(ledger, monkeypatch)
        transaction.set_rollback(True)


@_SETTINGS
@given(ledger=random_ledgers.ledgers(), places_now=st.booleans())
def test_the_periods_page_attributes_the_gpu_hours_the_months_figure_tree_shows(
        ledger: random_ledgers.Ledger, places_now: bool) -> None:
    with transaction.atomic():
        _write(ledger)
        now = ledger.now if places_now else month_bounds(ledger.month)[1]
        for view in list_billing_periods(scope=FINANCE, now=now):
            assert view.split is not None
            start, end = month_bounds(view.month)
            tree = get_figure_tree(scope=FINANCE, start=start, end=end, places=2, depth="namespace")
            assert view.split.attributed == sum((tree.shown(root).gpu_hours for root in tree.roots.values()),
                                                Decimal(0)), view.month
        transaction.set_rollback(True)


def test_right_sizing_requests_are_each_hours_request_times_its_seconds_on_every_node() -> None:
    """The requests are joined once per span of a pod's hours (node and pod instance, WorkloadMeta's
    key), not once per hour row: still each hour's request × its seconds, summed, per container; a
    container that one node never reported a request for (or reported one that is not a number) is
    unknown, on every node."""
    start = datetime(2026, 3, 1, tzinfo=UTC)
    nodes = [Node.objects.create(name=f"gpu-node-{i}") for i in (1, 2)]
    # The pod ran on node 1 for two days (two GPUs on the first), then on node 2, where its
    # sidecar's request was never reported and its trainer's is malformed.
    requests: list[dict[str, dict[str, Any]]] = [
        {"server": {"mem_mb": 40960, "sm": 54}, "sidecar": {"mem_mb": 1024.5, "sm": 2}, "trainer": {"sm": 8}},
        {"server": {"mem_mb": 20480, "sm": 27}, "trainer": {"mem_mb": "lots", "sm": 8}},
    ]
    for node, request in zip(nodes, requests, strict=True):
        WorkloadMeta.objects.create(node=node, namespace="ml", pod="bert", pod_uid="uid-bert", requests=request,
                                    first_seen=start, last_seen=start)
    rows = [(nodes[0], "GPU-0", 0, 3, "server", 3600), (nodes[0], "GPU-1", 0, 3, "server", 1800),
            (nodes[0], "GPU-0", 1, 5, "sidecar", 3600), (nodes[0], "GPU-0", 26, 2, "trainer", 900),
            (nodes[1], "GPU-7", 50, 4, "server", 3600), (nodes[1], "GPU-7", 50, 4, "trainer", 1200),
            (nodes[1], "GPU-7", 51, 1, "sidecar", 600)]
    for node, gpu, first, hours, container, seconds in rows:
        for h in range(first, first + hours):
            with_day(UsageHour.objects.create(
                hour=start + timedelta(hours=h), gpu_uuid=gpu, node=node, tenant="acme", namespace="ml", pod="bert",
                container=container, pod_uid="uid-bert", sla_tier="gold", seconds=seconds, mem_used_mb_s=seconds * 100,
                mem_granted_mb_s=seconds * 200, mem_billed_mb_s=seconds * 200, sm_used_s=seconds, sm_granted_s=seconds * 2,
                sm_billed_s=seconds * 2, pcie_mb=0, share_gpu_s=seconds, charge=Decimal(1), idle_share=Decimal(0)))
    # Each hour row's request × its seconds, summed per container; unknown once any row's is.
    expected: dict[str, dict[str, Decimal | None]] = {}
    for u in UsageHour.objects.all():
        request = requests[nodes.index(u.node)].get(u.container, {})
        sums = expected.setdefault(u.container, {"mem_mb": Decimal(0), "sm": Decimal(0)})
        for field in ("mem_mb", "sm"):
            value, before = request.get(field), sums[field]
            known = isinstance(value, int | float) and before is not None
            sums[field] = before + Decimal(str(value)) * u.seconds if known and before is not None else None
    got = {r.container: {"mem_mb": r.mem_requested_mb_s, "sm": r.sm_requested_s}
           for r in list_container_use(tenant="acme", start=start, end=start + timedelta(days=31),
                                       workloads=[("ml", "bert", "uid-bert")])}
    assert got == expected
    assert got["server"] == {"mem_mb": Decimal(40960 * 3600 * 3 + 40960 * 1800 * 3 + 20480 * 3600 * 4),
                             "sm": Decimal(54 * 5400 * 3 + 27 * 3600 * 4)}
    assert got["sidecar"] == {"mem_mb": None, "sm": None}
    assert got["trainer"] == {"mem_mb": None, "sm": Decimal(8 * 1800 + 8 * 4800)}
    # The days on which each of the pod's containers ran on one GPU and tier are read from their day
    # rows, peaks included: without their hours, the same figures. Its first day (its server on two
    # GPUs) is read from its hours only.
    def read() -> list[str]:
        return sorted(map(repr, list_container_use(tenant="acme", start=start, end=start + timedelta(days=31),
                                                   workloads=[("ml", "bert", "uid-bert")])))

    as_read = read()
    UsageHour.objects.filter(hour__gte=start + timedelta(days=1)).delete()
    assert read() == as_read
    UsageHour.objects.filter(hour__lt=start + timedelta(days=1)).delete()
    server = next(r for r in list_container_use(tenant="acme", start=start, end=start + timedelta(days=31),
                                                workloads=[("ml", "bert", "uid-bert")]) if r.container == "server")
    assert server.seconds == 3600 * 4  # node 2's day only
