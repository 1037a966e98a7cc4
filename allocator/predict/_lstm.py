"""A one-layer LSTM in numpy: forward pass, backpropagation through time, Adam.

Shapes: inputs ``x`` (batch, steps, features); the head reads the last hidden
state and gives ``outputs`` numbers per window. Gate order in ``w`` and ``b``
is input, forget, output, candidate. A window is read from a zero state, so
backpropagation runs through the window's steps and no further (truncated BPTT
at the window length).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from allocator.predict._forecast import FloatArray

__all__ = [
    "Adam",
    "LstmInference",
    "LstmParams",
    "clip_by_global_norm",
    "lstm_backward",
    "lstm_forward",
    "lstm_init",
    "pinball_loss",
]


@dataclass(frozen=True, slots=True)
class LstmParams:
    w: FloatArray  # (features + hidden, 4 × hidden)
    b: FloatArray  # (4 × hidden,)
    v: FloatArray  # (hidden, outputs)
    c: FloatArray  # (outputs,)

    @property
    def hidden(self) -> int:
        return int(self.v.shape[0])

    @property
    def outputs(self) -> int:
        return int(self.v.shape[1])

    @property
    def features(self) -> int:
        return int(self.w.shape[0]) - self.hidden

    def arrays(self) -> dict[str, FloatArray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def map(self, fn: Callable[[FloatArray], FloatArray]) -> LstmParams:
        return LstmParams(**{name: fn(array) for name, array in self.arrays().items()})


@dataclass(frozen=True, slots=True)
class _Cache:
    x: FloatArray  # (batch, steps, features)
    gates: FloatArray  # (steps, batch, 4 × hidden), after the non-linearities
    cells: FloatArray  # (steps + 1, batch, hidden); cells[0] is the zero state
    hiddens: FloatArray  # (steps + 1, batch, hidden)


def lstm_init(*, features: int, hidden: int, outputs: int, rng: np.random.Generator) -> LstmParams:
    """Uniform(±1/√hidden) weights, forget-gate bias 1 (remember by default), zero head bias."""
    scale = 1.0 / math.sqrt(hidden)
    b = np.zeros(4 * hidden)
    b[hidden : 2 * hidden] = 1.0
    return LstmParams(
        w=rng.uniform(-scale, scale, size=(features + hidden, 4 * hidden)),
        b=b,
        v=rng.uniform(-scale, scale, size=(hidden, outputs)),
        c=np.zeros(outputs),
    )


def _sigmoid(a: FloatArray) -> FloatArray:
    out: FloatArray = 0.5 * (1.0 + np.tanh(0.5 * a))  # overflow-free logistic
    return out


def lstm_forward(params: LstmParams, x: FloatArray) -> tuple[FloatArray, _Cache]:
    batch, steps, _ = x.shape
    hid = params.hidden
    gates = np.empty((steps, batch, 4 * hid))
    cells = np.zeros((steps + 1, batch, hid))
    hiddens = np.zeros((steps + 1, batch, hid))
    w_x, w_h = params.w[: params.features], params.w[params.features :]
    projected = x @ w_x + params.b  # (batch, steps, 4 × hidden): input part of every step at once
    for t in range(steps):
        a = projected[:, t, :] + hiddens[t] @ w_h
        g = gates[t]
        g[:, : 3 * hid] = _sigmoid(a[:, : 3 * hid])
        g[:, 3 * hid :] = np.tanh(a[:, 3 * hid :])
        cells[t + 1] = g[:, hid : 2 * hid] * cells[t] + g[:, :hid] * g[:, 3 * hid :]
        hiddens[t + 1] = g[:, 2 * hid : 3 * hid] * np.tanh(cells[t + 1])
    y = hiddens[steps] @ params.v + params.c
    return y, _Cache(x=x, gates=gates, cells=cells, hiddens=hiddens)


class LstmInference:
    """The forward pass of :func:`lstm_forward` for inference only, tuned for many small windows.

    Equal to ``lstm_forward(params, x)[0]`` to rounding (the sums run in another order). What makes
    it cheaper, per step, for the agent's tick (a few dozen windows of ~30 steps, where numpy's
    per-call cost is most of the time): the state is laid out transposed, ``(rows, batch)``, so every
    gate is a contiguous block of rows; the input projection, the bias and the recurrence are one
    matmul of ``[h; x_t; 1]``; the logistic of three gates comes from the one ``tanh`` call over all
    four, their weights pre-scaled by ½ (exact in binary floating point: σ(a) = ½ (1 + tanh(a/2)));
    and ``f·c + i·g`` is one product of the rows ``[i; f]`` with the rows ``[g; c]`` and one sum.
    Nine numpy calls per step instead of about fifteen, and no per-step allocation.
    """

    __slots__ = ("_features", "_head_b", "_head_w", "_hidden", "_weights")

    def __init__(self, params: LstmParams) -> None:
        hid, feat = params.hidden, params.features
        scale = np.ones(4 * hid)
        scale[: 3 * hid] = 0.5
        # Columns of the stacked input [h; x_t; 1]: hidden state first, then the features, then the bias.
        stacked = np.vstack([params.w[feat:], params.w[:feat], params.b[None, :]]) * scale
        self._weights: FloatArray = np.ascontiguousarray(stacked.T)  # (4 × hidden, hidden + features + 1)
        self._head_w: FloatArray = np.ascontiguousarray(params.v.T)  # (outputs, hidden)
        self._head_b: FloatArray = params.c[:, None].copy()
        self._hidden, self._features = hid, feat

    @property
    def features(self) -> int:
        return self._features

    def forward(self, x: FloatArray) -> FloatArray:
        """Inputs ``(steps, features, batch)``, time-major and transposed → outputs ``(outputs, batch)``."""
        steps, feat, batch = x.shape
        if feat != self._features:
            raise ValueError(f"expected {self._features} features per step, got {feat}")
        hid = self._hidden
        stacked = np.empty((hid + feat + 1, batch))  # [h; x_t; 1]
        stacked[:hid] = 0.0
        stacked[hid + feat] = 1.0
        h, x_t = stacked[:hid], stacked[hid : hid + feat]
        z = np.empty((5 * hid, batch))  # rows: i, f, o, g (gate activations), c (cell state)
        z[4 * hid :] = 0.0
        pre, sig, cell = z[: 4 * hid], z[: 3 * hid], z[4 * hid :]
        pair_a, pair_b = z[: 2 * hid], z[3 * hid :]  # [i; f] and [g; c]
        out_gate = z[2 * hid : 3 * hid]
        products = np.empty((2 * hid, batch))
        ig, fc = products[:hid], products[hid:]
        tanh_c = np.empty((hid, batch))
        for t in range(steps):
            x_t[...] = x[t]
            np.matmul(self._weights, stacked, out=pre)
            np.tanh(pre, out=pre)
            sig += 1.0
            sig *= 0.5
            np.multiply(pair_a, pair_b, out=products)
            np.add(fc, ig, out=cell)
            np.tanh(cell, out=tanh_c)
            np.multiply(out_gate, tanh_c, out=h)
        y: FloatArray = self._head_w @ h + self._head_b
        return y


def lstm_backward(params: LstmParams, cache: _Cache, dy: FloatArray) -> LstmParams:
    """Gradients of a loss with ``∂loss/∂y = dy`` with respect to every parameter."""
    hid = params.hidden
    steps = cache.gates.shape[0]
    w_h = params.w[params.features :]
    dv = cache.hiddens[steps].T @ dy
    dc = dy.sum(axis=0)
    dh = dy @ params.v.T
    dcell = np.zeros_like(dh)
    da_all = np.empty_like(cache.gates)
    for t in reversed(range(steps)):
        g = cache.gates[t]
        i, f, o, cand = g[:, :hid], g[:, hid : 2 * hid], g[:, 2 * hid : 3 * hid], g[:, 3 * hid :]
        tanh_c = np.tanh(cache.cells[t + 1])
        dcell = dcell + dh * o * (1.0 - tanh_c**2)
        da = da_all[t]
        da[:, :hid] = dcell * cand * i * (1.0 - i)
        da[:, hid : 2 * hid] = dcell * cache.cells[t] * f * (1.0 - f)
        da[:, 2 * hid : 3 * hid] = dh * tanh_c * o * (1.0 - o)
        da[:, 3 * hid :] = dcell * i * (1.0 - cand**2)
        dh = da @ w_h.T
        dcell = dcell * f
    # Sum over steps and batch: inputs part from x, recurrent part from the previous hidden states.
    dw_x = np.einsum("bsf,sbg->fg", cache.x, da_all)
    dw_h = np.einsum("sbh,sbg->hg", cache.hiddens[:steps], da_all)
    return LstmParams(w=np.vstack([dw_x, dw_h]), b=da_all.sum(axis=(0, 1)), v=dv, c=dc)


def pinball_loss(prediction: FloatArray, target: FloatArray, tau: float | FloatArray) -> tuple[float, FloatArray]:
    """Mean quantile loss at level ``tau`` (0.5 → half the MAE; an array gives one level per output) and its gradient."""
    residual = target - prediction
    loss = float(np.mean(np.maximum(tau * residual, (tau - 1.0) * residual)))
    grad = np.where(residual > 0, -tau, 1.0 - tau) / residual.size
    return loss, grad


def clip_by_global_norm(grads: LstmParams, max_norm: float) -> LstmParams:
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.arrays().values()))
    if norm <= max_norm or norm == 0.0:
        return grads
    return grads.map(lambda g: g * (max_norm / norm))


class Adam:
    """Adam (Kingma & Ba, 2015) with bias correction."""

    def __init__(self, params: LstmParams, *, lr: float, beta1: float = 0.9, beta2: float = 0.999) -> None:
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, 1e-8
        self._m = params.map(np.zeros_like)
        self._v = params.map(np.zeros_like)
        self._t = 0

    def step(self, params: LstmParams, grads: LstmParams) -> LstmParams:
        self._t += 1
        b1, b2 = self.beta1, self.beta2
        m = {k: b1 * self._m.arrays()[k] + (1 - b1) * g for k, g in grads.arrays().items()}
        v = {k: b2 * self._v.arrays()[k] + (1 - b2) * g * g for k, g in grads.arrays().items()}
        self._m, self._v = LstmParams(**m), LstmParams(**v)
        lr_t = self.lr * math.sqrt(1 - b2**self._t) / (1 - b1**self._t)
        return LstmParams(**{k: p - lr_t * m[k] / (np.sqrt(v[k]) + self.eps) for k, p in params.arrays().items()})
