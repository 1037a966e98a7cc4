"""From an LLM request trace to a per-workload GPU load signal (docs/prediction.md).

Fluid model of a quantised Llama-2-7B server, one request at a time per stream:
a request arriving at ``a`` prefills its ``context`` tokens at ``prefill_tokens_per_s``
and then decodes its ``generated`` tokens at ``decode_tokens_per_s``; its KV cache
grows linearly over both phases and is freed when the last token is generated.
Requests are dispatched round-robin over ``replicas`` identical servers; each
replica is one workload, so one trace gives ``replicas`` signals on one time axis.

- memory (MB = MiB, as NVML and ``memory_mb`` report it), sampled at the end of each
  step: fixed footprint (weights + runtime) + tokens in flight × KV MB per token;
- SM demand (SMs of ``sm_count``), averaged over each step: prefill and decode token
  rates, each divided by the card's throughput for that phase, × ``sm_count``, and
  saturated at ``sm_count`` (the model is open loop: no queueing, so this is demand).
"""

from __future__ import annotations

import csv
import math
from array import array
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["LoadModel", "LoadSignal", "RequestTrace", "build_load_signal", "read_azure_llm_trace"]

FloatArray = npt.NDArray[np.float64]

_MIB = 2**20
# Llama-2-7B: 32 layers, hidden size 4096, 6.74e9 parameters (Touvron et al., 2023).
_LAYERS = 32
_HIDDEN = 4096
_PARAMS = 6.74e9
_WEIGHT_BITS = 4  # AWQ/GPTQ 4-bit weights
_KV_BYTES_PER_VALUE = 2  # fp16 KV cache
# K and V, per layer, per hidden unit: 32 × 4096 × 2 × 2 B = 512 KiB = 0.5 MB per token.
KV_MB_PER_TOKEN = _LAYERS * _HIDDEN * 2 * _KV_BYTES_PER_VALUE / _MIB
# 6.74e9 × 4 bit = 3,214 MB of weights, plus CUDA context and activation workspace.
WEIGHTS_MB = _PARAMS * _WEIGHT_BITS / 8 / _MIB
RUNTIME_OVERHEAD_MB = 512.0


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Assumptions of the load model; every rate is in tokens per second."""

    step_s: float = 0.1
    replicas: int = 4
    prefill_tokens_per_s: float = 5_000.0  # one request's prompt processing
    decode_tokens_per_s: float = 30.0  # one request's generation (tens of tokens/s)
    card_prefill_tokens_per_s: float = 10_000.0  # prefill throughput that fills every SM
    card_decode_tokens_per_s: float = 2_500.0  # batched decode throughput that fills every SM
    kv_mb_per_token: float = KV_MB_PER_TOKEN
    fixed_mb: float = WEIGHTS_MB + RUNTIME_OVERHEAD_MB
    sm_count: int = 108  # A100

    def __post_init__(self) -> None:
        positive = {
            "step_s": self.step_s,
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "card_prefill_tokens_per_s": self.card_prefill_tokens_per_s,
            "card_decode_tokens_per_s": self.card_decode_tokens_per_s,
        }
        for name, value in positive.items():
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if self.replicas < 1 or self.sm_count < 1:
            raise ValueError("replicas and sm_count must be >= 1")
        if not (math.isfinite(self.kv_mb_per_token) and self.kv_mb_per_token >= 0):
            raise ValueError(f"kv_mb_per_token must be finite and >= 0, got {self.kv_mb_per_token!r}")
        if not (math.isfinite(self.fixed_mb) and self.fixed_mb >= 0):
            raise ValueError(f"fixed_mb must be finite and >= 0, got {self.fixed_mb!r}")


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """Requests sorted by arrival; ``arrival_s`` counts from the first request."""

    arrival_s: FloatArray
    context_tokens: FloatArray
    generated_tokens: FloatArray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.context_tokens) != n or len(self.generated_tokens) != n:
            raise ValueError("arrival_s, context_tokens and generated_tokens must have the same length")
        if n and (np.any(np.diff(self.arrival_s) < 0) or self.arrival_s[0] < 0):
            raise ValueError("arrival_s must be sorted and >= 0")
        if np.any(self.context_tokens < 0) or np.any(self.generated_tokens < 0):
            raise ValueError("token counts must be >= 0")


@dataclass(frozen=True, slots=True)
class LoadSignal:
    """One row per replica, one column per step; column ``k`` is time ``(k + 1) × step_s``."""

    step_s: float
    memory_mb: FloatArray  # shape (replicas, steps), sampled at the end of each step
    sm: FloatArray  # shape (replicas, steps), mean SM demand over each step


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure_llm_trace(path: Path | str) -> RequestTrace:
    """Read ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference traces, 2023 and 2024).

    Values go into typed arrays (8 bytes each, not a Python float's 32): the 2024 traces hold a week
    of requests. Rows out of time order are put in order (stably: equal stamps keep the file's order);
    an empty token count reads as 0. A malformed file raises ValueError naming the file, row and column.
    """
    path = Path(path)
    arrivals, contexts, generated = array("d"), array("d"), array("d")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            arrivals.append(_stamp_seconds(row["TIMESTAMP"] or "", where))
            contexts.append(_tokens(row["ContextTokens"], "ContextTokens", where))
            generated.append(_tokens(row["GeneratedTokens"], "GeneratedTokens", where))
    arrival = np.array(arrivals, dtype=np.float64)
    context = np.array(contexts, dtype=np.float64)
    output = np.array(generated, dtype=np.float64)
    if len(arrival) and np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")
        arrival, context, output = arrival[order], context[order], output[order]
    if len(arrival):
        arrival -= arrival[0]
    return RequestTrace(arrival_s=arrival, context_tokens=context, generated_tokens=output)


def _stamp_seconds(stamp: str, where: str) -> float:
    """A request's TIMESTAMP → seconds since 0001-01-01 UTC (only differences matter).

    The 2023 traces write stamps without an offset, with 7 fractional digits
    (``2023-11-16 18:15:46.6805900``, read as UTC); the 2024 week-long ones add a UTC offset and
    sometimes drop the fraction (``2024-05-10 00:00:00.009930+00:00``, ``2024-05-10 00:00:01+00:00``).
    Parsed by hand rather than by ``datetime``, which keeps six fractional digits.
    """
    text = stamp.strip()
    offset = 0.0
    try:
        if text.endswith("Z"):
            text = text[:-1]
        elif len(text) > 6 and text[-6] in "+-" and text[-3] == ":":
            sign = 1.0 if text[-6] == "+" else -1.0
            offset = sign * (int(text[-5:-3]) * 3_600.0 + int(text[-2:]) * 60.0)
            text = text[:-6]
        day, clock = text.replace("T", " ", 1).split(" ")
        hours, minutes, seconds = clock.split(":")
        return (
            date.fromisoformat(day).toordinal() * 86_400.0
            + int(hours) * 3_600.0
            + int(minutes) * 60.0
            + float(seconds)
            - offset
        )
    except ValueError:
        raise ValueError(f"{where}: TIMESTAMP is not 'YYYY-MM-DD HH:MM:SS[.f][+HH:MM]': {stamp!r}") from None


def _tokens(cell: str | None, column: str, where: str) -> float:
    """A token count: empty reads as 0."""
    value = cell_number(cell, column, where)
    return 0.0 if value is None else value


def cell_number(cell: str | None, column: str, where: str) -> float | None:
    """A CSV cell that must be a finite number >= 0 (None: empty); ``where`` names the file and row."""
    text = (cell or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {column} is not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: {column} must be finite and >= 0, got {text!r}")
    return value


def build_load_signal(trace: RequestTrace, model: LoadModel | None = None) -> LoadSignal:
    """Memory and SM demand per replica at ``model.step_s`` resolution up to the last arrival."""
    model = model or LoadModel()
    dt = model.step_s
    steps = math.floor(float(trace.arrival_s[-1]) / dt + 1e-9) if len(trace.arrival_s) else 0
    ends = (np.arange(steps, dtype=np.float64) + 1.0) * dt
    tokens = np.zeros((model.replicas, steps))
    prefill = np.zeros((model.replicas, steps))  # prefill tokens processed in each step
    decode = np.zeros((model.replicas, steps))
    p_rate, d_rate = model.prefill_tokens_per_s, model.decode_tokens_per_s
    for index, (start, context, generated) in enumerate(
        zip(trace.arrival_s, trace.context_tokens, trace.generated_tokens, strict=True)
    ):
        replica = index % model.replicas
        prefill_end = start + context / p_rate
        done = prefill_end + generated / d_rate
        first = math.floor(start / dt)
        last = min(steps, math.ceil(done / dt) + 1)
        if first >= last:
            continue
        t = ends[first:last]
        in_prefill = (t >= start) & (t < prefill_end)
        in_decode = (t >= prefill_end) & (t < done)
        tokens[replica, first:last] += np.where(
            in_prefill, p_rate * (t - start), np.where(in_decode, context + d_rate * (t - prefill_end), 0.0)
        )
        lo = t - dt
        prefill[replica, first:last] += p_rate * np.clip(np.minimum(t, prefill_end) - np.maximum(lo, start), 0.0, None)
        decode[replica, first:last] += d_rate * np.clip(np.minimum(t, done) - np.maximum(lo, prefill_end), 0.0, None)
    sm_fraction = prefill / dt / model.card_prefill_tokens_per_s + decode / dt / model.card_decode_tokens_per_s
    return LoadSignal(
        step_s=dt,
        memory_mb=model.fixed_mb + model.kv_mb_per_token * tokens,
        sm=model.sm_count * np.minimum(1.0, sm_fraction),
    )
