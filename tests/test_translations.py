"""Every user-facing string has a Simplified Chinese translation, and the shipped .mo
matches the .po (so nobody forgets `compilemessages`)."""

from __future__ import annotations

import ast
import gettext
import re
from pathlib import Path

LOCALE = Path(__file__).resolve().parent.parent / "locale" / "zh_Hans" / "LC_MESSAGES"


def _entries() -> dict[str, str]:
    text = (LOCALE / "django.po").read_text(encoding="utf-8")
    entries = {}
    for block in text.split("\n\n"):
        m = re.search(r'^msgid ((?:".*"\n)+)msgstr ((?:".*"\n?)+)', block + "\n", re.M)
        if not m:
            continue
        msgid = "".join(ast.literal_eval(s) for s in re.findall(r'".*"', m.group(1)))
        msgstr = "".join(ast.literal_eval(s) for s in re.findall(r'".*"', m.group(2)))
        if msgid and "#, fuzzy" not in block:
            entries[msgid] = msgstr
    return entries


def test_every_string_is_translated_to_simplified_chinese():
    entries = _entries()
    assert len(entries) > 30
    assert [k for k, v in entries.items() if not v] == []


def test_compiled_catalogue_matches_the_po_file():
    with (LOCALE / "django.mo").open("rb") as fh:
        catalogue = gettext.GNUTranslations(fh)
    stale = {k: v for k, v in _entries().items() if catalogue.gettext(k) != v}
    assert stale == {}, "run: python manage.py compilemessages"
