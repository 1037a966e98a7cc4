"""The per-seed arrival sequence (docs/packing.md, Semantics: arrival sequence).

Pods are sorted by name and shuffled with the seed. The workload is then tuned to
``tune × cluster GPU milli``: uniformly random originals are cloned as ``<orig>-tuned-<i>``
and appended until the first draw with ``total + gpu_milli > target`` (the per-GPU share of
the drawn pod, as the FGD simulator compares), where ``total`` is the running
``Σ num_gpu × gpu_milli``. A workload already above the target instead loses uniformly random
pods until it is not. The arrival sequence uses its own generator, so it is identical for
every policy under one seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from allocator.packing._model import IntArray, PodSpec

__all__ = ["Arrival", "arrival_rng", "build_arrival", "tuned_name"]


@dataclass(frozen=True, slots=True, eq=False)
class Arrival:
    """Pods in arrival order: ``origin[i]`` indexes the original pod list, ``names[i]`` its name."""

    origin: IntArray
    names: tuple[str, ...]
    target_milli: int  # tune × cluster GPU milli

    @property
    def size(self) -> int:
        return len(self.names)


def tuned_name(original: str, clone_index: int) -> str:
    return f"{original}-tuned-{clone_index}"


def arrival_rng(seed: int) -> np.random.Generator:
    """The generator of the arrival sequence of ``seed`` (stream 0 of the seed)."""
    return np.random.default_rng([seed, 0])


def build_arrival(*, pods: Sequence[PodSpec], cluster_gpu_milli: int, tune: float, seed: int) -> Arrival:
    """Shuffle ``pods`` (sorted by name) with ``seed`` and tune them to ``tune × cluster_gpu_milli``."""
    if not pods:
        raise ValueError("the workload has no pods")
    if not np.isfinite(tune) or tune <= 0:
        raise ValueError(f"tune must be finite and > 0, got {tune!r}")
    if cluster_gpu_milli <= 0:
        raise ValueError(f"cluster_gpu_milli must be > 0, got {cluster_gpu_milli}")
    rng = arrival_rng(seed)
    by_name = sorted(range(len(pods)), key=lambda i: pods[i].name)
    order = [by_name[i] for i in rng.permutation(len(by_name))]
    names = [pods[i].name for i in order]
    target = int(tune * cluster_gpu_milli)  # truncated like the simulator's int64(float64)
    share = [p.gpu_milli for p in pods]
    request = [p.gpu_request_milli for p in pods]
    total = sum(request[i] for i in order)
    if total <= target:
        if max(share) <= 0:
            raise ValueError("cannot tune a workload that requests no GPU")
        clone = 0
        while True:
            pick = by_name[int(rng.integers(len(pods)))]  # uniform over the originals, in name order
            if total + share[pick] > target:
                break
            order.append(pick)
            names.append(tuned_name(pods[pick].name, clone))
            total += request[pick]
            clone += 1
    else:
        while total > target:
            drop = int(rng.integers(len(order)))
            total -= request[order[drop]]
            del order[drop]
            del names[drop]
    return Arrival(origin=np.array(order, dtype=np.int64), names=tuple(names), target_milli=target)
