"""The ledger has one owner (docs/design.md, Layout and layering): billing/ledger/ is the only package that names a ledger
table in SQL or imports a ledger model, and the import-linter contracts in pyproject.toml hold
and fail when broken.

What an import graph cannot see (SQL text, a model imported by name through billing.models) is
checked here by reading the source.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

LEDGER_TABLES = (
    "billing_raw_sample", "billing_usagebatch", "billing_batchgpu", "billing_usageminute", "billing_gpuminute",
    "billing_usagehour", "billing_gpuhour", "billing_usageday", "billing_gpuday", "billing_card",
    "billing_workload(?!meta)",  # the minute store's workloads, not the pods' metadata
)
# billing_raw_sample's partitions are billing_raw_sample_YYYYMMDD.
_TABLE = re.compile(r"\b(" + "|".join(LEDGER_TABLES) + r")\w*\b")
LEDGER_MODELS = frozenset({"UsageBatch", "BatchGpu", "UsageMinute", "GpuMinute", "UsageHour", "GpuHour",
                           "UsageDay", "GpuDay", "Card", "Workload"})

# Django registers the ledger's models through billing.models (registration, not use).
REGISTRATION = "billing/models/__init__.py"

LAYERS_CONTRACT = "billing layers: edges -> queries -> services -> ledger -> models"
LEDGER_MODELS_CONTRACT = "only billing.ledger imports the ledger's models"
DOMAINS_CONTRACT = "billing's domains meet only through each other's facade"


def _service_modules() -> list[Path]:
    """Every Python module of the service outside the ledger and the migrations."""
    out = []
    for package in ("billing", "config"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(("billing/ledger/", "billing/migrations/")):
                continue
            out.append(path)
    return out


def _string_constants(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals, f-string parts included, with their line: where SQL text lives (a comment
    or a docstring that mentions a table is not a statement)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_module_outside_the_ledger_names_a_ledger_table_in_sql() -> None:
    found = []
    for path in _service_modules():
        rel = path.relative_to(ROOT).as_posix()
        for line, text in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            found += [f"{rel}:{line}: {m.group(0)}" for m in _TABLE.finditer(text)]
    assert found == [], "ledger tables named outside billing/ledger/:\n" + "\n".join(found)


def test_the_sql_check_sees_a_table_in_a_statement_but_not_in_a_docstring() -> None:
    tree = ast.parse('"""Reads billing_usagehour."""\nSQL = f"SELECT 1 FROM billing_gpuday_x WHERE {x}"\n')
    names = [m.group(0) for _line, text in _string_constants(tree) for m in _TABLE.finditer(text)]
    assert names == ["billing_gpuday_x"]


def _ledger_model_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of each import of a ledger model: the models module itself, or a ledger model's
    name taken from any module (billing.models still holds them for registration)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("billing.ledger.models")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("billing"):
            if node.module == "billing.ledger" and any(a.name == "models" for a in node.names):
                out.append((node.lineno, "billing.ledger.models"))
            elif node.module == "billing.ledger.models":
                out.append((node.lineno, node.module))
            else:
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if a.name in LEDGER_MODELS]
    return out


def test_no_module_outside_the_ledger_imports_a_ledger_model() -> None:
    found = []
    for path in _service_modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel == REGISTRATION:
            continue
        found += [f"{rel}:{line}: {what}" for line, what in _ledger_model_imports(ast.parse(path.read_text("utf-8")))]
    assert found == [], "ledger models imported outside billing/ledger/:\n" + "\n".join(found)


def test_billing_models_registers_the_ledger_models_without_exporting_them() -> None:
    import billing.models

    assert LEDGER_MODELS.isdisjoint(billing.models.__all__)
    from django.apps import apps

    registered = {m.__name__ for m in apps.get_app_config("billing").get_models()}
    assert registered >= LEDGER_MODELS


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def test_the_layers_run_one_way_from_the_edges_to_the_models() -> None:
    contract = _contracts()[LAYERS_CONTRACT]
    assert contract["type"] == "layers"
    layers = [re.split(r"\s*[|:]\s*", layer) for layer in contract["layers"]]
    assert layers == [
        ["billing.web", "billing.api", "billing.tasks", "billing.management"],
        ["billing.queries"], ["billing.services"], ["billing.ledger"], ["billing.models"],
    ]


def test_only_the_ledger_may_import_its_models() -> None:
    contract = _contracts()[LEDGER_MODELS_CONTRACT]
    assert contract["type"] == "forbidden"
    assert contract["forbidden_modules"] == ["billing.ledger.models"]
    assert "billing.ledger" not in contract["source_modules"]
    # Every package of the service besides the ledger (and its migrations) is a source.
    packages = {f"billing.{p.stem}" for p in (ROOT / "billing").iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert packages - {"billing.ledger", "billing.migrations"} <= set(contract["source_modules"])


def test_no_contract_ignores_an_import_but_the_registration_and_the_facades() -> None:
    for name, contract in _contracts().items():
        if name == DOMAINS_CONTRACT:
            continue
        assert contract.get("ignore_imports", []) in ([], ["billing.models -> billing.ledger.models"]), name


def test_every_service_module_is_in_a_domain_and_only_facades_are_ignored() -> None:
    """The domains contract ignores exactly "anything -> a domain's facade", and every module of
    billing.services is a domain or one of the two shared modules."""
    contract = _contracts()[DOMAINS_CONTRACT]
    domains = set(contract["modules"])
    assert set(contract["ignore_imports"]) == {f"billing.services.** -> {d}" for d in domains if d != "billing.services.demo"}
    on_disk = {f"billing.services.{p.stem}" for p in (ROOT / "billing" / "services").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert on_disk == domains | {"billing.services.audit", "billing.services.input_limits"}


def test_a_domain_reaching_into_another_domain_breaks_the_contract(tree_copy: Path) -> None:
    (tree_copy / "billing" / "services" / "fleet" / "layering_probe.py").write_text(
        "import billing.services.pricing\nimport billing.services.pricing.rate_cards\n")
    result = _lint_imports(tree_copy)
    assert result.returncode != 0
    assert f"{DOMAINS_CONTRACT} BROKEN" in result.stdout
    assert "billing.services.fleet.layering_probe -> billing.services.pricing.rate_cards" in result.stdout
    # Through the facade is the way in: the first import alone is not reported.
    assert "billing.services.fleet.layering_probe -> billing.services.pricing (l.1)" not in result.stdout


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in (LAYERS_CONTRACT, LEDGER_MODELS_CONTRACT, DOMAINS_CONTRACT):
        assert f"{name} KEPT" in result.stdout


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The project's packages and pyproject.toml in a scratch directory, to break on purpose."""
    for package in ("billing", "config", "allocator", "agents"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_fail_when_a_service_imports_a_query_or_a_page_imports_a_ledger_model(tree_copy: Path) -> None:
    (tree_copy / "billing" / "services" / "layering_probe.py").write_text("import billing.queries.finance\n")
    (tree_copy / "billing" / "ledger" / "layering_probe.py").write_text("import billing.services.audit\n")
    (tree_copy / "billing" / "web" / "layering_probe.py").write_text("from billing.ledger.models import UsageHour\n")
    result = _lint_imports(tree_copy)
    assert result.returncode != 0
    out = result.stdout
    assert f"{LAYERS_CONTRACT} BROKEN" in out
    assert f"{LEDGER_MODELS_CONTRACT} BROKEN" in out
    assert "billing.services.layering_probe -> billing.queries.finance" in out
    assert "billing.ledger.layering_probe -> billing.services.audit" in out
    assert "billing.web.layering_probe -> billing.ledger.models" in out
