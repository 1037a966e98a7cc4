"""A TrueType subset of Noto Sans SC for the PDFs (invoices, credit notes, the paired report):
reportlab embeds TrueType outlines only, and the whole font is ~30 000 glyphs, so each document
embeds just the characters it shows.

A PDF must never draw a character its subset lacks (reportlab would draw the empty .notdef glyph,
as the paired report once did for the "O" of "Ours", a string left out of the subset), nor name a
font it does not embed (reportlab's canvas and tables default to the standard Helvetica, which is
referenced, not embedded). So a document draws only through one `PdfFont`: its paragraphs refuse a
character outside the subset, its canvas starts in the subset font, and its tables are set in it.

Text that Noto Sans SC cannot draw at all (Hebrew, Arabic, Devanagari, Thai, emoji, and control or
invisible format characters such as a zero-width joiner) is refused where people type it (the
credit-note reason, a tenant's PO number and cost centre: `undrawable`), with a message naming the
characters. What is already stored, or comes from elsewhere (a tenant's name, a node's GPU model),
is drawn with each such character replaced by REPLACEMENT (`drawable`): a credit note is immutable,
so a PDF that raised on one character would fail for good. Fallback fonts were not the choice:
reportlab neither shapes Arabic or Devanagari nor orders right-to-left text, so their glyphs would be
drawn, but wrong."""

from __future__ import annotations

import hashlib
import io
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["REPLACEMENT", "PdfFont", "cjk_font_name", "drawable", "pdf_font", "undrawable"]

# Drawn instead of a character the font lacks: a white square, which Noto Sans SC has.
REPLACEMENT = "\u25a1"
# Drawn as spaces by `PdfFont.missing` (reportlab breaks lines on them).
_SPACING = frozenset("\n\t")


@dataclass(frozen=True)
class PdfFont:
    """The embedded font subset of one PDF and the only way that PDF draws text."""

    name: str
    characters: frozenset[str]

    def missing(self, text: str) -> set[str]:
        """Characters of `text` the subset lacks (line breaks and tabs are drawn as spaces)."""
        return set(text.replace("\n", " ").replace("\t", " ")) - self.characters

    def paragraph(self, text: str, style: Any) -> Any:
        """A reportlab Paragraph of plain `text` (escaped, never markup) in `style`, which must be
        set in this font. A character the font has no glyph for is drawn as REPLACEMENT (`drawable`).
        Refused (ValueError) when the subset lacks one of its characters: the caller left that
        string out of `pdf_font`, a bug a test catches before a reader does."""
        from reportlab.platypus import Paragraph

        text = drawable(text)
        missing = self.missing(text)
        if missing or style.fontName != self.name:
            raise ValueError(f"cannot draw {text!r} in the PDF font {self.name}: "
                             f"characters {sorted(missing)!r} are not in its subset (style font {style.fontName})")
        return Paragraph(escape(text), style)

    def table_commands(self) -> list[tuple[Any, ...]]:
        """TableStyle commands that set every cell in this font (a Table's default is Helvetica)."""
        return [("FONTNAME", (0, 0), (-1, -1), self.name)]

    def template_options(self) -> dict[str, Any]:
        """SimpleDocTemplate options that start its canvas in this font (reportlab's canvas starts
        in Helvetica and names it on every page)."""
        return {"initialFontName": self.name}


def pdf_font(strings: Iterable[str]) -> PdfFont:
    """The font subset covering every character of `strings` (all the text a document draws)."""
    name, covered = _register_subset("".join(sorted(set(drawable("".join(strings))) | {" "})))
    return PdfFont(name=name, characters=covered)


def cjk_font_name(text: str) -> str:
    """Register (once per character set) a TrueType subset of Noto Sans SC covering `text`."""
    return pdf_font([text]).name


def undrawable(text: str) -> list[str]:
    """The characters of `text` a PDF cannot draw (in order, each once): those Noto Sans SC has no
    glyph for, and control and format characters (line breaks and tabs excepted)."""
    glyphs = _font_characters()
    return list(dict.fromkeys(c for c in text if c not in _SPACING
                              and (ord(c) not in glyphs or unicodedata.category(c) in ("Cc", "Cf"))))


def drawable(text: str) -> str:
    """`text` with each character `undrawable` names replaced by REPLACEMENT."""
    bad = set(undrawable(text))
    return "".join(REPLACEMENT if c in bad else c for c in text) if bad else text


@lru_cache(maxsize=1)
def _font_characters() -> frozenset[int]:
    """The code points Noto Sans SC has a glyph for (its cmap)."""
    import pylopdf_fonts_zh_cn
    from fontTools.ttLib import TTFont as FontFile

    return frozenset(FontFile(pylopdf_fonts_zh_cn.sans_path(), lazy=True).getBestCmap())


@lru_cache(maxsize=128)
def _register_subset(chars: str) -> tuple[str, frozenset[str]]:
    """The registered name of the subset for `chars`, and the characters it really covers (its
    cmap: a character Noto Sans SC lacks is not covered, whatever was asked)."""
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    name = "NotoSansSC-" + hashlib.sha256(chars.encode()).hexdigest()[:12]
    font = TTFont(name, io.BytesIO(_truetype_subset(chars, postscript_name=name)))
    pdfmetrics.registerFont(font)
    return name, frozenset(chr(code) for code in font.face.charToGlyph)


def _truetype_subset(chars: str, *, postscript_name: str) -> bytes:
    """Noto Sans SC (SIL OFL 1.1, shipped by the pylopdf-fonts-zh-cn wheel) cut down to `chars`
    and converted from CFF to TrueType outlines, which is what reportlab embeds. Subsetting first
    keeps this to about a second for an invoice; the whole font has ~30 000 glyphs.

    Each subset carries its own PostScript name: reportlab registers one font per face name and
    quietly hands every later font of that face the first one registered, so with the original
    name ("NotoSansSC-Regular") the second document a process drew used the first one's subset and
    lost every character only it had (the missing glyphs of the paired report)."""
    import pylopdf_fonts_zh_cn
    from fontTools import subset
    from fontTools.pens.cu2quPen import Cu2QuPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen
    from fontTools.ttLib import TTFont as FontFile
    from fontTools.ttLib import newTable

    font = FontFile(pylopdf_fonts_zh_cn.sans_path(), lazy=True)
    options = subset.Options()
    options.name_IDs = ["*"]
    options.notdef_outline = True
    options.layout_features = []
    options.hinting = False
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=chars)
    subsetter.subset(font)

    glyph_set = font.getGlyphSet()
    order = font.getGlyphOrder()
    glyphs = {}
    for glyph_name in order:
        pen = TTGlyphPen(None)
        # Cubic to quadratic within 1 font unit (of 1000 per em): invisible at any print size.
        glyph_set[glyph_name].draw(Cu2QuPen(pen, 1.0, reverse_direction=True))
        glyphs[glyph_name] = pen.glyph()
    glyf = newTable("glyf")
    glyf.glyphOrder = order
    glyf.glyphs = glyphs
    font["glyf"] = glyf
    font["loca"] = newTable("loca")
    for table in ("CFF ", "VORG"):
        if table in font:
            del font[table]
    maxp = newTable("maxp")
    maxp.tableVersion = 0x00010000
    for field in ("maxZones", "maxTwilightPoints", "maxStorage", "maxFunctionDefs", "maxInstructionDefs",
                  "maxStackElements", "maxSizeOfInstructions", "maxComponentElements"):
        setattr(maxp, field, 0)
    maxp.maxZones = 1
    font["maxp"] = maxp
    font["head"].indexToLocFormat = 0
    font["head"].glyphDataFormat = 0
    font["post"].formatType = 3.0
    for record in font["name"].names:
        if record.nameID == 6:  # the PostScript name, reportlab's face name
            record.string = postscript_name
    font.sfntVersion = "\x00\x01\x00\x00"
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()
