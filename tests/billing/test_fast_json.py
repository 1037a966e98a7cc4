"""The OpenCost views' JSON (billing.api.renderers): orjson's bytes, read back as DRF's renderer
writes them, with DRF's escapes and fallbacks."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st
from rest_framework.renderers import JSONRenderer

from billing.api.renderers import FastJSONRenderer, SharedFields


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


_KEYS = st.text(max_size=6)


@given(own=st.dictionaries(_KEYS, _values(_EXACT), max_size=5), shared=st.dictionaries(_KEYS, _values(_EXACT), max_size=5),
       indent=st.booleans())
def test_shared_fields_are_written_after_each_objects_own(own, shared, indent):
    """An object that ends with the shared member is its own fields, then the shared ones, as one
    JSON object: the same object orjson's fragment or DRF's indented answer writes, with no key
    written twice."""
    own = {k: v for k, v in own.items() if k not in shared}
    fields = SharedFields(shared)
    media = "application/json; indent=2" if indent else None
    value = {"sets": [{**own, **fields.member}, {**own, **fields.member}]}
    pairs: list[list[str]] = []

    def keys_of(items):
        pairs.append([k for k, _ in items])
        return dict(items)

    written = json.loads(FastJSONRenderer().render(value, media), object_pairs_hook=keys_of)
    assert written == {"sets": [{**own, **shared}] * 2}
    assert all(len(keys) == len(set(keys)) for keys in pairs)
