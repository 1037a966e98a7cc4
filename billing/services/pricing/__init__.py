"""Pricing: what a GPU-hour costs. Rate cards (validated, audited, re-pricing the ledger from the
first minute they change), the approved GPU models a card may price, and SLA tiers with their
fair-share weights. The arithmetic the ledger applies to a window lives in billing.ledger.pricing,
below every service, because the rollup applies it as it writes.

The facade: code outside this package imports from here, never from its modules."""

from __future__ import annotations

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
    "MAX_DESCRIPTION_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "MODEL_NAME_MAX_LEN",
    "approve_gpu_model",
    "approved_gpu_models",
    "change_sla_tier",
    "count_unapproved_gpus",
    "create_rate_card",
    "create_sla_tier",
    "earliest_change",
    "end_rate_card",
    "known_gpu_models",
    "retire_gpu_model",
    "retire_rate_card",
    "retire_sla_tier",
    "set_sla_tier_weight",
    "unapproved_fleet_models",
]
