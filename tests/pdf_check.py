"""What every PDF we ship must pass, checked with Debian's qpdf (`make test` installs it) and
fontTools: `qpdf --check` finds no error, every font is embedded (each /Font has a
/FontDescriptor with a /FontFile, /FontFile2 or /FontFile3: no standard Helvetica referenced
and left to the reader), and every character drawn exists in its embedded font (each code a
text operator shows is in the font's cmap and is not .notdef), so no glyph is missing."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fontTools.ttLib import TTFont

__all__ = ["PdfFacts", "check_pdf"]

_FONT_FILES = ("/FontFile", "/FontFile2", "/FontFile3")
# A text-showing operand and operator as reportlab writes them: (literal) Tj, <hex> Tj, [..] TJ.
_TEXT = re.compile(rb"/(?P<font>[^\s/]+)\s+[\d.]+\s+Tf|(?P<literal>\((?:\\.|[^\\)])*\))\s*(?:Tj|')"
                   rb"|<(?P<hex>[0-9a-fA-F\s]*)>\s*(?:Tj|')")
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f", b"(": b"(", b")": b")", b"\\": b"\\"}


@dataclass(frozen=True)
class PdfFacts:
    fonts: tuple[str, ...]  # BaseFont of every font, all embedded
    text: str  # every string drawn, in order, decoded through each font's /ToUnicode
    lines: tuple[str, ...]  # the same, one entry per text operator (a wrapped paragraph is several)

    @property
    def words(self) -> str:
        """The lines joined by spaces: a paragraph wrapped over lines reads as its sentence."""
        return " ".join(self.lines)


def _qpdf(*args: str) -> subprocess.CompletedProcess[bytes]:
    if shutil.which("qpdf") is None:
        raise AssertionError("qpdf is not installed: `make test` installs Debian's qpdf (apt-get install qpdf)")
    return subprocess.run(["qpdf", *args], capture_output=True, check=False)


def _unescape(literal: bytes) -> bytes:
    body = literal[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        if body[i:i + 1] == b"\\":
            nxt = body[i + 1:i + 2]
            octal = re.match(rb"[0-7]{1,3}", body[i + 1:i + 4])
            if octal:
                out.append(int(octal.group(), 8) & 0xFF)
                i += 1 + len(octal.group())
                continue
            out += _ESCAPES.get(nxt, nxt)
            i += 2
            continue
        out += body[i:i + 1]
        i += 1
    return bytes(out)


def _to_unicode(stream: dict[str, Any]) -> dict[int, str]:
    """The one-byte code -> text map of a /ToUnicode CMap's bfchar entries (what reportlab writes)."""
    data = base64.b64decode(stream["data"]).decode("latin-1")
    return {int(code, 16): bytes.fromhex(text).decode("utf-16-be")
            for code, text in re.findall(r"<([0-9A-Fa-f]{2})>\s*<((?:[0-9A-Fa-f]{4})+)>", data)}


def check_pdf(content: bytes, tmp_path: Path) -> PdfFacts:
    """Assert the PDF passes qpdf, embeds every font and draws no missing glyph; its fonts and text."""
    path = tmp_path / "checked.pdf"
    path.write_bytes(content)
    check = _qpdf("--check", str(path))
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    dump = _qpdf("--json=2", "--json-stream-data=inline", "--decode-level=generalized", str(path))
    assert dump.returncode == 0, dump.stderr.decode()
    objects: dict[str, Any] = json.loads(dump.stdout)["qpdf"][1]

    def obj(ref: str) -> Any:
        return objects[f"obj:{ref}"]

    cmaps: dict[bytes, tuple[dict[int, str], dict[int, str]]] = {}
    names = []
    for entry in objects.values():
        value = entry.get("value") if isinstance(entry, dict) else None
        if not isinstance(value, dict) or value.get("/Type") != "/Font":
            continue
        base = value.get("/BaseFont", "?")
        names.append(base)
        descendants = value.get("/DescendantFonts")
        described = obj(descendants[0])["value"] if isinstance(descendants, list) else value
        descriptor_ref = described.get("/FontDescriptor")
        assert descriptor_ref, f"font {base} has no /FontDescriptor: it is referenced, not embedded"
        descriptor = obj(descriptor_ref)["value"]
        embedded = [k for k in _FONT_FILES if k in descriptor]
        assert embedded, f"font {base} is not embedded (no /FontFile*)"
        stream = obj(descriptor[embedded[0]])["stream"]
        font_file = TTFont(io.BytesIO(base64.b64decode(stream["data"])))
        cmap = font_file["cmap"].tables[0].cmap
        assert "/Name" in value, f"font {base} has no /Name to match its resource name"
        to_unicode = _to_unicode(obj(value["/ToUnicode"])["stream"]) if "/ToUnicode" in value else {}
        cmaps[value["/Name"][1:].encode()] = (cmap, to_unicode)

    drawn: list[str] = []
    for entry in objects.values():
        stream = entry.get("stream") if isinstance(entry, dict) else None
        if not stream or "data" not in stream:
            continue
        data = base64.b64decode(stream["data"])
        if b" Tf" not in data:
            continue
        current: tuple[dict[int, str], dict[int, str]] | None = None
        for match in _TEXT.finditer(data):
            if match.group("font"):
                current = cmaps.get(match.group("font"))
                assert current is not None, f"text set in font /{match.group('font').decode()}, not embedded"
                continue
            if match.group("literal") is not None:
                codes = _unescape(match.group("literal"))
            else:
                codes = bytes.fromhex(re.sub(rb"\s", b"", match.group("hex")).decode())
            if not codes:
                continue
            assert current is not None, "text drawn before any font was set"
            cmap, to_unicode = current
            for code in codes:
                glyph = cmap.get(code)
                assert glyph not in (None, ".notdef"), (f"code {code} is drawn but missing from its embedded font, in "
                                                        f"{match.group(0)[:120]!r}")
            drawn.append("".join(to_unicode.get(code, chr(code)) for code in codes))
    return PdfFacts(fonts=tuple(names), text="".join(drawn), lines=tuple(drawn))
