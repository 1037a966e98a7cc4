"""Rate-card changes by admins: a new price from a date, or the end of a card (DESIGN §4).

Cards price GPU-minutes by the card in effect at the start of each minute, so a change at
instant T re-prices every minute from T on. The rule chosen here is the simplest one that
never re-prices the past: **T must be a whole minute, at or after now rounded up to the next
minute** (`earliest_change`). Nothing already billed can change, a finalized invoice least of
all, and no re-roll of history is needed. One exception remains: ingest accepts batches up to
the allowed clock skew ahead of the server's clock, so minutes at or after T may already sit
in the ledger, priced by the old card. The change therefore takes the rollup's lock, and if the
ledger holds any minute of that GPU model at or after T it re-rolls [T, last such minute] with
`rebuild_ledger` in the same transaction, so the ledger always matches the cards.

A period that is closed or closing (BillingPeriod) is refused as well, whatever its month.
Every rule failure raises `InvalidInput` before anything is written; each change is audited
("rate_card.created", "rate_card.superseded", "rate_card.ended") with before and after, in
the change's transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils.translation import gettext as _

from billing.errors import InvalidInput
from billing.ledger.minutes import get_last_ledger_minute
from billing.ledger.rollup import lock_ledger, rebuild_ledger
from billing.models import BilledBasis, BillingPeriod, IdlePolicy, RateCard
from billing.services.audit import record_audit_event

__all__ = ["RateCardChange", "create_rate_card", "earliest_change", "end_rate_card"]

_CURRENCY = re.compile(r"^[A-Z]{3}$")
_PRICE_PLACES = 6  # RateCard.price_per_gpu_hour: max_digits=14, decimal_places=6
_PRICE_BELOW = Decimal(10) ** (14 - _PRICE_PLACES)
_ALPHA_PLACES = 3
_MODEL_MAX_LEN = 128
_URL_MAX_LEN = 500


@dataclass(frozen=True)
class RateCardChange:
    """What a change did: the card created or ended, and the card it superseded (if any)."""

    card_id: int
    superseded_id: int | None
    reprice_minutes: int


def earliest_change(now: datetime) -> datetime:
    """The first instant a card may start or end at: `now` rounded up to a whole minute (UTC)."""
    floor = now.astimezone(UTC).replace(second=0, microsecond=0)
    return floor if floor == now else floor + timedelta(minutes=1)


def _snapshot(card: RateCard) -> dict[str, Any]:
    return {
        "id": card.pk,
        "gpu_model": card.gpu_model,
        "currency": card.currency,
        "price_per_gpu_hour": str(card.price_per_gpu_hour),
        "effective_from": card.effective_from.isoformat(),
        "effective_to": card.effective_to.isoformat() if card.effective_to else None,
        "alpha": str(card.alpha),
        "billed_basis": card.billed_basis,
        "idle_policy": card.idle_policy,
        "source_url": card.source_url,
        "source_note": card.source_note,
    }


def _decimal(text: str | Decimal, *, field: str, places: int, below: Decimal) -> Decimal:
    """A non-negative-or-not number with at most `places` decimals and |value| < `below`."""
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation as exc:
        raise InvalidInput(_("%(field)s: %(value)r is not a number") % {"field": field, "value": str(text)}) from exc
    if not value.is_finite():
        raise InvalidInput(_("%(field)s must be a finite number") % {"field": field})
    if abs(value) >= below:
        raise InvalidInput(_("%(field)s must be below %(below)s") % {"field": field, "below": below})
    quantum = Decimal(1).scaleb(-places)
    if value != value.quantize(quantum):
        raise InvalidInput(
            _("%(field)s may have at most %(places)s decimal places, not %(value)s")
            % {"field": field, "places": places, "value": value}
        )
    return value.quantize(quantum)


def _check_instant(at: datetime, *, field: str, now: datetime) -> datetime:
    """The rules every start or end of a card obeys (see the module docstring)."""
    if at.tzinfo is None:
        raise InvalidInput(_("%(field)s must carry a time zone (UTC)") % {"field": field})
    at = at.astimezone(UTC)
    if at.second or at.microsecond:
        raise InvalidInput(
            _("%(field)s must be a whole minute (cards price whole GPU-minutes), not %(at)s")
            % {"field": field, "at": at.isoformat()}
        )
    month = date(at.year, at.month, 1)
    period = BillingPeriod.objects.filter(month=month).exclude(status=BillingPeriod.Status.OPEN).first()
    if period is not None:
        raise InvalidInput(
            _("%(field)s %(at)s lies in the billing period %(month)s, which is %(status)s: "
              "its invoices must never change")
            % {"field": field, "at": at.isoformat(), "month": f"{month:%Y-%m}", "status": period.get_status_display()}
        )
    earliest = earliest_change(now)
    if at < earliest:
        raise InvalidInput(
            _("%(field)s %(at)s is in the past; a price may change from %(earliest)s (UTC) on, so minutes "
              "already metered keep their price")
            % {"field": field, "at": at.isoformat(), "earliest": earliest.isoformat()}
        )
    return at


def _lock_model(gpu_model: str) -> None:
    """Serialise changes of one model: the same advisory lock the no-overlap trigger takes."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('billing_ratecard:' || %s))", [gpu_model])


def _reroll_from(*, gpu_model: str, start: datetime) -> int:
    """Re-price ledger minutes of `gpu_model` at or after `start` (skewed batches already rolled up).

    Holds the rollup's lock until commit, so no rollup prices with the old cards meanwhile."""
    lock_ledger()
    last = get_last_ledger_minute(gpu_model=gpu_model, since=start)
    if last is None:
        return 0
    return rebuild_ledger(start=start, end=last + timedelta(minutes=1)).gpu_minutes


def _audit(*, now: datetime, actor_label: str, actor_id: int | None, action: str, card: RateCard,
           before: dict[str, Any] | None, after: dict[str, Any]) -> None:
    record_audit_event(at=now, actor_id=actor_id, actor_label=actor_label, action=action, object_type="rate_card",
                       object_id=str(card.pk), before=before, after=after)


def _check_currency_in_month(*, gpu_model: str, currency: str, start: datetime) -> None:
    """Invoices carry one currency: a model's price may change currency only at a month's start."""
    month_start = start.replace(day=1, hour=0, minute=0)
    if start == month_start:
        return
    other = (
        RateCard.objects.filter(gpu_model=gpu_model, effective_from__lt=start)
        .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=month_start))
        .exclude(currency=currency)
        .first()
    )
    if other is not None:
        raise InvalidInput(
            _("%(model)s is priced in %(old)s earlier in %(month)s; invoices are single-currency, so a change to "
              "%(new)s may start at the beginning of a month (%(next)s) at the earliest")
            % {"model": gpu_model, "old": other.currency, "new": currency, "month": f"{start:%Y-%m}",
               "next": datetime(start.year + (start.month == 12), start.month % 12 + 1, 1, tzinfo=UTC).isoformat()}
        )


def create_rate_card(
    *,
    gpu_model: str,
    price_per_gpu_hour: str | Decimal,
    currency: str,
    effective_from: datetime,
    source_url: str,
    source_note: str,
    now: datetime,
    actor_label: str,
    actor_id: int | None = None,
    alpha: str | Decimal | None = None,
    billed_basis: str | None = None,
    idle_policy: str | None = None,
) -> RateCardChange:
    """A new price for `gpu_model` from `effective_from` on, open-ended.

    The card in effect at `effective_from`, if open-ended, is closed there (superseded) in the
    same transaction. `alpha`, `billed_basis` and `idle_policy` left as None are taken from that
    card (else the model defaults). Refused: a card with a set end covering `effective_from`, a
    card starting at or after it (the new open-ended card would overlap it), a currency change
    inside a month, and every rule of `_check_instant`.
    """
    gpu_model = gpu_model.strip()
    if not gpu_model:
        raise InvalidInput(_("GPU model is required (exactly as NVML names it)"))
    if len(gpu_model) > _MODEL_MAX_LEN:
        raise InvalidInput(_("GPU model may have at most %(n)s characters") % {"n": _MODEL_MAX_LEN})
    price = _decimal(price_per_gpu_hour, field=_("price per GPU-hour"), places=_PRICE_PLACES, below=_PRICE_BELOW)
    if price < 0:
        raise InvalidInput(_("price per GPU-hour must not be negative, not %(price)s") % {"price": price})
    currency = currency.strip().upper()
    if not _CURRENCY.match(currency):
        raise InvalidInput(_("currency must be an ISO 4217 code of 3 letters, such as USD, not %(c)r") % {"c": currency})
    source_url = source_url.strip()
    if not source_url:
        raise InvalidInput(_("source URL is required: every price must cite where it comes from"))
    try:
        URLValidator(schemes=["http", "https"])(source_url)
    except ValidationError as exc:
        raise InvalidInput(_("source URL %(url)r is not an http(s) URL") % {"url": source_url}) from exc
    if len(source_url) > _URL_MAX_LEN:
        raise InvalidInput(_("source URL may have at most %(n)s characters") % {"n": _URL_MAX_LEN})
    source_note = source_note.strip()
    if not source_note:
        raise InvalidInput(_("source note is required: say what the source states (list price, region, date)"))
    alpha_value = None
    if alpha is not None and str(alpha).strip() != "":
        alpha_value = _decimal(alpha, field=_("alpha"), places=_ALPHA_PLACES, below=Decimal(10))
        if not Decimal(0) <= alpha_value <= Decimal(1):
            raise InvalidInput(_("alpha must lie between 0 and 1, not %(alpha)s") % {"alpha": alpha_value})
    if billed_basis and billed_basis not in BilledBasis.values:
        raise InvalidInput(_("billed basis must be one of %(choices)s") % {"choices": ", ".join(BilledBasis.values)})
    if idle_policy and idle_policy not in IdlePolicy.values:
        raise InvalidInput(_("idle policy must be one of %(choices)s") % {"choices": ", ".join(IdlePolicy.values)})
    start = _check_instant(effective_from, field=_("effective from"), now=now)

    with transaction.atomic():
        _lock_model(gpu_model)
        cards = list(RateCard.objects.select_for_update().filter(gpu_model=gpu_model).order_by("effective_from"))
        covering = next(
            (c for c in cards if c.effective_from <= start and (c.effective_to is None or start < c.effective_to)),
            None,
        )
        if covering is not None and covering.effective_to is not None:
            raise InvalidInput(
                _("card #%(id)s for %(model)s already runs until %(to)s; a new card from %(start)s would overlap "
                  "it. End that card at %(start)s first, or choose %(to)s or later.")
                % {"id": covering.pk, "model": gpu_model, "to": covering.effective_to.isoformat(),
                   "start": start.isoformat()}
            )
        later = next((c for c in cards if c.effective_from >= start), None)
        if later is not None:
            raise InvalidInput(
                _("a card for %(model)s already starts at %(at)s (card #%(id)s); an open-ended card from %(start)s "
                  "would overlap it. End or change that card first, or choose a later date.")
                % {"model": gpu_model, "at": later.effective_from.isoformat(), "id": later.pk,
                   "start": start.isoformat()}
            )
        _check_currency_in_month(gpu_model=gpu_model, currency=currency, start=start)
        template = covering or (cards[-1] if cards else None)
        card = RateCard(
            gpu_model=gpu_model, currency=currency, price_per_gpu_hour=price, effective_from=start,
            effective_to=None,
            alpha=alpha_value if alpha_value is not None else (template.alpha if template else Decimal("0.5")),
            billed_basis=billed_basis or (template.billed_basis if template else BilledBasis.MAX),
            idle_policy=idle_policy or (template.idle_policy if template else IdlePolicy.PLATFORM),
            source_url=source_url, source_note=source_note,
        )
        try:
            with transaction.atomic():
                if covering is not None:
                    before = _snapshot(covering)
                    covering.effective_to = start
                    covering.save(update_fields=["effective_to"])
                card.save()
        except IntegrityError as exc:  # the trigger: another admin's change committed in between
            raise InvalidInput(_("this card would overlap another card for %(model)s: %(error)s")
                               % {"model": gpu_model, "error": str(exc).splitlines()[0]}) from exc
        _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="rate_card.created", card=card,
               before=None, after=_snapshot(card))
        if covering is not None:
            _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="rate_card.superseded",
                   card=covering, before=before, after={**_snapshot(covering), "superseded_by": card.pk})
        minutes = _reroll_from(gpu_model=gpu_model, start=start)
    return RateCardChange(card_id=card.pk, superseded_id=covering.pk if covering else None, reprice_minutes=minutes)


def end_rate_card(
    *, card_id: int, effective_to: datetime, now: datetime, actor_label: str, actor_id: int | None = None
) -> RateCardChange:
    """End card `card_id` at `effective_to` (exclusive): from then on its model has no price
    until a new card starts. Same rules as a new card; the card must not have ended already,
    and an end may be moved later only up to the next card of the model."""
    end = _check_instant(effective_to, field=_("effective to"), now=now)
    with transaction.atomic():
        row = RateCard.objects.filter(pk=card_id).first()
        if row is None:
            raise InvalidInput(_("no rate card with id %(id)s") % {"id": card_id})
        _lock_model(row.gpu_model)
        card = RateCard.objects.select_for_update().get(pk=card_id)
        if card.effective_to is not None and card.effective_to <= now:
            raise InvalidInput(
                _("card #%(id)s already ended at %(to)s; its past is billed and cannot change")
                % {"id": card.pk, "to": card.effective_to.isoformat()}
            )
        if end <= card.effective_from:
            raise InvalidInput(
                _("effective to must be after the card's start %(start)s") % {"start": card.effective_from.isoformat()}
            )
        nxt = (
            RateCard.objects.filter(gpu_model=card.gpu_model, effective_from__gt=card.effective_from)
            .order_by("effective_from")
            .first()
        )
        if nxt is not None and end > nxt.effective_from:
            raise InvalidInput(
                _("card #%(id)s may end at %(next)s at the latest, where card #%(next_id)s starts")
                % {"id": card.pk, "next": nxt.effective_from.isoformat(), "next_id": nxt.pk}
            )
        if card.effective_to == end:
            return RateCardChange(card_id=card.pk, superseded_id=None, reprice_minutes=0)
        before, old_end = _snapshot(card), card.effective_to
        card.effective_to = end
        card.save(update_fields=["effective_to"])
        _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="rate_card.ended", card=card,
               before=before, after=_snapshot(card))
        minutes = _reroll_from(gpu_model=card.gpu_model, start=end if old_end is None else min(end, old_end))
    return RateCardChange(card_id=card.pk, superseded_id=None, reprice_minutes=minutes)

