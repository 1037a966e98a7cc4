"""Evaluating the alert rules (docs/alerts.md): what each finds now, and which of it is new.

Spend anomalies are periods: every evaluation looks again at the complete periods of the last day
(hours) or two (days), so usage that lands late still counts, and raises an AlertEvent for the
first period of each run of anomalous periods, once (a unique key: rule, scope, period). Idle share
and over-granting are conditions over a trailing window: each rule and scope keeps a flag
(AlertState, its row locked while compared), a crossing above raises one AlertEvent and a crossing
back is audited, as the budgets' forecast-over-budget flag is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db import IntegrityError, transaction

from billing.ledger.allocation import UNALLOCATED, list_usage_groups
from billing.ledger.spend import list_metered_periods, list_period_spends
from billing.ledger.totals import get_priced_currency, list_gpu_totals_by_node
from billing.models import AlertEvent, AlertGranularity, AlertGrouping, AlertKind, AlertResource, AlertRule, AlertState
from billing.money import amount_text
from billing.services.alerts.detect import (
    MAD_TO_SIGMA,
    MIN_HISTORY,
    RELATIVE_SPREAD,
    anomaly_verdict,
    idle_share_pct,
    over_granting_ratio,
)
from billing.services.audit import record_audit_event

__all__ = ["CHECKED_PERIODS", "OVER_GRANTING_CAP", "evaluate_alerts"]

_HOUR, _DAY, _WEEK = timedelta(hours=1), timedelta(days=1), timedelta(weeks=1)
# The complete periods every evaluation looks at again: a day of hours, or two days.
CHECKED_PERIODS = {AlertGranularity.HOUR: 24, AlertGranularity.DAY: 2}
# Granted ÷ used is stored at most this (a workload that used nothing is over-granted without bound).
OVER_GRANTING_CAP = Decimal(1_000_000)


@dataclass(frozen=True)
class Finding:
    """What a rule found for one scope now."""

    key: str
    firing: bool
    value: Decimal
    period_start: datetime
    period_end: datetime
    currency: str
    explore_path: str
    details: dict[str, Any] = field(default_factory=dict)
    baseline: Decimal | None = None
    score: Decimal | None = None


def evaluate_alerts(*, now: datetime) -> list[int]:
    """Evaluate every enabled rule at `now`; returns the ids of the AlertEvents raised (to be
    delivered after commit). Idempotent: evaluating again at the same data raises nothing new."""
    raised: list[int] = []
    for rule in AlertRule.objects.filter(enabled=True).select_related("tenant").order_by("pk"):
        if rule.kind == AlertKind.SPEND_ANOMALY:
            raised += _raise_anomalies(rule, _anomalies(rule, now=now), now=now)
        elif rule.kind == AlertKind.IDLE_SHARE:
            raised += _raise_crossings(rule, _idle_findings(rule, now=now), now=now)
        else:
            raised += _raise_crossings(rule, _over_granting_findings(rule, now=now), now=now)
    return raised


def _explore(start: datetime, end: datetime, **steps: str) -> str:
    """The Explore view of [start, end) (whole UTC days, both ends included) down the path `steps`."""
    last = end - timedelta(microseconds=1)
    query = {"start": f"{start.astimezone(UTC):%Y-%m-%d}", "end": f"{last.astimezone(UTC):%Y-%m-%d}", **steps}
    return "/explore/?" + urlencode({k: v for k, v in query.items() if v})


def _floor_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


# --- Spend anomalies -------------------------------------------------------------------------------

def _method(rule: AlertRule) -> str:
    unit = "hour" if rule.granularity == AlertGranularity.HOUR else "day"
    return (f"robust z-score of the {unit}'s spend against the same {unit} of each of the previous "
            f"{rule.baseline_weeks} weeks: (spend - median) / max({MAD_TO_SIGMA} x MAD, "
            f"{RELATIVE_SPREAD * 100:.0f} % of the median, floor / threshold); anomalous at z >= {rule.threshold} "
            f"with spend at least {rule.min_amount} {rule.currency} above the median; at least {MIN_HISTORY} of "
            f"those weeks with spend")


def _anomalies(rule: AlertRule, *, now: datetime) -> list[Finding]:
    """Each anomalous checked period that starts a run of them (the period before it is not)."""
    period = _HOUR if rule.granularity == AlertGranularity.HOUR else _DAY
    last = (_floor_hour(now) if period == _HOUR else _floor_hour(now).replace(hour=0)) - period
    checked = [last - i * period for i in range(CHECKED_PERIODS[AlertGranularity(rule.granularity)], -1, -1)]
    needed = sorted({p - k * _WEEK for p in checked for k in range(rule.baseline_weeks + 1)})
    by_namespace = rule.group_by == AlertGrouping.NAMESPACE
    spends: dict[tuple[str, str], dict[datetime, Decimal]] = {}
    for row in list_period_spends(granularity=rule.granularity, periods=needed, by_namespace=by_namespace,
                                  tenant=rule.tenant.slug if rule.tenant else None):
        spends.setdefault((row.tenant, row.namespace), {})[row.at] = row.spend
    metered = list_metered_periods(granularity=rule.granularity, periods=needed)
    currency = get_priced_currency(start=needed[0], end=last + period) or rule.currency
    findings = []
    for (tenant, namespace), series in sorted(spends.items()):
        previous = None
        for p in checked:
            baseline = [series.get(p - k * _WEEK, Decimal(0)) for k in range(1, rule.baseline_weeks + 1)
                        if p - k * _WEEK in metered]
            verdict = anomaly_verdict(series.get(p, Decimal(0)), baseline, threshold=rule.threshold,
                                      floor=rule.min_amount)
            anomalous = verdict is not None and verdict.anomalous
            if anomalous and previous is False and verdict is not None:
                key = f"{tenant}/{namespace}" if by_namespace else tenant
                findings.append(Finding(
                    key=key, firing=True, value=verdict.value, period_start=p, period_end=p + period,
                    currency=currency, baseline=verdict.median, score=verdict.score.quantize(Decimal("0.001")),
                    explore_path=_explore(p, p + period, tenant=tenant, namespace=namespace),
                    details={"method": _method(rule), "granularity": rule.granularity, "weeks": rule.baseline_weeks,
                             "baseline": [amount_text(b, currency) for b in baseline],
                             "median": amount_text(verdict.median, currency),
                             "excess": amount_text(verdict.value - verdict.median, currency),
                             "score": f"{verdict.score:.1f}", "threshold": str(rule.threshold),
                             "floor": str(rule.min_amount), "tenant": tenant, "namespace": namespace},
                ))
            # The first checked period only says whether a run was already going on before the rest.
            previous = anomalous
    return findings


def _raise_anomalies(rule: AlertRule, findings: Iterable[Finding], *, now: datetime) -> list[int]:
    raised = []
    for finding in findings:
        try:
            with transaction.atomic():
                raised.append(_raise(rule, finding, now=now))
        except IntegrityError:
            continue  # this run was alerted already (alert_event_anomaly_once)
    return raised


# --- Idle share and over-granting: crossings of a threshold ----------------------------------------

def _window(rule: AlertRule, now: datetime) -> tuple[datetime, datetime]:
    end = _floor_hour(now)
    return end - timedelta(hours=rule.window_hours), end


def _idle_findings(rule: AlertRule, *, now: datetime) -> list[Finding]:
    start, end = _window(rule, now)
    currency = get_priced_currency(start=start, end=end) or rule.currency
    by_node = list_gpu_totals_by_node(start=start, end=end)
    if rule.group_by == AlertGrouping.FLEET:
        scopes = {"fleet": ("", list(by_node.values()))}
    else:
        scopes = {f"node {name}": (name, [totals]) for name, totals in by_node.items()}
    findings = []
    for key, (node, parts) in sorted(scopes.items()):
        idle, card = sum((t.idle_cost for t in parts), Decimal(0)), sum((t.card_cost for t in parts), Decimal(0))
        pct = idle_share_pct(idle_cost=idle, card_cost=card)
        if pct is None:
            continue
        findings.append(Finding(
            key=key, firing=pct > rule.threshold and idle >= rule.min_amount, value=pct, period_start=start,
            period_end=end, currency=currency, explore_path=_explore(start, end, node=node),
            details={"method": (f"idle cost / cost of the cards over the last {rule.window_hours} hours; alerting "
                                f"above {rule.threshold} % with at least {rule.min_amount} {rule.currency} idle"),
                     "idle_pct": f"{pct:.1f}", "idle_cost": amount_text(idle, currency),
                     "card_cost": amount_text(card, currency), "threshold": str(rule.threshold),
                     "floor": str(rule.min_amount), "node": node},
        ))
    return findings


_UNITS = {AlertResource.MEMORY: ("mem_granted_mb_s", "mem_used_mb_s", "GB·h", Decimal(1024 * 3600)),
          AlertResource.SM: ("sm_granted_s", "sm_used_s", "SM·h", Decimal(3600))}


def _over_granting_findings(rule: AlertRule, *, now: datetime) -> list[Finding]:
    start, end = _window(rule, now)
    currency = get_priced_currency(start=start, end=end) or rule.currency
    tenants = [rule.tenant.slug] if rule.tenant else None
    granted_field, used_field, unit, per_unit = _UNITS[AlertResource(rule.resource)]
    findings = []
    rows = list_usage_groups(start=start, end=end, starts=None, keys=["tenant", "namespace", "controller"], filters={},
                             tenants=tenants, by_node=False)
    for row in sorted(rows, key=lambda r: r.keys):
        tenant, namespace, controller = row.keys
        granted, used = getattr(row, granted_field), getattr(row, used_field)
        ratio = over_granting_ratio(granted=granted, used=used)
        if ratio is None:
            continue
        ratio = min(ratio, OVER_GRANTING_CAP)
        cost = row.charge + row.idle_share
        steps = {"tenant": tenant, "namespace": namespace, "controller": controller}
        findings.append(Finding(
            key=f"{tenant}/{namespace}/{controller if controller != UNALLOCATED else '(no controller)'}",
            firing=ratio > rule.threshold and cost >= rule.min_amount, value=ratio, period_start=start,
            period_end=end, currency=currency, explore_path=_explore(start, end, **steps),
            details={"method": (f"{AlertResource(rule.resource).label} granted / used over the last "
                                f"{rule.window_hours} hours, per controller; alerting above {rule.threshold}x for "
                                f"workloads costing at least {rule.min_amount} {rule.currency}"),
                     "ratio_text": f"{ratio:.1f}" if ratio < OVER_GRANTING_CAP else f"≥{OVER_GRANTING_CAP}",
                     "resource": rule.resource, "unit": unit,
                     "granted": f"{granted / per_unit:.2f}", "used": f"{used / per_unit:.2f}",
                     "cost": amount_text(cost, currency), "threshold": str(rule.threshold),
                     "floor": str(rule.min_amount), **steps},
        ))
    return findings


def _raise_crossings(rule: AlertRule, findings: list[Finding], *, now: datetime) -> list[int]:
    """Compare each scope's flag with what it held (row locked): a crossing above raises an alert,
    a crossing back is audited. A scope no longer found (a node gone) crosses back."""
    raised = []
    found = {f.key: f for f in findings}
    stale = AlertState.objects.filter(rule=rule, firing=True).exclude(key__in=list(found)).values_list("key", flat=True)
    for key in sorted({*found, *stale}):
        finding = found.get(key)
        with transaction.atomic():
            state, _created = AlertState.objects.select_for_update().get_or_create(
                rule=rule, key=key, defaults={"evaluated_at": now, "changed_at": now})
            firing = finding is not None and finding.firing
            was_firing = state.firing
            state.firing, state.evaluated_at = firing, now
            state.value = finding.value if finding is not None else Decimal(0)
            if firing != was_firing:
                state.changed_at = now
                if finding is not None and firing:
                    raised.append(_raise(rule, finding, now=now))
                else:
                    record_audit_event(at=now, actor_label="system", action="alert.cleared", object_type="alert_rule",
                                       object_id=str(rule.pk), before={"key": key, "firing": True},
                                       after={"key": key, "firing": False,
                                              "value": None if finding is None else str(finding.value)})
            state.save()
    return raised


def _raise(rule: AlertRule, finding: Finding, *, now: datetime) -> int:
    """Write the alert and its audit event (inside the caller's transaction)."""
    event = AlertEvent.objects.create(
        rule=rule, kind=rule.kind, key=finding.key, period_start=finding.period_start, period_end=finding.period_end,
        value=finding.value, baseline=finding.baseline, score=finding.score, currency=finding.currency,
        details=finding.details, explore_path=finding.explore_path, fired_at=now,
    )
    record_audit_event(at=now, actor_label="system", action="alert.fired", object_type="alert_rule",
                       object_id=str(rule.pk), before=None,
                       after={"event": event.pk, "kind": rule.kind, "key": finding.key,
                              "period_start": finding.period_start.isoformat(), "value": str(finding.value)})
    return event.pk
