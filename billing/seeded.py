"""The names and descriptions the product seeds (the demo's SLA tiers, the tenant of unattributed
processes), and how a page or document shows one: still as seeded, in the reader's language;
anything an admin wrote, as written. Pure: the demo seeds them (billing.services.demo), the pages'
`seeded` filter and the invoice documents show them."""

from __future__ import annotations

from decimal import Decimal

from django.utils.translation import gettext, gettext_noop

__all__ = ["SEED_TEXTS", "SLA_TIERS", "UNATTRIBUTED_NAME", "seeded_text"]

# (slug, name, weight, description) of each seeded SLA tier.
SLA_TIERS = [
    ("gold", gettext_noop("Gold"), Decimal("4"), gettext_noop("Latency-critical inference; largest share under contention.")),
    ("silver", gettext_noop("Silver"), Decimal("2"), gettext_noop("Standard online inference.")),
    ("bronze", gettext_noop("Bronze"), Decimal("1"), gettext_noop("Batch and offline work.")),
    ("best-effort", gettext_noop("Best effort"), Decimal("0.5"),
     gettext_noop("Runs on spare capacity; first to be throttled.")),
]
UNATTRIBUTED_NAME = gettext_noop("Unattributed processes")
SEED_TEXTS = frozenset({UNATTRIBUTED_NAME, *(t[1] for t in SLA_TIERS), *(t[3] for t in SLA_TIERS)})


def seeded_text(value: str) -> str:
    """A seeded name or description in the reader's language; any other text as written."""
    return gettext(value) if value in SEED_TEXTS else value
