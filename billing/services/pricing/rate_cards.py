"""Rate-card changes by admins: a new price from a date, or the end of a card (docs/billing.md, Rate cards).

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
A price of 0 (a free GPU model) is saved only with `confirm_free=True`, the form's explicit
"I confirm this GPU model is free", and the audit event records that confirmation. A GPU model
must be approved (`check_gpu_model`, billing.services.pricing.gpu_models): a name a node reports is never
priced, nor offered in the form, until an admin approves it. A model that no card prices from
some instant on may get a card from that instant, in the past (`_check_start`): it prices only
usage that was billed at nothing, which the next close then bills as a late-usage adjustment.

Retiring a card (`retire_rate_card`, for a mistaken card) stops it applying from the next
whole minute; minutes already priced by it keep its price, and it stays on every invoice it
priced. An upcoming card that never applied is retired whole, and the card that ends where it
starts (the one it superseded) prices its time again. Retiring never takes a price away from a
GPU that has one: retiring the card in effect now is refused while the fleet has GPUs of its
model; save the correct price first (it supersedes the card), then retire the card.

Every rule failure raises `InvalidInput` before anything is written; each change is audited
("rate_card.created", "rate_card.superseded", "rate_card.ended", "rate_card.retired",
"rate_card.resumed") with before and after, in the change's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils.translation import gettext as _

from billing.currencies import check_currency
from billing.errors import InvalidInput
from billing.ledger.locks import lock_ledger
from billing.ledger.minutes import get_last_ledger_minute
from billing.ledger.rollup import rebuild_ledger
from billing.models import BilledBasis, BillingPeriod, Commitment, Gpu, IdlePolicy, RateCard
from billing.services.audit import record_audit_event
from billing.services.pricing.gpu_models import approved_gpu_models, is_approved

__all__ = [
    "RateCardChange",
    "check_gpu_model",
    "create_rate_card",
    "earliest_change",
    "end_rate_card",
    "known_gpu_models",
    "retire_rate_card",
]

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
        "retired_at": card.retired_at.isoformat() if card.retired_at else None,
        "retire_reason": card.retire_reason,
    }


def known_gpu_models() -> list[str]:
    """The GPU models a card may price: the approved ones (billing.services.pricing.gpu_models), in name
    order. A name a node reports is never offered until an admin approves it."""
    return approved_gpu_models()


def check_gpu_model(name: str) -> str:
    """`name` trimmed, if it is an approved GPU model; else `InvalidInput`."""
    name = name.strip()
    if not name:
        raise InvalidInput(_("GPU model is required (exactly as NVML names it)"))
    if len(name) > _MODEL_MAX_LEN:
        raise InvalidInput(_("GPU model may have at most %(n)s characters") % {"n": _MODEL_MAX_LEN})
    if not is_approved(name):
        raise InvalidInput(
            _("GPU model %(model)r is not approved: approve it on the GPU models page first (only approved "
              "models are priced)") % {"model": name})
    return name


def _decimal(text: str | Decimal, *, field: str, places: int, below: Decimal) -> Decimal:
    """A non-negative-or-not number with at most `places` decimals and |value| < `below`."""
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation as exc:
        raise InvalidInput(_("%(field)s: %(value)r is not a number") % {"field": field, "value": str(text)}) from exc
    if not value.is_finite():
        raise InvalidInput(_("%(field)s must be a finite number") % {"field": field})
    # copy_abs, not abs(): abs() rounds to the context and overflows on 1e9999999 (a 500).
    if value.copy_abs() >= below:
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


def _unpriced_since(gpu_model: str, at: datetime) -> bool:
    """True when no card of `gpu_model` prices any instant from `at` on (a card retired before it
    started prices nothing): every minute of the model since `at` is unpriced, so pricing them
    changes no amount that was ever billed."""
    return not (RateCard.objects.filter(gpu_model=gpu_model)
                .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=at))
                .exclude(effective_to=F("effective_from")).exists())


def _check_start(*, gpu_model: str, at: datetime, now: datetime, currency: str) -> datetime:
    """The start of a new card: the rules of `_check_instant`, with one exception. Usage of a model
    no card priced (an unapproved model a node reported, approved since) may be priced from the
    past, as far back as its months can still be adjusted: those minutes were billed at nothing, so
    nothing billed changes, and the close of a month after bills them as late-usage adjustments
    (billing.services.invoicing.close). Refused inside a month being closed (its close is reading), and
    before the late-usage horizon of the current month (no invoice would carry the adjustment,
    and the usage must never be silently dropped), and in a currency other than the cards that
    priced the same time (one invoice carries one currency: a second would fail the next close)."""
    if at.tzinfo is None or at >= earliest_change(now) or not _unpriced_since(gpu_model, at):
        return _check_instant(at, field=_("effective from"), now=now)
    at = at.astimezone(UTC)
    if at.second or at.microsecond:
        raise InvalidInput(_("%(field)s must be a whole minute (cards price whole GPU-minutes), not %(at)s")
                           % {"field": _("effective from"), "at": at.isoformat()})
    month = date(at.year, at.month, 1)
    closing = BillingPeriod.objects.filter(month__gte=month, status=BillingPeriod.Status.CLOSING).first()
    if closing is not None:
        raise InvalidInput(_("%(month)s is being closed; price its usage once the close is done (it then becomes "
                             "a late-usage adjustment)") % {"month": f"{closing.month:%Y-%m}"})
    month_end = datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=UTC)
    current = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if month_end + settings.VGPU_LATE_USAGE_HORIZON < current:
        raise InvalidInput(
            _("%(month)s is beyond the late-usage horizon (%(days)s days): no invoice can carry an adjustment "
              "for it any more. The earliest start is %(earliest)s (UTC).")
            % {"month": f"{month:%Y-%m}", "days": settings.VGPU_LATE_USAGE_HORIZON.days,
               "earliest": _earliest_adjustable(current).isoformat()})
    others = set(RateCard.objects.exclude(gpu_model=gpu_model).filter(effective_from__lt=now)
                 .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=at))
                 .exclude(effective_to=F("effective_from")).values_list("currency", flat=True))
    if others and currency not in others:
        raise InvalidInput(
            _("the usage since %(at)s is invoiced in %(others)s; a card in %(currency)s from then would put two "
              "currencies on one invoice") % {"at": at.isoformat(), "others": ", ".join(sorted(others)),
                                              "currency": currency})
    return at


def _earliest_adjustable(current: datetime) -> datetime:
    """The first day of the earliest month whose late usage the invoices from `current` on still carry."""
    month = current
    while month + settings.VGPU_LATE_USAGE_HORIZON >= current:  # the month before `month` ends at `month`
        month = (month - timedelta(days=1)).replace(day=1)
    return month  # the loop stopped at the first month whose predecessor is past the horizon


def _lock_model(gpu_model: str) -> None:
    """Serialise changes of one model: the same advisory lock the no-overlap trigger takes."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('billing_ratecard:' || %s))", [gpu_model])


def _locked_card(card_id: int) -> RateCard:
    """Card `card_id`, locked for a change inside the caller's transaction: its model's lock first,
    then the row, in the order every change of that model takes them (no deadlock between two)."""
    row = RateCard.objects.filter(pk=card_id).first()
    if row is None:
        raise InvalidInput(_("no rate card with id %(id)s") % {"id": card_id})
    _lock_model(row.gpu_model)
    return RateCard.objects.select_for_update().get(pk=card_id)


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
        .exclude(effective_to=F("effective_from"))  # retired before it started: it never priced
        .first()
    )
    if other is not None:
        raise InvalidInput(
            _("%(model)s is priced in %(old)s earlier in %(month)s; invoices are single-currency, so a change to "
              "%(new)s may start at the beginning of a month (%(next)s) at the earliest")
            % {"model": gpu_model, "old": other.currency, "new": currency, "month": f"{start:%Y-%m}",
               "next": datetime(start.year + (start.month == 12), start.month % 12 + 1, 1, tzinfo=UTC).isoformat()}
        )


def _check_commitment_currency(*, gpu_model: str, currency: str, start: datetime) -> None:
    """A commitment of the model in force from `start` on fixes the currency its cards are invoiced in."""
    other = (Commitment.objects.filter(gpu_model=gpu_model, effective_to__gt=start).exclude(currency=currency)
             .exclude(effective_to=F("effective_from")).first())
    if other is not None:
        raise InvalidInput(
            _("commitment #%(id)s prices %(model)s in %(other)s until %(to)s; a card in %(currency)s would put two "
              "currencies on one invoice") % {"id": other.pk, "model": gpu_model, "other": other.currency,
                                              "to": other.effective_to.isoformat(), "currency": currency})


def create_rate_card(  # noqa: PLR0912, PLR0915 - one check per field of the form, then the write
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
    confirm_free: bool = False,
) -> RateCardChange:
    """A new price for `gpu_model` from `effective_from` on, open-ended.

    The card in effect at `effective_from`, if open-ended, is closed there (superseded) in the
    same transaction. `alpha`, `billed_basis` and `idle_policy` left as None are taken from that
    card (else the model defaults). Refused: a card with a set end covering `effective_from`, a
    card starting at or after it (the new open-ended card would overlap it), a currency change
    inside a month, and every rule of `_check_instant`.
    """
    gpu_model = check_gpu_model(gpu_model)
    price = _decimal(price_per_gpu_hour, field=_("price per GPU-hour"), places=_PRICE_PLACES, below=_PRICE_BELOW)
    if price < 0:
        raise InvalidInput(_("price per GPU-hour must not be negative, not %(price)s") % {"price": price})
    if price == 0 and not confirm_free:
        raise InvalidInput(
            _("a price of 0 makes every GPU-minute of %(model)s free from %(start)s; if that is intended, tick "
              "“I confirm this GPU model is free” and save again")
            % {"model": gpu_model, "start": effective_from.isoformat()})
    currency = check_currency(currency)
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
    start = _check_start(gpu_model=gpu_model, at=effective_from, now=now, currency=currency)

    with transaction.atomic():
        _lock_model(gpu_model)
        # Retired cards price nothing from their retirement on, so they never block a new card.
        cards = list(RateCard.objects.select_for_update().filter(gpu_model=gpu_model, retired_at__isnull=True)
                     .order_by("effective_from"))
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
        _check_commitment_currency(gpu_model=gpu_model, currency=currency, start=start)
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
        after = {**_snapshot(card), "confirmed_free": True} if price == 0 else _snapshot(card)
        _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="rate_card.created", card=card,
               before=None, after=after)
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
        card = _locked_card(card_id)
        if card.retired_at is not None:
            raise InvalidInput(_("card #%(id)s is retired; it cannot be changed") % {"id": card.pk})
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


_REASON_MAX_LEN = 500


def _reason(text: str) -> str:
    reason = " ".join(text.split())
    if not reason:
        raise InvalidInput(_("say why the card is retired: the reason is kept in the audit log and shown on the page"))
    if len(reason) > _REASON_MAX_LEN:
        raise InvalidInput(_("the reason may have at most %(n)s characters") % {"n": _REASON_MAX_LEN})
    return reason


def _predecessor(card: RateCard) -> RateCard | None:
    """The card that ends exactly where `card` starts (usually the one it superseded)."""
    return (RateCard.objects.select_for_update()
            .filter(gpu_model=card.gpu_model, effective_to=card.effective_from, retired_at__isnull=True)
            .exclude(pk=card.pk).first())


def _refuse_unpriced_gpus(card: RateCard, stop: datetime) -> None:
    gpus = Gpu.objects.filter(model=card.gpu_model).count()
    if gpus:
        raise InvalidInput(
            _("card #%(id)s prices %(model)s from %(stop)s on and the fleet has %(gpus)s GPU(s) of this model: "
              "retiring it would leave them without a price. Save the correct price from %(stop)s first (it "
              "supersedes this card), then retire this card.")
            % {"id": card.pk, "model": card.gpu_model, "stop": stop.isoformat(), "gpus": gpus})


def retire_rate_card(*, card_id: int, reason: str, now: datetime, actor_label: str,
                     actor_id: int | None = None) -> RateCardChange:
    """Retire card `card_id` (a mistaken card): it stops applying from the next whole minute, or
    never applies if it starts later. Minutes it priced keep its price (and its invoices keep it).
    Retiring never takes a price away from a GPU that has one: a card in effect now is refused while
    the fleet has GPUs of its model (save the correct price first; it supersedes this card), and the
    time an upcoming card gives up is priced by the card that ends where it starts, if any. Audited
    as `rate_card.retired` (and `rate_card.resumed` for the card before)."""
    reason = _reason(reason)
    with transaction.atomic():
        card = _locked_card(card_id)
        if card.retired_at is not None:
            raise InvalidInput(_("card #%(id)s was already retired at %(at)s")
                               % {"id": card.pk, "at": card.retired_at.isoformat()})
        stop = max(earliest_change(now), card.effective_from)
        gives_up_time = card.effective_to is None or card.effective_to > stop
        resumed = None
        if gives_up_time:
            _check_instant(stop, field=_("retirement"), now=now)
            if card.effective_from < stop:  # it prices now: the fleet's GPUs of the model would lose their price
                _refuse_unpriced_gpus(card, stop)
            else:
                resumed = _predecessor(card)
        before, old_end = _snapshot(card), card.effective_to
        if gives_up_time:
            card.effective_to = stop
        card.retired_at, card.retired_by, card.retire_reason = now, actor_label, reason
        card.save(update_fields=["effective_to", "retired_at", "retired_by", "retire_reason"])
        _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="rate_card.retired", card=card,
               before=before, after=_snapshot(card))
        if resumed is not None:
            _resume(resumed, until=old_end, retired=card, now=now, actor_label=actor_label, actor_id=actor_id)
        minutes = _reroll_from(gpu_model=card.gpu_model, start=stop) if gives_up_time else 0
    return RateCardChange(card_id=card.pk, superseded_id=None, reprice_minutes=minutes)


def _resume(card: RateCard, *, until: datetime | None, retired: RateCard, now: datetime, actor_label: str,
            actor_id: int | None) -> None:
    """`card` prices the time a retired card gave up, up to `until` (None: open-ended)."""
    before = _snapshot(card)
    card.effective_to = until
    card.save(update_fields=["effective_to"])
    if until is not None:
        following = RateCard.objects.filter(gpu_model=card.gpu_model, effective_from=until,
                                            retired_at__isnull=True).first()
        if following is not None:  # invoices are single-currency: the card after must still fit its month
            _check_currency_in_month(gpu_model=card.gpu_model, currency=following.currency, start=until)
    _audit(now=now, actor_label=actor_label, actor_id=actor_id, action="rate_card.resumed", card=card,
           before=before, after={**_snapshot(card), "resumed_after": retired.pk})

