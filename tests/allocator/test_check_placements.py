"""The independent placement checker accepts what every policy places on the real trace
and catches each kind of infeasible placement."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from allocator.experiments.check_placements import check_seed
from allocator.experiments.check_placements import main as check_main
from allocator.experiments.fgd import run_seed

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
NODES_CSV = TRACES / "openb_node_list_gpu_node.csv"
PODS_CSV = TRACES / "openb_pod_list_default.csv"


@pytest.fixture(scope="module")
def bestfit_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fgd")
    outcome = run_seed(nodes_path=NODES_CSV, pods_path=PODS_CSV, tune=1.3, seed=42, policy="bestfit", outdir=out)
    seed_dir = out / "bestfit" / "seed42"
    assert seed_dir.exists()
    # The checker recomputes the metric from the placements alone and agrees with the harness.
    check = check_seed(NODES_CSV, seed_dir)
    assert check.violations == ()
    assert check.alloc_at_130 == pytest.approx(outcome.alloc_at_130, abs=1e-9)
    return seed_dir


def _corrupt(seed_dir: Path, tmp_path: Path, mutate) -> Path:
    target = tmp_path / "seed42"
    target.mkdir()
    (target / "arrived.csv").write_text((seed_dir / "arrived.csv").read_text())
    with (seed_dir / "placements.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    mutate(rows)
    with (target / "placements.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["pod", "node", "gpus", "gpu_milli"])
        writer.writeheader()
        writer.writerows(rows)
    return target


def _first(rows, predicate):
    return next(r for r in rows if predicate(r))


def test_bestfit_placements_on_the_real_trace_pass_the_independent_check(bestfit_seed: Path) -> None:
    assert check_main(["--nodes", str(NODES_CSV), "--outdir", str(bestfit_seed.parent.parent)]) == 0


def test_checker_catches_two_whole_gpu_pods_on_one_gpu(bestfit_seed: Path, tmp_path: Path) -> None:
    def mutate(rows):
        whole = [r for r in rows if r["node"] and r["gpu_milli"] == "1000" and "|" not in r["gpus"]]
        whole[1]["node"], whole[1]["gpus"] = whole[0]["node"], whole[0]["gpus"]

    check = check_seed(NODES_CSV, _corrupt(bestfit_seed, tmp_path, mutate))
    assert any("was not free" in v or "above 1000" in v for v in check.violations)


def test_checker_catches_a_dropped_pod_row(bestfit_seed: Path, tmp_path: Path) -> None:
    check = check_seed(NODES_CSV, _corrupt(bestfit_seed, tmp_path, lambda rows: rows.pop(3)))
    assert check.violations


def test_checker_catches_a_pod_on_too_few_gpus(bestfit_seed: Path, tmp_path: Path) -> None:
    def mutate(rows):
        multi = _first(rows, lambda r: r["node"] and "|" in r["gpus"])
        multi["gpus"] = multi["gpus"].split("|")[0]

    check = check_seed(NODES_CSV, _corrupt(bestfit_seed, tmp_path, mutate))
    assert any("asks" in v for v in check.violations)
