"""Usage models of the study's workloads (docs/design.md, The study), as pure functions of time.

Each model maps (workload key, elapsed seconds) to memory (MiB), SM fraction of
the card (0..1) and PCIe rate (MB/s). Randomness comes from numpy Generators
seeded by (key, stream, chunk of time), so any instant can be evaluated on its
own: the same key and elapsed time always give the same reading.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["PEAKS", "PROFILES", "ProfilePeak", "ProfileUsage", "profile_usage"]

_NOISE_STEP_S = 0.5  # noise changes every half second
_NOISE_PER_CHUNK = 128  # noise values drawn per generator (64 s)
_ARRIVAL_CHUNK_S = 64  # request arrivals are drawn per 64 s chunk
_ON_OFF_PERIOD_S = 16  # a Llama server is busy or quiet for 16 s at a time
_LONGEST_REQUEST_S = 8.0  # prefill <= 0.41 s + decode <= 5.6 s, rounded up

# Llama-2-7B, 4-bit weights: ~3.8 GB of weights + CUDA context; fp16 KV cache of
# 2 x 32 layers x 4096 hidden x 2 bytes = 0.5 MiB per token in flight.
_LLAMA_BASE_MB = 4100.0
_LLAMA_MAX_MB = 6144.0
_KV_MB_PER_TOKEN = 0.5


@dataclass(frozen=True, slots=True)
class ProfileUsage:
    mem_mb: float  # MiB held
    sm_fraction: float  # share of the card's SMs busy, 0..1
    pcie_mb_per_s: float


@dataclass(frozen=True, slots=True)
class ProfilePeak:
    """The most a profile's workload ever holds: its use is clipped to these, at every instant."""

    mem_mb: float  # MiB
    sm_fraction: float  # share of the card's SMs


# Each profile's bounds, used by its model below and known before a workload of it has any history
# (agents.backends.sim places the demo's pods by them).
PEAKS: dict[str, ProfilePeak] = {
    "bert-base": ProfilePeak(mem_mb=500.0, sm_fraction=0.10),
    "resnet50": ProfilePeak(mem_mb=1200.0, sm_fraction=0.45),
    "llama2-7b-q4": ProfilePeak(mem_mb=_LLAMA_MAX_MB, sm_fraction=0.80),
}


@dataclass(frozen=True, slots=True)
class _Request:
    arrival_s: float
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    output_tokens: int


def _clip(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


@lru_cache(maxsize=8192)
def _noise_chunk(key: int, stream: int, chunk: int) -> np.ndarray:
    return np.random.default_rng([key, stream, chunk]).standard_normal(_NOISE_PER_CHUNK)


def _noise(key: int, stream: int, t: float) -> float:
    """Standard normal noise, constant over each half second."""
    chunk, index = divmod(math.floor(t / _NOISE_STEP_S), _NOISE_PER_CHUNK)
    return float(_noise_chunk(key, stream, chunk)[index])


def _constant(key: int, stream: int, low: float, high: float) -> float:
    """A per-workload constant drawn uniformly from [low, high)."""
    return float(np.random.default_rng([key, stream]).uniform(low, high))


def _bert_base(key: int, t: float) -> ProfileUsage:
    """BERT-base inference: ~300-500 MB, 5-10 % of SMs, steady with small noise."""
    peak = PEAKS["bert-base"]
    mem = _clip(_constant(key, 1, 320.0, 460.0) + 6.0 * _noise(key, 2, t), 300.0, peak.mem_mb)
    sm = _clip(0.075 + 0.01 * _noise(key, 3, t), 0.05, peak.sm_fraction)
    pcie = max(0.0, 2.0 + 0.4 * _noise(key, 4, t))
    return ProfileUsage(mem_mb=mem, sm_fraction=sm, pcie_mb_per_s=pcie)


def _resnet50(key: int, t: float) -> ProfileUsage:
    """ResNet-50, batch 4: ~1180 MB, moderate SM load that rises and falls with batches."""
    period_s = _constant(key, 1, 1.5, 3.0)
    phase = _constant(key, 2, 0.0, 1.0)
    wave = 0.5 + 0.5 * math.sin(2.0 * math.pi * (t / period_s + phase))
    peak = PEAKS["resnet50"]
    mem = _clip(1180.0 + 8.0 * _noise(key, 3, t), 1160.0, peak.mem_mb)
    sm = _clip(0.06 + 0.30 * wave + 0.02 * _noise(key, 4, t), 0.03, peak.sm_fraction)
    pcie = max(0.0, 4.0 + 10.0 * wave + _noise(key, 5, t))
    return ProfileUsage(mem_mb=mem, sm_fraction=sm, pcie_mb_per_s=pcie)


@lru_cache(maxsize=8192)
def _requests(key: int, chunk: int) -> tuple[_Request, ...]:
    """Seeded on/off Poisson arrivals of one 64 s chunk."""
    rng = np.random.default_rng([key, 7, chunk])
    requests: list[_Request] = []
    for period in range(_ARRIVAL_CHUNK_S // _ON_OFF_PERIOD_S):
        begin = chunk * _ARRIVAL_CHUNK_S + period * _ON_OFF_PERIOD_S
        rate_per_s = 0.6 if rng.random() < 0.45 else 0.04
        count = int(rng.poisson(rate_per_s * _ON_OFF_PERIOD_S))
        for arrival in np.sort(rng.uniform(begin, begin + _ON_OFF_PERIOD_S, count)):
            prompt = int(rng.integers(64, 1024))
            output = int(rng.integers(32, 256))
            requests.append(
                _Request(
                    arrival_s=float(arrival),
                    prefill_s=prompt * 0.0004,  # ~2.5k prompt tokens/s
                    decode_s=output * 0.022,  # ~45 output tokens/s
                    prompt_tokens=prompt,
                    output_tokens=output,
                )
            )
    return tuple(requests)


def _llama2_7b_q4(key: int, t: float) -> ProfileUsage:
    """Quantised Llama-2-7B: bursty requests spike SMs to 40-80 % and grow the KV cache."""
    first = max(0, math.floor((t - _LONGEST_REQUEST_S) / _ARRIVAL_CHUNK_S))
    last = math.floor(t / _ARRIVAL_CHUNK_S)
    kv_tokens = 0.0
    sm = 0.02  # idle server: kernel launches for health checks
    active = 0
    for chunk in range(first, last + 1):
        for r in _requests(key, chunk):
            elapsed = t - r.arrival_s
            if elapsed < 0 or elapsed >= r.prefill_s + r.decode_s:
                continue
            active += 1
            if elapsed < r.prefill_s:
                sm += 0.70
                kv_tokens += r.prompt_tokens * elapsed / r.prefill_s
            else:
                sm += 0.40
                generated = r.output_tokens * (elapsed - r.prefill_s) / r.decode_s
                kv_tokens += r.prompt_tokens + generated
    base = _LLAMA_BASE_MB + 10.0 * _noise(key, 3, t)
    peak = PEAKS["llama2-7b-q4"]
    mem = _clip(base + kv_tokens * _KV_MB_PER_TOKEN, _LLAMA_BASE_MB - 40.0, peak.mem_mb)
    sm = _clip(sm + 0.02 * _noise(key, 4, t), 0.01, peak.sm_fraction)
    pcie = 0.1 + 0.3 * active
    return ProfileUsage(mem_mb=mem, sm_fraction=sm, pcie_mb_per_s=pcie)


PROFILES: dict[str, Callable[[int, float], ProfileUsage]] = {
    "bert-base": _bert_base,
    "resnet50": _resnet50,
    "llama2-7b-q4": _llama2_7b_q4,
}


def profile_usage(profile: str, *, key: int, elapsed_s: float) -> ProfileUsage:
    """Usage of a ``profile`` workload ``elapsed_s`` seconds into the simulation."""
    if elapsed_s < 0:
        raise ValueError(f"elapsed_s must be >= 0, got {elapsed_s}")
    try:
        model = PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})") from None
    return model(key, elapsed_s)
