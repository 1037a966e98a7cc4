"""JSON for the answers that can be large: orjson, with DRF's rules kept.

A month of per-pod allocations at 1,000 GPUs is 39k allocations and 73 MB of JSON; Python's json
wrote it in 0.77 s of the answer's 2.7 s (docs/benchmarks.md, "The allocation API over HTTP").
orjson writes the same JSON (no spaces, UTF-8, as DRF's compact JSON) several times faster. What
DRF's renderer does besides is kept: an `indent` asked for (the browsable API, `Accept:
application/json; indent=4`) goes to DRF's own renderer, a value orjson does not know goes through
DRF's encoder, and U+2028 and U+2029 are escaped so the answer is also valid JavaScript. Floats are
written in their shortest round-trip digits by either, orjson in JavaScript's notation (`0.00001` and
`1.5e-7`, where Python's json writes `1e-05` and `1.5e-07`), as Go's encoder, OpenCost's, writes them:
the same numbers to every JSON parser.

Fields that are the same in every object of an answer (an OpenCost Allocation's thirty-odd zeros
for resources the ledger does not meter) can be written as JSON once (`SharedFields`): each object is
a dict of its own fields that ends with `**shared.member`, one member whose value orjson writes as
that JSON, the first shared field's value and then the other shared members. The answer is then one
orjson call with a callback per object that only returns the written JSON. Building and writing a
per-pod month's 39k allocations took 378 ms as dicts of every field, 325 with each object's own
fields written by a callback of its own and joined to the shared ones, less again this way
(docs/benchmarks.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer

__all__ = ["FastJSONRenderer", "SharedFields"]

# U+2028 and U+2029 in UTF-8: E2 80 A8 and E2 80 A9.
_SEPARATORS = re.compile(b"\xe2\x80[\xa8\xa9]")
_ESCAPED = {"\u2028".encode(): b"\\u2028", "\u2029".encode(): b"\\u2029"}
_LEAD = b"\xe2"


class SharedFields:
    """Fields that many objects of an answer share, and their JSON, written once. An object takes
    them as the member `**shared.member`: the first shared field's name, whose value is this, which
    the renderer writes as that field's value followed by the other shared members. An object must
    not have a shared field's name among its own."""

    __slots__ = ("fields", "fragment", "member")

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = dict(fields)
        self.member: dict[str, SharedFields] = {}
        self.fragment = orjson.Fragment(b"")
        if self.fields:
            first, *rest = self.fields
            written = orjson.dumps(self.fields[first])
            if rest:
                written += b"," + orjson.dumps({name: self.fields[name] for name in rest})[1:-1]
            self.fragment = orjson.Fragment(written)
            self.member = {first: self}


def _expanded(value: Any) -> Any:
    """`value` with each object's shared member replaced by the shared fields themselves: for an
    encoder that writes members one by one (DRF's, indented)."""
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        shared: list[SharedFields] = []
        for key, item in value.items():
            if isinstance(item, SharedFields):
                shared.append(item)
            else:
                out[key] = _expanded(item)
        for fields in shared:
            out.update(fields.fields)
        return out
    if isinstance(value, list | tuple):
        return [_expanded(item) for item in value]
    return value


class FastJSONRenderer(JSONRenderer):  # type: ignore[misc]  # DRF ships no type hints
    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: dict[str, Any] | None = None) -> bytes:
        if data is None:
            return b""
        if self.get_indent(accepted_media_type, renderer_context or {}) is not None:
            return bytes(super().render(_expanded(data), accepted_media_type, renderer_context))
        fallback = self.encoder_class().default

        def default(o: Any) -> Any:
            if isinstance(o, SharedFields):
                return o.fragment
            return fallback(o)

        out = orjson.dumps(data, default=default)
        # Both separators start with the byte E2, which most answers never hold: looking for that one
        # byte (memchr) takes 7 ms over a per-pod month's 73 MB, where the pattern's search took 43.
        # Where it is there (any character from U+2000 to U+2FFF), one search for either separator,
        # then the replace.
        if _LEAD not in out or not _SEPARATORS.search(out):
            return out
        return _SEPARATORS.sub(lambda m: _ESCAPED[m.group()], out)
