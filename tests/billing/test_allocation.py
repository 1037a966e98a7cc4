"""The allocation query (billing.queries.allocation, docs/allocation-api.md): OpenCost's parameters parsed at fixed
instants (month ends, 29 February, Sundays), and sets over a hand-written ledger whose every expected
figure is computed by hand: aggregation by every key, labels and controllers from WorkloadMeta,
steps and accumulation, idle as `__idle__`, per node and shared, and tenant scope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing.api.allocation_params import parse_aggregate, parse_bool, parse_step, parse_window
from billing.ledger import reads
from billing.ledger.allocation import list_idle_rows
from billing.ledger.models import GpuHour, UsageHour, WorkloadMeta
from billing.models import Node
from billing.queries.allocation import (
    DEFAULT_AGGREGATE,
    IDLE,
    UNALLOCATED,
    ParameterError,
    Window,
    align_window,
    allocation_sets,
)
from billing.scope import Scope
from tests.conftest import with_day

D = Decimal
FINANCE = Scope(tenants=None, is_finance=True, is_admin=False)
ACME = Scope(tenants=frozenset({"acme"}), is_finance=False, is_admin=False)
NOBODY = Scope(tenants=frozenset(), is_finance=False, is_admin=False)
H = datetime(2026, 3, 2, 10, tzinfo=UTC)  # a Monday
DAY = Window(datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 3, tzinfo=UTC))


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# --- window ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "now", "start", "end"), [
    ("today", utc(2028, 2, 29, 13, 5), utc(2028, 2, 29), utc(2028, 3, 1)),
    ("yesterday", utc(2028, 3, 1, 0, 30), utc(2028, 2, 29), utc(2028, 3, 1)),
    # Weeks start on Sunday (OpenCost): 2026-03-01 is a Sunday.
    ("week", utc(2026, 3, 4, 9, 15), utc(2026, 3, 1), utc(2026, 3, 4, 9, 15)),
    ("week", utc(2026, 3, 1, 0, 0), utc(2026, 3, 1), utc(2026, 3, 1)),
    ("lastweek", utc(2026, 3, 4, 9), utc(2026, 2, 22), utc(2026, 3, 1)),
    ("lastweek", utc(2026, 3, 7, 23, 59), utc(2026, 2, 22), utc(2026, 3, 1)),
    ("month", utc(2028, 2, 29, 23, 59), utc(2028, 2, 1), utc(2028, 2, 29, 23, 59)),
    ("month", utc(2028, 3, 1), utc(2028, 3, 1), utc(2028, 3, 1)),  # empty at its first instant
    ("lastmonth", utc(2028, 3, 1, 0, 0, 1), utc(2028, 2, 1), utc(2028, 3, 1)),
    ("lastmonth", utc(2027, 1, 31, 23, 59), utc(2026, 12, 1), utc(2027, 1, 1)),
    ("lastmonth", utc(2026, 3, 31, 12), utc(2026, 2, 1), utc(2026, 3, 1)),
    # Durations end at the end of the current unit: 7d is today and the 6 days before.
    ("7d", utc(2028, 3, 2, 13, 5), utc(2028, 2, 25), utc(2028, 3, 3)),
    ("24h", utc(2026, 3, 2, 13, 5), utc(2026, 3, 1, 14), utc(2026, 3, 2, 14)),
    ("30m", utc(2026, 3, 2, 13, 5, 9), utc(2026, 3, 2, 12, 36), utc(2026, 3, 2, 13, 6)),
    ("2w", utc(2026, 3, 2, 13), utc(2026, 2, 17), utc(2026, 3, 3)),
    ("2026-02-28T22:00:00Z,2026-03-01T02:00:00Z", utc(2030, 1, 1), utc(2026, 2, 28, 22), utc(2026, 3, 1, 2)),
    ("2026-03-01T08:00:00+08:00,2026-03-01T10:00:00+08:00", utc(2030, 1, 1), utc(2026, 3, 1), utc(2026, 3, 1, 2)),
    ("1772323200,1772409600", utc(2030, 1, 1), utc(2026, 3, 1), utc(2026, 3, 2)),
])
def test_window_forms(text: str, now: datetime, start: datetime, end: datetime) -> None:
    assert parse_window(text, now=now) == Window(start, end)


@pytest.mark.parametrize("text", ["", "week2", "7x", "0d", "-7d", "2026-03-01", "2026-03-01T00:00:00,2026-03-02T00:00:00Z",
                                  "2026-03-02T00:00:00Z,2026-03-01T00:00:00Z", "a,b", "99999999999,1", "1,2,3"])
def test_bad_windows_name_the_window(text: str) -> None:
    with pytest.raises(ParameterError) as caught:
        parse_window(text, now=utc(2026, 3, 2))
    assert caught.value.parameter == "window"
    assert str(caught.value).startswith("window: ")


def test_an_empty_window_has_one_empty_set(db) -> None:
    empty = parse_window("month", now=utc(2028, 3, 1))
    assert allocation_sets(FINANCE, window=empty, aggregate=["pod"], include_idle=True) == [{}]


def test_windows_align_to_the_ledger_hours() -> None:
    assert align_window(Window(utc(2026, 3, 2, 12, 36), utc(2026, 3, 2, 13, 6))) == \
        Window(utc(2026, 3, 2, 12), utc(2026, 3, 2, 14))
    assert align_window(DAY) == DAY


def test_step_aggregate_and_booleans() -> None:
    assert parse_step(None) is None
    assert parse_step("") is None
    assert parse_step("1d") == timedelta(days=1)
    assert parse_step("6h") == timedelta(hours=6)
    assert parse_step("120m") == timedelta(hours=2)
    assert parse_step("1w") == timedelta(weeks=1)
    # Any duration OpenCost takes, rounded up to the ledger's hours.
    assert parse_step("30m") == timedelta(hours=1)
    assert parse_step("90m") == timedelta(hours=2)
    for bad in ("0h", "1y", "d", "1.5h", "999999w", "9999999s"):
        with pytest.raises(ParameterError) as caught:
            parse_step(bad)
        assert caught.value.parameter == "step"
    assert parse_aggregate(None) == DEFAULT_AGGREGATE
    assert parse_aggregate("namespace, label:app,namespace") == ("namespace", "label:app")
    # OpenCost drops keys it does not know (ParseAggregationProperties); `all` is one allocation.
    assert parse_aggregate("namespaces,label:,pod,,node") == ("pod", "node")
    assert parse_aggregate("all") == ()
    assert parse_aggregate("bogus") == ()
    assert parse_aggregate("deployment,team,services") == ("deployment", "label:team", "service")
    assert parse_bool("accumulate", "TRUE", default=False)
    assert not parse_bool("accumulate", None, default=False)
    with pytest.raises(ParameterError) as caught:
        parse_bool("includeIdle", "yes", default=False)
    assert caught.value.parameter == "includeIdle"


# --- a hand-written ledger -------------------------------------------------------------------------

def gpu_hour(node: Node, gpu: str, hour: datetime, *, card: str, idle: str, idle_allocated: str = "0",
             seconds: str = "3600", model: str = "A100") -> None:
    with_day(GpuHour.objects.create(
        gpu_uuid=gpu, node=node, gpu_model=model, hour=hour, metered_seconds=D(seconds), card_cost=D(card),
        charged=D(card) - D(idle), idle_cost=D(idle), idle_allocated=D(idle_allocated), currency="USD", priced=True))


def usage_hour(node: Node, gpu: str, hour: datetime, *, tenant: str, pod: str, charge: str, idle_share: str = "0",
               share: str = "0", tier: str = "gold", container: str = "main", seconds: str = "3600",
               mem: str = "0", sm: str = "0") -> None:
    q = {f: D(0) for f in ("mem_billed_mb_s", "sm_billed_s", "pcie_mb")}
    with_day(UsageHour.objects.create(
        gpu_uuid=gpu, node=node, tenant=tenant, namespace=f"{tenant}-ns", pod=pod, container=container,
        pod_uid=f"uid-{pod}", sla_tier=tier, seconds=D(seconds), mem_used_mb_s=D(mem), mem_granted_mb_s=D(mem) * 2,
        sm_used_s=D(sm), sm_granted_s=D(sm) * 2, share_gpu_s=D(share), charge=D(charge), idle_share=D(idle_share),
        hour=hour, **q))


def meta(node: Node, namespace: str, pod: str, *, kind: str = "", controller: str = "",
         labels: dict[str, str] | None = None, requests: dict[str, dict[str, float]] | None = None) -> None:
    WorkloadMeta.objects.create(node=node, namespace=namespace, pod=pod, pod_uid=f"uid-{pod}", controller_kind=kind,
                                controller_name=controller, labels=labels or {}, requests=requests or {},
                                first_seen=H, last_seen=H)


@pytest.fixture
def fleet(db):
    """Two nodes in two clusters. Hour H: n1's GPU-a card 10 (idle 4, 1 of it spread onto acme),
    acme/bert 4 + 1 idle share, globex/llm 2; n2's GPU-b card 6 (idle 3), acme/vit 3 (H100).
    Hour H+1: GPU-a card 10 all idle. Hour H+25 (next day): GPU-a card 10, acme/bert 10."""
    n1 = Node.objects.create(name="node-1", cluster="east")
    n2 = Node.objects.create(name="node-2", cluster="")
    gpu_hour(n1, "GPU-a", H, card="10", idle="4", idle_allocated="1")
    usage_hour(n1, "GPU-a", H, tenant="acme", pod="bert", charge="4", idle_share="1", share="1440", mem="100",
               sm="10")
    usage_hour(n1, "GPU-a", H, tenant="globex", pod="llm", charge="2", share="720", tier="silver", mem="50", sm="5")
    gpu_hour(n2, "GPU-b", H, card="6", idle="3", model="H100")
    usage_hour(n2, "GPU-b", H, tenant="acme", pod="vit", charge="3", share="1800", container="train", mem="10")
    gpu_hour(n1, "GPU-a", H + timedelta(hours=1), card="10", idle="10")
    gpu_hour(n1, "GPU-a", H + timedelta(hours=25), card="10", idle="0")
    usage_hour(n1, "GPU-a", H + timedelta(hours=25), tenant="acme", pod="bert", charge="10", share="3600")
    meta(n1, "acme-ns", "bert", kind="deployment", controller="bert", labels={"app": "nlp", "team": "a"},
         requests={"main": {"mem_mb": 2, "sm": 0.5}})
    meta(n1, "globex-ns", "llm", kind="statefulset", controller="llm", labels={"app": "nlp"})
    return n1, n2


def costs(one_set: dict) -> dict[str, Decimal]:
    return {name: a.total_cost for name, a in one_set.items()}


def test_namespace_sets_with_idle(fleet) -> None:
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["namespace"], include_idle=True)
    # acme: 4 + 1 (idle share) + 3; platform idle: (4 − 1) + 3 + 10.
    assert costs(s) == {"acme-ns": D(8), "globex-ns": D(2), IDLE: D(16)}
    assert list(s) == ["acme-ns", "globex-ns", IDLE]
    acme = s["acme-ns"]
    assert acme.gpu_cost == D(7)
    assert acme.shared_idle_cost == D(1)
    assert acme.currency == "USD"
    assert acme.gpu_hours == D("0.9")
    assert acme.properties == {"namespace": "acme-ns"}
    assert (acme.start, acme.end, acme.minutes) == (H, H + timedelta(hours=1), D(60))
    assert (acme.mem_used_mb_s, acme.mem_granted_mb_s, acme.sm_used_s) == (D(110), D(220), D(10))
    # vit has no WorkloadMeta row: its request is unknown, so acme's is too.
    assert acme.mem_requested_mb_s is None
    idle = s[IDLE]
    # GPU-hours nobody used: (3600 − 2160) + (3600 − 1800) + 3600 seconds.
    assert idle.gpu_hours == D(6840) / 3600
    assert idle.is_idle
    assert (idle.start, idle.end) == (DAY.start, DAY.end)
    # Σ allocations = Σ card cost of the day.
    assert sum(costs(s).values()) == D(26)


def test_every_key_and_unallocated(fleet) -> None:
    def names(key: str) -> dict[str, Decimal]:
        return costs(allocation_sets(FINANCE, window=DAY, aggregate=[key])[0])

    assert names("cluster") == {"east": D(7), UNALLOCATED: D(3)}
    assert names("node") == {"node-1": D(7), "node-2": D(3)}
    assert names("controllerKind") == {"deployment": D(5), "statefulset": D(2), UNALLOCATED: D(3)}
    assert names("controller") == {"deployment:bert": D(5), "statefulset:llm": D(2), UNALLOCATED: D(3)}
    assert names("pod") == {"bert": D(5), "llm": D(2), "vit": D(3)}
    assert names("container") == {"main": D(7), "train": D(3)}
    assert names("tenant") == {"acme": D(8), "globex": D(2)}
    assert names("gpu_model") == {"A100": D(7), "H100": D(3)}
    assert names("sla_tier") == {"gold": D(8), "silver": D(2)}
    assert names("gpu") == {"GPU-a": D(7), "GPU-b": D(3)}
    assert names("label:app") == {"nlp": D(7), UNALLOCATED: D(3)}
    assert names("label:team") == {"a": D(5), UNALLOCATED: D(5)}
    multi = allocation_sets(FINANCE, window=DAY, aggregate=["namespace", "label:app"])[0]
    assert costs(multi) == {"acme-ns/nlp": D(5), f"acme-ns/{UNALLOCATED}": D(3), "globex-ns/nlp": D(2)}
    assert multi["acme-ns/nlp"].properties == {"namespace": "acme-ns", "label:app": "nlp"}
    default = allocation_sets(FINANCE, window=DAY, aggregate=[])[0]
    assert set(default) == {"east/node-1/acme-ns/bert/main", "east/node-1/globex-ns/llm/main",
                            f"{UNALLOCATED}/node-2/acme-ns/vit/train"}


def test_requested_resources_from_workload_meta(fleet) -> None:
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["pod"])
    assert s["bert"].mem_requested_mb_s == D(7200)
    assert s["bert"].sm_requested_s == D(1800)
    assert s["llm"].mem_requested_mb_s is None  # a WorkloadMeta row without this container's request
    WorkloadMeta.objects.filter(pod="llm").update(requests={"main": {"mem_mb": "lots", "sm": 1}})
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["pod"])
    # Malformed is unknown.
    assert s["llm"].mem_requested_mb_s is None
    assert s["llm"].sm_requested_s == D(3600)


def test_filters(fleet) -> None:
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["pod"], filters={"label:app": ["nlp"]}, include_idle=True)
    # Workload filters leave the platform's idle whole (it belongs to no workload)...
    assert costs(s) == {"bert": D(5), "llm": D(2), IDLE: D(16)}
    # ...GPU filters narrow it.
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["pod"], filters={"node": ["node-2"]}, include_idle=True)
    assert costs(s) == {"vit": D(3), IDLE: D(3)}


def test_steps_and_accumulate(fleet) -> None:
    window = Window(utc(2026, 3, 2), utc(2026, 3, 4))
    daily = allocation_sets(FINANCE, window=window, aggregate=["namespace"], step=timedelta(days=1),
                            include_idle=True)
    assert [costs(s) for s in daily] == [{"acme-ns": D(8), "globex-ns": D(2), IDLE: D(16)}, {"acme-ns": D(10), IDLE: D(0)}]
    [whole] = allocation_sets(FINANCE, window=window, aggregate=["namespace"], step=timedelta(days=1),
                              accumulate=True, include_idle=True)
    assert costs(whole) == {"acme-ns": D(18), "globex-ns": D(2), IDLE: D(16)}
    # acme's usage runs from H to the end of H+25.
    assert (whole["acme-ns"].start, whole["acme-ns"].end) == (H, H + timedelta(hours=26))
    hourly = allocation_sets(FINANCE, window=Window(H, H + timedelta(hours=3)), aggregate=["namespace"],
                             step=timedelta(hours=1), include_idle=True)
    assert [costs(s) for s in hourly] == [{"acme-ns": D(8), "globex-ns": D(2), IDLE: D(6)}, {IDLE: D(10)}, {}]
    # A last set shorter than the step ends with the window.
    uneven = allocation_sets(FINANCE, window=Window(utc(2026, 3, 2), utc(2026, 3, 3, 12)), aggregate=["pod"],
                             step=timedelta(days=1))
    assert [len(s) for s in uneven] == [3, 1]
    assert uneven[1]["bert"].end == H + timedelta(hours=26)
    with pytest.raises(ParameterError):
        allocation_sets(FINANCE, window=Window(utc(2026, 1, 1), utc(2026, 4, 1)), aggregate=["pod"],
                        step=timedelta(hours=1))


def test_idle_by_node_and_shared(fleet) -> None:
    # OpenCost merges per-node idle into one __idle__ unless splitIdle asks for it apart.
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["namespace"], include_idle=True, idle_by_node=True)
    assert costs(s) == {"acme-ns": D(8), "globex-ns": D(2), IDLE: D(16)}
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["namespace"], include_idle=True, idle_by_node=True,
                          split_idle=True)
    assert costs(s) == {"acme-ns": D(8), "globex-ns": D(2), f"node-1/{IDLE}": D(13), f"node-2/{IDLE}": D(3)}
    assert s[f"node-2/{IDLE}"].properties == {"node": "node-2", "cluster": UNALLOCATED}
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["namespace"], include_idle=True, split_idle=True)
    assert costs(s) == {"acme-ns": D(8), "globex-ns": D(2), f"east/{IDLE}": D(13), f"{UNALLOCATED}/{IDLE}": D(3)}
    # Shared over the whole set by charge (acme 7, globex 2 of 9): 16 × 7/9 and 16 × 2/9.
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["namespace"], include_idle=True, share_idle=True)
    assert set(s) == {"acme-ns", "globex-ns"}
    assert abs(s["acme-ns"].total_cost - (D(8) + D(16) * 7 / 9)) <= D("1e-12")
    assert sum(costs(s).values()) == D(26)  # parts at ledger precision that add up exactly
    # Per node: node-1's 13 by acme 4 : globex 2; node-2's 3 onto acme alone.
    [s] = allocation_sets(FINANCE, window=DAY, aggregate=["namespace"], share_idle=True, idle_by_node=True)
    assert abs(s["globex-ns"].total_cost - (D(2) + D(13) / 3)) <= D("1e-12")
    assert abs(s["acme-ns"].shared_idle_cost - (D(1) + D(13) * 2 / 3 + D(3))) <= D("1e-12")
    assert sum(costs(s).values()) == D(26)
    # An hour of idle cards nobody charged: nothing to share it by, so it stays __idle__.
    [s] = allocation_sets(FINANCE, window=Window(H + timedelta(hours=1), H + timedelta(hours=2)),
                          aggregate=["namespace"], include_idle=True, share_idle=True)
    assert costs(s) == {IDLE: D(10)}


def test_idle_counts_the_usage_on_the_gpu_rows_that_pass_the_filters_only(fleet) -> None:
    """The idle read sums each side per set (and node) on its own: a usage row without a GPU row of
    its hour, or on a GPU row a filter drops, must still count for nothing."""
    n1 = Node.objects.get(name="node-1")
    usage_hour(n1, "GPU-z", H, tenant="acme", pod="ghost", charge="5", share="100")  # GPU-z has no GPU row
    usage_hour(n1, "GPU-a", H + timedelta(hours=2), tenant="acme", pod="late", charge="7", share="50")  # nor GPU-a then

    def idle(**kw: Any) -> list[tuple[str, D, D, D, D]]:
        rows = list_idle_rows(start=H, end=H + timedelta(hours=3), starts=None, tree=None, **{"filters": {}, **kw})
        return sorted((r.node, r.platform_idle, r.metered_seconds, r.share_gpu_s, r.charge) for r in rows)

    # H: GPU-a idle 4 (1 of it spread), GPU-b 3; H+1: GPU-a 10; shares 1440 + 720 + 1800, charges 4 + 2 + 3.
    assert idle(by_node=False) == [("", D(16), D(3 * 3600), D(3960), D(9))]
    assert idle(by_node=True) == [("node-1", D(13), D(2 * 3600), D(2160), D(6)), ("node-2", D(3), D(3600), D(1800), D(3))]
    assert idle(by_node=False, filters={"gpu_model": ["H100"]}) == [("", D(3), D(3600), D(1800), D(3))]
    assert idle(by_node=False, filters={"gpu": ["GPU-a"]}) == [("", D(13), D(2 * 3600), D(2160), D(6))]


def test_a_tenant_sees_only_its_own_and_no_platform_idle(fleet) -> None:
    [s] = allocation_sets(ACME, window=DAY, aggregate=["namespace"], include_idle=True, share_idle=True)
    assert costs(s) == {"acme-ns": D(8)}
    [s] = allocation_sets(ACME, window=DAY, aggregate=["tenant"], filters={"tenant": ["globex"]})
    assert s == {}
    assert allocation_sets(NOBODY, window=DAY, aggregate=["namespace"], include_idle=True) == [{}]


def test_day_ledger_and_hour_ledger_agree(fleet, monkeypatch) -> None:
    def read(**kw: Any) -> list[dict]:
        return allocation_sets(FINANCE, window=Window(utc(2026, 3, 2), utc(2026, 3, 4)), aggregate=["pod", "gpu"],
                               include_idle=True, share_idle=True, idle_by_node=True, **kw)

    days = read(step=timedelta(days=1))
    monkeypatch.setattr(reads, "ledger_for", lambda start, end: reads.HOURS)
    assert read(step=timedelta(days=1)) == days
