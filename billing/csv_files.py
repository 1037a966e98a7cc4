"""The one CSV writer of the product: every CSV a user downloads is written through `csv_writer`,
so no cell can be read as a formula by a spreadsheet (CSV, or formula, injection; docs/exports.md).

A spreadsheet evaluates a cell that starts with `=`, `+`, `-` or `@` (and a tab or carriage return
before one, which some strip first). A tenant name, a credit-note reason, a pod name or a GPU model
reported by a node is text someone else chose; written verbatim, `=HYPERLINK("http://…")` becomes a
live link in finance's spreadsheet. OWASP's rule: prefix such a cell with a single quote, which the
spreadsheet shows as text and does not evaluate.

Numbers must stay numbers: `-12.34` is a credit, not a formula. So the writer decides by the
value's type, never by its text: an int, a Decimal, a float or a `Number` (text our code formatted
from a number: `number(amount_text(...))`) is written as it is; every other value is text and is
neutralised when it starts like a formula. A node that reports a GPU model "-1" gets "'-1".

Every file starts with a UTF-8 byte order mark: Excel opens a CSV without one in the machine's
ANSI code page, and a tenant named 星河智能 comes out as mojibake. Readers that know UTF-8
(Python's "utf-8-sig", pandas, DuckDB, polars, LibreOffice) skip it.

A download's name carries its period as the page shows it, first and last day both included
(`download_name`), never the exclusive end the ledger reads to.

Pure (the standard library, billing.money and billing.calendar), below every layer, like billing.money."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from billing.calendar import last_day
from billing.money import amount_text, format_minor_units, quantity_text

__all__ = ["BOM", "FORMULA_STARTS", "Number", "amount_cell", "csv_writer", "download_name", "inert_cell", "minor_cell",
           "number", "quantity_cell"]

# U+FEFF at the start of the file: how Excel knows a CSV is UTF-8.
BOM = "\ufeff"

# OWASP's characters, and their full-width forms, which spreadsheets in CJK locales also evaluate.
FORMULA_STARTS = frozenset("=+-@\uff1d\uff0b\uff0d\uff20")
_CONTROL_STARTS = frozenset("\t\r\n")


class Number(str):
    """Text our code wrote from a number (an amount, a quantity): a cell the writer leaves as it is."""

    __slots__ = ()


def number(text: str) -> Number:
    """Mark `text`, formatted by our code from a number, as a number for the CSV writer."""
    return Number(text)


def amount_cell(amount: Decimal, currency: str) -> Number:
    """billing.money.amount_text, as a number cell."""
    return Number(amount_text(amount, currency))


def quantity_cell(value: Decimal, places: int) -> Number:
    """billing.money.quantity_text, as a number cell."""
    return Number(quantity_text(value, places))


def minor_cell(minor: int, currency: str) -> Number:
    """billing.money.format_minor_units, as a number cell."""
    return Number(format_minor_units(minor, currency))


def inert_cell(value: Any) -> str:
    """One cell as written: None empty, numbers (by type) as they are, text neutralised when a
    spreadsheet would read it as a formula (its first character, or its first after leading
    whitespace, is one of FORMULA_STARTS, or it starts with a tab, CR or LF)."""
    if value is None:
        return ""
    if isinstance(value, Number):
        return str.__str__(value)
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    text = str(value)
    if text[:1] in _CONTROL_STARTS or text.lstrip()[:1] in FORMULA_STARTS:
        return "'" + text
    return text


class _Sink(Protocol):
    def write(self, s: str, /) -> Any: ...


class InertWriter:
    """csv.writer's writerow and writerows, every cell through `inert_cell`.

    csv quotes a field that holds a character of the line terminator only: with "\n" rows, a bare
    CR in a name went out unquoted and split the row for any reader. So rows are written with
    "\r\n" (every field holding CR or LF is quoted) and end with the terminator asked for."""

    def __init__(self, out: _Sink, **options: Any) -> None:
        self._out, self._end = out, options.pop("lineterminator", "\r\n")
        self._row = io.StringIO()
        self._writer = csv.writer(self._row, lineterminator="\r\n", **options)
        out.write(BOM)

    def writerow(self, row: Iterable[Any]) -> None:
        self._row.seek(0)
        self._row.truncate()
        self._writer.writerow([inert_cell(v) for v in row])
        self._out.write(self._row.getvalue()[:-2] + self._end)

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def csv_writer(out: _Sink, **options: Any) -> InertWriter:
    """The product's CSV writer over an empty `out` (a StringIO or an HttpResponse), which it
    starts with the BOM; `options` are csv's."""
    return InertWriter(out, **options)


def download_name(stem: str, start: datetime, end: datetime, extension: str = "csv") -> str:
    """`stem-YYYYMMDD-YYYYMMDD.csv` for the period [start, end): its first and its last day, as
    the page's "from … to … (inclusive)" says them."""
    return f"{stem}-{start.astimezone(UTC):%Y%m%d}-{last_day(end):%Y%m%d}.{extension}"
