"""The FGD allocation experiment (shared FGD_EXPERIMENT.md; docs/packing.md).

    python -m allocator.experiments.fgd --nodes FILE --pods FILE --tune 1.3 --seeds 42-51 \\
        --policy NAME --outdir DIR --json

Per seed it writes ``DIR/<policy>/seed<S>/arrived.csv`` (the arrived workload in arrival
order, the pod CSV's columns, clones named ``<orig>-tuned-<i>``) and ``placements.csv``
(``pod,node,gpus,gpu_milli``; ``gpus`` ``|``-separated GPU indices on the node, ``gpu_milli``
the per-GPU share; an empty ``node`` means the pod was not placed).
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

__all__ = ["ExperimentSummary", "SeedOutcome", "main", "parse_seeds", "run_experiment", "run_seed"]

PLACEMENT_COLUMNS = ("pod", "node", "gpus", "gpu_milli")


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
            "alloc_at_100": _mean_sd([o.alloc_at_100 for o in self.outcomes]),
            "alloc_at_130": _mean_sd([o.alloc_at_130 for o in self.outcomes]),
            "pods_placed": sum(o.pods_placed for o in self.outcomes),
            "pods_failed": sum(o.pods_failed for o in self.outcomes),
            "seconds": round(self.seconds, 3),
        }


def _mean_sd(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (0 for one seed); None when a seed never reached the level."""
    if not values or any(math.isnan(v) for v in values):
        return {"mean": None, "sd": None}
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": round(statistics.fmean(values), 4), "sd": round(sd, 4)}


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51``, ``42`` or ``42,45,50-51`` → the seeds in that order, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
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
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (name,cpu_milli,memory_mib,num_gpu,...)")
    parser.add_argument("--tune", type=float, default=1.3, help="arrived GPU milli as a multiple of the cluster's")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,45,50-51")
    parser.add_argument("--policy", default="best", help="bestfit, random, fgd, strand or best (= strand)")
    parser.add_argument(
        "--outdir", type=Path, default=None, help="write <policy>/seed<S>/{arrived,placements}.csv here"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel (processes)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        summary = run_experiment(
            nodes_path=args.nodes,
            pods_path=args.pods,
            tune=args.tune,
            seeds=seeds,
            policy=args.policy,
            outdir=args.outdir,
            jobs=args.jobs,
        )
    except (ValueError, OSError) as error:
        parser.exit(2, f"error: {error}\n")
    if args.json:
        print(json.dumps(summary.as_json()))
        return 0
    print(f"policy {summary.policy}")
    print("seed  arrived%  alloc@100  alloc@130  placed  failed")
    for o in summary.outcomes:
        print(
            f"{o.seed:<5} {o.arrived_percent:8.2f}  {o.alloc_at_100:9.2f}  {o.alloc_at_130:9.2f}"
            f"  {o.pods_placed:6d}  {o.pods_failed:6d}"
        )
    data = summary.as_json()
    print(f"alloc_at_100 {data['alloc_at_100']}  alloc_at_130 {data['alloc_at_130']}  seconds {data['seconds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
