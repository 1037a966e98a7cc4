"""Every number adds up (docs/billing.md, How totals add): a real demo, walked over HTTP as finance, a tenant member and an
admin, in English and Simplified Chinese. On every page, the figures a table or tile marks as parts
(`data-sum="G"`) add up, exactly as displayed, to the figure it marks as their total
(`data-sum-total="G"`); every CSV writes money with the currency's decimals and quantities with
their stated places (docs/exports.md), and its total rows are the sums of its rows as written.

The rule (billing.money.round_parts): each amount is rounded once; every total is the sum of the
rounded amounts shown. The markup is in the templates, so a page whose total is computed any other
way (the unrounded total, rounded) fails here on the first cent that does not add."""

from __future__ import annotations

import csv
import io
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import requests

from billing.ledger.models import GpuHour, UsageHour
from billing.models import Gpu, Node
from billing.scope import FINANCE_GROUP
from billing.services.exports import GPU_HOURS_PLACES
from billing.services.exports.focus_dataset import dataset_file_names
from tests import clock
from tests.conftest import user_in, with_day
from tests.demo_process import Demo
from tests.focus_validator import assert_passes, write_focus_csv

# The demo migrates, then meters a simulated day of last month and one of this month before the
# walk starts: minutes on a loaded machine.
pytestmark = pytest.mark.timeout(1800)

MINOR_DECIMALS = {"USD": 2}  # the demo's rate cards are in USD
QUANTITY_DECIMALS = 4  # GPU-hours, GB·h, SM·h in the CSVs (billing.money.QUANTITY_PLACES)
SEEDS = ("/", "/finance/", "/tenants/", "/invoices/", "/periods/", "/reports/", "/rebalance/", "/budgets/",
         "/nodes/", "/rate-cards/", "/sla-tiers/", "/audit/")
# Not pages: signing out, switching language, the API, probes, static files, PDFs (checked by the
# invoices' own tests).
SKIP = re.compile(r"^/(accounts/logout|i18n/|api/|static/|metrics|healthz|readyz)|\.pdf$")
MAX_VARIANTS_PER_PATH = 12  # query strings followed per path (the audit log pages on and on)
NUMBER = re.compile(r"[−-]?\d[\d,]*(?:\.\d+)?")


def _login(demo: Demo, username: str, language: str) -> requests.Session:
    s = requests.Session()
    s.headers["Accept-Language"] = language
    s.get(f"{demo.base}/accounts/login/", timeout=10)
    resp = s.post(f"{demo.base}/accounts/login/", timeout=10, headers={"Referer": f"{demo.base}/accounts/login/"},
                  data={"username": username, "password": demo.passwords[username],
                        "csrfmiddlewaretoken": s.cookies["csrftoken"]})
    assert resp.status_code == 200, resp.text[:1000]
    assert "sessionid" in s.cookies, resp.text[:1000]
    return s


# --- pages -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    parts: tuple[str, ...]  # groups this figure is a part of
    totals: tuple[str, ...]  # groups this figure is the total of
    text: str
    figure: str = ""  # its identity (data-figure, billing.figures.figure_key): the same figure on any page
    live: str = ""  # the identity of a figure that moves as usage lands (data-figure-live): the same within a page


class _MarkParser(HTMLParser):
    """The text of every element carrying data-sum / data-sum-total, and the page's links."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                      "track", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str, str, tuple[str, str], list[str]]] = []
        self.marks: list[Mark] = []
        self.links: list[str] = []
        self.down_links: list[str] = []  # the drill-down's links to the level a row opens

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
            if a.get("data-testid") == "explore-down":
                self.down_links.append(a["href"])
        if tag not in self.VOID:
            self.stack.append((tag, a.get("data-sum", ""), a.get("data-sum-total", ""),
                               (a.get("data-figure", ""), a.get("data-figure-live", "")), []))

    def handle_data(self, data: str) -> None:
        for _tag, part, total, figure, text in self.stack:
            if part or total or any(figure):
                text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag not in {t for t, *_ in self.stack}:
            return  # a stray end tag closes nothing
        while self.stack:
            name, part, total, (figure, live), text = self.stack.pop()
            if part or total or figure or live:
                self.marks.append(Mark(tuple(part.split()), tuple(total.split()), " ".join("".join(text).split()),
                                       figure, live))
            if name == tag:
                return


def _figure(text: str) -> Decimal:
    """The number an element shows: "1,234.57 USD" -> 1234.57, "−3.10" -> -3.10, "3 GPUs:" -> 3."""
    match = NUMBER.search(text)
    assert match, f"no number in {text!r}"
    return Decimal(match.group(0).replace("−", "-").replace(",", ""))


def _decimals(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


@dataclass
class Walk:
    """What one user saw: page marks by URL, the CSVs by URL, and the cross-page figures."""

    pages: dict[str, list[Mark]] = field(default_factory=dict)
    csvs: dict[str, tuple[str, list[list[str]]]] = field(default_factory=dict)  # url -> (filename, rows)
    groups_checked: set[str] = field(default_factory=set)


def _walk(demo: Demo, session: requests.Session, seeds: tuple[str, ...], *, follow: bool) -> Walk:
    walk = Walk()
    queue = [urljoin(demo.base, s) for s in seeds]
    seen: set[str] = set()
    variants: dict[str, int] = defaultdict(int)
    while queue:
        url = queue.pop(0)
        parts = urlsplit(url)
        if url in seen or parts.netloc != urlsplit(demo.base).netloc or SKIP.search(parts.path):
            continue
        seen.add(url)
        if parts.query:
            variants[parts.path] += 1
            if variants[parts.path] > MAX_VARIANTS_PER_PATH:
                continue
        resp = session.get(url, timeout=60)
        if resp.status_code != 200:
            continue  # a page this user may not see, or a bad period: nothing to add up
        kind = resp.headers.get("Content-Type", "")
        if kind.startswith("text/csv"):
            name = re.search(r'filename="([^"]+)"', resp.headers.get("Content-Disposition", ""))
            walk.csvs[url] = (name.group(1) if name else "", list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig")))))
            continue
        if not kind.startswith("text/html"):
            continue
        parser = _MarkParser()
        parser.feed(resp.text)
        walk.pages[url] = parser.marks
        _check_page(url, parser.marks, walk)
        if follow:
            queue.extend(urljoin(url, href) for href in parser.links if not href.startswith("#"))
    return walk


def _check_page(url: str, marks: list[Mark], walk: Walk) -> None:
    """Each group's parts add to its total exactly as shown, at the total's precision."""
    parts: dict[str, list[Decimal]] = defaultdict(list)
    totals: dict[str, list[Decimal]] = defaultdict(list)
    for m in marks:
        for g in m.parts:
            parts[g].append(_figure(m.text))
        for g in m.totals:
            totals[g].append(_figure(m.text))
    for g in parts:
        # A part with no total on its page is a table that lost its footer; x- groups add up
        # across pages (invoices to their period's total) and are checked by _check_cross_pages.
        assert g.startswith("x-") or g in totals, f"{url}: {g!r} has parts but no total"
    for g, shown in totals.items():
        if g.startswith("x-"):
            continue
        assert len(shown) == 1, f"{url}: {g!r} has {len(shown)} totals"
        total = shown[0]
        assert all(_decimals(p) == _decimals(total) for p in parts[g]), (url, g, parts[g], total)
        assert sum(parts[g], Decimal(0)) == total, f"{url}: {g!r}: {' + '.join(map(str, parts[g]))} ≠ {total}"
        walk.groups_checked.add(re.sub(r"^row-.*", "row", re.sub(r"^gpus-.*", "gpus", g)))


def _check_cross_pages(walk: Walk) -> int:
    """Each column of the invoices page (subtotal, tax, total, credited, balance due) adds up, per
    month and currency, to that month's figure on the periods page."""
    parts: dict[str, list[Decimal]] = defaultdict(list)
    totals: dict[str, Decimal] = {}
    for marks in walk.pages.values():
        for m in marks:
            for g in m.parts:
                if g.startswith("x-"):
                    parts[g].append(_figure(m.text))
            for g in m.totals:
                if g.startswith("x-"):
                    totals[g] = _figure(m.text)
    for g, total in totals.items():
        assert sum(parts[g], Decimal(0)) == total, f"{g}: invoices {parts[g]} do not add to the period's {total}"
    return len(totals)


def _figures_over(walks: list[Walk]) -> dict[str, list[tuple[str, Decimal]]]:
    """Every figure with an identity (data-figure) the walks saw whose period is over: key -> (url, value).
    A period still running is left out: its figures move between two page loads, rightly. One over for
    an hour has been rolled up whole (the demo rolls up every few seconds). A key with no period names
    a document that never changes once written (a finished paired report): always compared."""
    settled = clock.now() - timedelta(hours=1)
    seen: dict[str, list[tuple[str, Decimal]]] = defaultdict(list)
    for walk in walks:
        for url, marks in walk.pages.items():
            for m in marks:
                if not m.figure:
                    continue
                _kind, _start, end, *_scope = m.figure.split("|")
                if not end or datetime.fromisoformat(end) <= settled:
                    seen[m.figure].append((url, _figure(m.text)))
    return seen


def _check_figures(walks: list[Walk]) -> dict[str, list[tuple[str, Decimal]]]:
    """One figure is the same wherever it is shown: on every page, at every drill-down level (a row and
    the level it opens carry one key) and in every language, to the last digit shown."""
    seen = _figures_over(walks)
    for key, shown in seen.items():
        values = {(v, _decimals(v)) for _url, v in shown}
        assert len(values) == 1, f"{key} is shown as " + "; ".join(f"{v} on {url}" for url, v in shown)
    return seen


def _check_live(walk: Walk) -> int:
    """A figure of the period in progress (data-figure-live) is the same wherever one page shows it (the
    portal's month to date, its upcoming invoice's subtotal and its workloads' total): one page is one
    instant, so they cannot have moved apart. Returns how many such figures were shown twice on a page."""
    twice = 0
    for url, marks in walk.pages.items():
        shown: dict[str, set[Decimal]] = defaultdict(set)
        counts: dict[str, int] = defaultdict(int)
        for m in marks:
            if m.live:
                shown[m.live].add(_figure(m.text))
                counts[m.live] += 1
        for key, values in shown.items():
            assert len(values) == 1, f"{url}: {key} is shown as {sorted(values)}"
        twice += sum(1 for n in counts.values() if n > 1)
    return twice


def _drill(demo: Demo, session: requests.Session, url: str, *, rows: int) -> list[str]:
    """The drill-down from `url` to the GPUs: the levels opened by the first `rows` rows of each
    level (one URL per page visited, in order)."""
    visited = []
    level = [urljoin(demo.base, url)]
    while level:
        following = []
        for page in level:
            resp = session.get(page, timeout=60)
            assert resp.status_code == 200, (page, resp.status_code)
            visited.append(page)
            parser = _MarkParser()
            parser.feed(resp.text)
            following += [urljoin(page, href) for href in parser.down_links[:rows]]
        level = following
    return visited


# --- CSVs ------------------------------------------------------------------------------------


def _exact(text: str, places: int, what: str) -> Decimal:
    assert re.fullmatch(r"-?\d+" + (rf"\.\d{{{places}}}" if places else ""), text), f"{what}: {text!r} is not to {places} places"
    return Decimal(text)


def _money(row: dict[str, str], column: str, what: str) -> Decimal:
    return _exact(row[column], MINOR_DECIMALS[row["currency"]], f"{what} {column}")


def _check_csv(name: str, rows: list[list[str]]) -> str:
    """Check one CSV by its kind (from its file name); returns the kind."""
    header, *body = rows
    records = [dict(zip(header, r, strict=True)) for r in body]
    if re.fullmatch(r"gpu-cost-\d{8}-\d{8}\.csv", name):
        _check_tenant_costs_csv(name, records)
        return "tenants"
    if re.fullmatch(r"gpu-cost-(timeline|workloads)-\d{8}-\d{8}\.csv", name):
        for r in records:
            _money(r, "cost", name)
            for q in ("gpu_hours_equivalent", "mem_used_gb_h", "sm_used_h"):
                if q in r:
                    _exact(r[q], QUANTITY_DECIMALS, f"{name} {q}")
        return name.split("-")[2]
    if re.fullmatch(r"gpu-cost-utilisation-\d{8}-\d{8}\.csv", name):
        for r in records:
            for q in ("metered_gpu_s", "sm_used_s", "sm_capacity_s", "mem_used_mb_s", "mem_capacity_mb_s"):
                _exact(r[q], 0, f"{name} {q}")
            for q in ("sm_utilisation_pct", "idle_memory_pct"):
                if r[q]:
                    _exact(r[q], 1, f"{name} {q}")
        return "utilisation"
    if re.fullmatch(r"[a-z0-9-]+-workloads-\d{8}-\d{8}\.csv", name):
        _check_sum_row(name, records, "namespace", ["cost"],
                       ["gpu_hours_equivalent", "mem_used_gb_h", "mem_granted_gb_h", "sm_used_h", "sm_granted_h"])
        return "portal-workloads"
    if re.fullmatch(r"explore-(tenant|namespace|controller|pod|gpu)-\d{8}-\d{8}\.csv", name):
        _check_explore_csv(name, records)
        return "explore"
    if re.fullmatch(r"fleet-gpus-\d{8}-\d{8}\.csv", name):
        _check_sum_row(name, records, "node", ["card_cost", "attributed", "idle_cost"], ["energy_kwh"])
        for r in records:
            assert _money(r, "attributed", name) + _money(r, "idle_cost", name) == _money(r, "card_cost", name), name
        return "fleet"
    if name.endswith("-focus-1.3.csv"):
        return "focus"
    if re.fullmatch(r"CN-\d{4}-\d+\.csv", name):
        _check_credit_note_csv(name, records)
        return "credit-note"
    if re.fullmatch(r"paired-report-\d+-\d{8}-\d{8}\.csv", name):
        _check_savings_csv(name, records)
        return "savings"
    if re.fullmatch(r"invoices-\d{8}\.csv", name):
        _check_invoice_list_csv(name, records)
        return "invoice-list"
    if re.fullmatch(r"[a-z0-9-]+-upcoming-\d{4}-\d{2}\.csv|VGL-.*\.csv", name):
        _check_invoice_csv(name, records)
        return "invoice"
    raise AssertionError(f"a CSV this test does not know: {name}")


def _check_tenant_costs_csv(name: str, records: list[dict[str, str]]) -> None:
    *rows, total = records
    assert total["tenant"] == "(total)", name
    for r in [*rows, total]:
        charge, idle, row_total = (_money(r, c, name) if r[c] else Decimal(0) for c in ("charge", "idle_share", "total"))
        assert charge + idle == row_total, f"{name} {r['tenant']}: {charge} + {idle} ≠ {row_total}"
    _check_sum_row(name, records, "tenant", ["charge", "idle_share", "total"],
                   ["gpu_hours_equivalent", "mem_used_gb_h", "sm_used_h"])
    _check_energy_columns(name, records, "tenant")


def _check_explore_csv(name: str, records: list[dict[str, str]]) -> None:
    """The drill-down's CSV: cost and quantities add to "(total)"; a requested column adds only
    when every row's request is known (its total is empty otherwise); percentages to 1 place."""
    _check_sum_row(name, records, "name", ["cost", "previous_cost", "change"],
                   ["gpu_hours", "mem_used_gb_h", "mem_granted_gb_h", "sm_used_h", "sm_granted_h"])
    _check_energy_columns(name, records, "name")
    *rows, total = records
    for column in ("mem_requested_gb_h", "sm_requested_h"):
        if total[column]:
            assert all(r[column] for r in rows), f"{name} {column}: a total over unknown requests"
            _check_sum_row(name, records, "name", [], [column])
    for r in records:
        for column in ("mem_used_of_granted_pct", "mem_used_of_requested_pct", "sm_used_of_granted_pct",
                       "sm_used_of_requested_pct"):
            if r[column]:
                _exact(r[column], 1, f"{name} {column}")


def _check_energy_columns(name: str, records: list[dict[str, str]], key: str) -> None:
    """kWh adds to "(total)"; energy cost and kg CO2e too where the total is known (empty: some row's is not)."""
    *rows, total = records
    _check_sum_row(name, records, key, [], ["energy_kwh"])
    for column, money in (("energy_cost", True), ("co2e_kg", False)):
        if total[column]:
            assert all(r[column] for r in rows if r[key] != "(idle, platform)"), f"{name} {column}: a total over unknowns"
            _check_sum_row(name, records, key, [column] if money else [], [] if money else [column])


def _check_sum_row(name: str, records: list[dict[str, str]], key: str, money: list[str], quantities: list[str]) -> None:
    """The last row is "(total)": each column the sum of the rows above as written."""
    *rows, total = records
    assert total[key] == "(total)", f"{name}: no total row"
    for column in money:
        cells = [_money(r, column, name) for r in rows if r[column]]
        assert sum(cells, Decimal(0)) == _money(total, column, name), f"{name} {column}"
    for column in quantities:
        cells = [_exact(r[column], QUANTITY_DECIMALS, f"{name} {column}") for r in rows if r[column]]
        assert sum(cells, Decimal(0)) == _exact(total[column], QUANTITY_DECIMALS, f"{name} {column}"), f"{name} {column}"


def _check_invoice_csv(name: str, records: list[dict[str, str]]) -> None:
    """Lines add to the subtotal row, subtotal + tax to the total row (the upcoming invoice's CSV
    has no subtotal row when there is no tax: its lines add to the total)."""
    by_label = {r["line"]: r for r in records if r["line"] in {"subtotal", "tax", "total"}}
    lines = [r for r in records if r["line"] not in by_label]
    total = by_label["total"]
    for r in lines:
        if r["gpu_hours"]:
            _exact(r["gpu_hours"], GPU_HOURS_PLACES, f"{name} gpu_hours")
        assert _money(r, "amount", name) == Decimal(int(r["amount_minor"])).scaleb(-MINOR_DECIMALS[r["currency"]])
    lines_minor = sum(int(r["amount_minor"]) for r in lines)
    lines_major = sum((_money(r, "amount", name) for r in lines), Decimal(0))
    if "subtotal" in by_label:
        assert lines_minor == int(by_label["subtotal"]["amount_minor"]), f"{name}: lines ≠ subtotal"
        assert lines_major == _money(by_label["subtotal"], "amount", name), f"{name}: lines ≠ subtotal"
    tax = by_label.get("tax")
    tax_minor, tax_major = (int(tax["amount_minor"]), _money(tax, "amount", name)) if tax else (0, Decimal(0))
    assert lines_minor + tax_minor == int(total["amount_minor"]), f"{name}: lines + tax ≠ total"
    assert lines_major + tax_major == _money(total, "amount", name), f"{name}: lines + tax ≠ total"


_LIST_MONEY = ("subtotal", "tax", "total", "credited", "balance_due")


def _check_invoice_list_csv(name: str, records: list[dict[str, str]]) -> None:
    """The invoice list's CSV: each amount in minor units is the major-unit cell exactly; subtotal +
    tax = total; credited at most the total; an unpaid invoice's balance is its total less what is
    credited, a paid one's never positive (a credit owed back is negative); a "(total)" row, when
    there is one, is the sum of the rows above in every column (the balance over issued invoices)."""
    rows = [r for r in records if r["invoice_number"] != "(total)"]
    for r in records:
        for column in _LIST_MONEY:
            if r[f"{column}_minor"] or r[column]:
                minor = int(r[f"{column}_minor"])
                assert _money(r, column, name) == Decimal(minor).scaleb(-MINOR_DECIMALS[r["currency"]]), (name, column)
        assert int(r["subtotal_minor"]) + int(r["tax_minor"]) == int(r["total_minor"]), f"{name} {r['invoice_number']}"
        assert 0 <= int(r["credited_minor"]) <= int(r["total_minor"]), f"{name} {r['invoice_number']}"
    for r in rows:
        if r["payment_status"] == "draft":
            assert r["balance_due_minor"] == "", f"{name} {r['invoice_number']}: a draft has no balance"
        elif r["payment_status"] == "paid":
            assert int(r["balance_due_minor"]) <= 0, f"{name} {r['invoice_number']}: paid, yet something due"
        else:
            assert int(r["balance_due_minor"]) == int(r["total_minor"]) - int(r["credited_minor"]), (
                f"{name} {r['invoice_number']}: unpaid balance ≠ total − credited")
    if records and records[-1]["invoice_number"] == "(total)":
        total = records[-1]
        for column in _LIST_MONEY:
            cells = [int(r[f"{column}_minor"]) for r in rows if r[f"{column}_minor"]]
            assert sum(cells) == int(total[f"{column}_minor"] or 0), f"{name} {column}"


def _check_credit_note_csv(name: str, records: list[dict[str, str]]) -> None:
    """Net + tax = total, in minor units and as written with the currency's decimals."""
    for r in records:
        assert int(r["amount_minor"]) + int(r["tax_minor"]) == int(r["total_minor"]), name
        assert _money(r, "amount", name) + _money(r, "tax", name) == _money(r, "total", name), name


def _check_savings_csv(name: str, records: list[dict[str, str]]) -> None:
    """The fleet's rows add to its "Fleet cost" row and the chargeback's to its total (each section's
    last), in every column with amounts; saving = static − dynamic on every row that has both;
    dynamic allocation's cost is the same figure on every alternatives row, the fleet's busy-cards
    row and the chargeback's total; every amount with the currency's decimals."""
    for section, columns in (("fleet", ("dynamic",)), ("chargeback", ("static", "dynamic", "saving"))):
        *rows, total = [r for r in records if r["section"] == section]
        for column in columns:
            if not total[column]:
                continue  # no static alternative fits: nothing to compare with
            cells = [_money(r, column, f"{name} {r['row']}") for r in rows]
            assert sum(cells, Decimal(0)) == _money(total, column, name), f"{name} {section} {column}"
    for r in records:
        if r["section"] in ("alternatives", "chargeback") and r["static"] and r["saving"]:
            assert _money(r, "static", name) - _money(r, "dynamic", name) == _money(r, "saving", name), r
    dynamic = {_money(r, "dynamic", name) for r in records if r["section"] == "alternatives"}
    busy = next(r for r in records if r["section"] == "fleet")
    charged = [r for r in records if r["section"] == "chargeback"][-1]
    assert dynamic == {_money(busy, "dynamic", name)} == {_money(charged, "dynamic", name)}, name
    for r in records:
        if r["section"] == "paired_test" and r["currency"] and r["saving"]:
            _money(r, "saving", name)


def _check_focus_matches_invoice(walk: Walk) -> int:
    """Σ BilledCost of an invoice's FOCUS file is its CSV total (FOCUS carries ledger precision by its
    spec, with one rounding row per line; docs/exports.md)."""
    by_number = {n.removesuffix(".csv"): rows for n, rows in walk.csvs.values() if n.startswith("VGL-")
                 and not n.endswith("-focus-1.3.csv")}
    checked = 0
    for name, rows in walk.csvs.values():
        if not (name.startswith("VGL-") and name.endswith("-focus-1.3.csv")):
            continue
        header, *body = rows
        billed = sum((Decimal(dict(zip(header, r, strict=True))["BilledCost"]) for r in body), Decimal(0))
        invoice = by_number[name.removesuffix("-focus-1.3.csv")]
        assert billed == Decimal(invoice[-1][invoice[0].index("amount")]), name
        checked += 1
    return checked


def _demo_focus_dataset(demo: Demo, timeout_s: float = 240) -> Path:
    """This month's fleet FOCUS dataset (CSV) as the demo's beat writes it, every 2 minutes."""
    month = clock.now().date().replace(day=1)
    path = demo.data_dir / "focus" / f"{month:%Y-%m}" / dataset_file_names(month)[0]
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(2)
    assert path.exists(), f"the demo wrote no fleet FOCUS dataset at {path}"
    return path


def _check_focus_with_the_validator(walk: Walk, demo: Demo, tmp_path: Path) -> int:
    """Every FOCUS file the demo serves (invoices, credit notes) and its fleet dataset pass the FinOps
    Foundation's focus-validator, in one run over all their rows (tests/focus_validator.py)."""
    files = [rows for name, rows in walk.csvs.values() if name.endswith("-focus-1.3.csv")]
    with _demo_focus_dataset(demo).open(newline="", encoding="utf-8-sig") as f:
        files.append(list(csv.reader(f)))
    header = files[0][0]
    assert all(rows[0] == header for rows in files)
    body = [row for rows in files for row in rows[1:]]
    assert_passes(write_focus_csv(tmp_path / "demo-focus.csv", header, body))
    return len(files)


# --- the walk ----------------------------------------------------------------------------------


def _last_month_query() -> str:
    first = clock.now().date().replace(day=1)
    last = first - timedelta(days=1)
    return f"start={last.replace(day=1).isoformat()}&end={last.isoformat()}"


def _month_before_last_query() -> str:
    last = clock.now().date().replace(day=1) - timedelta(days=1)
    before = last.replace(day=1) - timedelta(days=1)
    return f"start={before.replace(day=1).isoformat()}&end={before.isoformat()}"


def test_every_page_and_csv_of_the_demo_adds_up(demo: Demo, tmp_path: Path) -> None:
    kinds: set[str] = set()
    groups: set[str] = set()
    for username in ("finance", "acme-engineer", "admin"):
        walk = _walk(demo, _login(demo, username, "en"), SEEDS, follow=True)
        assert walk.pages, username
        assert walk.csvs, username
        # What was walked, for a failure's report (pytest shows it then, or with -s).
        print(f"{username}: {len(walk.pages)} pages, {len(walk.csvs)} CSVs, groups {sorted(walk.groups_checked)}")  # noqa: T201 - what was walked, for a failure's report
        for name, rows in walk.csvs.values():
            kinds.add(_check_csv(name, rows))
        groups |= walk.groups_checked
        compared = {key: len(shown) for key, shown in _check_figures([walk]).items() if len(shown) > 1}
        print(f"{username}: figures met more than once: {compared}")  # noqa: T201 - what was compared, for a failure's report
        if username == "finance":  # the savings card's report, on the dashboard and on the report's own page
            assert any(key.startswith("report_alternative_cost|") for key in compared), compared
        if username == "acme-engineer":  # the portal's month to date, upcoming subtotal and workloads' total
            assert _check_live(walk) >= 1
        else:
            _check_live(walk)
        if username in ("finance", "acme-engineer"):  # an invoice on the list (or portal) and on its own page
            assert any(key.startswith("invoice_balance_due|") for key in compared), compared
            assert any(key.startswith("invoice_total|") for key in compared), compared
        if username == "finance":
            assert _check_cross_pages(walk) >= 1, "no closed period's total was checked against its invoices"
            assert _check_focus_matches_invoice(walk) >= 1
            assert _check_focus_with_the_validator(walk, demo, tmp_path) >= 2  # an invoice's and the dataset
        if username == "acme-engineer":
            assert "attributed" in walk.groups_checked  # the tenant's own "Your cost" adds up too
    # Every kind of table with a total was met and checked, and every kind of CSV.
    assert {"fleet", "attributed", "total", "charge", "idle-share", "foot", "row", "workloads",
            "upcoming", "explore-cost", "explore-kwh", "tenant-kwh", "fleet-card", "fleet-idle"} <= groups, groups
    assert {"tenants", "timeline", "workloads", "utilisation", "portal-workloads", "invoice", "invoice-list",
            "focus", "explore", "fleet"} <= kinds, kinds


def test_pages_and_their_csvs_show_the_same_totals_in_both_languages(demo: Demo) -> None:
    """Last month is closed, so its figures hold still: the page's totals are its CSV's, in English
    and in Simplified Chinese (no grouping there, the same digits)."""
    query = _last_month_query()
    shown: dict[str, list[Decimal]] = {}
    for language in ("en", "zh-hans"):
        session = _login(demo, "finance", language)
        walk = _walk(demo, session, (f"/finance/?{query}", f"/tenants/acme/?{query}", "/invoices/", "/periods/"),
                     follow=False)
        finance, portal = (walk.pages[urljoin(demo.base, p)] for p in (f"/finance/?{query}", f"/tenants/acme/?{query}"))
        fleet = next(_figure(m.text) for m in finance if "fleet" in m.totals)
        workloads = next(_figure(m.text) for m in portal if "workloads" in m.totals)
        shown[language] = [fleet, workloads]
        assert _check_cross_pages(walk) >= 1
        tenants_csv = _records(session, f"{demo.base}/finance/?{query}&format=csv")
        _check_tenant_costs_csv("tenants CSV", tenants_csv)
        assert Decimal(tenants_csv[-1]["total"]) == fleet
        workloads_csv = _records(session, f"{demo.base}/tenants/acme/?{query}&format=csv")
        assert workloads_csv[-1]["namespace"] == "(total)"
        assert Decimal(workloads_csv[-1]["cost"]) == workloads
    assert shown["en"] == shown["zh-hans"]


def test_one_figure_is_the_same_on_every_page_level_and_language(demo: Demo) -> None:
    """Last month, closed: a tenant's cost and GPU-hours on the finance page, in the drill-down (its
    row, and the total of the level that row opens, down to the GPUs) and on its portal, a pod's on
    the finance page and its portal, the month's metered GPU-hours on the finance and periods pages
    are one figure each, in English and in Simplified Chinese."""
    query = _last_month_query()
    walks = []
    for language in ("en", "zh-hans"):
        session = _login(demo, "finance", language)
        explore = _drill(demo, session, f"/explore/?{query}", rows=2)
        assert len(explore) >= 5, explore  # tenants, then two of them down to their GPUs
        # The month to date too: its month-over-month table shows last month's figures, and its
        # comparison the same days of last month.
        # The fleet view's comparison names the month before last's card cost: that month's finance page.
        walks.append(_walk(demo, session, (f"/finance/?{query}", f"/tenants/acme/?{query}", "/periods/",
                                           f"/fleet/?{query}", f"/finance/?{_month_before_last_query()}", *explore,
                                           "/finance/", "/tenants/acme/"), follow=False))
    seen = _check_figures(walks)
    first = clock.now().date().replace(day=1)
    last_month = (f"{(first - timedelta(days=1)).replace(day=1).isoformat()}T00:00:00+00:00",
                  f"{first.isoformat()}T00:00:00+00:00")
    # The month shown (its comparison also names the month before, with no usage in the demo).
    acme = [key for key in seen if key.startswith("cost|") and key.split("|")[3:] == ["tenant=acme"]
            and tuple(key.split("|")[1:3]) == last_month]
    assert len(acme) == 1, sorted(seen)
    # acme's cost: finance row, drill-down row, the namespaces' total, the portal; in each language.
    assert len({url for url, _ in seen[acme[0]]}) >= 4, seen[acme[0]]
    assert len(seen[acme[0]]) >= 4 * 2, seen[acme[0]]
    # Every level down to the GPUs: each row's figure met again as the total of the level it opens.
    assert max(len(key.split("|")) for key in seen) == 3 + 5, sorted(seen)  # kind, start, end, then five steps
    assert any(key.startswith("gpu_hours|") for key in seen), sorted(seen)
    # The month's metered GPU-hours: the finance page's tile and the periods page.
    assert any(key.startswith("metered_gpu_hours|") and len({url for url, _ in shown}) >= 2
               for key, shown in seen.items()), sorted(seen)
    # The fleet's card cost: the finance page's total GPU cost and the fleet view's total.
    assert any(key.startswith("card_cost|") and len({url for url, _ in shown}) >= 2
               for key, shown in seen.items()), sorted(seen)
    # The fleet view's previous period (the month before last) against that month's finance page.
    before = (f"{(first - timedelta(days=1)).replace(day=1) - timedelta(days=1):%Y-%m}-01T00:00:00+00:00",
              last_month[0])
    pages = {urlsplit(url).path for url, _ in seen.get("card_cost|{}|{}".format(*before), [])}
    assert {"/fleet/", "/finance/"} <= pages, sorted(seen)
    # Last month's bars of the month to date's month-over-month tables: the figures of last month's pages.
    for key in ("cost|{}|{}".format(*last_month), "cost|{}|{}|tenant=acme".format(*last_month)):
        assert len({url for url, _ in seen[key]}) >= 2, (key, seen.get(key))
    assert any(url.endswith("/finance/") for url, _ in seen["cost|{}|{}".format(*last_month)])
    assert any(url.endswith("/tenants/acme/") for url, _ in seen["cost|{}|{}|tenant=acme".format(*last_month)])
    # A pod instance: the finance page's top workloads, its row on the portal and its cost panel there.
    assert any("|pod_uid=" in key and len({url for url, _ in shown}) >= 2 for key, shown in seen.items()), sorted(seen)


def _records(session: requests.Session, url: str) -> list[dict[str, str]]:
    header, *rows = list(csv.reader(io.StringIO(session.get(url, timeout=60).content.decode("utf-8-sig"))))
    return [dict(zip(header, r, strict=True)) for r in rows]


# --- the rule on hand-made figures (fast, no demo) ------------------------------------------------


def _marks(html: str) -> list[Mark]:
    parser = _MarkParser()
    parser.feed(html)
    return parser.marks


def test_the_checker_fails_on_a_total_that_does_not_add() -> None:
    html = ('<table><tr><td data-sum="t">317.01 USD</td></tr><tr><td data-sum="t">317.01 USD</td></tr>'
            '<tr><td data-sum="t">317.01 USD</td></tr><tfoot><td data-sum-total="t"><strong>951.02</strong> USD'
            '</td></tfoot></table>')
    with pytest.raises(AssertionError, match=r"≠ 951\.02"):
        _check_page("/x", _marks(html), Walk())
    with pytest.raises(AssertionError, match="no total"):
        _check_page("/x", _marks('<p data-sum="lost">1.00</p>'), Walk())
    _check_page("/x", _marks(html.replace("951.02", "951.03")), Walk())


def test_the_checker_fails_on_one_figure_shown_two_ways() -> None:
    """Two pages, or two languages, showing one figure (the same key) differently fail; a period
    still running is not compared (its figures move between loads); equal figures pass."""
    over = "cost|2026-11-01T00:00:00+00:00|2026-12-01T00:00:00+00:00|tenant=acme"
    running = f"cost|2026-11-01T00:00:00+00:00|{(clock.now() + timedelta(days=1)).isoformat()}|tenant=acme"

    def walk(**pages: str) -> Walk:
        return Walk(pages={url: _marks(html) for url, html in pages.items()})

    finance = f'<td><strong data-figure="{over}">1,594.18 USD</strong></td><td data-figure="{running}">10.00</td>'
    explore = f'<strong data-figure="{over}">1594.17</strong><p data-figure="{running}">10.01</p>'
    with pytest.raises(AssertionError, match=r"1594\.18 on finance; 1594\.17 on explore"):
        _check_figures([walk(finance=finance), walk(explore=explore)])
    # The same figure grouped as each language writes it (zh-hans: no grouping) is one figure.
    seen = _check_figures([walk(finance=finance), walk(explore=explore.replace("1594.17", "1594.18"))])
    assert list(seen) == [over]
    with pytest.raises(AssertionError, match="is shown as"):  # one more digit is another figure
        _check_figures([walk(finance=finance, explore=explore.replace("1594.17", "1594.180"))])
    # A figure of the month in progress: the same within one page (one instant), never across two loads.
    mtd = "month_to_date|2026-12-01T00:00:00+00:00||tenant=acme"
    portal = f'<p data-figure-live="{mtd}">599.04 USD</p><td data-figure-live="{mtd}">599.05</td>'
    with pytest.raises(AssertionError, match=r"portal: month_to_date.*599\.04.*599\.05"):
        _check_live(walk(portal=portal))
    assert _check_live(walk(portal=portal.replace("599.05", "599.04"), later=portal.replace("599.04", "601.00").replace("599.05", "601.00"))) == 2


@pytest.mark.django_db
def test_three_tenants_of_a_third_each_add_up_on_the_page_and_in_the_csv(client) -> None:
    """A November seen before the fix: rows that each round up summed to 951.02 beside "Attributed" 951.04,
    because the total was the unrounded sum rounded. Now the total is the sum of the rows shown."""
    hour = clock.now().replace(minute=0, second=0, microsecond=0) - timedelta(days=40)
    node = Node.objects.create(name="n1")
    gpu = Gpu.objects.create(uuid="GPU-1", node=node, model="A100", memory_mb=80000, sm_count=100,
                             first_seen_at=hour, last_seen_at=hour)
    with_day(GpuHour.objects.create(gpu_uuid=gpu.uuid, node=node, gpu_model=gpu.model, hour=hour,
                                    metered_seconds=Decimal(3600), card_cost=Decimal("1000.004"),
                                    charged=Decimal("951.018"), idle_cost=Decimal("48.986"),
                                    idle_allocated=Decimal(0), currency="USD", priced=True))
    zero = {f: Decimal(0) for f in ("mem_granted_mb_s", "mem_billed_mb_s", "sm_granted_s", "sm_billed_s", "pcie_mb",
                                    "mem_used_mb_s", "sm_used_s", "share_gpu_s", "idle_share")}
    for tenant in ("t1", "t2", "t3"):
        with_day(UsageHour.objects.create(gpu_uuid=gpu.uuid, node=node, tenant=tenant, namespace="ns", pod="p",
                                          container="c", pod_uid=f"uid-{tenant}", sla_tier="gold", hour=hour,
                                          seconds=Decimal(3600), charge=Decimal("317.006"), **zero))
    client.force_login(user_in(FINANCE_GROUP))
    day = hour.date().isoformat()
    html = client.get("/finance/", {"start": day, "end": day}).content.decode()
    marks = _marks(html)
    walk = Walk()
    _check_page("/finance/", marks, walk)
    assert {"fleet", "attributed", "total", "charge", "foot", "row"} <= walk.groups_checked
    shown = {g: _figure(m.text) for m in marks for g in m.totals}
    assert shown["attributed"] == Decimal("951.03")  # 3 × 317.01, not round(951.018) = 951.02
    assert shown["fleet"] == Decimal("1000.02")  # 951.03 + idle 48.99, not round(1000.004) = 1000.00
    assert 'data-testid="totals-rule"' in html
    resp = client.get("/finance/", {"start": day, "end": day, "format": "csv"})
    header, *rows = list(csv.reader(io.StringIO(resp.content.decode("utf-8-sig"))))
    records = [dict(zip(header, r, strict=True)) for r in rows]
    _check_tenant_costs_csv("tenants CSV", records)
    assert [r["total"] for r in records] == ["317.01", "317.01", "317.01", "48.99", "1000.02"]
