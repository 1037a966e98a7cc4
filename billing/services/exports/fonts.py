"""A TrueType subset of Noto Sans SC for the PDFs (invoices, the paired report): reportlab embeds
TrueType outlines only, and the whole font is ~30 000 glyphs, so each document embeds just the
characters it shows."""

from __future__ import annotations

import hashlib
import io
from functools import lru_cache

__all__ = ["cjk_font_name"]


def cjk_font_name(text: str) -> str:
    """Register (once per character set) a TrueType subset of Noto Sans SC covering `text`."""
    return _register_subset("".join(sorted(set(text))))


@lru_cache(maxsize=128)
def _register_subset(chars: str) -> str:
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    name = "NotoSansSC-" + hashlib.sha256(chars.encode()).hexdigest()[:12]
    pdfmetrics.registerFont(TTFont(name, io.BytesIO(_truetype_subset(chars))))
    return name


def _truetype_subset(chars: str) -> bytes:
    """Noto Sans SC (SIL OFL 1.1, shipped by the pylopdf-fonts-zh-cn wheel) cut down to `chars`
    and converted from CFF to TrueType outlines, which is what reportlab embeds. Subsetting first
    keeps this to about a second for an invoice; the whole font has ~30 000 glyphs."""
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
    font.sfntVersion = "\x00\x01\x00\x00"
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()
