"""Independent feasibility check of an FGD experiment's output.

    python -m allocator.experiments.check_placements --nodes FILE --outdir DIR [--policy NAME] [--json]

Re-reads `arrived.csv` and `placements.csv` of every seed with the csv module and nothing
from `allocator.packing`, replays the placements in arrival order against the node list, and
checks every rule of docs/packing.md's Semantics: each arrived pod appears once, in order; a placed pod's
node exists, its GPU model is allowed, CPU, memory and the 1000-pod limit hold, a sharing pod
sits on one GPU with room, a whole-GPU pod takes `num_gpu` GPUs that were fully free, CPU pods
take no GPU; no GPU ever holds more than 1000 milli. It then recomputes the allocation metric
from the placements alone, so the reported figures can be checked against what was placed.
Exit code 1 on the first seed with a violation.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SeedCheck", "check_seed", "main"]

MAX_PODS_PER_NODE = 1000  # "fewer than 1001"


@dataclass
class _Node:
    cpu_milli: int
    memory_mib: int
    model: str
    gpu_free: list[int]
    pods: int = 0


@dataclass(frozen=True)
class SeedCheck:
    seed_dir: str
    pods: int
    placed: int
    violations: tuple[str, ...]
    alloc_at_100: float | None
    alloc_at_130: float | None


@dataclass
class _Metric:
    gpus: int
    arrived: int = 0
    used: int = 0
    by_level: dict[int, list[float]] = field(default_factory=dict)

    def record(self) -> None:
        level = round(self.arrived / self.gpus / 10)
        self.by_level.setdefault(level, []).append(round(self.used / self.gpus / 10, 2))

    def at(self, level: int) -> float | None:
        values = self.by_level.get(level)
        return statistics.fmean(values) if values else None


def _read_nodes(path: Path) -> dict[str, _Node]:
    with path.open(newline="") as fh:
        return {
            r["sn"]: _Node(int(r["cpu_milli"]), int(r["memory_mib"]), r["model"], [1000] * int(r["gpu"]))
            for r in csv.DictReader(fh)
        }


def check_seed(nodes_csv: Path, seed_dir: Path) -> SeedCheck:  # noqa: PLR0912, PLR0915 - one check per rule a placement must keep, read in one pass
    nodes = _read_nodes(nodes_csv)
    metric = _Metric(gpus=sum(len(n.gpu_free) for n in nodes.values()))
    violations: list[str] = []
    with (seed_dir / "arrived.csv").open(newline="") as fa, (seed_dir / "placements.csv").open(newline="") as fp:
        arrived = list(csv.DictReader(fa))
        placements = list(csv.DictReader(fp))
    if len(arrived) != len(placements):
        violations.append(f"{len(arrived)} arrived pods but {len(placements)} placement rows")
    placed = 0
    for i, (pod, where) in enumerate(zip(arrived, placements, strict=False)):
        name = pod["name"]
        if where["pod"] != name:
            violations.append(f"row {i}: placement for {where['pod']!r}, arrival {name!r}")
            break
        num_gpu = int(pod["num_gpu"])
        milli = min(int(pod["gpu_milli"]), 1000)
        gpu_pod = num_gpu > 0 and milli > 0
        metric.arrived += num_gpu * milli if gpu_pod else 0
        node_name = where["node"]
        if node_name:
            node = nodes.get(node_name)
            if node is None:
                violations.append(f"{name}: unknown node {node_name}")
                break
            gpus = [int(g) for g in where["gpus"].split("|")] if where["gpus"] else []
            node.cpu_milli -= int(pod["cpu_milli"])
            node.memory_mib -= int(pod["memory_mib"])
            node.pods += 1
            if node.cpu_milli < 0 or node.memory_mib < 0:
                violations.append(f"{name}: CPU or memory of {node_name} overcommitted")
            if node.pods > MAX_PODS_PER_NODE:
                violations.append(f"{name}: more than {MAX_PODS_PER_NODE} pods on {node_name}")
            if not gpu_pod:
                if gpus:
                    violations.append(f"{name}: a CPU pod holds GPUs {gpus}")
            else:
                allowed = [m for m in pod["gpu_spec"].split("|") if m]
                if allowed and node.model not in allowed:
                    violations.append(f"{name}: model {node.model} not in {allowed}")
                if len(gpus) != num_gpu or len(set(gpus)) != len(gpus):
                    violations.append(f"{name}: asks {num_gpu} GPU(s), placed on {gpus}")
                for g in gpus:
                    if not 0 <= g < len(node.gpu_free):
                        violations.append(f"{name}: GPU index {g} outside {node_name}")
                        continue
                    if (milli == 1000 or num_gpu > 1) and node.gpu_free[g] != 1000:
                        violations.append(f"{name}: whole GPU {node_name}/{g} was not free")
                    node.gpu_free[g] -= milli
                    if node.gpu_free[g] < 0:
                        violations.append(f"{name}: GPU {node_name}/{g} above 1000 milli")
                metric.used += num_gpu * milli
            placed += 1
        metric.record()
        if len(violations) >= 20:
            break
    return SeedCheck(str(seed_dir), len(arrived), placed, tuple(violations), metric.at(100), metric.at(130))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=Path, required=True)
    parser.add_argument("--outdir", type=Path, required=True)
    parser.add_argument("--policy", help="only this policy's folder (default: every policy under --outdir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    pattern = f"{args.policy}/seed*" if args.policy else "*/seed*"
    seed_dirs = sorted(p for p in args.outdir.glob(pattern) if (p / "placements.csv").exists())
    if not seed_dirs:
        print(f"check_placements: no */seed*/placements.csv under {args.outdir}", file=sys.stderr)
        return 2
    results = [check_seed(args.nodes, d) for d in seed_dirs]
    bad = [r for r in results if r.violations]
    if args.json:
        print(json.dumps([r.__dict__ | {"violations": list(r.violations)} for r in results], indent=1))
    else:
        for r in results:
            state = "OK" if not r.violations else f"{len(r.violations)} violation(s): {r.violations[0]}"
            print(
                f"{r.seed_dir}: {r.placed}/{r.pods} placed, alloc@100 {r.alloc_at_100}, "
                f"alloc@130 {r.alloc_at_130}: {state}"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
