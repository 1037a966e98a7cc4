"""The LSTM's inference forward, compiled (numba): one loop nest per window, no numpy call per step.

At the agent's tick (a few dozen windows of ~30 steps, hidden 24) numpy's per-call cost and,
on CPUs without AVX-512, its scalar ``tanh`` for float64 were most of the tick
(docs/allocation.md, "Tick latency"). Here each window runs its recurrence in compiled loops
over contiguous rows that LLVM vectorises, and ``tanh`` is computed in vectorisable arithmetic
to double precision (:func:`_tanh`), so the forward is one call for the whole batch.

``fastmath={"contract"}`` only lets LLVM fuse a multiply and an add (one rounding instead of
two); sums keep their order, so results match ``lstm_forward`` to rounding (the tests hold it
to 1e-12). ``error_model="numpy"``: a division by zero gives inf instead of raising, which lets
the loops vectorise (nothing here divides by zero: ``1 + exp(-y) >= 1``).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numba
import numpy as np

from allocator.predict._forecast import FloatArray

__all__ = ["lstm_window_forecasts", "tanh_into"]

_LN2_HI = 6.93147180369123816490e-01  # ln 2 split in two (fdlibm's): k × _LN2_HI is exact for |k| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_LOG2E = 1.4426950408889634
_ROUND = 6755399441055744.0  # 1.5 × 2**52: (v + _ROUND) − _ROUND is v rounded to an integer, in float
_ROUND_BITS = int(np.float64(_ROUND).view(np.int64))
_ONE_BITS = int(np.float64(1.0).view(np.int64))
_TANH_ONE = 40.0  # tanh(x) rounds to ±1 for |x| >= 19.1, so 2|x| is capped here (k <= 58)
_JIT: dict[str, Any] = {"fastmath": {"contract"}, "error_model": "numpy", "nogil": True}


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]  # numba is untyped
def _tanh(x: float) -> float:
    """tanh to ~1 ulp in arithmetic LLVM vectorises (libm's tanh is a scalar call).

    tanh|x| = (1 − e^−y) / (1 + e^−y) with y = 2|x|; e^−y = 2^−k e^r with k the nearest integer
    to y / ln 2 and |r| <= ln 2 / 2; e^r − 1 by its Taylor series to r^12 (error below 2e-16 on
    that range), kept apart from the 1 so that small |x| loses nothing to cancellation; 2^−k is
    written straight into the exponent bits (k <= 58: a normal number, exact). NaN gives ±1: the
    kernel's inputs are validated finite before they get here.
    """
    y = 2.0 * abs(x)
    y = y if y < _TANH_ONE else _TANH_ONE
    rounded = y * _LOG2E + _ROUND  # k in the low bits of the significand
    k = rounded - _ROUND
    r = (k * _LN2_HI - y) + k * _LN2_LO
    q = 1.0 / 479001600.0
    q = q * r + 1.0 / 39916800.0
    q = q * r + 1.0 / 3628800.0
    q = q * r + 1.0 / 362880.0
    q = q * r + 1.0 / 40320.0
    q = q * r + 1.0 / 5040.0
    q = q * r + 1.0 / 720.0
    q = q * r + 1.0 / 120.0
    q = q * r + 1.0 / 24.0
    q = q * r + 1.0 / 6.0
    q = q * r + 0.5
    q = q * r + 1.0
    q = q * r  # e^r − 1
    # 2^−k built in the exponent field: 1.0's bits less k << 52 (integer vector ops, no conversion).
    k_bits = np.float64(rounded).view(np.int64) - _ROUND_BITS
    scale = np.int64(_ONE_BITS - (k_bits << 52)).view(np.float64)
    t = (q + 1.0) * scale  # e^−y
    num = -q if k == 0.0 else 1.0 - t  # 1 − e^−y; for k = 0 straight from e^r − 1
    return math.copysign(num / (1.0 + t), x)


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _tanh_into(values: FloatArray, out: FloatArray) -> None:
    for i in range(values.size):
        out.flat[i] = _tanh(values.flat[i])


def tanh_into(values: FloatArray, out: FloatArray) -> None:
    """``out[...] = tanh(values)`` with the kernel's own tanh (for its tests)."""
    _tanh_into(np.ascontiguousarray(values, dtype=np.float64), out)


@numba.njit(**_JIT)  # type: ignore[untyped-decorator]
def _forward(
    weights: FloatArray,
    head_w: FloatArray,
    head_b: FloatArray,
    windows: FloatArray,
    mean: float,
    std: float,
    head_from: int,
    out: FloatArray,
) -> None:
    """Raw windows (batch, window + 1) → ``out`` (batch, k): last value + std × outputs ``head_from…+k``.

    The inputs of each step are ``window_features``' (value relative to the window's last, step
    change, level; same operations, so the same numbers). ``weights`` (rows, 4 × hidden): row r
    multiplies entry r of the stacked input [h; x_t; 1; 0…] (rows a multiple of 4, padded with zero
    rows); columns are the gates i, f, o, g, the first three scaled by ½ so that one tanh gives
    σ(a) = ½ (1 + tanh(a/2)). ``head_w`` (outputs, hidden).
    """
    batch, size = windows.shape
    rows, gates = weights.shape
    hid = gates // 4
    stacked = np.zeros(rows)
    pre = np.empty(gates)
    cell = np.empty(hid)
    for b in range(batch):
        stacked[:] = 0.0
        stacked[hid + 3] = 1.0
        cell[:] = 0.0
        last = windows[b, size - 1]
        for t in range(size - 1):
            value = windows[b, t + 1]
            stacked[hid] = (value - last) / std
            stacked[hid + 1] = (value - windows[b, t]) / std
            stacked[hid + 2] = (value - mean) / std
            # pre = weightsᵀ · stacked, four rows at a time: one load and store of pre per four
            # multiply-adds, each over the contiguous gate columns.
            s0, s1, s2, s3 = stacked[0], stacked[1], stacked[2], stacked[3]
            for g in range(gates):
                pre[g] = weights[0, g] * s0 + weights[1, g] * s1 + weights[2, g] * s2 + weights[3, g] * s3
            for r in range(4, rows, 4):
                s0, s1, s2, s3 = stacked[r], stacked[r + 1], stacked[r + 2], stacked[r + 3]
                for g in range(gates):
                    pre[g] += weights[r, g] * s0 + weights[r + 1, g] * s1 + weights[r + 2, g] * s2 + weights[r + 3, g] * s3
            for g in range(3 * hid):
                pre[g] = 0.5 * (1.0 + _tanh(pre[g]))
            for g in range(3 * hid, gates):
                pre[g] = _tanh(pre[g])
            for j in range(hid):
                c = pre[hid + j] * cell[j] + pre[j] * pre[3 * hid + j]
                cell[j] = c
                stacked[j] = pre[2 * hid + j] * _tanh(c)
        for k in range(out.shape[1]):
            acc = 0.0
            for j in range(hid):
                acc += stacked[j] * head_w[head_from + k, j]
            out[b, k] = last + std * (acc + head_b[head_from + k])


def lstm_window_forecasts(
    weights: FloatArray,
    head_w: FloatArray,
    head_b: FloatArray,
    windows: FloatArray,
    *,
    mean: float,
    std: float,
    head: slice,
) -> FloatArray:
    """Run :func:`_forward` (compiled on the first call: seconds) over ``windows``; ``head``: the outputs to read."""
    start, stop, _ = head.indices(head_w.shape[0])
    out = np.empty((windows.shape[0], stop - start))
    _forward(weights, head_w, head_b, np.ascontiguousarray(windows, dtype=np.float64), mean, std, start, out)
    return cast(FloatArray, out)
