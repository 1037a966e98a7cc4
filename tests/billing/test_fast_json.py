"""The OpenCost views' JSON (billing.api.renderers): orjson's bytes, read back as DRF's renderer
writes them, with DRF's escapes and fallbacks."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st
from rest_framework.renderers import JSONRenderer

from billing.api.renderers import FastJSONRenderer


def _values(scalars: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                        max_leaves=20)


_EXACT = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()


@given(_values(_EXACT))
def test_without_floats_it_writes_drfs_bytes(value):
    assert FastJSONRenderer().render(value) == JSONRenderer().render(value)


@given(_values(_EXACT | st.floats(allow_nan=False, allow_infinity=False)).filter(lambda v: v is not None))
def test_with_floats_it_writes_the_same_numbers(value):
    """Both write a float's shortest round-trip digits, orjson in JavaScript's notation (`1.5e-7`,
    Python `1.5e-07`): the same numbers read back. (None is no body at all, both ways.)"""
    assert json.loads(FastJSONRenderer().render(value)) == json.loads(JSONRenderer().render(value)) == value


def test_line_and_paragraph_separators_are_escaped_as_drf_does():
    value = {"name": "a\u2028b\u2029c", "other": "it\u2019s 中文"}
    fast = FastJSONRenderer().render(value)
    assert fast == JSONRenderer().render(value)
    assert b"\\u2028" in fast
    assert b"\\u2029" in fast
    assert "\u2019".encode() in fast  # only those two are escaped


def test_what_orjson_does_not_know_goes_through_drfs_encoder():
    assert json.loads(FastJSONRenderer().render({"amount": Decimal("1.25")})) == {"amount": 1.25}


def test_an_indent_asked_for_is_drfs_own_answer():
    value = {"a": [1, 2], "b": "x"}
    assert (FastJSONRenderer().render(value, "application/json; indent=2")
            == JSONRenderer().render(value, "application/json; indent=2"))
    assert FastJSONRenderer().render(None) == b""
