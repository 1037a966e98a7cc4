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
from allocator.predict._kernel import lstm_window_forecasts

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


_WINDOW_FEATURES = 3  # what ``allocator.predict._model.window_features`` gives per step


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
    """The forecasts of :func:`lstm_forward` on raw windows, for inference only, compiled for many small windows.

    ``forecasts(windows, …)`` is ``last + std × lstm_forward(params, window_features(windows, mean,
    std))[0][:, head]`` to rounding (the sums run in another order, and :mod:`allocator.predict._kernel`
    computes tanh itself), where ``last`` is each window's newest value. The parameters are laid out once
    for the kernel: the input projection, the bias and the recurrence are one product with the stacked
    input ``[h; x_t; 1]``, and the three logistic gates' weights are pre-scaled by ½ (exact in binary
    floating point: σ(a) = ½ (1 + tanh(a/2))), so one tanh serves all four gates. Building one
    compiles the kernel if this process has not yet (seconds): an agent pays that when it builds its
    predictors, not at its first tick.
    """

    __slots__ = ("_head_b", "_head_w", "_weights")

    def __init__(self, params: LstmParams) -> None:
        hid, feat = params.hidden, params.features
        if feat != _WINDOW_FEATURES:
            raise ValueError(f"the inference kernel reads {_WINDOW_FEATURES} window features per step, got {feat}")
        scale = np.ones(4 * hid)
        scale[: 3 * hid] = 0.5
        # Rows of the stacked input [h; x_t; 1]: hidden state first, then the features, then the bias,
        # then zero rows up to a multiple of 4 (the kernel takes the rows four at a time).
        rows = hid + feat + 1
        stacked = np.zeros((rows + (-rows) % 4, 4 * hid))
        stacked[:rows] = np.vstack([params.w[feat:], params.w[:feat], params.b[None, :]]) * scale
        self._weights: FloatArray = stacked
        self._head_w: FloatArray = np.ascontiguousarray(params.v.T)  # (outputs, hidden)
        self._head_b: FloatArray = params.c.copy()
        self.forecasts(np.zeros((1, 2)), mean=0.0, std=1.0, head=slice(0, 1))  # compile now, once per process

    def forecasts(self, windows: FloatArray, *, mean: float, std: float, head: slice) -> FloatArray:
        """Raw windows ``(batch, window + 1)`` → ``(batch, outputs in head)``: newest value + std × output."""
        if windows.ndim != 2 or windows.shape[1] < 2:
            raise ValueError(f"expected windows (batch, >= 2 values), got shape {windows.shape}")
        return lstm_window_forecasts(self._weights, self._head_w, self._head_b, windows, mean=mean, std=std, head=head)


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
