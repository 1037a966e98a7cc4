"""The usage model: how much of its request each pod uses, step by step (docs/replay.md).

A pod's GPU shard (one per requested GPU) runs one workload class. A class is a profile
on one A100-80GB for a pod that requested the whole card; a pod that requested a share
``r`` of a card uses ``r`` times that profile ("scaled into the request"):

    memory_mb(t) = r × (mem_base_mb + mem_burst_mb × x(t))
    sm(t)        = r × sm_count × (sm_base + sm_burst × y(t))

``x`` and ``y`` are burst signals in [0, 1] resampled from the Azure LLM inference trace:
``requests`` is the 1 s request count, ``tokens`` is the number of tokens in flight
(prompt + generated so far, decoding at ``decode_tokens_per_s``), each divided by its
99th percentile and clipped to 1. Each pod reads the trace from its own offset, at
1 s per second, wrapping around; the replay steps ``step_s`` seconds at a time and keeps
the mean and the peak of each step (peak-within-step statistics), plus the sorted
per-second values so that seconds above a threshold can be counted exactly.

The class and the offset of a pod come from a keyed hash of ``(seed, pod name)``, so
they do not depend on the order or the subset of pods replayed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from allocator.replay._trace import AzureRequests, GpuPod

__all__ = [
    "A100_MEMORY_MB",
    "A100_SM_COUNT",
    "DEFAULT_CLASSES",
    "BurstSignals",
    "PodUsage",
    "UsageModel",
    "WorkloadClass",
    "assign_classes",
    "build_burst_signals",
    "build_pod_usage",
    "shortfall",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Driver = Literal["requests", "tokens", "none"]

A100_MEMORY_MB = 81_920.0  # A100-SXM4-80GB as NVML reports it (MiB, called MB in this project)
A100_SM_COUNT = 108


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """Use of one GPU by a pod of this class that requested the whole card.

    Memory in MB; SM as a fraction of the card's SMs; ``*_driver`` names the burst
    signal that scales the burst part (``none``: constant).
    """

    name: str
    weight: float  # relative share of GPU pods assigned to this class
    mem_base_mb: float
    mem_burst_mb: float
    mem_driver: Driver
    sm_base: float
    sm_burst: float
    sm_driver: Driver

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("workload class name must not be empty")
        for label, value in (("weight", self.weight), ("mem_base_mb", self.mem_base_mb)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"class {self.name!r}: {label} must be finite and > 0, got {value!r}")
        for label, value in (
            ("mem_burst_mb", self.mem_burst_mb),
            ("sm_base", self.sm_base),
            ("sm_burst", self.sm_burst),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"class {self.name!r}: {label} must be finite and >= 0, got {value!r}")
        if self.mem_base_mb + self.mem_burst_mb > A100_MEMORY_MB:
            raise ValueError(f"class {self.name!r}: peak memory exceeds one A100-80GB ({A100_MEMORY_MB:.0f} MB)")
        if self.sm_base + self.sm_burst > 1.0:
            raise ValueError(f"class {self.name!r}: sm_base + sm_burst must be <= 1 (the whole card)")
        if self.sm_base + self.sm_burst <= 0:
            raise ValueError(f"class {self.name!r}: the class must use some SM at its peak")
        for label, driver, burst in (
            ("mem_driver", self.mem_driver, self.mem_burst_mb),
            ("sm_driver", self.sm_driver, self.sm_burst),
        ):
            if driver not in ("requests", "tokens", "none"):
                raise ValueError(f"class {self.name!r}: {label} must be requests, tokens or none, got {driver!r}")
            if (driver == "none") != (burst == 0):
                raise ValueError(f"class {self.name!r}: {label} is 'none' exactly when its burst part is 0")


# Sources and reasoning for every number: docs/replay.md §Usage model.
DEFAULT_CLASSES: tuple[WorkloadClass, ...] = (
    WorkloadClass(
        name="bert-base-inference",
        weight=1.0,
        mem_base_mb=300.0,  # fp16 weights (110 M params, 220 MB) + CUDA context
        mem_burst_mb=200.0,  # activations of concurrent requests: 300-500 MB in all
        mem_driver="requests",
        sm_base=0.02,
        sm_burst=0.10,  # "low SM": at most 12 % of the card
        sm_driver="requests",
    ),
    WorkloadClass(
        name="resnet50-batch4",
        weight=1.0,
        mem_base_mb=1_180.0,  # the study: 1180 MB at batch 4
        mem_burst_mb=0.0,
        mem_driver="none",
        sm_base=0.06,
        sm_burst=0.10,  # peak 16 %: the study fits 6 per card
        sm_driver="requests",
    ),
    WorkloadClass(
        name="llama2-7b-q4",
        weight=1.0,
        mem_base_mb=3_726.0,  # 6.74e9 params × 4 bit = 3,214 MB + 512 MB runtime
        mem_burst_mb=2_048.0,  # KV cache: 4,096 tokens × 0.5 MB (32 layers × 4096 × K,V × fp16)
        mem_driver="tokens",
        sm_base=0.02,
        sm_burst=0.12,  # peak 14 %: the study runs 7 per card
        sm_driver="requests",
    ),
)


@dataclass(frozen=True, slots=True)
class UsageModel:
    """Configuration of the usage model; see the module docstring."""

    step_s: int = 60
    seed: int = 20_231_116
    classes: tuple[WorkloadClass, ...] = DEFAULT_CLASSES
    decode_tokens_per_s: float = 30.0
    card_memory_mb: float = A100_MEMORY_MB
    card_sm_count: int = A100_SM_COUNT

    def __post_init__(self) -> None:
        if not 1 <= self.step_s <= 3_600:
            raise ValueError(f"step_s must be an integer number of seconds in 1..3600, got {self.step_s!r}")
        if not self.classes:
            raise ValueError("at least one workload class is needed")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"workload class names must be unique, got {names}")
        if not (math.isfinite(self.decode_tokens_per_s) and self.decode_tokens_per_s > 0):
            raise ValueError(f"decode_tokens_per_s must be finite and > 0, got {self.decode_tokens_per_s!r}")
        if self.card_memory_mb != A100_MEMORY_MB or self.card_sm_count != A100_SM_COUNT:
            # The class profiles and the MIG profiles are A100-80GB numbers.
            raise ValueError("the replay models A100-80GB cards only (81920 MB, 108 SMs)")


@dataclass(frozen=True, slots=True)
class BurstSignals:
    """Per-second burst signals and their per-window statistics.

    Row ``o`` of each ``*_sorted`` array holds the sorted values of seconds
    ``o, o+1, …, o+step_s-1`` (wrapping around), so a pod reading from offset ``o``
    sees that window in one step.
    """

    length_s: int
    step_s: int
    requests_p99: float  # requests per second that maps to 1.0
    tokens_p99: float  # tokens in flight that maps to 1.0
    requests_sorted: FloatArray = field(repr=False)
    tokens_sorted: FloatArray = field(repr=False)
    requests_s: FloatArray = field(repr=False)  # per second, in [0, 1]: what a pod reads second by second
    tokens_s: FloatArray = field(repr=False)

    def per_second(self, driver: Driver) -> FloatArray:
        """The signal second by second (``none``: zeros)."""
        if driver == "requests":
            return self.requests_s
        if driver == "tokens":
            return self.tokens_s
        return np.zeros(self.length_s)

    def sorted_windows(self, driver: Driver) -> FloatArray:
        if driver == "requests":
            return self.requests_sorted
        if driver == "tokens":
            return self.tokens_sorted
        raise ValueError("a constant ('none') driver has no burst windows")


def build_burst_signals(requests: AzureRequests, *, step_s: int, decode_tokens_per_s: float = 30.0) -> BurstSignals:
    """Normalised 1 s request-rate and tokens-in-flight signals of the Azure trace."""
    length = math.floor(float(requests.arrival_s[-1])) + 1
    if length < step_s:
        raise ValueError(f"the request trace spans {length} s, shorter than one step ({step_s} s)")
    second = np.minimum(np.floor(requests.arrival_s).astype(np.int64), length - 1)
    rate = np.bincount(second, minlength=length).astype(np.float64)
    tokens = np.zeros(length)
    mid = np.arange(length, dtype=np.float64) + 0.5  # sample each second at its middle
    for start, context, generated in zip(
        requests.arrival_s, requests.context_tokens, requests.generated_tokens, strict=True
    ):
        done = start + generated / decode_tokens_per_s
        lo = math.ceil(start - 0.5)
        hi = min(length, math.ceil(done - 0.5))
        if hi > lo:
            t = mid[lo:hi]
            tokens[lo:hi] += context + decode_tokens_per_s * (t - start)
    rate_p99 = float(np.percentile(rate, 99))
    tokens_p99 = float(np.percentile(tokens, 99))
    if rate_p99 <= 0 or tokens_p99 <= 0:
        raise ValueError("the request trace is too sparse to give a burst signal (99th percentile is 0)")
    index = (np.arange(length)[:, None] + np.arange(step_s)[None, :]) % length
    requests_s = np.minimum(1.0, rate / rate_p99)
    tokens_s = np.minimum(1.0, tokens / tokens_p99)
    return BurstSignals(
        length_s=length,
        step_s=step_s,
        requests_p99=rate_p99,
        tokens_p99=tokens_p99,
        requests_sorted=np.sort(requests_s[index], axis=1),
        tokens_sorted=np.sort(tokens_s[index], axis=1),
        requests_s=requests_s,
        tokens_s=tokens_s,
    )


@dataclass(frozen=True, slots=True)
class PodUsage:
    """Use of every pod, one row per (pod, step it overlaps), pods back to back.

    Rows of pod ``i`` are ``offset[i] : offset[i] + steps[i]``; row ``j`` of pod ``i``
    is global step ``first_step[i] + j``. Quantities are per GPU shard of the pod
    (every shard of a pod uses the same); memory in MB, SM in SMs.
    """

    step_s: int
    pods: tuple[GpuPod, ...]
    class_index: IntArray  # per pod, into UsageModel.classes
    share: FloatArray  # per pod: gpu_milli / 1000
    offset: IntArray  # per pod
    first_step: IntArray  # per pod
    steps: IntArray  # per pod
    seconds: FloatArray  # per row: seconds of the step the pod held its GPUs (0 < s <= step_s)
    window: IntArray  # per row: the burst window the row reads
    mem_mean_mb: FloatArray
    mem_peak_mb: FloatArray
    sm_mean: FloatArray
    sm_peak: FloatArray

    @property
    def rows(self) -> int:
        return int(self.seconds.shape[0])

    def pod_of_row(self) -> IntArray:
        return np.repeat(np.arange(len(self.pods), dtype=np.int64), self.steps)


def _hash_draws(seed: int, name: str) -> tuple[float, int]:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=16).digest()
    uniform = int.from_bytes(digest[:8], "big") / 2.0**64
    return uniform, int.from_bytes(digest[8:], "big")


def assign_classes(pods: Sequence[GpuPod], model: UsageModel, burst_length_s: int) -> tuple[IntArray, IntArray]:
    """Class index and burst-signal start second of each pod, from (seed, name) only."""
    weights = np.array([c.weight for c in model.classes])
    cumulative = np.cumsum(weights) / weights.sum()
    classes = np.empty(len(pods), dtype=np.int64)
    starts = np.empty(len(pods), dtype=np.int64)
    for i, pod in enumerate(pods):
        uniform, bits = _hash_draws(model.seed, pod.name)
        classes[i] = min(int(np.searchsorted(cumulative, uniform, side="right")), len(model.classes) - 1)
        starts[i] = bits % burst_length_s
    return classes, starts


def _window_stats(signals: BurstSignals, driver: Driver, window: IntArray) -> tuple[FloatArray, FloatArray]:
    if driver == "none":
        zeros = np.zeros(window.shape[0])
        return zeros, zeros
    rows = signals.sorted_windows(driver)
    return rows[window].mean(axis=1), rows[window, -1]


def build_pod_usage(pods: Sequence[GpuPod], model: UsageModel, signals: BurstSignals) -> PodUsage:
    """Per-step mean and peak use of every pod under ``model``, pods sorted by (start, name)."""
    if signals.step_s != model.step_s:
        raise ValueError(f"burst signals were built for {signals.step_s} s steps, the model uses {model.step_s} s")
    # A canonical order makes every float sum below independent of the caller's order.
    pods = tuple(sorted(pods, key=lambda p: (p.start_s, p.name)))
    if len({p.name for p in pods}) != len(pods):
        raise ValueError("pod names must be unique: a pod's class and bursts are keyed by its name")
    step = float(model.step_s)
    n = len(pods)
    start = np.array([p.start_s for p in pods], dtype=np.float64)
    end = np.array([p.end_s for p in pods], dtype=np.float64)
    share = np.array([p.share for p in pods], dtype=np.float64)
    first = np.floor(start / step).astype(np.int64)
    last = np.ceil(end / step).astype(np.int64)  # exclusive
    steps = np.maximum(last - first, 1)
    offset = np.zeros(n, dtype=np.int64)
    if n:
        offset[1:] = np.cumsum(steps)[:-1]
    total = int(steps.sum())
    classes, burst_start = assign_classes(pods, model, signals.length_s)

    pod = np.repeat(np.arange(n, dtype=np.int64), steps)
    local = np.arange(total, dtype=np.int64) - np.repeat(offset, steps)
    global_step = np.repeat(first, steps) + local
    lo = np.maximum(np.repeat(start, steps), global_step * step)
    hi = np.minimum(np.repeat(end, steps), (global_step + 1) * step)
    seconds = hi - lo
    window = (np.repeat(burst_start, steps) + local * model.step_s) % signals.length_s

    mem_mean = np.empty(total)
    mem_peak = np.empty(total)
    sm_mean = np.empty(total)
    sm_peak = np.empty(total)
    row_class = classes[pod]
    row_share = share[pod]
    sms = float(model.card_sm_count)
    for index, cls in enumerate(model.classes):
        rows = np.flatnonzero(row_class == index)
        if not rows.size:
            continue
        r = row_share[rows]
        x_mean, x_peak = _window_stats(signals, cls.mem_driver, window[rows])
        y_mean, y_peak = _window_stats(signals, cls.sm_driver, window[rows])
        mem_mean[rows] = r * (cls.mem_base_mb + cls.mem_burst_mb * x_mean)
        mem_peak[rows] = r * (cls.mem_base_mb + cls.mem_burst_mb * x_peak)
        sm_mean[rows] = r * sms * (cls.sm_base + cls.sm_burst * y_mean)
        sm_peak[rows] = r * sms * (cls.sm_base + cls.sm_burst * y_peak)
    return PodUsage(
        step_s=model.step_s,
        pods=tuple(pods),
        class_index=classes,
        share=share,
        offset=offset,
        first_step=first,
        steps=steps,
        seconds=seconds,
        window=window,
        mem_mean_mb=mem_mean,
        mem_peak_mb=mem_peak,
        sm_mean=sm_mean,
        sm_peak=sm_peak,
    )


def shortfall(
    usage: PodUsage,
    model: UsageModel,
    signals: BurstSignals,
    rows: IntArray,
    *,
    resource: Literal["memory", "sm"],
    grant: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Per row in ``rows``: seconds whose use exceeds ``grant``, and Σ (use − grant) over them.

    The second is in unit-seconds (SM-seconds or MB-seconds). Both are counted exactly on
    the row's burst window, then scaled to the seconds the pod held its GPUs in that step.
    """
    seconds = np.zeros(rows.shape[0])
    amount = np.zeros(rows.shape[0])
    if not rows.size:
        return seconds, amount
    pod = usage.pod_of_row()[rows]
    row_class = usage.class_index[pod]
    share = usage.share[pod]
    scale = usage.seconds[rows] / float(model.step_s)
    sms = float(model.card_sm_count)
    for index, cls in enumerate(model.classes):
        mask = row_class == index
        if not mask.any():
            continue
        r = share[mask]
        if resource == "memory":
            base, burst, driver = r * cls.mem_base_mb, r * cls.mem_burst_mb, cls.mem_driver
        else:
            base, burst, driver = r * sms * cls.sm_base, r * sms * cls.sm_burst, cls.sm_driver
        g = grant[mask]
        if driver == "none":
            count = np.where(base > g, float(model.step_s), 0.0)
            short = np.maximum(base - g, 0.0) * float(model.step_s)
        else:
            threshold = (g - base) / burst
            values = signals.sorted_windows(driver)[usage.window[rows[mask]]]
            above = values > threshold[:, None]
            count = above.sum(axis=1).astype(np.float64)
            short = burst * np.where(above, values - threshold[:, None], 0.0).sum(axis=1)
        seconds[mask] = count * scale[mask]
        amount[mask] = short * scale[mask]
    return seconds, amount
