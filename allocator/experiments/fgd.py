"""The FGD allocation experiment (its rules: docs/packing.md).

    python -m allocator.experiments.fgd --nodes FILE --pods FILE [FILE ...] --tune 1.3 \\
        --seeds 42-51 --policy NAME[,NAME...] --outdir DIR --table FILE --json

Every pod file is run with every policy; the result is one table, one row per trace ×
policy (``--table`` writes it as CSV; ``--json`` prints one JSON object per row). Per seed
it writes ``DIR/<policy>/seed<S>/arrived.csv`` (``DIR/<trace>/<policy>/seed<S>/`` when several
pod files are given; ``<trace>`` is the file name without ``.csv``): the arrived workload in
arrival order, the pod CSV's columns, clones named ``<orig>-tuned-<i>``; and
``placements.csv`` (``pod,node,gpus,gpu_milli``; ``gpus`` ``|``-separated GPU indices on the
node, ``gpu_milli`` the per-GPU share; an empty ``node`` means the pod was not placed).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from allocator.packing import (
    GPU_MILLI,
    Cluster,
    allocation_at,
    build_arrival,
    make_policy,
    policy_rng,
    read_nodes_csv,
    read_pods_csv,
    resolve_policy_name,
    simulate,
)

__all__ = [
    "TABLE_COLUMNS",
    "ExperimentSummary",
    "SeedOutcome",
    "main",
    "mean_sd",
    "parse_policies",
    "parse_seeds",
    "run_experiment",
    "run_seed",
    "trace_names",
]

PLACEMENT_COLUMNS = ("pod", "node", "gpus", "gpu_milli")
TABLE_COLUMNS = (
    "trace",
    "policy",
    "seeds",
    "alloc_at_100_mean",
    "alloc_at_100_sd",
    "alloc_at_130_mean",
    "alloc_at_130_sd",
    "pods_placed",
    "pods_failed",
    "seconds",
)


@dataclass(frozen=True, slots=True)
class SeedOutcome:
    seed: int
    alloc_at_100: float  # NaN when no event had arrived% == 100
    alloc_at_130: float
    pods_placed: int
    pods_failed: int
    arrived_percent: float  # Σ arrived GPU milli as % of the cluster's


@dataclass(frozen=True, slots=True)
class ExperimentSummary:
    policy: str
    seeds: tuple[int, ...]
    outcomes: tuple[SeedOutcome, ...]
    seconds: float

    def as_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "seeds": list(self.seeds),
            "alloc_at_100": mean_sd([o.alloc_at_100 for o in self.outcomes]),
            "alloc_at_130": mean_sd([o.alloc_at_130 for o in self.outcomes]),
            "pods_placed": sum(o.pods_placed for o in self.outcomes),
            "pods_failed": sum(o.pods_failed for o in self.outcomes),
            "seconds": round(self.seconds, 3),
        }

    def table_row(self, trace: str) -> dict[str, object]:
        """This summary as one row of the ``--table`` CSV (``TABLE_COLUMNS``; empty when never reached)."""
        row: dict[str, object] = {"trace": trace, "policy": self.policy, "seeds": _seed_text(self.seeds)}
        for level, values in (
            ("alloc_at_100", [o.alloc_at_100 for o in self.outcomes]),
            ("alloc_at_130", [o.alloc_at_130 for o in self.outcomes]),
        ):
            stats = mean_sd(values)
            row[f"{level}_mean"] = "" if stats["mean"] is None else stats["mean"]
            row[f"{level}_sd"] = "" if stats["sd"] is None else stats["sd"]
        row["pods_placed"] = sum(o.pods_placed for o in self.outcomes)
        row["pods_failed"] = sum(o.pods_failed for o in self.outcomes)
        row["seconds"] = round(self.seconds, 3)
        return row


def _seed_text(seeds: Sequence[int]) -> str:
    """Seeds in the ``--seeds`` syntax, runs collapsed: (42, 43, 44, 50) → ``42-44,50``."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)


def mean_sd(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (0 for one seed); None when a seed never reached the level."""
    if not values or any(math.isnan(v) for v in values):
        return {"mean": None, "sd": None}
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": round(statistics.fmean(values), 4), "sd": round(sd, 4)}


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51``, ``42`` or ``42,45,50-51`` → the seeds in that order, without repeats."""
    seeds: list[int] = []
    for item in text.split(","):
        part = item.strip()
        if not part:
            raise ValueError(f"empty item in seed list {text!r}")
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ValueError(f"seed item {part!r} must be N or N-M with whole numbers >= 0") from None
        if first < 0 or last < first:
            raise ValueError(f"seed range {part!r} must be ascending and >= 0")
        seeds.extend(s for s in range(first, last + 1) if s not in seeds)
    return tuple(seeds)


def parse_policies(text: str) -> tuple[str, ...]:
    """``bestfit,fgd`` → the policy names in that order, without repeats; unknown names fail."""
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            raise ValueError(f"empty item in policy list {text!r}")
        resolve_policy_name(name)
        if name not in names:
            names.append(name)
    return tuple(names)


def trace_names(pods_paths: Sequence[Path]) -> tuple[str, ...]:
    """Each pod file's name without ``.csv``: the ``trace`` column and, with several files, the folder."""
    names = tuple(p.stem for p in pods_paths)
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(f"pod files {pods_paths[names.index(name)]} and {pods_paths[i]} share the name {name!r}")
    return names


def run_seed(
    *, nodes_path: Path, pods_path: Path, tune: float, seed: int, policy: str, outdir: Path | None
) -> SeedOutcome:
    """One seed: build the arrival sequence, place every pod, write the two CSVs when ``outdir`` is set."""
    nodes = read_nodes_csv(nodes_path)
    header, rows, pods = read_pods_csv(pods_path)
    cluster = Cluster.from_nodes(nodes)
    arrival = build_arrival(pods=pods, cluster_gpu_milli=cluster.total_gpus * GPU_MILLI, tune=tune, seed=seed)
    chosen = make_policy(policy, cluster=cluster, workload=pods, rng=policy_rng(seed))
    result = simulate(cluster=cluster, pods=pods, arrival=arrival, policy=chosen)
    if outdir is not None:
        target = outdir / policy / f"seed{seed}"
        target.mkdir(parents=True, exist_ok=True)
        with (target / "arrived.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
            writer.writeheader()
            for origin, name in zip(arrival.origin, arrival.names, strict=True):
                writer.writerow({**rows[int(origin)], "name": name})
        with (target / "placements.csv").open("w", newline="", encoding="utf-8") as handle:
            out = csv.writer(handle, lineterminator="\n")
            out.writerow(PLACEMENT_COLUMNS)
            for i, name in enumerate(arrival.names):
                node = int(result.node[i])
                out.writerow(
                    [
                        name,
                        cluster.nodes[node].name if node >= 0 else "",
                        "|".join(str(g) for g in result.gpus[i]),
                        pods[int(arrival.origin[i])].gpu_milli,
                    ]
                )
    return SeedOutcome(
        seed=seed,
        alloc_at_100=allocation_at(result.used_milli, result.arrived_milli, cluster.total_gpus, 100),
        alloc_at_130=allocation_at(result.used_milli, result.arrived_milli, cluster.total_gpus, 130),
        pods_placed=result.placed,
        pods_failed=result.failed,
        arrived_percent=float(result.arrived_milli[-1]) / cluster.total_gpus / 10 if arrival.size else 0.0,
    )


def run_experiment(
    *,
    nodes_path: Path,
    pods_path: Path,
    tune: float,
    seeds: Sequence[int],
    policy: str,
    outdir: Path | None,
    jobs: int = 1,
) -> ExperimentSummary:
    resolve_policy_name(policy)  # fail before any work on a bad name
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if not seeds:
        raise ValueError("at least one seed is needed")
    started = time.perf_counter()  # only for the reported `seconds`
    one = partial(run_seed, nodes_path=nodes_path, pods_path=pods_path, tune=tune, policy=policy, outdir=outdir)
    if jobs == 1 or len(seeds) == 1:
        outcomes = [one(seed=s) for s in seeds]
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(seeds))) as pool:
            futures = [pool.submit(one, seed=s) for s in seeds]
            outcomes = [f.result() for f in futures]
    return ExperimentSummary(
        policy=policy, seeds=tuple(seeds), outcomes=tuple(outcomes), seconds=time.perf_counter() - started
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m allocator.experiments.fgd", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    parser.add_argument(
        "--pods", type=Path, nargs="+", required=True, help="one or more pod list CSVs (name,cpu_milli,num_gpu,...)"
    )
    parser.add_argument("--tune", type=float, default=1.3, help="arrived GPU milli as a multiple of the cluster's")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,45,50-51")
    parser.add_argument(
        "--policy", default="best", help="comma-separated: bestfit, random, fgd, strand or best (= strand)"
    )
    parser.add_argument(
        "--outdir", type=Path, default=None, help="write [<trace>/]<policy>/seed<S>/{arrived,placements}.csv here"
    )
    parser.add_argument("--table", type=Path, default=None, help="write the trace × policy table here as CSV")
    parser.add_argument("--json", action="store_true", help="print one JSON object per trace × policy")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel (processes)")
    return parser


def _print_table(rows: Sequence[dict[str, object]]) -> None:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in TABLE_COLUMNS}
    print("  ".join(c.ljust(widths[c]) for c in TABLE_COLUMNS).rstrip())
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in TABLE_COLUMNS).rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    rows: list[dict[str, object]] = []
    try:
        seeds = parse_seeds(args.seeds)
        policies = parse_policies(args.policy)
        names = trace_names(args.pods)
        for pods_path, trace in zip(args.pods, names, strict=True):
            outdir = args.outdir / trace if args.outdir is not None and len(args.pods) > 1 else args.outdir
            for policy in policies:
                summary = run_experiment(
                    nodes_path=args.nodes,
                    pods_path=pods_path,
                    tune=args.tune,
                    seeds=seeds,
                    policy=policy,
                    outdir=outdir,
                    jobs=args.jobs,
                )
                rows.append(summary.table_row(trace))
                if args.json:
                    print(json.dumps({"trace": trace, "pods": str(pods_path), **summary.as_json()}), flush=True)
        if args.table is not None:
            args.table.parent.mkdir(parents=True, exist_ok=True)
            with args.table.open("w", newline="", encoding="utf-8") as handle:
                writer = csv.DictWriter(handle, fieldnames=TABLE_COLUMNS, lineterminator="\n")
                writer.writeheader()
                writer.writerows(rows)
    except (ValueError, OSError) as error:
        parser.exit(2, f"error: {error}\n")
    if not args.json:
        _print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
