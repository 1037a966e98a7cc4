"""Fit every predictor on the training part of a load signal, and evaluate them on the rest.

Protocol (docs/prediction.md): the first ``train_fraction`` of the time axis is
training data, the rest is the test. Inside training, steps before
``fit_fraction`` fit the parameters (normalisation, EWMA α, Holt α and β, LSTM
weights) and the steps between fit and train pick the LSTM's epoch and calibrate
each predictor's additive margins, so that every predictor is calibrated the
same way on data none of them was fitted on.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, get_args

import numpy as np

from allocator.predict._baselines import ewma_levels, holt_peaks_from_states, holt_states
from allocator.predict._evaluation import ForecastMetrics, Origins, Split, finish, peak_targets, point_forecasts, score
from allocator.predict._forecast import HORIZONS_S, FloatArray, PredictorKind, Resource
from allocator.predict._lstm import (
    Adam,
    LstmParams,
    clip_by_global_norm,
    lstm_backward,
    lstm_forward,
    lstm_init,
    pinball_loss,
)
from allocator.predict._model import ModelBundle, ResourceModel, window_features
from allocator.predict._signal import LoadModel, LoadSignal

__all__ = ["EvaluationRow", "TrainingConfig", "evaluate_bundle", "fit_bundle", "train_lstm"]

KINDS: tuple[PredictorKind, ...] = get_args(PredictorKind)
_EWMA_ALPHAS = np.round(np.arange(1, 51) / 50, 2)  # 0.02 .. 1.00
_HOLT_ALPHAS = np.round(np.arange(1, 21) / 20, 2)  # 0.05 .. 1.00
_HOLT_BETAS = np.array([0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0])
A100_MEMORY_MB = 81_920.0


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    window: int = 30  # 3 s of history at 100 ms
    hidden: int = 24
    epochs: int = 8
    batch: int = 128
    windows_per_epoch: int = 16_384  # drawn without replacement from the fit windows each epoch
    lr: float = 3e-3  # Adam; decays linearly to 10 % over the epochs
    clip_norm: float = 1.0
    tau: float = 0.5  # pinball level of the LSTM's loss: 0.5 = median (MAE-optimal) point forecast
    seed: int = 20_231_116
    fit_fraction: float = 0.6
    train_fraction: float = 0.7
    target_under_rate: float = 0.05  # calibrated margins aim at this share of under-predictions

    def __post_init__(self) -> None:
        if min(self.window, self.hidden, self.epochs, self.batch, self.windows_per_epoch) < 1:
            raise ValueError("window, hidden, epochs, batch and windows_per_epoch must be >= 1")
        if not (0 < self.tau < 1 and 0 < self.target_under_rate < 1 and self.lr > 0 and self.clip_norm > 0):
            raise ValueError("need 0 < tau < 1, 0 < target_under_rate < 1, lr > 0, clip_norm > 0")
        Split.of(100, fit_fraction=self.fit_fraction, train_fraction=self.train_fraction)


Mode = Literal["raw", "calibrated", "equal_risk"]
MODES: tuple[Mode, ...] = get_args(Mode)


@dataclass(frozen=True, slots=True)
class EvaluationRow:
    """``raw``: point forecast; ``calibrated``: with the margins fitted on the calibration part (what
    ships); ``equal_risk``: a diagnostic with margins set on the test part itself so that every
    predictor under-predicts exactly the target share there, which compares their sharpness alone."""

    resource: Resource
    kind: PredictorKind
    mode: Mode
    horizon_s: float
    metrics: ForecastMetrics


def _windows(x: FloatArray, origins: Origins, window: int) -> FloatArray:
    padded = np.pad(x, ((0, 0), (window, 0)), mode="edge")
    out: FloatArray = padded[origins.series[:, None], origins.step[:, None] + np.arange(window + 1)[None, :]]
    return out


def train_lstm(
    *,
    fit_windows: FloatArray,
    fit_targets: FloatArray,
    val_windows: FloatArray,
    val_targets: FloatArray,
    mean: float,
    std: float,
    config: TrainingConfig,
    rng: np.random.Generator,
) -> tuple[LstmParams, list[dict[str, float]]]:
    """Fit windows → peaks with the pinball loss; keep the epoch with the lowest validation loss.

    Six outputs: the median peak (τ = ``config.tau``) and the upper quantile
    (τ = 1 − ``config.target_under_rate``) for each horizon, both as the peak above
    the window's last sample in units of ``std``.
    """
    taus = np.repeat([config.tau, 1.0 - config.target_under_rate], fit_targets.shape[1])
    inputs = window_features(fit_windows, mean, std)
    targets = np.tile((fit_targets - fit_windows[:, -1:]) / std, 2)
    val_inputs = window_features(val_windows, mean, std)
    val_scaled = np.tile((val_targets - val_windows[:, -1:]) / std, 2)
    params = lstm_init(features=inputs.shape[-1], hidden=config.hidden, outputs=targets.shape[1], rng=rng)
    adam = Adam(params, lr=config.lr)
    best, best_loss, log = params, math.inf, []
    for epoch in range(config.epochs):
        adam.lr = config.lr * (1.0 - 0.9 * epoch / max(1, config.epochs - 1))
        order = rng.permutation(len(inputs))[: config.windows_per_epoch]
        losses = []
        for start in range(0, len(order), config.batch):
            batch = order[start : start + config.batch]
            y, cache = lstm_forward(params, inputs[batch])
            loss, dy = pinball_loss(y, targets[batch], taus)
            grads = clip_by_global_norm(lstm_backward(params, cache, dy), config.clip_norm)
            params = adam.step(params, grads)
            losses.append(loss)
        y_val, _ = lstm_forward(params, val_inputs)
        val_loss, _ = pinball_loss(y_val, val_scaled, taus)
        val_mae = float(np.mean(np.abs(std * (y_val[:, :3] - val_scaled[:, :3]))))
        log.append({"epoch": epoch + 1, "fit_loss": float(np.mean(losses)), "val_loss": val_loss, "val_mae": val_mae})
        if val_loss < best_loss:
            best, best_loss = params, val_loss
    return best, log


def _tune_ewma(x: FloatArray, targets: FloatArray, origins: Origins) -> float:
    levels = ewma_levels(x, _EWMA_ALPHAS)  # (series, grid, steps)
    at = levels[origins.series, :, origins.step]  # (origins, grid)
    y = targets[origins.series, origins.step]
    errors = sum(np.abs(at - y[:, h, None]).mean(axis=0) for h in range(y.shape[1]))
    return float(_EWMA_ALPHAS[int(np.argmin(errors))])


def _tune_holt(x: FloatArray, targets: FloatArray, origins: Origins) -> tuple[float, float]:
    y = targets[origins.series, origins.step]  # (origins, 3)
    alphas, betas = (g.ravel() for g in np.meshgrid(_HOLT_ALPHAS, _HOLT_BETAS, indexing="ij"))
    errors = np.empty(len(alphas))
    chunk = 25  # grid points per pass over the series: bounds memory to a few tens of MB
    for start in range(0, len(alphas), chunk):
        part = slice(start, start + chunk)
        levels, trends = holt_states(x, alphas[part], betas[part])
        peaks = holt_peaks_from_states(levels[origins.series, :, origins.step], trends[origins.series, :, origins.step])
        errors[part] = np.abs(peaks - y[:, None, :]).mean(axis=(0, 2))
    best = int(np.argmin(errors))  # first minimum: smallest α, then smallest β
    return float(alphas[best]), float(betas[best])


def _margins(points: FloatArray, targets: FloatArray, target_under_rate: float) -> tuple[float, float, float]:
    m = np.quantile(targets - points, 1.0 - target_under_rate, axis=0)
    return float(m[0]), float(m[1]), float(m[2])


def fit_bundle(signal: LoadSignal, *, config: TrainingConfig, load_model: LoadModel, trace_digest: str) -> ModelBundle:
    """Fit all predictors for memory and SM on the training part of ``signal`` (deterministic for a seed)."""
    rng = np.random.default_rng(config.seed)
    total = signal.memory_mb.shape[1]
    split = Split.of(total, fit_fraction=config.fit_fraction, train_fraction=config.train_fraction)
    capacities: dict[Resource, float] = {"memory_mb": A100_MEMORY_MB, "sm": float(load_model.sm_count)}
    resources: dict[Resource, ResourceModel] = {}
    logs: dict[str, object] = {}
    per_resource: tuple[tuple[Resource, FloatArray], ...] = (("memory_mb", signal.memory_mb), ("sm", signal.sm))
    for resource, x in per_resource:
        series = x.shape[0]
        fit_x = x[:, : split.fit]
        targets = peak_targets(x)
        fit_origins = Origins.between(series=series, start=0, stop=split.fit, first=config.window)
        cal_origins = Origins.between(series=series, start=split.fit, stop=split.train)
        mean, std = float(fit_x.mean()), float(fit_x.std())
        ewma_alpha = _tune_ewma(fit_x, targets, fit_origins)
        holt_alpha, holt_beta = _tune_holt(fit_x, targets, fit_origins)
        lstm, log = train_lstm(
            fit_windows=_windows(x, fit_origins, config.window),
            fit_targets=targets[fit_origins.series, fit_origins.step],
            val_windows=_windows(x, cal_origins, config.window),
            val_targets=targets[cal_origins.series, cal_origins.step],
            mean=mean,
            std=std,
            config=config,
            rng=rng,
        )
        model = ResourceModel(
            resource=resource,
            capacity=capacities[resource],
            mean=mean,
            std=std,
            lstm=lstm,
            ewma_alpha=ewma_alpha,
            holt_alpha=holt_alpha,
            holt_beta=holt_beta,
            margins=MappingProxyType({}),
        )
        cal_targets = targets[cal_origins.series, cal_origins.step]
        margins = {
            kind: _margins(
                point_forecasts(kind, model, x, cal_origins, config.window, upper=True),
                cal_targets,
                config.target_under_rate,
            )
            for kind in KINDS
        }
        resources[resource] = dataclasses.replace(model, margins=MappingProxyType(margins))
        logs[resource] = log
    meta = {
        "config": dataclasses.asdict(config),
        "load_model": dataclasses.asdict(load_model),
        "trace_sha256": trace_digest,
        "split_steps": dataclasses.asdict(split),
        "series": int(signal.memory_mb.shape[0]),
        "training_log": logs,
    }
    return ModelBundle(
        step_s=signal.step_s, window=config.window, resources=MappingProxyType(resources), meta_json=json.dumps(meta)
    )


def evaluate_bundle(
    bundle: ModelBundle, signal: LoadSignal, *, split: Split, target_under_rate: float
) -> list[EvaluationRow]:
    """Every predictor in every mode, per resource and horizon, on the test part ``[train, total)``."""
    rows: list[EvaluationRow] = []
    signals: Mapping[Resource, FloatArray] = {"memory_mb": signal.memory_mb, "sm": signal.sm}
    for resource, model in bundle.resources.items():
        x = signals[resource]
        origins = Origins.between(series=x.shape[0], start=split.train, stop=split.total)
        targets = peak_targets(x)[origins.series, origins.step]
        for kind in KINDS:
            for mode in MODES:
                points = point_forecasts(kind, model, x, origins, bundle.window, upper=mode != "raw")
                if mode == "raw":
                    margins = (0.0, 0.0, 0.0)
                elif mode == "calibrated":
                    margins = model.margins[kind]
                else:
                    margins = _margins(points, targets, target_under_rate)
                metrics = score(finish(points, margins, model.capacity), targets)
                for horizon_s, m in zip(HORIZONS_S, metrics, strict=True):
                    rows.append(EvaluationRow(resource, kind, mode, horizon_s, m))
    return rows
