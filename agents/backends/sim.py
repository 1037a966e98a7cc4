"""Trace-driven simulated GPUs: a scenario file plus the study's workload profiles.

Scenario file (JSON)::

    {"node": "gpu-node-01", "seed": 7,
     "gpus": [{"uuid": "GPU-…", "model": "NVIDIA A100-SXM4-80GB",
               "memory_mb": 81920, "sm_count": 108}],
     "workloads": [{"tenant": "acme", "namespace": "acme-prod",
                    "pod": "bert-7f9c4-x2k9p", "container": "server",
                    "pod_uid": "…", "sla_tier": "gold", "gpu": "GPU-…",
                    "profile": "bert-base",
                    "guarantee_mem_mb": 384, "limit_mem_mb": 1024, "weight": 4, "sm_requested": 54,
                    "controller_kind": "Deployment", "controller_name": "bert",
                    "labels": {"app": "bert", "team": "acme-search"}}]}

The keys after ``profile`` are optional. The controller and labels are what an agent on a real
node learns from the pod (agents.owners); the guarantee is also reported as the memory request, and
``sm_requested`` (SMs, at most the card's) as the SM request a pod's sm-count asks for. Readings are a function of the
seed and of the seconds elapsed since ``epoch``: no wall clock inside.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from agents.backends._profiles import PEAKS, PROFILES, profile_usage
from agents.interfaces import Entitlement, GpuInfo, UsageReading, Workload, WorkloadMeta
from agents.owners import allowed_labels, parse_label_keys
from allocator.rebalance import SM_MILLI, Pool, PoolNode, PoolWorkload, apply_moves, plan_rebalance

__all__ = [
    "SLA_TIERS",
    "Scenario",
    "SimBackend",
    "SimWorkload",
    "demo_fleet",
    "demo_scenario",
    "load_scenario",
    "parse_scenario",
    "predicted_reservation",
]

SLA_TIERS = ("gold", "silver", "bronze", "best-effort")
A100_80GB = GpuInfo(uuid="", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108)

_WORKLOAD_KEYS = ("tenant", "namespace", "pod", "container", "pod_uid", "sla_tier", "gpu", "profile")
_OPTIONAL_KEYS = ("guarantee_mem_mb", "limit_mem_mb", "weight", "sm_requested", "controller_kind", "controller_name",
                  "labels")
# The demo's controllers by app: a Deployment's pods (name-<hash>-<id>), a StatefulSet's, a Job's.
_CONTROLLERS = {"bert": "Deployment", "resnet50": "Job", "llama2-7b": "StatefulSet"}
# Characters Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_APPS = {  # profile -> (app name, container name, guarantee MiB, limit MiB)
    "bert-base": ("bert", "server", 384, 1024),
    "resnet50": ("resnet50", "worker", 1024, 2048),
    "llama2-7b-q4": ("llama2-7b", "llm", 4096, 8192),
}
_PROFILE_MIX = (0.4, 0.3, 0.3)
# The SMs a demo app's pods ask for (a whole card for the LLM, half for training); bert's pods ask
# for none, as many real pods do not: the demo shows advice against a request and against a grant.
_SM_REQUESTS = {"llama2-7b": 108, "resnet50": 54}
_TEAMS = {"bert": "search", "resnet50": "vision", "llama2-7b": "assistant"}  # a team per app, per tenant  # share of bert-base, resnet50, llama2-7b-q4 pods


@dataclass(frozen=True, slots=True)
class SimWorkload:
    workload: Workload
    gpu: str
    profile: str
    entitlement: Entitlement
    key: int  # seeds this workload's randomness


@dataclass(frozen=True, slots=True)
class Scenario:
    node: str
    seed: int
    gpus: tuple[GpuInfo, ...]
    workloads: tuple[SimWorkload, ...]


def _stable_int(*parts: object) -> int:
    """A non-negative 64-bit integer from text, stable across processes and platforms."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _require(mapping: Any, key: str, kind: type, path: str) -> Any:
    """``mapping[key]`` checked to be of JSON type ``kind`` (ints accepted as floats)."""
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{path}: expected a JSON object, got {mapping!r}")
    if key not in mapping:
        raise ValueError(f"{path}.{key}: required")
    value = mapping[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{path}.{key}: expected {kind.__name__}, got {value!r}")
    if kind is str and not value:
        raise ValueError(f"{path}.{key}: must not be empty")
    return value


def parse_scenario(data: Mapping[str, Any]) -> Scenario:  # noqa: PLR0912 - one check per field of the scenario, each naming its path
    """Validate a scenario document; errors name the offending path."""
    if not isinstance(data, Mapping):
        raise ValueError("scenario: expected a JSON object")
    node = _require(data, "node", str, "scenario")
    seed = _require(data, "seed", int, "scenario")
    if seed < 0:
        raise ValueError(f"scenario.seed: must be >= 0, got {seed}")
    gpus: list[GpuInfo] = []
    for i, raw in enumerate(_require(data, "gpus", list, "scenario")):
        path = f"gpus[{i}]"
        gpu = GpuInfo(
            uuid=_require(raw, "uuid", str, path),
            model=_require(raw, "model", str, path),
            memory_mb=_require(raw, "memory_mb", int, path),
            sm_count=_require(raw, "sm_count", int, path),
        )
        if gpu.memory_mb <= 0 or gpu.sm_count <= 0:
            raise ValueError(f"{path}: memory_mb and sm_count must be > 0")
        if any(g.uuid == gpu.uuid for g in gpus):
            raise ValueError(f"{path}.uuid: duplicate GPU {gpu.uuid!r}")
        gpus.append(gpu)
    if not gpus:
        raise ValueError("scenario.gpus: at least one GPU is required")
    known_gpus = {g.uuid for g in gpus}
    workloads: list[SimWorkload] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(_require(data, "workloads", list, "scenario")):
        path = f"workloads[{i}]"
        fields = {k: _require(raw, k, str, path) for k in _WORKLOAD_KEYS}
        unknown = set(raw) - set(_WORKLOAD_KEYS) - set(_OPTIONAL_KEYS)
        if unknown:
            raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
        if fields["gpu"] not in known_gpus:
            raise ValueError(f"{path}.gpu: unknown GPU {fields['gpu']!r}")
        if fields["profile"] not in PROFILES:
            raise ValueError(f"{path}.profile: unknown {fields['profile']!r} (known: {sorted(PROFILES)})")
        if fields["sla_tier"] not in SLA_TIERS:
            raise ValueError(f"{path}.sla_tier: unknown {fields['sla_tier']!r} (known: {SLA_TIERS})")
        workload = Workload(**{k: fields[k] for k in _WORKLOAD_KEYS[:6]})
        if (fields["gpu"], workload.key) in seen:
            raise ValueError(f"{path}: {workload.key} appears twice on {fields['gpu']}")
        seen.add((fields["gpu"], workload.key))
        guarantee = _require(raw, "guarantee_mem_mb", float, path) if "guarantee_mem_mb" in raw else 0.0
        limit = _require(raw, "limit_mem_mb", float, path) if "limit_mem_mb" in raw else None
        weight = _require(raw, "weight", float, path) if "weight" in raw else None
        if not math.isfinite(guarantee) or guarantee < 0:
            raise ValueError(f"{path}.guarantee_mem_mb: must be >= 0")
        if limit is not None and not limit >= guarantee:
            raise ValueError(f"{path}.limit_mem_mb: must be >= guarantee_mem_mb ({guarantee})")
        if weight is not None and not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"{path}.weight: must be > 0")
        meta = _scenario_meta(raw, path)
        meta = _with_requests(meta, raw, path, next(g for g in gpus if g.uuid == fields["gpu"]), guarantee)
        workload = replace(workload, meta=meta)
        workloads.append(
            SimWorkload(
                workload=workload,
                gpu=fields["gpu"],
                profile=fields["profile"],
                entitlement=Entitlement(guarantee_mem_mb=guarantee, limit_mem_mb=limit, weight=weight),
                key=_stable_int(seed, workload.pod_uid, workload.container, fields["gpu"]),
            )
        )
    return Scenario(node=node, seed=seed, gpus=tuple(gpus), workloads=tuple(workloads))


def _with_requests(meta: WorkloadMeta, raw: Mapping[str, Any], path: str, card: GpuInfo,
                   guarantee: float) -> WorkloadMeta:
    """The description with what the pod asked for on its card: the memory guarantee (what the pod
    asked for, as a request's is) and the SMs of `sm_requested`, checked as the service checks them."""
    if "guarantee_mem_mb" in raw:
        meta = replace(meta, mem_requested_mb=min(round(guarantee), card.memory_mb))
    if "sm_requested" in raw:
        sm = _require(raw, "sm_requested", float, path)
        if not (math.isfinite(sm) and 0 <= sm <= card.sm_count):
            raise ValueError(f"{path}.sm_requested: must be a number of SMs in [0, {card.sm_count}]")
        meta = replace(meta, sm_requested=float(sm))
    return meta


def _scenario_meta(raw: Mapping[str, Any], path: str) -> WorkloadMeta:
    """A scenario workload's controller and labels, checked as the service will check them."""
    kind = _require(raw, "controller_kind", str, path) if "controller_kind" in raw else ""
    name = _require(raw, "controller_name", str, path) if "controller_name" in raw else ""
    if bool(kind) != bool(name):
        raise ValueError(f"{path}: controller_kind and controller_name go together")
    labels = _require(raw, "labels", dict, path) if "labels" in raw else {}
    if not all(isinstance(v, str) for v in labels.values()):
        raise ValueError(f"{path}.labels: values must be strings")
    try:
        parse_label_keys(",".join(labels))
    except ValueError as error:
        raise ValueError(f"{path}.labels: {error}") from error
    return WorkloadMeta(controller_kind=kind, controller_name=name, labels=tuple(sorted(labels.items())))


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors name the file and the offending path."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return parse_scenario(data)
    except json.JSONDecodeError as error:
        raise ValueError(f"scenario {path}: not valid JSON ({error})") from error
    except ValueError as error:
        raise ValueError(f"scenario {path}: {error}") from error


# A simulated card's power draw: idle plus the rest of its board power in proportion to SM use. The
# A100 SXM4's maximum is 400 W (NVIDIA's A100 datasheet); an idle one draws about 60 W.
IDLE_POWER_W = 60.0
MAX_POWER_W = 400.0


class SimBackend:
    """``GpuBackend`` over a scenario; ``epoch`` is elapsed time zero of the profiles. It meters energy
    (``agents.interfaces.EnergyReader``) as the NVML backend does without an energy counter: the power
    of each read held until the next, integrated over time."""

    def __init__(self, scenario: Scenario, *, epoch: datetime, label_keys: Sequence[str] | None = None) -> None:
        """``label_keys``: the agent's label allow-list, applied to the scenario's labels as to a
        real pod's; None keeps them all."""
        if epoch.tzinfo is None:
            raise ValueError("epoch must be an aware UTC datetime")
        if label_keys is not None:
            scenario = _with_allowed_labels(scenario, label_keys)
        self._scenario = scenario
        self._epoch = epoch
        self._gpus = {g.uuid: g for g in scenario.gpus}
        self._lock = threading.Lock()
        self._workloads = scenario.workloads  # shrinks when pods are evicted
        self._energy: dict[str, tuple[float, float, datetime]] = {}  # uuid -> (joules, power held W, since)

    @property
    def scenario(self) -> Scenario:
        return self._scenario

    @property
    def workloads(self) -> tuple[SimWorkload, ...]:
        """The workloads still running (the scenario's, less evicted pods)."""
        with self._lock:
            return self._workloads

    def remove_pod(self, *, namespace: str, pod: str) -> int:
        """An evicted pod stops: its containers' workloads leave every GPU. Returns how many left."""
        with self._lock:
            kept = tuple(w for w in self._workloads if (w.workload.namespace, w.workload.pod) != (namespace, pod))
            removed = len(self._workloads) - len(kept)
            self._workloads = kept
        return removed

    def processes(self, workload: Workload) -> Sequence[int]:
        """Simulated workloads have no host processes (the watchdog's ``signal`` action has nothing to act on)."""
        return ()

    def inventory(self) -> Sequence[GpuInfo]:
        return self._scenario.gpus

    def energy_j(self, *, now: datetime) -> dict[str, float]:
        """Cumulative joules per GPU: the power at the previous call held until ``now``."""
        power = self._power_w(now)
        energy: dict[str, float] = {}
        for gpu_uuid, watts in power.items():
            joules, held, since = self._energy.get(gpu_uuid, (0.0, watts, now))
            joules += held * max((now - since).total_seconds(), 0.0)
            self._energy[gpu_uuid] = (joules, watts, now)
            energy[gpu_uuid] = joules
        return energy

    def _power_w(self, now: datetime) -> dict[str, float]:
        busy: dict[str, float] = {g.uuid: 0.0 for g in self._scenario.gpus}
        for r in self.read(now=now):
            busy[r.gpu] += r.sm_used / self._gpus[r.gpu].sm_count
        return {g: IDLE_POWER_W + (MAX_POWER_W - IDLE_POWER_W) * min(share, 1.0) for g, share in busy.items()}

    def read(self, *, now: datetime) -> Sequence[UsageReading]:
        elapsed_s = (now - self._epoch).total_seconds()
        if elapsed_s < 0:
            raise ValueError(f"{now.isoformat()} is before the simulation epoch")
        readings: list[UsageReading] = []
        running = self.workloads
        for gpu in self._scenario.gpus:
            on_gpu = [w for w in running if w.gpu == gpu.uuid]
            usage = [profile_usage(w.profile, key=w.key, elapsed_s=elapsed_s) for w in on_gpu]
            # A card cannot hold or run more than it has: an over-full scenario is scaled
            # down pro rata (allocations fail, kernels time-slice).
            mem_scale = _fit(sum(u.mem_mb for u in usage), gpu.memory_mb)
            sm_scale = _fit(sum(u.sm_fraction for u in usage), 1.0)
            readings.extend(
                UsageReading(
                    workload=w.workload,
                    gpu=gpu.uuid,
                    mem_used_mb=min(u.mem_mb * mem_scale, gpu.memory_mb),
                    sm_used=min(u.sm_fraction * sm_scale * gpu.sm_count, gpu.sm_count),
                    pcie_mb_per_s=u.pcie_mb_per_s,
                    entitlement=w.entitlement,
                )
                for w, u in zip(on_gpu, usage, strict=True)
            )
        return readings


def _with_allowed_labels(scenario: Scenario, keys: Sequence[str]) -> Scenario:
    def allowed(w: SimWorkload) -> SimWorkload:
        meta = replace(w.workload.meta, labels=allowed_labels(dict(w.workload.meta.labels), keys))
        return replace(w, workload=replace(w.workload, meta=meta))

    return replace(scenario, workloads=tuple(allowed(w) for w in scenario.workloads))


def _fit(total: float, capacity: float) -> float:
    """Scale factor bringing ``total`` within ``capacity``; 1e-9 below exact so that the
    rounded float sum of the scaled parts stays <= capacity too."""
    return 1.0 if total <= capacity else capacity / total * (1.0 - 1e-9)


def _name(rng: np.random.Generator, length: int) -> str:
    return "".join(_NAME_ALPHABET[i] for i in rng.integers(0, len(_NAME_ALPHABET), length))


def demo_scenario(node: str, *, seed: int, gpu_count: int = 8, tenants: Sequence[tuple[str, str]],
                  pods_per_gpu: tuple[int, int] = (2, 4)) -> dict[str, Any]:
    """A realistic node: A100 80GB cards, ``pods_per_gpu`` pods each (from the first to the second,
    both included), mixed profiles across ``tenants``.

    ``tenants`` are ``(slug, sla_tier)`` pairs. The same arguments give the same
    document.
    """
    if not tenants:
        raise ValueError("tenants: at least one (slug, sla_tier) pair is required")
    for slug, tier in tenants:
        if not slug or tier not in SLA_TIERS:
            raise ValueError(f"tenant {slug!r}: tier {tier!r} not in {SLA_TIERS}")
    if gpu_count < 1:
        raise ValueError(f"gpu_count must be >= 1, got {gpu_count}")
    fewest, most = pods_per_gpu
    if not 1 <= fewest <= most:
        raise ValueError(f"pods_per_gpu must be (fewest, most) with 1 <= fewest <= most, got {pods_per_gpu}")
    rng = np.random.default_rng([seed, _stable_int("demo", node)])
    gpus = [
        {
            "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-ledger:{node}:gpu:{index}")),
            "model": A100_80GB.model,
            "memory_mb": A100_80GB.memory_mb,
            "sm_count": A100_80GB.sm_count,
        }
        for index in range(gpu_count)
    ]
    profiles = list(_APPS)
    workloads: list[dict[str, Any]] = []
    for gpu in gpus:
        for _ in range(int(rng.integers(fewest, most + 1))):
            slug, tier = tenants[int(rng.integers(0, len(tenants)))]
            profile = profiles[int(rng.choice(len(profiles), p=_PROFILE_MIX))]
            app, container, guarantee_mb, limit_mb = _APPS[profile]
            namespace = f"{slug}-prod" if rng.random() < 0.8 else f"{slug}-staging"
            pod = f"{app}-{_name(rng, 5)}-{_name(rng, 5)}"
            kind = _CONTROLLERS[app]
            # No draws of their own: the demo's pods, usage and costs stay what they were.
            controller = pod.rsplit("-", 1)[0] if kind == "Job" else app
            workloads.append(
                {
                    "tenant": slug,
                    "namespace": namespace,
                    "pod": pod,
                    "container": container,
                    "pod_uid": str(uuid.UUID(bytes=rng.bytes(16), version=4)),
                    "sla_tier": tier,
                    "gpu": gpu["uuid"],
                    "profile": profile,
                    "guarantee_mem_mb": guarantee_mb,
                    "limit_mem_mb": limit_mb,
                    "controller_kind": kind,
                    "controller_name": controller,
                    "labels": {"app": app, "team": f"{slug}-{_TEAMS[app]}"},
                    # No draws of their own either: what the pods ask for adds nothing to the draws.
                    **({"sm_requested": _SM_REQUESTS[app]} if app in _SM_REQUESTS else {}),
                }
            )
    return {"node": node, "seed": seed, "gpus": gpus, "workloads": workloads}


def predicted_reservation(profile: str) -> tuple[int, int]:
    """What a pod of ``profile`` is predicted to hold of a card before it has any history, in the
    rebalance planner's units (memory MB, SM milli), rounded up: its profile's peak, per resource.

    Use never exceeds the peak (agents.backends._profiles clips to it), so a card whose pods'
    reservations fit never runs short, at any tier's miss target; a headroom on top would guard a
    forecast's error, and a bound has none. A pod's request plays no part: it is what whole-card and
    request-fraction scheduling reserve, not what the pod uses."""
    peak = PEAKS[profile]
    return math.ceil(round(peak.mem_mb, 6)), math.ceil(round(peak.sm_fraction * SM_MILLI, 6))


def demo_fleet(nodes: Sequence[str], *, tenants: Sequence[tuple[str, str]], gpu_count: int = 8) -> dict[str, dict[str, Any]]:
    """The demo's fleet: a scenario per node (seeded by its position in ``nodes``, from 1), with
    its pods placed by their predicted reservations.

    The pods arrive as a scheduler of whole cards places them, one per card, so that every static
    alternative fits on the fleet (a whole card needs a card per pod). The product's placement then
    packs them by what they are predicted to hold (``predicted_reservation``): the rebalance planner
    (allocator.rebalance), each card a node of one GPU so that it empties cards rather than whole
    nodes, empties every card whose pods fit, at their reservations, on cards that stay busy. The cards it empties are
    the saving dynamic allocation makes; a pod may land on another node's card. The same arguments
    give the same documents."""
    drawn = [demo_scenario(node, seed=seed, gpu_count=gpu_count, tenants=tenants, pods_per_gpu=(1, 1))
             for seed, node in enumerate(nodes, start=1)]
    # A card's name in the pool sorts in the fleet's order (node, then index), which orders the
    # planner's ties, as the static alternatives are placed in the fleet's order.
    cards = {f"{doc['node']}/{index:03d}": (doc["node"], gpu) for doc in drawn for index, gpu in enumerate(doc["gpus"])}
    name_of = {gpu["uuid"]: name for name, (_, gpu) in cards.items()}
    pods = {w["pod_uid"]: w for doc in drawn for w in doc["workloads"]}
    reserved = {uid: predicted_reservation(w["profile"]) for uid, w in pods.items()}
    pool = Pool.build(
        [PoolNode(name=name, model=gpu["model"], gpus=1, gpu_memory_mb=gpu["memory_mb"]) for name, (_, gpu) in cards.items()],
        [PoolWorkload(key=uid, node=name_of[w["gpu"]], gpus=(0,), memory_mb=reserved[uid][0], sm_milli=reserved[uid][1])
         for uid, w in pods.items()],
    )
    plan = plan_rebalance(pool, max_moves=len(pods), price_per_gpu_hour=Decimal(0))
    placed = {w.key: cards[w.node] for w in apply_moves(pool, plan.moves).workloads}
    return {doc["node"]: {**doc, "workloads": [{**w, "gpu": placed[uid][1]["uuid"]} for uid, w in pods.items()
                                               if placed[uid][0] == doc["node"]]}
            for doc in drawn}
