"""Ledger reads for money: invoice lines, the upcoming-invoice preview, month-to-date spend, and a
tenant's workloads, as frozen rows.

Two ways to read a period:

- **From hours** (`list_invoice_totals_from_hours`, `get_unpriced_seconds`): every workload-hour of
  the period joined to its GPU-hour. The close of a month reads this way; it is the reference.
- **Closed days plus hours** (every other read here): the UTC days of the period that are over at
  `now` and lie wholly inside it come from the day ledger (UsageDay, GpuDay: exact sums of their
  hours, billing.ledger.rollup), the rest (the day in progress, the hours after it, partial days at
  the edges) from the hour ledger. ~24x fewer rows for a month, and the same sums to the ledger
  unit: sums of exact decimals do not depend on how they are grouped.

One refinement keeps the invoice totals equal to the hour-based close: the close groups by the
GPU-hour's currency and model and keeps priced hours only. A GPU-day row carries one currency and
`priced = every hour priced`, so the days on which some GPU has both priced and unpriced hours, and
every day in which a rate card starts or ends other than at midnight (the currency may change inside
it), are read from their hours instead. A GPU's model does not change inside a day (a GPU UUID names
one card), and every GPU-hour row has metered seconds (the rollup writes none without).

The key of a row is (gpu_uuid, window) as the ledger stores it today; when the ledger carries
node_id in its keys (migration 0017_distribution_key), the GPU joins here take node_id too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Q

from billing.calendar import month_bounds
from billing.ledger.models import WorkloadMeta
from billing.ledger.reads import CLOSED_THROUGH, fetch_rows, period_read_cursor
from billing.ledger.retention import require_hours_retained
from billing.models.pricing import RateCard

__all__ = [
    "HourSpend",
    "InvoiceTotal",
    "PeriodSpend",
    "PricedSplit",
    "ScopeHourSpend",
    "ScopeSpend",
    "SpendScope",
    "TenantSpend",
    "WorkloadDay",
    "closed_days",
    "get_latest_hour",
    "get_unpriced_seconds",
    "hour_ranges_sql",
    "list_hour_spends",
    "list_invoice_totals",
    "list_invoice_totals_from_hours",
    "list_metered_periods",
    "list_month_to_date_spends",
    "list_period_spends",
    "list_scope_hour_spends",
    "list_scope_spends",
    "list_workload_days",
    "priced_split",
]

_ZERO = Decimal(0)
_Row = TypeVar("_Row")
_DAY = timedelta(days=1)
# PostgreSQL timestamps have microsecond resolution: `< at + 1 µs` is `<= at`.
_TICK = timedelta(microseconds=1)


@dataclass(frozen=True)
class InvoiceTotal:
    """Priced usage of one tenant on one GPU model and SLA tier, ledger precision."""

    tenant: str
    currency: str
    gpu_model: str
    sla_tier: str
    charge: Decimal
    idle_share: Decimal
    share_gpu_s: Decimal


@dataclass(frozen=True)
class TenantSpend:
    """Charge and idle share of a tenant over a period, ledger precision, and the same per invoice
    line (GPU model and SLA tier): `lines` of (charge, idle share), which a page rounds one by one
    as the invoice does."""

    tenant: str
    charge: Decimal
    idle_share: Decimal
    lines: tuple[tuple[Decimal, Decimal], ...] = ()

    @property
    def spend(self) -> Decimal:
        return self.charge + self.idle_share


@dataclass(frozen=True)
class HourSpend:
    """Charge plus idle share of a tenant in one ledger hour."""

    tenant: str
    hour: datetime
    spend: Decimal


@dataclass(frozen=True)
class WorkloadDay:
    """Cost (charge + idle share) and memory used on one UTC day of one pod instance, (namespace,
    pod, pod_uid), or of the tenant's other pod instances together (`workload` None)."""

    day: date
    workload: tuple[str, str, str] | None
    cost: Decimal
    mem_used_mb_s: Decimal


# --- Which part of a period comes from days -------------------------------------------------


def _midnight_floor(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _midnight_ceil(at: datetime) -> datetime:
    floor = _midnight_floor(at)
    return floor if floor == at else floor + _DAY


def closed_days(start: datetime, end: datetime, now: datetime) -> tuple[datetime, datetime] | None:
    """[first, last) midnights: the UTC days wholly inside [start, end) and over at `now`, which the
    day ledger answers for; None when there is no such day (everything is read from hours)."""
    first = _midnight_ceil(start)
    last = min(_midnight_floor(end), _midnight_floor(now))
    return (first, last) if first < last else None


@dataclass(frozen=True)
class _Split:
    """A period as day rows of [days_from, days_to) and hour rows of `hour_ranges`."""

    days_from: datetime
    days_to: datetime
    hour_ranges: tuple[tuple[datetime, datetime], ...]


def _split(start: datetime, end: datetime, now: datetime | None) -> _Split:
    """Refused (HoursPruned) when the part read from hours begins before the earliest hour kept."""
    days = None if now is None else closed_days(start, end, now)
    if days is None:
        split = _Split(start, start, ((start, end),))
    else:
        first, last = days
        split = _Split(first, last, tuple(r for r in ((start, first), (last, end)) if r[0] < r[1]))
    if split.hour_ranges:
        require_hours_retained(start=split.hour_ranges[0][0])
    return split


def hour_ranges_sql(ranges: Sequence[tuple[datetime, datetime]], column: str, params: dict[str, Any]) -> str:
    """`(column >= a AND column < b) OR ...` for `ranges`, parameters added to `params`; FALSE for none."""
    parts = []
    for i, (lo, hi) in enumerate(ranges):
        params[f"h{i}_lo"], params[f"h{i}_hi"] = lo, hi
        parts.append(f"({column} >= %(h{i}_lo)s AND {column} < %(h{i}_hi)s)")
    return "(" + " OR ".join(parts) + ")" if parts else "FALSE"


_TENANTS = "(%(tenants)s::text[] IS NULL OR {col} = ANY(%(tenants)s::text[]))"


def _tenants_param(tenants: Collection[str] | None) -> list[str] | None:
    return None if tenants is None else sorted(tenants)


def _fetch(sql: str, params: dict[str, Any], *, period_read: bool = False) -> list[tuple[Any, ...]]:
    """Rows of `sql`; with `period_read`, under the ledger's period-read planner settings."""
    if not period_read:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall())


def _fetch_as(sql: str, params: dict[str, Any], row_type: type[_Row]) -> list[_Row]:
    """Rows of `sql` as `row_type` (fields matched to column names), under the period-read settings."""
    with period_read_cursor() as cur:
        cur.execute(sql, params)
        return fetch_rows(cur, row_type)


# --- Invoice lines ----------------------------------------------------------------------------

_TOTALS_FROM_HOURS = (
    "SELECT u.tenant, g.currency, g.gpu_model, u.sla_tier, sum(u.charge) AS charge, sum(u.idle_share) AS idle_share, "  # noqa: S608 - fixed SQL
    "sum(u.share_gpu_s) AS share_gpu_s FROM billing_usagehour u JOIN billing_gpuhour g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour "
    "WHERE u.hour >= %(start)s AND u.hour < %(end)s AND g.hour >= %(start)s AND g.hour < %(end)s AND g.priced AND " + _TENANTS.format(col="u.tenant") + " "
    "GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
)


def list_invoice_totals_from_hours(
    *, start: datetime, end: datetime, tenants: Collection[str] | None = None
) -> list[InvoiceTotal]:
    """Priced usage of [start, end) per (tenant, currency, GPU model, SLA tier), from every
    workload-hour joined to its GPU-hour; of every tenant or of `tenants` only. Sorted by that key."""
    return _fetch_as(_TOTALS_FROM_HOURS, {"start": start, "end": end, "tenants": _tenants_param(tenants)},
                     InvoiceTotal)


@dataclass(frozen=True)
class PricedSplit:
    """A period as a read of priced rows takes it (module docstring): day rows of the closed days in
    [days_from, days_to) but `hour_days` (midnights), hour rows of `hour_ranges` (the rest of the
    period and those days)."""

    days_from: datetime
    days_to: datetime
    hour_days: tuple[datetime, ...]
    hour_ranges: tuple[tuple[datetime, datetime], ...]


def priced_split(start: datetime, end: datetime, now: datetime) -> PricedSplit:
    """How to read [start, end) at `now` where a row must know the rate card or currency that priced
    each of its hours: a GPU-day row says so only when all its hours were priced alike, so the days
    not wholly priced and the days with a rate-card change inside are read from their hours."""
    split = _split(start, end, now)
    hour_days = tuple(sorted(_days_with_card_changes(split.days_from, split.days_to)
                             | _days_partly_priced(split.days_from, split.days_to)))
    if hour_days:
        require_hours_retained(start=hour_days[0])
    return PricedSplit(split.days_from, split.days_to, hour_days,
                       (*split.hour_ranges, *((day, day + _DAY) for day in hour_days)))


def list_invoice_totals(
    *, start: datetime, end: datetime, now: datetime, tenants: Collection[str] | None = None
) -> list[InvoiceTotal]:
    """`list_invoice_totals_from_hours` to the ledger unit, read from closed days plus hours (module
    docstring): GPU-days not wholly priced and days with a rate-card change inside are read from
    their hours."""
    split = priced_split(start, end, now)
    params: dict[str, Any] = {"days_from": split.days_from, "days_to": split.days_to,
                              "hour_days": list(split.hour_days), "tenants": _tenants_param(tenants)}
    ranges = split.hour_ranges
    tenant_u = _TENANTS.format(col="u.tenant")
    sql = (
        "SELECT tenant, currency, gpu_model, sla_tier, sum(charge) AS charge, sum(idle_share) AS idle_share,"  # noqa: S608 - fixed SQL; values are parameters
        " sum(share_gpu_s) AS share_gpu_s FROM ("
        # Closed days, wholly priced, but for the days read from hours.
        " SELECT u.tenant, g.currency, g.gpu_model, u.sla_tier, u.charge, u.idle_share, u.share_gpu_s"
        " FROM billing_usageday u JOIN billing_gpuday g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.day = u.day"
        " WHERE u.day >= %(days_from)s AND u.day < %(days_to)s AND g.day >= %(days_from)s AND g.day < %(days_to)s"
        f" AND g.priced AND NOT (u.day = ANY(%(hour_days)s::timestamptz[])) AND {tenant_u}"
        # The hours of the rest of the period and of those days.
        " UNION ALL SELECT u.tenant, g.currency, g.gpu_model, u.sla_tier, u.charge, u.idle_share, u.share_gpu_s"
        " FROM billing_usagehour u JOIN billing_gpuhour g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid AND g.hour = u.hour"
        f" WHERE g.priced AND {hour_ranges_sql(ranges, 'u.hour', params)}"
        f" AND {hour_ranges_sql(ranges, 'g.hour', params)} AND {tenant_u}"
        ") rows GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
    )
    return _fetch_as(sql, params, InvoiceTotal)


def _days_with_card_changes(days_from: datetime, days_to: datetime) -> set[datetime]:
    """Midnights of the days in [days_from, days_to) in which a rate card starts or ends other
    than at midnight: a GPU's hours may carry two currencies that day."""
    if days_from >= days_to:
        return set()
    cards = RateCard.objects.filter(Q(effective_from__gt=days_from, effective_from__lt=days_to)
                                    | Q(effective_to__gt=days_from, effective_to__lt=days_to))
    days = set()
    for card in cards.only("effective_from", "effective_to"):
        for at in (card.effective_from, card.effective_to):
            if at is not None and days_from < at < days_to and _midnight_floor(at) != at:
                days.add(_midnight_floor(at))
    return days


def _days_partly_priced(days_from: datetime, days_to: datetime) -> set[datetime]:
    """Midnights of the days in [days_from, days_to) on which some GPU has priced and unpriced hours:
    the day row cannot tell them apart. (A rate card that starts or ends inside a day does this, and
    is found by _days_with_card_changes; this finds any other.) A GPU-day with no priced hour at all
    (a model without a card) needs no hours: the close leaves all of it out, as the day rows do."""
    if days_from >= days_to:
        return set()
    rows = _fetch("SELECT DISTINCT day FROM billing_gpuday WHERE day >= %(lo)s AND day < %(hi)s AND NOT priced "
                  "AND metered_seconds > unpriced_seconds", {"lo": days_from, "hi": days_to})
    return {r[0] for r in rows}


def get_unpriced_seconds(*, start: datetime, end: datetime) -> Decimal:
    """Metered seconds of [start, end) that no rate card priced (whole GPU-hours, as the close counts them)."""
    rows = _fetch("SELECT coalesce(sum(metered_seconds), 0) FROM billing_gpuhour WHERE hour >= %(start)s "
                  "AND hour < %(end)s AND NOT priced", {"start": start, "end": end})
    return Decimal(rows[0][0])


def get_latest_hour(*, start: datetime, end: datetime) -> datetime | None:
    """Start of the newest GPU-hour of the hour ledger in [start, end); None when there is none."""
    rows = _fetch("SELECT max(hour) FROM billing_gpuhour WHERE hour >= %(start)s AND hour < %(end)s",
                  {"start": start, "end": end})
    latest: datetime | None = rows[0][0]
    return latest


# --- Spend ------------------------------------------------------------------------------------

_USAGE_COLUMNS = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "charge", "idle_share",
                  "share_gpu_s", "mem_used_mb_s", "mem_granted_mb_s", "sm_used_s", "sm_granted_s")


def _usage_rows(split: _Split, params: dict[str, Any]) -> str:
    """A subquery of usage rows over `split`, of `params["tenants"]`: the day rows of its days and the
    hour rows of its hour ranges, with `at` (day or hour), `first_hour`, `last_hour` and _USAGE_COLUMNS."""
    params["days_from"], params["days_to"] = split.days_from, split.days_to
    columns = ", ".join(_USAGE_COLUMNS)
    return (
        f"(SELECT day AS at, first_hour, last_hour, {columns} FROM billing_usageday"  # noqa: S608 - fixed names
        f" WHERE day >= %(days_from)s AND day < %(days_to)s AND {_TENANTS.format(col='tenant')}"
        f" UNION ALL SELECT hour, hour, hour, {columns} FROM billing_usagehour"
        f" WHERE {hour_ranges_sql(split.hour_ranges, 'hour', params)} AND {_TENANTS.format(col='tenant')})"
    )


def list_month_to_date_spends(*, tenants: Collection[str], start: datetime, now: datetime) -> list[TenantSpend]:
    """Charge and idle share of each of `tenants` (sorted by slug) over the ledger hours in
    [start, now] (the hour of `now` counts, later hours not yet), in total and per invoice line (GPU
    model of the GPU row, SLA tier); a tenant without usage has 0. One query whatever the number of
    tenants."""
    spends = {slug: TenantSpend(slug, _ZERO, _ZERO) for slug in sorted(set(tenants))}
    if spends and now >= start:
        split = _split(start, now + _TICK, now)
        params: dict[str, Any] = {"tenants": list(spends), "days_from": split.days_from, "days_to": split.days_to,
                                  "month": start}
        tenant = _TENANTS.format(col="u.tenant")
        # The month's closed days from its month rows (billing.ledger.months), which hold the days
        # before CLOSED_THROUGH, wherever those are days of this read only: CLOSED_THROUGH not after the
        # last day read (a `now` before the last close, as a back-dated read asks, is read from days).
        # A big tenant has a row per workload there against one per workload and day (9.8k against
        # 52k day rows at the month's end at 1,000 GPUs). CLOSED_THROUGH is read by the statement
        # itself, so that month and day rows are one state of the ledger (a close moves days over).
        months = f"{CLOSED_THROUGH} <= %(days_to)s" if _month_to_date(start, now) else "FALSE"
        # Left joins: a usage row always has its GPU row (the rollup writes both); the model only names a
        # line, and a month row carries its GPU-days' model.
        rows = _fetch(
            "SELECT tenant, gpu_model, sla_tier, sum(charge), sum(idle_share) FROM ("  # noqa: S608 - fixed SQL; values are parameters
            " SELECT u.tenant, coalesce(u.gpu_model, '') AS gpu_model, u.sla_tier, u.charge, u.idle_share"
            f" FROM billing_usagemonth u WHERE u.month = %(month)s AND {months} AND {tenant}"
            " UNION ALL SELECT u.tenant, coalesce(g.gpu_model, ''), u.sla_tier, u.charge, u.idle_share"
            " FROM billing_usageday u LEFT JOIN billing_gpuday g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid"
            " AND g.day = u.day AND g.day >= %(days_from)s AND g.day < %(days_to)s"
            f" WHERE u.day >= (CASE WHEN {months} THEN greatest({CLOSED_THROUGH}, %(days_from)s) ELSE %(days_from)s END)"
            f" AND u.day < %(days_to)s AND {tenant}"
            " UNION ALL SELECT u.tenant, coalesce(g.gpu_model, ''), u.sla_tier, u.charge, u.idle_share"
            " FROM billing_usagehour u LEFT JOIN billing_gpuhour g ON g.node_id = u.node_id AND g.gpu_uuid = u.gpu_uuid"
            f" AND g.hour = u.hour AND {hour_ranges_sql(split.hour_ranges, 'g.hour', params)}"
            f" WHERE {hour_ranges_sql(split.hour_ranges, 'u.hour', params)} AND {tenant}"
            ") rows GROUP BY 1, 2, 3 ORDER BY 1, 2, 3", params, period_read=True)
        lines: dict[str, list[tuple[Decimal, Decimal]]] = {}
        for slug, _model, _tier, charge, idle in rows:
            lines.setdefault(slug, []).append((charge, idle))
        spends.update({slug: TenantSpend(slug, sum((c for c, _i in parts), _ZERO), sum((i for _c, i in parts), _ZERO),
                                         tuple(parts)) for slug, parts in lines.items()})
    return list(spends.values())


def _month_to_date(start: datetime, now: datetime) -> bool:
    """Whether [start, now] is a month to date: `start` a UTC month's first midnight (a month row's
    month) and `now` inside that month, so that the month's rows hold no day after the ones read."""
    first, after = month_bounds(start.astimezone(UTC).date())
    return start == first and now < after


def list_hour_spends(*, tenants: Collection[str], since: datetime, until: datetime) -> list[HourSpend]:
    """Charge plus idle share of each of `tenants` in each ledger hour of [since, until) with usage,
    from the hour ledger (a short window: the forecast's recent complete hours), sorted by tenant
    and hour. One query whatever the number of tenants."""
    if not tenants or since >= until:
        return []
    return _fetch_as(
        "SELECT tenant, hour, sum(charge) + sum(idle_share) AS spend FROM billing_usagehour "
        "WHERE tenant = ANY(%(tenants)s::text[]) AND hour >= %(since)s AND hour < %(until)s GROUP BY 1, 2 ORDER BY 1, 2",
        {"tenants": sorted(set(tenants)), "since": since, "until": until}, HourSpend,
    )


# --- Spend of a part of a tenant (budgets by namespace and label) ------------------------------


@dataclass(frozen=True)
class SpendScope:
    """The usage a budget counts: all of a tenant's, or the part of it in one namespace, or the
    part whose pod carries a label (`label`: (key, value), matched against the labels the agent last
    reported for the pod, WorkloadMeta.labels; only labels on the agents' allow-list are known)."""

    tenant: str
    namespace: str | None = None
    label: tuple[str, str] | None = None


@dataclass(frozen=True)
class ScopeSpend:
    """Charge and idle share of the scope at `index` (in the list asked) over a period."""

    index: int
    charge: Decimal
    idle_share: Decimal

    @property
    def spend(self) -> Decimal:
        return self.charge + self.idle_share


@dataclass(frozen=True)
class ScopeHourSpend:
    """Charge plus idle share of the scope at `index` in one ledger hour."""

    index: int
    hour: datetime
    spend: Decimal


_META = WorkloadMeta._meta.db_table


def _scopes_sql(scopes: Sequence[SpendScope], params: dict[str, Any]) -> str:
    """`JOIN s ON ...`: each usage row `u` (with node_id, tenant, namespace, pod, pod_uid) joined to
    every scope it belongs to (a row counts in a tenant's budget and in its namespace's alike)."""
    params["s_tenant"] = [s.tenant for s in scopes]
    params["s_namespace"] = [s.namespace for s in scopes]
    params["s_key"] = [s.label[0] if s.label else None for s in scopes]
    params["s_value"] = [s.label[1] if s.label else None for s in scopes]
    params["tenants"] = sorted({s.tenant for s in scopes})
    meta = ""
    if any(s.label for s in scopes):
        meta = (f" LEFT JOIN {_META} m ON m.node_id = u.node_id AND m.namespace = u.namespace AND m.pod = u.pod"
                " AND m.pod_uid = u.pod_uid")
    label = "(s.label_key IS NULL OR m.labels ->> s.label_key = s.label_value)" if meta else "TRUE"
    return (f"{meta} JOIN unnest(%(s_tenant)s::text[], %(s_namespace)s::text[], %(s_key)s::text[], "
            "%(s_value)s::text[]) WITH ORDINALITY AS s(tenant, namespace, label_key, label_value, i) "
            f"ON s.tenant = u.tenant AND (s.namespace IS NULL OR s.namespace = u.namespace) AND {label}")


def list_scope_spends(*, scopes: Sequence[SpendScope], start: datetime, now: datetime) -> list[ScopeSpend]:
    """Charge and idle share of each of `scopes` over the ledger hours in [start, now] (the hour of
    `now` counts), read like `list_month_to_date_spends` (closed days plus hours), one per scope in
    the order given (0 without usage). One query whatever the number of scopes."""
    spends = [ScopeSpend(i, _ZERO, _ZERO) for i in range(len(scopes))]
    if not scopes or now < start:
        return spends
    params: dict[str, Any] = {}
    split = _split(start, now + _TICK, now)
    params["days_from"], params["days_to"] = split.days_from, split.days_to
    columns = "node_id, tenant, namespace, pod, pod_uid, charge, idle_share"
    rows = (
        f"(SELECT {columns} FROM billing_usageday WHERE day >= %(days_from)s AND day < %(days_to)s"  # noqa: S608 - fixed names
        f" AND {_TENANTS.format(col='tenant')} UNION ALL SELECT {columns} FROM billing_usagehour"
        f" WHERE {hour_ranges_sql(split.hour_ranges, 'hour', params)} AND {_TENANTS.format(col='tenant')})"
    )
    join = _scopes_sql(scopes, params)
    for index, charge, idle in _fetch(f"SELECT s.i, sum(u.charge), sum(u.idle_share) FROM {rows} u{join} GROUP BY 1",  # noqa: S608 - fixed SQL; values are parameters
                                      params, period_read=True):
        spends[index - 1] = ScopeSpend(index - 1, charge, idle)
    return spends


def list_scope_hour_spends(*, scopes: Sequence[SpendScope], since: datetime, until: datetime) -> list[ScopeHourSpend]:
    """Charge plus idle share of each of `scopes` in each ledger hour of [since, until) with usage,
    from the hour ledger, sorted by scope (its index in `scopes`) and hour."""
    if not scopes or since >= until:
        return []
    params: dict[str, Any] = {"since": since, "until": until}
    join = _scopes_sql(scopes, params)
    rows = _fetch(
        "SELECT s.i, u.hour, sum(u.charge) + sum(u.idle_share) FROM billing_usagehour u"  # noqa: S608 - fixed SQL; values are parameters
        f"{join} WHERE u.tenant = ANY(%(tenants)s::text[]) AND u.hour >= %(since)s AND u.hour < %(until)s"
        " GROUP BY 1, 2 ORDER BY 1, 2", params)
    return [ScopeHourSpend(index - 1, hour, spend) for index, hour, spend in rows]


# --- Spend of chosen periods (anomaly alerts) ------------------------------------------------


@dataclass(frozen=True)
class PeriodSpend:
    """Charge plus idle share of a tenant (and namespace, "" when not asked per namespace) in one
    ledger hour or UTC day."""

    tenant: str
    namespace: str
    at: datetime
    spend: Decimal


# Granularity -> (usage table, GPU table, column): whole days come from the day ledger.
_PERIOD_TABLES = {"hour": ("billing_usagehour", "billing_gpuhour", "hour"),
                  "day": ("billing_usageday", "billing_gpuday", "day")}


def list_period_spends(*, granularity: str, periods: Sequence[datetime], by_namespace: bool,
                       tenant: str | None) -> list[PeriodSpend]:
    """Charge plus idle share in each of `periods` (starts of ledger hours, or midnights UTC with
    "day"), per tenant (of `tenant` only unless None) and, with `by_namespace`, per namespace; only
    groups with usage. One statement, however scattered the periods (a baseline's weeks)."""
    usage, _gpus, at = _PERIOD_TABLES[granularity]
    namespace = "namespace" if by_namespace else "''"
    return _fetch_as(
        f"SELECT tenant, {namespace} AS namespace, {at} AS at, sum(charge) + sum(idle_share) AS spend FROM {usage} "  # noqa: S608 - fixed names; values are parameters
        f"WHERE {at} = ANY(%(periods)s::timestamptz[]) AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s) "
        "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        {"periods": list(periods), "tenant": tenant}, PeriodSpend)


def list_metered_periods(*, granularity: str, periods: Sequence[datetime]) -> set[datetime]:
    """Which of `periods` the ledger metered any GPU in: a baseline period without any is no
    history (the service was not metering), unlike one in which a tenant spent nothing."""
    _usage, gpus, at = _PERIOD_TABLES[granularity]
    rows = _fetch(f"SELECT DISTINCT {at} FROM {gpus} WHERE {at} = ANY(%(periods)s::timestamptz[])",  # noqa: S608 - fixed names
                  {"periods": list(periods)})
    return {row[0] for row in rows}


# --- A tenant's workloads ---------------------------------------------------------------------


def list_workload_days(
    *, tenant: str, start: datetime, end: datetime, now: datetime, workloads: Sequence[tuple[str, str, str]]
) -> list[WorkloadDay]:
    """Per UTC day of [start, end) with usage of `tenant`: the cost (charge + idle share) and memory
    used of each of `workloads` ((namespace, pod, pod_uid) keys: the charted ones) and, with
    `workload` None, of all its other workloads together."""
    params: dict[str, Any] = {"tenants": [tenant], "namespaces": [w[0] for w in workloads],
                              "pods": [w[1] for w in workloads], "pod_uids": [w[2] for w in workloads]}
    rows = _fetch_as(
        "SELECT date_trunc('day', u.at, 'UTC') AS day, k.i AS workload, sum(u.charge) + sum(u.idle_share) AS cost, "  # noqa: S608 - fixed SQL; values are parameters
        "sum(u.mem_used_mb_s) AS mem_used_mb_s "
        f"FROM {_usage_rows(_split(start, end, now), params)} u "
        "LEFT JOIN unnest(%(namespaces)s::text[], %(pods)s::text[], %(pod_uids)s::text[]) WITH ORDINALITY "
        "AS k(namespace, pod, pod_uid, i) ON k.namespace = u.namespace AND k.pod = u.pod AND k.pod_uid = u.pod_uid "
        "GROUP BY 1, 2",
        params, _WorkloadDayRow,
    )
    return [WorkloadDay(day=r.day.astimezone(UTC).date(), workload=None if r.workload is None else workloads[r.workload - 1],
                        cost=r.cost, mem_used_mb_s=r.mem_used_mb_s) for r in rows]


@dataclass(frozen=True)
class _WorkloadDayRow:
    day: datetime
    workload: int | None  # 1-based index into the charted workloads; None: all the others
    cost: Decimal
    mem_used_mb_s: Decimal
