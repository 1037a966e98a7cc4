"""Pricing: what a GPU-hour costs. Rate cards (validated, audited, re-pricing the ledger from the
first minute they change), commitments (reserved rates and on-prem cards at their amortised rate,
which price the cards they cover instead of the market card), the approved GPU models a card may
price, and SLA tiers with their fair-share weights. The arithmetic the ledger applies to a window lives in billing.ledger.pricing,
below every service, because the rollup applies it as it writes.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

from billing.services.pricing.commitments import (
    LIFE_YEARS,
    MAX_CARDS,
    RESERVED_TERMS_YEARS,
    AmortisedRate,
    OnPremCosts,
    amortised_rate,
    commitment_term,
    create_commitment,
    earliest_hour,
    retire_commitment,
)
from billing.services.pricing.gpu_models import (
    MODEL_NAME_MAX_LEN,
    approve_gpu_model,
    approved_gpu_models,
    count_unapproved_gpus,
    retire_gpu_model,
    unapproved_fleet_models,
)
from billing.services.pricing.rate_cards import (
    create_rate_card,
    earliest_change,
    end_rate_card,
    known_gpu_models,
    retire_rate_card,
)
from billing.services.pricing.sla import (
    MAX_DESCRIPTION_LENGTH,
    MAX_NAME_LENGTH,
    MAX_WEIGHT,
    MIN_WEIGHT,
    change_sla_tier,
    create_sla_tier,
    retire_sla_tier,
    set_sla_tier_weight,
)

__all__ = [
    "LIFE_YEARS",
    "MAX_CARDS",
    "MAX_DESCRIPTION_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "MODEL_NAME_MAX_LEN",
    "RESERVED_TERMS_YEARS",
    "AmortisedRate",
    "OnPremCosts",
    "amortised_rate",
    "approve_gpu_model",
    "approved_gpu_models",
    "change_sla_tier",
    "commitment_term",
    "count_unapproved_gpus",
    "create_commitment",
    "create_rate_card",
    "create_sla_tier",
    "earliest_change",
    "earliest_hour",
    "end_rate_card",
    "known_gpu_models",
    "retire_commitment",
    "retire_gpu_model",
    "retire_rate_card",
    "retire_sla_tier",
    "set_sla_tier_weight",
    "unapproved_fleet_models",
]
