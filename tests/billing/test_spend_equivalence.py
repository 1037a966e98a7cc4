"""The upcoming invoice and month-to-date spend read closed days from the day ledger plus the rest
from hours (billing.ledger.spend); the close reads every workload-hour. For random ledgers (several
GPUs, tenants and tiers, priced, unpriced and partly priced hours, rate cards that change mid-month
and mid-day, in another currency too, late usage for a closed month) and `now` on the first of the
month, at a midnight, mid-day, on the last day, 29 February, the preview's lines and totals are the
close's, to the ledger unit and after the one rounding; the spend is the sum of the hour rows."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.calendar import month_bounds
from billing.errors import InvalidInput
from billing.ledger import spend
from billing.ledger.models import GpuHour, UsageHour
from billing.ledger.rollup import rebuild_days
from billing.models import Invoice, Node, RateCard
from billing.services.budgets.spend import get_month_to_date_spends
from billing.services.invoicing.close import close_period, preview_invoices

pytestmark = pytest.mark.django_db

A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
TENANTS = ("acme", "globex", "initech")
# February 2024 has a 29th; the others are a 31-day month, a 30-day month and a year's end.
MONTHS = (date(2024, 2, 1), date(2026, 1, 1), date(2026, 4, 1), date(2025, 12, 1))
UNIT = Decimal(1).scaleb(-12)  # the ledger unit


@dataclass(frozen=True)
class Card:
    model: str
    start: datetime
    end: datetime | None
    currency: str


@dataclass(frozen=True)
class Row:
    """One workload-hour: GPU index, hour, identity, amounts in ledger units."""

    gpu: int
    hour: datetime
    tenant: str
    tier: str
    pod: str
    charge_units: int
    idle_units: int
    share_units: int


@dataclass(frozen=True)
class Ledger:
    month: date
    now: datetime
    models: tuple[str, ...]
    cards: tuple[Card, ...]
    partly_priced: frozenset[tuple[int, datetime]]  # (gpu, hour) with an unpriced minute
    rows: tuple[Row, ...]
    late_rows: tuple[Row, ...]  # for the month before, after it was closed


def _nows(start: datetime, days: int) -> st.SearchStrategy[datetime]:
    """`now` inside the month: its first instant, a midnight, mid-day, the last day, the last instant."""
    day = st.integers(0, days - 1).map(lambda d: start + timedelta(days=d))
    return st.one_of(
        st.just(start),
        st.just(start + timedelta(hours=12, minutes=30)),
        day,
        day.map(lambda d: d + timedelta(hours=13, minutes=17, seconds=5)),
        st.just(start + timedelta(days=days - 1, hours=6)),
        st.just(start + timedelta(days=days) - timedelta(microseconds=1)),
    )


def _hours_near(start: datetime, days: int, *edges: datetime) -> st.SearchStrategy[datetime]:
    """Any hour of the month, biased to the edges: the hours around `edges` (`now`, rate-card
    changes), around midnights, the first and the last."""
    n = days * 24

    def around(at: datetime) -> st.SearchStrategy[int]:
        index = min(max(int((at - start).total_seconds() // 3600), 0), n - 1)
        return st.integers(max(0, index - 3), min(n - 1, index + 3))

    midnight = st.integers(0, days - 1).flatmap(lambda d: st.sampled_from([max(0, d * 24 - 1), d * 24]))
    return st.one_of(st.integers(0, n - 1), *(around(e) for e in edges), midnight,
                     st.sampled_from([0, n - 1])).map(lambda i: start + timedelta(hours=i))


def _rows(hours: st.SearchStrategy[datetime], gpus: int, max_size: int) -> st.SearchStrategy[list[Row]]:
    amount = st.integers(0, 10**15)
    row = st.builds(
        Row, gpu=st.integers(0, gpus - 1), hour=hours, tenant=st.sampled_from(TENANTS),
        tier=st.sampled_from(("gold", "bronze")), pod=st.sampled_from(("p1", "p2")), charge_units=amount,
        idle_units=st.one_of(st.just(0), amount), share_units=st.integers(0, 3600 * 10**12),
    )
    return st.lists(row, min_size=0, max_size=max_size,
                    unique_by=lambda r: (r.gpu, r.hour, r.tenant, r.tier, r.pod))


@st.composite
def ledgers(draw: st.DrawFn) -> Ledger:
    month = draw(st.sampled_from(MONTHS))
    start, end = month_bounds(month)
    prev_start, _ = month_bounds((start - timedelta(days=1)).date().replace(day=1))
    days = (end - start).days
    now = draw(_nows(start, days))
    gpus = draw(st.integers(1, 3))
    models = tuple(draw(st.sampled_from((A100, H100))) for _ in range(gpus))
    cards = []
    for model in sorted(set(models)):
        # The first card from long before; a change at some hour of the month (mid-day or at midnight),
        # maybe after a gap of unpriced hours, maybe in another currency.
        change = start + timedelta(hours=draw(st.integers(0, days * 24 - 1)))
        gap = timedelta(hours=draw(st.sampled_from((0, 0, 0, 1, 30))))
        cards.append(Card(model, prev_start - timedelta(days=400), change, "USD"))
        cards.append(Card(model, change + gap, None, draw(st.sampled_from(("USD", "EUR")))))
    hours = _hours_near(start, days, now, *(c.start for c in cards if c.start >= start))
    rows = draw(_rows(hours, gpus, 25))
    # Usage on both sides of a card change, on one GPU: the day then holds two cards' hours.
    for card in (c for c in cards if c.start >= start and draw(st.booleans())):
        gpu = next((i for i, m in enumerate(models) if m == card.model), None)
        for hour in (card.start - timedelta(hours=1), card.start):
            if gpu is not None and start <= hour < end:
                rows.append(Row(gpu, hour, draw(st.sampled_from(TENANTS)), "gold", "p3", draw(st.integers(0, 10**15)),
                                0, 10**12))
    partly = draw(st.frozensets(st.tuples(st.integers(0, gpus - 1), hours), max_size=3))
    late = draw(st.one_of(st.just([]), _rows(_hours_near(prev_start, (start - prev_start).days, start), gpus, 6)))
    return Ledger(month, now, models, tuple(cards), partly, tuple(rows), tuple(late))


def _card_at(cards: tuple[Card, ...], model: str, hour: datetime) -> Card | None:
    return next((c for c in cards if c.model == model and c.start <= hour and (c.end is None or hour < c.end)), None)


def _write(ledger: Ledger, rows: tuple[Row, ...]) -> None:
    """The hour rows as the rollup would leave them (currency and `priced` from the cards), then the
    day ledger derived from them."""
    node = Node.objects.get_or_create(name="gpu-node-1")[0]
    gpu_hours: dict[tuple[int, datetime], list[Row]] = defaultdict(list)
    for r in rows:
        gpu_hours[(r.gpu, r.hour)].append(r)
    usage: list[UsageHour] = []
    gpus: list[GpuHour] = []
    for (gpu, hour), its_rows in gpu_hours.items():
        model = ledger.models[gpu]
        card = _card_at(ledger.cards, model, hour)
        priced = card is not None and (gpu, hour) not in ledger.partly_priced
        # A priced hour holds charges; so does one priced only in part (bool_and of its minutes).
        charged = card is not None
        charge_sum = sum(r.charge_units for r in its_rows) if charged else 0
        gpus.append(GpuHour(
            gpu_uuid=f"GPU-{gpu}", node=node, gpu_model=model, hour=hour, metered_seconds=3600,
            card_cost=(charge_sum + 1) * UNIT, charged=charge_sum * UNIT, idle_cost=UNIT, idle_allocated=0,
            currency=card.currency if card else "", priced=priced,
        ))
        usage.extend(UsageHour(
            gpu_uuid=f"GPU-{gpu}", node=node, tenant=r.tenant, namespace=f"{r.tenant}-ns", pod=r.pod,
            container="main", pod_uid=f"uid-{r.pod}", sla_tier=r.tier, hour=hour, seconds=3600,
            mem_used_mb_s=1, mem_granted_mb_s=1, mem_billed_mb_s=1, sm_used_s=1, sm_granted_s=1, sm_billed_s=1,
            pcie_mb=0, share_gpu_s=r.share_units * UNIT, charge=(r.charge_units if charged else 0) * UNIT,
            idle_share=(r.idle_units if charged else 0) * UNIT,
        ) for r in its_rows)
    GpuHour.objects.bulk_create(gpus, ignore_conflicts=True)  # late rows may add to an hour written before
    UsageHour.objects.bulk_create(usage)
    if rows:
        hours = [r.hour for r in rows]
        rebuild_days(start=min(hours), end=max(hours) + timedelta(hours=1))


def _cards(ledger: Ledger) -> None:
    RateCard.objects.bulk_create([
        RateCard(gpu_model=c.model, currency=c.currency, price_per_gpu_hour=Decimal("2.5"), effective_from=c.start,
                 effective_to=c.end, source_url="https://example.org")
        for c in ledger.cards
    ])


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except InvalidInput as exc:
        return ("refused", str(exc))


def _stored(lines: Any) -> list[tuple[Any, ...]]:
    return sorted((x.kind, x.gpu_model, x.sla_tier, x.usage_month, x.gpu_hours, x.amount, x.amount_minor)
                  for x in lines)


def _check(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    start, end = month_bounds(ledger.month)
    _cards(ledger)
    if ledger.late_rows:
        prev = (start - timedelta(days=1)).date().replace(day=1)
        half = len(ledger.late_rows) // 2
        _write(ledger, ledger.late_rows[:half])
        _outcome(lambda: close_period(month=prev, now=start + timedelta(days=1)))
        _write(ledger, ledger.late_rows[half:])  # late usage: adjustment lines on this month's invoice
    _write(ledger, ledger.rows)

    preview = _outcome(lambda: preview_invoices(month=ledger.month, now=ledger.now))
    with monkeypatch.context() as m:  # the preview as it was before the day ledger: every day from hours
        m.setattr(spend, "closed_days", lambda start, end, now: None)
        with_hours_only = _outcome(lambda: preview_invoices(month=ledger.month, now=ledger.now))
    closed = _outcome(lambda: close_period(month=ledger.month, now=end + timedelta(days=1)))
    if isinstance(closed, tuple):
        assert preview == closed == with_hours_only
        return
    invoices = {i.tenant.slug: i for i in Invoice.objects.filter(period__month=ledger.month).select_related("tenant")}
    assert set(preview) == set(invoices)
    for slug, p in preview.items():
        invoice = invoices[slug]
        assert _stored(p.lines) == _stored(invoice.lines.all()), slug
        assert (p.total_minor, p.currency) == (invoice.total_minor, invoice.currency), slug
    assert preview == with_hours_only

    # Month-to-date spend: the hour rows of [month start, now], charge plus idle share.
    expected = dict.fromkeys(TENANTS, Decimal(0))
    for u in UsageHour.objects.filter(hour__gte=start, hour__lte=ledger.now):
        expected[u.tenant] += u.charge + u.idle_share
    assert get_month_to_date_spends(tenants=TENANTS, now=ledger.now) == expected


@hypothesis_settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ledger=ledgers())
def test_the_preview_from_closed_days_and_hours_is_the_hour_based_close(
        ledger: Ledger, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.VGPU_LATE_USAGE_HORIZON = timedelta(days=36500)
    # Each example in a savepoint rolled back: examples share the test's database.
    with transaction.atomic():
        _check(ledger, monkeypatch)
        transaction.set_rollback(True)


def test_closed_days_are_the_whole_utc_days_inside_the_period_that_are_over() -> None:
    start = datetime(2024, 2, 1, tzinfo=UTC)
    end = datetime(2024, 3, 1, tzinfo=UTC)
    assert spend.closed_days(start, end, start) is None  # on the 1st at 00:00: nothing is over
    assert spend.closed_days(start, end, start + timedelta(hours=23)) is None
    assert spend.closed_days(start, end, datetime(2024, 2, 29, tzinfo=UTC)) == (start, datetime(2024, 2, 29, tzinfo=UTC))
    assert spend.closed_days(start, end, datetime(2024, 3, 9, tzinfo=UTC)) == (start, end)  # the month is over
    # Partial days at the edges are not the day ledger's.
    assert spend.closed_days(start + timedelta(hours=1), end, end) == (start + timedelta(days=1), end)
    assert spend.closed_days(start, end - timedelta(minutes=1), end) == (start, end - timedelta(days=1))


def test_a_day_with_a_mid_day_currency_change_is_read_from_hours(db: Any) -> None:
    """One GPU, USD until 12:00 on the 10th, EUR after: acme used it in the morning, globex in the
    afternoon. Read from the day row (one currency per GPU-day) globex would be billed in USD."""
    month = date(2026, 1, 1)
    change = datetime(2026, 1, 10, 12, tzinfo=UTC)
    ledger = Ledger(
        month=month, now=datetime(2026, 1, 20, tzinfo=UTC), models=(A100,),
        cards=(Card(A100, datetime(2025, 1, 1, tzinfo=UTC), change, "USD"), Card(A100, change, None, "EUR")),
        partly_priced=frozenset(),
        rows=(Row(0, change - timedelta(hours=2), "acme", "gold", "p1", 10**12, 0, 0),
              Row(0, change + timedelta(hours=3), "globex", "gold", "p1", 2 * 10**12, 0, 0)),
        late_rows=(),
    )
    _cards(ledger)
    _write(ledger, ledger.rows)
    previews = preview_invoices(month=month, now=ledger.now)
    assert {slug: (p.currency, p.total_minor) for slug, p in previews.items()} == {"acme": ("USD", 100),
                                                                                    "globex": ("EUR", 200)}
