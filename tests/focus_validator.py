"""The FinOps Foundation's focus-validator, run as a subprocess on a FOCUS file (docs/exports.md, "The
official validator"): focus-validator 2.2.1, the newest release PyPI offers, on the newest rules it
ships (FOCUS 1.2), with the applicability criteria and the expected failures
docs/focus-validator-overrides.yaml names, each with its reason.

It lives in its own environment (`make focus-validator`: .venv-focus-validator, Python >= 3.12),
because it pins numpy<2 and its own pandera, duckdb and polars; FOCUS_VALIDATOR_VENV points
elsewhere. Used by tests/billing/test_focus_validator.py and by the demo's walk (tests/test_page_sums.py).

Also our own checks of the FOCUS 1.3 columns no 1.2 rule looks at (`assert_focus_1_3_columns`)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("FOCUS_VALIDATOR_VENV", ROOT / ".venv-focus-validator"))
OVERRIDES = ROOT / "docs" / "focus-validator-overrides.yaml"
VALIDATOR_VERSION = "2.2.1"  # PyPI's newest (pip index versions focus-validator, on Python >= 3.12)
RULES_VERSION = "1.2"  # the newest FOCUS version focus-validator 2.2.1 has rules for
# A console line per rule: "❌ InvoiceId-C-005-C: FAIL  (violations=7, msg=…)".
_RULE_LINE = re.compile(r"^\S+ (?P<rule>[A-Za-z]+-[A-Z]-\d{3}-[A-Z]): (?P<status>PASS|FAIL|SKIPPED)"
                        r"(?:\s+\((?:violations=(?P<violations>\d+))?(?P<rest>.*)\))?$")
_TOTAL_LINE = re.compile(r"^Total: (\d+) \| Pass: (\d+) \| Fail: (\d+) \| Skipped: (\d+)$", re.MULTILINE)
# FOCUS 1.3 columns we emit that focus-validator 2.2.1's 1.2 rules do not know (our own checks below).
FOCUS_1_3_ONLY = ("AllocatedMethodDetails", "AllocatedMethodId", "AllocatedResourceId", "AllocatedResourceName",
                  "AllocatedTags", "HostProviderName", "ServiceProviderName")


def site_packages() -> Path:
    found = sorted(VENV.glob("lib/python3*/site-packages/focus_validator"))
    if not found or not (VENV / "bin" / "focus-validator").exists():
        pytest.fail(f"focus-validator is not installed in {VENV}: run `make focus-validator`")
    return found[0].parent


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(OVERRIDES.read_text())
    return loaded


def claimed_criteria() -> list[str]:
    return sorted(config()["applicability_criteria"]["claimed"])


def overrides() -> set[str]:
    return {rule for entry in config()["overrides"] for rule in entry["rules"]}


def model() -> dict[str, Any]:
    """The rule model the validator ships for RULES_VERSION (what it runs, offline)."""
    for path in (site_packages() / "focus_validator" / "rules").glob("model-*.json"):
        loaded: dict[str, Any] = json.loads(path.read_text())
        if loaded["Details"]["FOCUSVersion"] == RULES_VERSION:
            return loaded
    pytest.fail(f"focus-validator ships no rule model for FOCUS {RULES_VERSION}")


def dataset_rules(dataset: str = "CostAndUsage") -> set[str]:
    """The rules a run over a FOCUS dataset evaluates: those its root rule reaches through dependencies
    and rule references (FOCUS 1.2's cost and usage dataset: 578; the model's other attribute rules are
    reached by none, so no run reports them)."""
    rules = model()["ModelRules"]
    seen: set[str] = set()
    todo = list(model()["ModelDatasets"][dataset]["ModelRules"])
    while todo:
        rule = todo.pop()
        if rule in seen or rule not in rules:
            continue
        seen.add(rule)
        criteria = rules[rule]["ValidationCriteria"]
        todo += criteria.get("Dependencies", []) + re.findall(r'"ModelRuleId": "([^"]+)"', json.dumps(criteria))
    return seen


def run_validator(*args: str) -> str:
    """The validator's console output. It runs offline (--block-download: the rules it ships, never a
    download) from its site-packages folder: it opens its ISO 4217 list by a path relative to the
    working directory, so anywhere else BillingCurrency's currency-code rule fails on any file."""
    done = subprocess.run([str(VENV / "bin" / "focus-validator"), "--block-download", *args], cwd=site_packages(),
                          capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONIOENCODING": "utf-8"},
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout


@dataclass(frozen=True)
class Verdict:
    passed: set[str]
    failed: dict[str, int]  # rule id -> violations the validator counted
    skipped: set[str]
    total: int
    report: str  # its console report (rows and example values), for a failure's message


def validate(data_file: Path) -> Verdict:
    """One run of the real validator over one file: every rule of RULES_VERSION, with our criteria."""
    report = run_validator("--validate-version", RULES_VERSION, "--applicability-criteria", ",".join(claimed_criteria()),
                           "--show-violations", "--data-file", str(data_file))
    verdict = Verdict(set(), {}, set(), 0, report)
    for line in report.splitlines():
        if (m := _RULE_LINE.match(line)) is None:
            continue
        if m["status"] == "PASS":
            verdict.passed.add(m["rule"])
        elif m["status"] == "FAIL":
            verdict.failed[m["rule"]] = int(m["violations"] or 0)
        else:
            verdict.skipped.add(m["rule"])
    total = _TOTAL_LINE.search(report)
    assert total, report[-4000:]
    return Verdict(verdict.passed, verdict.failed, verdict.skipped, int(total[1]), report)


def assert_passes(data_file: Path, *, platform_rows: int | None = None) -> Verdict:
    """Every rule ran (one verdict each, as many as the model has) and none failed that the overrides
    do not name. `platform_rows`: the rows on no invoice; then InvoiceId's not-null rule must count
    exactly those (every other row carries its invoice's number)."""
    verdict = validate(data_file)
    rules = dataset_rules()
    assert verdict.passed | set(verdict.failed) | verdict.skipped == rules, (
        sorted(rules ^ (verdict.passed | set(verdict.failed) | verdict.skipped)))
    assert verdict.total == len(rules), (
        sorted(rules ^ (verdict.passed | set(verdict.failed) | verdict.skipped)))
    unexpected = set(verdict.failed) - overrides()
    assert not unexpected, ({r: verdict.failed[r] for r in sorted(unexpected)}, verdict.report[-12000:])
    if platform_rows is not None:
        null_invoice_ids = verdict.failed.get("InvoiceId-C-005-C", 0)
        assert null_invoice_ids == platform_rows, (null_invoice_ids, platform_rows, verdict.report[-12000:])
    return verdict


def write_focus_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> Path:
    """Rows of several FOCUS files with the same header as one file: one validator run, not one per file."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def assert_focus_1_3_columns(rows: Iterable[Mapping[str, str | None]]) -> None:
    """FOCUS 1.3's requirements on the 1.3 columns we emit, which no rule of the validator checks yet:
    ServiceProviderName and HostProviderName (both mandatory, String, not null; ProviderName is
    deprecated and kept equal to ServiceProviderName), and split cost allocation (AllocatedMethodId
    null exactly when a charge is not a provider-calculated split, and then every Allocated* column
    null; AllocatedMethodDetails a JSON object with an Elements array; AllocatedTags a JSON object)."""
    for row in rows:
        for column in ("ServiceProviderName", "HostProviderName"):
            assert row[column], (column, row)
        assert row["ProviderName"] == row["ServiceProviderName"], row
        allocated = row["AllocatedMethodId"] is not None
        for column in ("AllocatedMethodDetails", "AllocatedResourceId", "AllocatedResourceName"):
            assert (row[column] is not None) == allocated, (column, row)
        if not allocated:
            assert row["AllocatedTags"] is None, row
            continue
        details = json.loads(row["AllocatedMethodDetails"] or "")
        assert isinstance(details, dict), row
        assert isinstance(details["Elements"], list), row
        assert details["Elements"], row
        assert all(0 <= e["AllocatedRatio"] <= 1 for e in details["Elements"]), row
        assert row["AllocatedTags"] is None or isinstance(json.loads(row["AllocatedTags"]), dict), row
