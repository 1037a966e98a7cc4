"""Targets, the time split, forecasts over whole series and the metrics (docs/prediction.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from allocator.predict._baselines import ewma_peak_forecasts, holt_peak_forecasts, last_value_peak_forecasts
from allocator.predict._forecast import FloatArray, PredictorKind, horizon_steps
from allocator.predict._model import ResourceModel, lstm_point_forecasts

__all__ = [
    "ForecastMetrics",
    "Origins",
    "Split",
    "peak_targets",
    "point_forecasts",
    "score",
]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Split:
    """Steps ``[0, fit)`` fit parameters, ``[fit, train)`` calibrate, ``[train, total)`` test."""

    fit: int
    train: int
    total: int

    @classmethod
    def of(cls, total: int, *, fit_fraction: float, train_fraction: float) -> Split:
        if not 0 < fit_fraction < train_fraction < 1:
            raise ValueError("need 0 < fit_fraction < train_fraction < 1")
        return cls(fit=int(total * fit_fraction), train=int(total * train_fraction), total=total)


@dataclass(frozen=True, slots=True)
class Origins:
    """Forecast origins ``(series[i], step[i])``: the forecast at a step uses samples up to that step."""

    series: IntArray
    step: IntArray

    @classmethod
    def between(cls, *, series: int, start: int, stop: int, first: int = 0) -> Origins:
        """Every origin whose whole 2 s target lies inside ``[start, stop)``."""
        longest = horizon_steps()[-1]
        steps = np.arange(max(start, first), stop - longest, dtype=np.int64)
        return cls(series=np.repeat(np.arange(series, dtype=np.int64), len(steps)), step=np.tile(steps, series))

    def __len__(self) -> int:
        return len(self.step)


@dataclass(frozen=True, slots=True)
class ForecastMetrics:
    """Errors of peak forecasts against the realised peaks, in resource units."""

    mae: float  # mean |forecast − peak|
    p95_abs_error: float  # 95th percentile of |forecast − peak|
    under_rate: float  # share of origins with forecast < peak: the SLO risk
    mean_over_reservation: float  # mean of max(forecast − peak, 0) over every origin
    count: int


def peak_targets(x: FloatArray) -> FloatArray:
    """(series, steps) → (series, steps, 3): peak over steps ``t+1..t+H`` per horizon; NaN past the end."""
    x = np.asarray(x, dtype=np.float64)
    out = np.full((*x.shape, 3), np.nan)
    for index, h in enumerate(horizon_steps()):
        if x.shape[1] > h:
            windows = np.lib.stride_tricks.sliding_window_view(x[:, 1:], h, axis=1)
            out[:, : windows.shape[1], index] = windows.max(axis=-1)
    return out


def point_forecasts(
    kind: PredictorKind, model: ResourceModel, x: FloatArray, origins: Origins, window: int, *, upper: bool = False
) -> FloatArray:
    """Peak forecasts of ``kind`` at ``origins`` before margins and clipping: shape (origins, 3).

    ``upper`` selects the LSTM's upper-quantile head; the baselines have a single forecast.
    """
    if kind == "lstm":
        padded = np.pad(np.asarray(x, dtype=np.float64), ((0, 0), (window, 0)), mode="edge")
        # Window of origin t: samples t − window .. t, i.e. padded[t .. t + window].
        offsets = origins.step[:, None] + np.arange(window + 1)[None, :]
        return lstm_point_forecasts(model, padded[origins.series[:, None], offsets], upper=upper)
    # The recursions only need samples up to the last origin.
    upto = np.asarray(x, dtype=np.float64)[:, : int(origins.step.max()) + 1]
    if kind == "last_value":
        full = last_value_peak_forecasts(upto)
    elif kind == "ewma":
        full = ewma_peak_forecasts(upto, model.ewma_alpha)
    elif kind == "holt":
        full = holt_peak_forecasts(upto, model.holt_alpha, model.holt_beta)
    else:
        raise ValueError(f"unknown predictor kind {kind!r}")
    return full[origins.series, origins.step]


def finish(points: FloatArray, margins: tuple[float, float, float], capacity: float) -> FloatArray:
    """The vectorised twin of ``finish_forecast``: add margins, clip to ``[0, capacity]``."""
    out: FloatArray = np.clip(points + np.asarray(margins)[None, :], 0.0, capacity)
    return out


def score(forecast: FloatArray, target: FloatArray) -> tuple[ForecastMetrics, ForecastMetrics, ForecastMetrics]:
    """Metrics per horizon for forecasts and targets of shape (origins, 3)."""
    results = []
    for h in range(3):
        error = forecast[:, h] - target[:, h]
        results.append(
            ForecastMetrics(
                mae=float(np.mean(np.abs(error))),
                p95_abs_error=float(np.percentile(np.abs(error), 95)),
                under_rate=float(np.mean(error < 0)),
                mean_over_reservation=float(np.mean(np.maximum(error, 0.0))),
                count=len(error),
            )
        )
    return results[0], results[1], results[2]
