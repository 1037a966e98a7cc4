"""Commitments: cards paid for over a term whether used or not (docs/billing.md, Commitments and
on-prem cards). Two kinds, priced by one rule (billing.ledger.pricing):

- **reserved**: N cards of a GPU model committed with a provider for 1 or 3 years at a rate per
  GPU-hour (a reserved instance, a committed-use discount);
- **on-prem**: N cards the organisation owns, at their amortised rate per GPU-hour over their life
  (`amortised_rate`): purchase price ÷ the hours of the life, the year's facility cost (space,
  cooling, support) ÷ the hours of a year, and the card's average power draw at the price of energy.

A commitment prices whole hours: from the later of its term's start (00:00 UTC of the start date)
and the next whole hour after it is recorded, to its term's end, so no minute already metered
changes price and a closed month never does. Retiring one (a mistake, a contract ended early)
stops it from the next whole hour. Its currency must be its model's rate cards' (an invoice has
one currency). Each change is audited (`commitment.created`, `commitment.retired`) and re-prices
the ledger minutes already rolled up from the change on, in its transaction, as a rate card does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils.translation import gettext as _

from billing.currencies import check_currency
from billing.errors import InvalidInput
from billing.models import Commitment, CommitmentKind, RateCard
from billing.money import unit_price
from billing.services.audit import record_audit_event
from billing.services.pricing.rate_cards import _check_instant, _decimal, _lock_model, _reroll_from, check_gpu_model

__all__ = [
    "LIFE_YEARS",
    "MAX_CARDS",
    "RESERVED_TERMS_YEARS",
    "AmortisedRate",
    "OnPremCosts",
    "amortised_rate",
    "commitment_term",
    "create_commitment",
    "earliest_hour",
    "retire_commitment",
]

RESERVED_TERMS_YEARS = (1, 3)  # what providers sell
LIFE_YEARS = range(1, 11)  # a card's depreciation life
MAX_CARDS = 1_000_000
_NOTE_MAX_LEN = 2000
_REASON_MAX_LEN = 500
_HOUR = timedelta(hours=1)
_S_PER_H = Decimal(3600)


@dataclass(frozen=True)
class AmortisedRate:
    """An on-prem card's cost per GPU-hour and its parts (exact; `total` is rounded once)."""

    capital: Decimal
    facility: Decimal
    power: Decimal
    total: Decimal


def commitment_term(start: date, years: int) -> tuple[datetime, datetime]:
    """[00:00 UTC of `start`, the same day `years` later): 29 February ends on 1 March."""
    begin = datetime(start.year, start.month, start.day, tzinfo=UTC)
    try:
        end = begin.replace(year=start.year + years)
    except ValueError:  # 29 February in a year that has none
        end = datetime(start.year + years, 3, 1, tzinfo=UTC)
    return begin, end


def amortised_rate(*, purchase_price: Decimal, life_years: int, term: tuple[datetime, datetime],
                   power_watts: int, energy_price_per_kwh: Decimal, facility_cost_per_year: Decimal) -> AmortisedRate:
    """Straight-line depreciation over the hours of the life (leap days counted), the facility's
    yearly cost over a year's share of those hours, and the average draw in kW times the energy price."""
    hours = Decimal((term[1] - term[0]) // _HOUR)
    capital = purchase_price / hours
    facility = facility_cost_per_year * life_years / hours
    power = Decimal(power_watts) / 1000 * energy_price_per_kwh
    return AmortisedRate(capital=capital, facility=facility, power=power, total=unit_price(capital + facility + power))


def earliest_hour(now: datetime) -> datetime:
    """The first whole hour (UTC) at or after `now`: when a commitment recorded now may start pricing."""
    floor = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return floor if floor == now else floor + _HOUR


def _snapshot(c: Commitment) -> dict[str, Any]:
    def text(value: object) -> str | None:
        return None if value is None else str(value)

    return {
        "id": c.pk, "gpu_model": c.gpu_model, "kind": c.kind, "cards": c.cards, "currency": c.currency,
        "price_per_gpu_hour": str(c.price_per_gpu_hour), "term_start": c.term_start.isoformat(),
        "term_end": c.term_end.isoformat(), "term_years": c.term_years,
        "effective_from": c.effective_from.isoformat(), "effective_to": c.effective_to.isoformat(),
        "purchase_price": text(c.purchase_price), "power_watts": c.power_watts,
        "energy_price_per_kwh": text(c.energy_price_per_kwh), "facility_cost_per_year": text(c.facility_cost_per_year),
        "note": c.note, "retired_at": c.retired_at.isoformat() if c.retired_at else None,
        "retire_reason": c.retire_reason,
    }


def _cards(value: str | int) -> int:
    try:
        cards = int(str(value).strip())
    except ValueError as exc:
        raise InvalidInput(_("cards: %(value)r is not a whole number") % {"value": str(value)}) from exc
    if not 1 <= cards <= MAX_CARDS:
        raise InvalidInput(_("cards must be between 1 and %(max)s, not %(cards)s") % {"max": MAX_CARDS, "cards": cards})
    return cards


def _positive(value: str | Decimal, *, field: str, places: int, below: Decimal, zero_ok: bool = False) -> Decimal:
    amount = _decimal(value, field=field, places=places, below=below)
    if amount < 0 or (amount == 0 and not zero_ok):
        raise InvalidInput(_("%(field)s must be %(rule)s, not %(value)s")
                           % {"field": field, "rule": _("0 or more") if zero_ok else _("above 0"), "value": amount})
    return amount


def _check_currency(*, gpu_model: str, currency: str, start: datetime, end: datetime) -> None:
    """One invoice, one currency: the model's rate cards and other commitments over the same time
    must be in the commitment's currency."""
    cards = set(RateCard.objects.filter(gpu_model=gpu_model, effective_from__lt=end)
                .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=start))
                .exclude(effective_to=F("effective_from")).values_list("currency", flat=True))
    others = set(Commitment.objects.filter(gpu_model=gpu_model, effective_from__lt=end, effective_to__gt=start)
                 .values_list("currency", flat=True))
    other = sorted((cards | others) - {currency})
    if other:
        raise InvalidInput(
            _("%(model)s is priced in %(other)s over this term; a commitment in %(currency)s would put two currencies "
              "on one invoice") % {"model": gpu_model, "other": ", ".join(other), "currency": currency})


def _note(text: str) -> str:
    note = text.strip()
    if not note:
        raise InvalidInput(_("note is required: name the contract, order or asset record the commitment comes from"))
    if len(note) > _NOTE_MAX_LEN:
        raise InvalidInput(_("note may have at most %(n)s characters") % {"n": _NOTE_MAX_LEN})
    return note


@dataclass(frozen=True)
class OnPremCosts:
    """What an on-prem card costs, as typed in a form (text) or given by a caller (Decimal)."""

    purchase_price: str | Decimal
    power_watts: str | int
    energy_price_per_kwh: str | Decimal
    facility_cost_per_year: str | Decimal


def _on_prem_fields(costs: OnPremCosts, *, life_years: int, term: tuple[datetime, datetime]) -> dict[str, Any]:
    purchase = _positive(costs.purchase_price, field=_("purchase price per card"), places=2, below=Decimal(10) ** 12)
    try:
        watts = int(str(costs.power_watts).strip())
    except ValueError as exc:
        raise InvalidInput(_("power: %(value)r is not a whole number of watts") % {"value": str(costs.power_watts)}) from exc
    if not 0 <= watts <= 100_000:
        raise InvalidInput(_("power must be between 0 and 100000 W per card, not %(w)s") % {"w": watts})
    energy = _positive(costs.energy_price_per_kwh, field=_("energy price per kWh"), places=6, below=Decimal(10) ** 4,
                       zero_ok=True)
    facility = _positive(costs.facility_cost_per_year, field=_("facility cost per card-year"), places=2,
                         below=Decimal(10) ** 12, zero_ok=True)
    rate = amortised_rate(purchase_price=purchase, life_years=life_years, term=term, power_watts=watts,
                          energy_price_per_kwh=energy, facility_cost_per_year=facility)
    return {"purchase_price": purchase, "power_watts": watts, "energy_price_per_kwh": energy,
            "facility_cost_per_year": facility, "price_per_gpu_hour": rate.total}


def create_commitment(
    *, kind: str, gpu_model: str, cards: str | int, currency: str, term_start: date, term_years: str | int,
    note: str, now: datetime, actor_label: str, actor_id: int | None = None,
    price_per_gpu_hour: str | Decimal | None = None, on_prem: OnPremCosts | None = None,
) -> Commitment:
    """Record a commitment (reserved: `price_per_gpu_hour`; on-prem: `on_prem`, whose amortised rate
    becomes its price) and re-price the ledger from where it starts pricing. Every rule failure
    raises `InvalidInput` before anything is written."""
    if kind not in CommitmentKind.values:
        raise InvalidInput(_("kind must be one of %(choices)s") % {"choices": ", ".join(CommitmentKind.values)})
    gpu_model = check_gpu_model(gpu_model)
    count = _cards(cards)
    currency = check_currency(currency)
    try:
        years = int(str(term_years).strip())
    except ValueError as exc:
        raise InvalidInput(_("term: %(value)r is not a whole number of years") % {"value": str(term_years)}) from exc
    allowed = RESERVED_TERMS_YEARS if kind == CommitmentKind.RESERVED else tuple(LIFE_YEARS)
    if years not in allowed:
        raise InvalidInput(_("the term of a %(kind)s commitment is one of %(allowed)s years, not %(years)s")
                           % {"kind": CommitmentKind(kind).label, "allowed": ", ".join(map(str, allowed)), "years": years})
    term = commitment_term(term_start, years)
    if kind == CommitmentKind.RESERVED:
        if price_per_gpu_hour is None:
            raise InvalidInput(_("a reserved commitment needs its committed price per GPU-hour"))
        fields: dict[str, Any] = {"price_per_gpu_hour": _positive(
            price_per_gpu_hour, field=_("committed price per GPU-hour"), places=6, below=Decimal(10) ** 8)}
    else:
        if on_prem is None:
            raise InvalidInput(_("on-prem cards need their purchase price, power, energy price and facility cost"))
        fields = _on_prem_fields(on_prem, life_years=years, term=term)
    note = _note(note)
    start = max(term[0], earliest_hour(now))
    if term[1] <= start:
        raise InvalidInput(_("the term ended at %(end)s: a commitment prices only time still to come")
                           % {"end": term[1].isoformat()})
    start = _check_instant(start, field=_("pricing start"), now=now)
    with transaction.atomic():
        _lock_model(gpu_model)
        _check_currency(gpu_model=gpu_model, currency=currency, start=start, end=term[1])
        commitment = Commitment.objects.create(
            gpu_model=gpu_model, kind=kind, cards=count, currency=currency, term_start=term[0], term_end=term[1],
            term_years=years, effective_from=start, effective_to=term[1], note=note, created_at=now,
            created_by=actor_label, **fields)
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="commitment.created",
                           object_type="commitment", object_id=str(commitment.pk), before=None,
                           after=_snapshot(commitment))
        _reroll_from(gpu_model=gpu_model, start=start)
    return commitment


def retire_commitment(*, commitment_id: int, reason: str, now: datetime, actor_label: str,
                      actor_id: int | None = None) -> Commitment:
    """Stop a commitment from the next whole hour (at once, if it has not started): hours it priced
    keep its price. Audited `commitment.retired` with the reason."""
    reason = " ".join(reason.split())
    if not reason:
        raise InvalidInput(_("say why the commitment is retired: the reason is kept in the audit log and shown"))
    if len(reason) > _REASON_MAX_LEN:
        raise InvalidInput(_("the reason may have at most %(n)s characters") % {"n": _REASON_MAX_LEN})
    with transaction.atomic():
        found = Commitment.objects.filter(pk=commitment_id).first()
        if found is None:
            raise InvalidInput(_("no commitment with id %(id)s") % {"id": commitment_id})
        _lock_model(found.gpu_model)
        commitment = Commitment.objects.select_for_update().get(pk=commitment_id)
        if commitment.retired_at is not None:
            raise InvalidInput(_("commitment #%(id)s was already retired at %(at)s")
                               % {"id": commitment.pk, "at": commitment.retired_at.isoformat()})
        stop = max(commitment.effective_from, earliest_hour(now))
        if commitment.effective_to <= stop:
            raise InvalidInput(_("commitment #%(id)s already ended at %(end)s; its hours are priced and stay so")
                               % {"id": commitment.pk, "end": commitment.effective_to.isoformat()})
        before = _snapshot(commitment)
        commitment.effective_to = stop
        commitment.retired_at, commitment.retired_by, commitment.retire_reason = now, actor_label, reason
        commitment.save(update_fields=["effective_to", "retired_at", "retired_by", "retire_reason"])
        record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action="commitment.retired",
                           object_type="commitment", object_id=str(commitment.pk), before=before,
                           after=_snapshot(commitment))
        _reroll_from(gpu_model=commitment.gpu_model, start=stop)
    return commitment
