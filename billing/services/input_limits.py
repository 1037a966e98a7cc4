"""Limits of what the service can store, read from the columns that store it.

Validation at every edge (batches, events, the policy and admission APIs) takes its bounds from
here, so an input either fits its column or is refused with a 4xx that names the field; it never
reaches the database to fail there as a 500. Pure: reads model metadata, never queries. A column's
bound is read by billing.ledger.columns (which also names the ledger's own), re-exported here.
"""

from __future__ import annotations

from typing import Any

from billing.ledger.columns import integer_max, max_length

__all__ = ["integer_max", "json_problem", "max_length", "text_problem"]


def text_problem(value: str) -> str | None:
    """Why Postgres cannot store `value` as text, or None when it can: text holds no NUL, and
    UTF-8 has no lone surrogates (JSON's \\ud800 escapes decode to them)."""
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (it holds a lone surrogate)"
    return None


def json_problem(value: Any, *, max_depth: int, depth: int = 0) -> str | None:
    """The first reason a decoded JSON value cannot be stored as jsonb: a string (or key) that
    text cannot hold, or nesting deeper than `max_depth`."""
    if depth > max_depth:
        return f"nests deeper than {max_depth} levels"
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        items: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        problem = json_problem(item, max_depth=max_depth, depth=depth + 1)
        if problem:
            return problem
    return None
