"""Baseline peak predictors: last value, EWMA and Holt (docs/prediction.md).

Each turns its point forecast of the signal into a forecast of the peak over
(t, t + h]: last value and EWMA forecast a flat line, so the peak is the level
itself; Holt forecasts ``level + j·trend`` for the steps ``j = 1..H`` of the
horizon, whose maximum is ``level + max(trend, H·trend)``.

The streaming classes (one ``observe`` per step) and the vectorised functions
(used to tune and evaluate on whole series) implement the same recursions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from allocator.predict._forecast import (
    STEP_S,
    FloatArray,
    PeakForecast,
    finish_forecast,
    horizon_steps,
    validate_margins,
    validate_observation,
)

__all__ = [
    "EwmaPredictor",
    "HoltPredictor",
    "LastValuePredictor",
    "ewma_peak_forecasts",
    "holt_peak_forecasts",
    "last_value_peak_forecasts",
]

_ZERO_MARGINS = (0.0, 0.0, 0.0)


def _check_unit(name: str, value: float) -> float:
    if not (0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


class LastValuePredictor:
    """Peak over every horizon = the latest sample."""

    def __init__(self, *, margins: Sequence[float] = _ZERO_MARGINS, capacity: float = math.inf) -> None:
        self._margins = validate_margins(margins, capacity)
        self._capacity = capacity
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = validate_observation(value)

    def predict(self) -> PeakForecast:
        last = 0.0 if self._last is None else self._last
        return finish_forecast((last, last, last), self._margins, self._capacity)


class EwmaPredictor:
    """Level ``l_t = α x_t + (1 − α) l_{t−1}``, ``l_0 = x_0``; peak over every horizon = ``l_t``."""

    def __init__(self, *, alpha: float, margins: Sequence[float] = _ZERO_MARGINS, capacity: float = math.inf) -> None:
        self.alpha = _check_unit("alpha", alpha)
        self._margins = validate_margins(margins, capacity)
        self._capacity = capacity
        self._level: float | None = None

    def observe(self, value: float) -> None:
        value = validate_observation(value)
        self._level = value if self._level is None else self.alpha * value + (1.0 - self.alpha) * self._level

    def predict(self) -> PeakForecast:
        level = 0.0 if self._level is None else self._level
        return finish_forecast((level, level, level), self._margins, self._capacity)


class HoltPredictor:
    """Holt's linear trend; ``l_0 = x_0, b_0 = 0``, then ``l_1 = x_1, b_1 = x_1 − x_0``, then the recursion."""

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        margins: Sequence[float] = _ZERO_MARGINS,
        capacity: float = math.inf,
        step_s: float = STEP_S,
    ) -> None:
        self.alpha = _check_unit("alpha", alpha)
        self.beta = _check_unit("beta", beta)
        self._steps = horizon_steps(step_s)
        self._margins = validate_margins(margins, capacity)
        self._capacity = capacity
        self._seen = 0
        self._level = 0.0
        self._trend = 0.0

    def observe(self, value: float) -> None:
        value = validate_observation(value)
        if self._seen == 0:
            self._level, self._trend = value, 0.0
        elif self._seen == 1:
            self._level, self._trend = value, value - self._level
        else:
            level = self.alpha * value + (1.0 - self.alpha) * (self._level + self._trend)
            self._trend = self.beta * (level - self._level) + (1.0 - self.beta) * self._trend
            self._level = level
        self._seen += 1

    def predict(self) -> PeakForecast:
        points = [self._level + max(self._trend, h * self._trend) for h in self._steps]
        return finish_forecast(points, self._margins, self._capacity)


def last_value_peak_forecasts(x: FloatArray) -> FloatArray:
    """``x`` of shape (series, steps) → point forecasts of shape (series, steps, 3)."""
    return np.repeat(np.asarray(x, dtype=np.float64)[..., None], 3, axis=-1)


def ewma_levels(x: FloatArray, alphas: FloatArray) -> FloatArray:
    """Levels for each α at once: ``x`` (series, steps), ``alphas`` (grid,) → (series, grid, steps)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.asarray(alphas, dtype=np.float64)[None, :]
    out = np.empty((x.shape[1], x.shape[0], a.shape[1]))  # time-major while filling: contiguous writes
    columns = np.ascontiguousarray(x.T)[:, :, None]
    level = np.repeat(columns[0], a.shape[1], axis=1)
    out[0] = level
    for t in range(1, x.shape[1]):
        level = a * columns[t] + (1.0 - a) * level
        out[t] = level
    return np.moveaxis(out, 0, -1)


def ewma_peak_forecasts(x: FloatArray, alpha: float) -> FloatArray:
    """(series, steps) → (series, steps, 3), the same numbers as :class:`EwmaPredictor`."""
    return last_value_peak_forecasts(ewma_levels(x, np.array([alpha]))[:, 0, :])


def holt_states(x: FloatArray, alphas: FloatArray, betas: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Level and trend for each (α, β) pair at once: (series, steps) → two arrays (series, grid, steps)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.asarray(alphas, dtype=np.float64)[None, :]
    b = np.asarray(betas, dtype=np.float64)[None, :]
    steps = x.shape[1]
    columns = np.ascontiguousarray(x.T)[:, :, None]  # (steps, series, 1)
    levels = np.empty((steps, x.shape[0], a.shape[1]))  # time-major while filling: contiguous writes
    trends = np.empty_like(levels)
    level = np.repeat(columns[0], a.shape[1], axis=1)
    trend = np.zeros_like(level)
    levels[0], trends[0] = level, trend
    if steps > 1:
        level, trend = np.repeat(columns[1], a.shape[1], axis=1), np.repeat(columns[1] - columns[0], a.shape[1], axis=1)
        levels[1], trends[1] = level, trend
    for t in range(2, steps):
        new_level = a * columns[t] + (1.0 - a) * (level + trend)
        trend = b * (new_level - level) + (1.0 - b) * trend
        level = new_level
        levels[t], trends[t] = level, trend
    return np.moveaxis(levels, 0, -1), np.moveaxis(trends, 0, -1)


def holt_peaks_from_states(levels: FloatArray, trends: FloatArray, step_s: float = STEP_S) -> FloatArray:
    """Peak of ``level + j·trend`` over ``j = 1..H`` for each horizon: appends a last axis of 3."""
    return np.stack([levels + np.maximum(trends, h * trends) for h in horizon_steps(step_s)], axis=-1)


def holt_peak_forecasts(x: FloatArray, alpha: float, beta: float, step_s: float = STEP_S) -> FloatArray:
    """(series, steps) → (series, steps, 3), the same numbers as :class:`HoltPredictor`."""
    levels, trends = holt_states(x, np.array([alpha]), np.array([beta]))
    return holt_peaks_from_states(levels[:, 0, :], trends[:, 0, :], step_s)
