"""The FinOps Foundation's focus-validator, run as a subprocess on a FOCUS file (docs/exports.md, "The
official validator"): focus-validator 1.0.0, the newest release PyPI offers, on the newest rule set
it ships (FOCUS 1.0), with the rules docs/focus-validator-overrides.yaml names left out.

It lives in its own environment (`make focus-validator`: .venv-focus-validator), because it pins
numpy<2 and pytz<2024; FOCUS_VALIDATOR_VENV points elsewhere. Used by
tests/billing/test_focus_validator.py and by the demo's walk (tests/test_page_sums.py)."""

from __future__ import annotations

import csv
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("FOCUS_VALIDATOR_VENV", ROOT / ".venv-focus-validator"))
OVERRIDES = ROOT / "docs" / "focus-validator-overrides.yaml"
# The Decimal columns of FOCUS 1.0 that we write. Our Parquet keeps them exact, DECIMAL(38, 18); pandas
# reads those as Python Decimals (dtype object) and the validator calls a column decimal only when it is
# float64, so on Parquet these eight rules fail whatever the values (the same rows pass them as CSV).
# Its override file cannot skip a data-type rule (the type stays on the column), so the test excludes
# them itself, for Parquet only (docs/exports.md, "The official validator").
PARQUET_DECIMAL_RULES = {f"{c}_IsDecimal" for c in ("BilledCost", "ConsumedQuantity", "ContractedCost",
                                                     "ContractedUnitPrice", "EffectiveCost", "ListCost",
                                                     "ListUnitPrice", "PricingQuantity")}
VALIDATOR_VERSION = "1.0.0"
RULES_VERSION = "1.0"  # the newest FOCUS version focus-validator 1.0.0 has rules for


def site_packages() -> Path:
    found = sorted(VENV.glob("lib/python3*/site-packages/focus_validator"))
    if not found or not (VENV / "bin" / "focus-validator").exists():
        pytest.fail(f"focus-validator is not installed in {VENV}: run `make focus-validator`")
    return found[0].parent


@dataclass(frozen=True)
class Verdict:
    passed: set[str]
    failed: dict[str, str]  # rule id -> the validator's description
    skipped: set[str]
    errored: dict[str, str]


def validate(data_file: Path, tmp_path: Path) -> Verdict:
    """One run of the real validator, its JUnit report read back (it exits 0 whatever it finds). It
    runs from its site-packages folder: it opens its ISO 4217 list by a path relative to the working
    directory, so anywhere else BillingCurrency_IsCurrencyCode fails on any file."""
    report = tmp_path / f"{data_file.name}.xml"
    subprocess.run([str(VENV / "bin" / "focus-validator"), "--data-file", str(data_file), "--validate-version",
                    RULES_VERSION, "--override-file", str(OVERRIDES), "--output-type", "unittest",
                    "--output-destination", str(report)],
                   cwd=site_packages(), check=True, capture_output=True, timeout=120)
    verdict = Verdict(set(), {}, set(), {})
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314 - the validator's report of our file
        rule = case.attrib["name"].split(" :: ")[0]
        if (failure := case.find("failure")) is not None:
            verdict.failed[rule] = failure.attrib.get("message", "")
        elif (error := case.find("error")) is not None:
            verdict.errored[rule] = error.attrib.get("message", "")
        elif case.find("skipped") is not None:
            verdict.skipped.add(rule)
        else:
            verdict.passed.add(rule)
    return verdict


def console_report(data_file: Path) -> str:
    """The validator's own text report (rows and example values), for a failure's message."""
    done = subprocess.run([str(VENV / "bin" / "focus-validator"), "--data-file", str(data_file),
                           "--validate-version", RULES_VERSION, "--override-file", str(OVERRIDES)],
                          cwd=site_packages(), capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def shipped_rules() -> set[str]:
    return {p.stem for p in (site_packages() / "focus_validator" / "rules" / "version_sets" / RULES_VERSION).glob("*.yaml")}


def overrides() -> set[str]:
    return set(yaml.safe_load(OVERRIDES.read_text())["overrides"])


def assert_passes(data_file: Path, tmp_path: Path, *, expected_failures: frozenset[str] = frozenset()) -> None:
    verdict = validate(data_file, tmp_path)
    failed = set(verdict.failed)
    assert failed == expected_failures and not verdict.errored, (verdict.failed, verdict.errored,
                                                                 console_report(data_file))
    # Every shipped rule ran and passed, but the ones we argue against, which it skipped.
    assert verdict.skipped == overrides()
    assert verdict.passed | verdict.skipped | failed == shipped_rules()


def write_focus_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[str]]) -> Path:
    """Rows of several FOCUS files with the same header as one file: one validator run, not one per file."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path
