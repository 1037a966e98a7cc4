"""How the exports write numbers: exact decimals, never floats or exponents."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["compact_json", "plain_decimal"]


def plain_decimal(value: Decimal) -> str:
    """A decimal as FOCUS NumericFormat wants it: no exponent, no '+', no trailing zeros."""
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def compact_json(value: Any) -> str:
    """Compact JSON with Decimals as exact JSON numbers (json.dumps would need floats)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{compact_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(compact_json(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return plain_decimal(value)
    return json.dumps(value, ensure_ascii=False)
