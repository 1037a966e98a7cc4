"""Trained predictors: the ``.npz`` bundle, the streaming LSTM predictor and the factories."""

from __future__ import annotations

import functools
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import cast, get_args

import numpy as np

from allocator.predict._baselines import EwmaPredictor, HoltPredictor, LastValuePredictor
from allocator.predict._forecast import (
    STEP_S,
    FloatArray,
    PeakForecast,
    PeakPredictor,
    PredictorKind,
    Resource,
    finish_forecast,
    validate_margins,
    validate_observation,
)
from allocator.predict._lstm import LstmInference, LstmParams, lstm_forward

__all__ = [
    "DEFAULT_KIND",
    "SHIPPED_MODEL_PATH",
    "LstmPredictor",
    "ModelBundle",
    "ResourceModel",
    "default_predictor",
    "load_bundle",
    "lstm_point_forecasts",
    "make_predictor",
    "predict_peaks",
    "save_bundle",
    "shipped_bundle",
    "window_features",
]

SHIPPED_MODEL_PATH = Path(__file__).parent / "models" / "azure_llm_conv_v1.npz"
_FORMAT = "vgpu-ledger/peak-predictor/v1"
KINDS: tuple[PredictorKind, ...] = get_args(PredictorKind)
RESOURCES: tuple[Resource, ...] = get_args(Resource)

# Chosen from the evaluation in docs/prediction.md: at the same under-prediction rate the LSTM reserves
# the least memory at every horizon (2-5 % less than the baselines), while for SM the calibrated last
# value reserves the least at 1 s and 2 s and the LSTM the most, so SM keeps the simplest baseline.
DEFAULT_KIND: Mapping[Resource, PredictorKind] = MappingProxyType({"memory_mb": "lstm", "sm": "last_value"})


@dataclass(frozen=True, slots=True)
class ResourceModel:
    """Everything fitted for one resource on the training part of one trace."""

    resource: Resource
    capacity: float  # forecasts are clipped to [0, capacity]
    mean: float  # normalisation of the LSTM's inputs, from the fit part only
    std: float
    lstm: LstmParams  # 6 outputs: median peak per horizon, then the upper quantile per horizon
    ewma_alpha: float
    holt_alpha: float
    holt_beta: float
    margins: Mapping[PredictorKind, tuple[float, float, float]]  # additive, per horizon, resource units


@dataclass(frozen=True, slots=True)
class ModelBundle:
    step_s: float
    window: int  # LSTM input: the last ``window`` steps (plus one more value for the first difference)
    resources: Mapping[Resource, ResourceModel]
    meta_json: str  # training configuration, load model, trace digest, split; informational


def window_features(windows: FloatArray, mean: float, std: float) -> FloatArray:
    """Raw values (batch, window + 1) → inputs (batch, window, 3).

    Per step: the value relative to the window's last one and the step change, both in units of
    ``std`` (shape, independent of the level), and the normalised level ``(x − mean) / std``.
    """
    x = np.asarray(windows, dtype=np.float64)
    return np.stack([(x[:, 1:] - x[:, -1:]) / std, (x[:, 1:] - x[:, :-1]) / std, (x[:, 1:] - mean) / std], axis=-1)


def lstm_point_forecasts(
    model: ResourceModel, windows: FloatArray, *, upper: bool = False, chunk: int = 8192
) -> FloatArray:
    """Raw windows (batch, window + 1) → peak forecasts (batch, 3) before margins: last + std × output.

    ``upper`` reads the upper-quantile head (outputs 3..5) instead of the median head (outputs 0..2).
    """
    head = slice(3, 6) if upper else slice(0, 3)
    out = np.empty((windows.shape[0], 3))
    for start in range(0, windows.shape[0], chunk):
        part = windows[start : start + chunk]
        y, _ = lstm_forward(model.lstm, window_features(part, model.mean, model.std))
        out[start : start + chunk] = part[:, -1:] + model.std * y[:, head]
    return out


def window_features_time_major(windows: FloatArray, mean: float, std: float) -> FloatArray:
    """:func:`window_features` laid out for :class:`LstmInference`: (batch, window + 1) → (window, 3, batch)."""
    x = np.asarray(windows, dtype=np.float64).T
    out = np.empty((x.shape[0] - 1, 3, x.shape[1]))
    out[:, 0] = (x[1:] - x[-1:]) / std
    out[:, 1] = (x[1:] - x[:-1]) / std
    out[:, 2] = (x[1:] - mean) / std
    return out


_INFERENCE_CACHE = 16  # models whose inference layout is kept: a process loads one bundle, tests a few
_inference_cache: dict[int, tuple[LstmParams, LstmInference]] = {}


def _inference(params: LstmParams) -> LstmInference:
    """The inference layout of ``params``, built once per parameter set (keyed by identity: arrays don't hash)."""
    hit = _inference_cache.get(id(params))
    if hit is not None and hit[0] is params:
        return hit[1]
    if len(_inference_cache) >= _INFERENCE_CACHE:
        _inference_cache.pop(next(iter(_inference_cache)))
    inference = LstmInference(params)
    _inference_cache[id(params)] = (params, inference)
    return inference


class LstmPredictor:
    """Streaming LSTM forecaster; before ``window + 1`` samples the history is padded with the first one.

    ``upper`` forecasts with the upper-quantile head (used with calibrated margins), otherwise the median.
    :meth:`predict` runs one window through :func:`lstm_forward`; :meth:`predict_batch` gives the same
    forecasts (to rounding) for many predictors of one model with one :class:`LstmInference` forward.
    The window is recomputed from a zero state at every forecast, and has to be: every step's inputs are
    relative to the window's newest value (:func:`window_features`), so no hidden state carries over.
    """

    def __init__(
        self, *, model: ResourceModel, window: int, margins: Sequence[float] | None = None, upper: bool = False
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self._model = model
        self._margins = validate_margins((0.0, 0.0, 0.0) if margins is None else margins, model.capacity)
        self._upper = upper
        self._size = window + 1
        self._history: deque[float] = deque(maxlen=self._size)
        self._inference = _inference(model.lstm)

    def observe(self, value: float) -> None:
        self._history.append(validate_observation(value))

    def predict(self) -> PeakForecast:
        if not self._history:
            return finish_forecast((0.0, 0.0, 0.0), self._margins, self._model.capacity)
        values = list(self._history)
        window = np.asarray([values[0]] * (self._size - len(values)) + values, dtype=np.float64)[None, :]
        points = lstm_point_forecasts(self._model, window, upper=self._upper)[0]
        return finish_forecast(points.tolist(), self._margins, self._model.capacity)

    @staticmethod
    def predict_batch(predictors: Sequence[LstmPredictor]) -> list[PeakForecast]:
        """``[p.predict() for p in predictors]``, with one batched forward per model (and head) among them."""
        out: list[PeakForecast | None] = [None] * len(predictors)
        groups: dict[tuple[int, bool], list[int]] = {}
        for k, p in enumerate(predictors):
            if p._history:
                groups.setdefault((id(p._model), p._upper), []).append(k)
            else:
                out[k] = p.predict()
        for members in groups.values():
            first = predictors[members[0]]
            model, size = first._model, first._size
            rows = []
            for k in members:
                values = list(predictors[k]._history)
                rows.append([values[0]] * (size - len(values)) + values if len(values) < size else values)
            windows = np.array(rows, dtype=np.float64)
            y = first._inference.forward(window_features_time_major(windows, model.mean, model.std))
            head = y[3:6] if first._upper else y[0:3]
            points = windows[:, -1:] + model.std * head.T
            for k, row in zip(members, points.tolist(), strict=True):
                p = predictors[k]
                out[k] = finish_forecast(row, p._margins, p._model.capacity)
        return [f for f in out if f is not None]


def predict_peaks(predictors: Sequence[PeakPredictor]) -> list[PeakForecast]:
    """``[p.predict() for p in predictors]``: the LSTMs among them batched (:meth:`LstmPredictor.predict_batch`)."""
    lstm = [k for k, p in enumerate(predictors) if isinstance(p, LstmPredictor)]
    if not lstm:
        return [p.predict() for p in predictors]
    out: list[PeakForecast | None] = [None] * len(predictors)
    batched = LstmPredictor.predict_batch([cast(LstmPredictor, predictors[k]) for k in lstm])
    for k, forecast in zip(lstm, batched, strict=True):
        out[k] = forecast
    return [f if f is not None else p.predict() for f, p in zip(out, predictors, strict=True)]


def make_predictor(
    kind: PredictorKind, resource: Resource, *, bundle: ModelBundle | None = None, calibrated: bool = True
) -> PeakPredictor:
    """A fresh predictor of ``kind`` for one workload's ``resource``, with the bundle's fitted parameters.

    ``calibrated`` adds the margin fitted so that the training trace's under-prediction rate is the
    bundle's target (docs/prediction.md), and for the LSTM reads its upper-quantile head; without it
    the forecast is the raw point (median) forecast.
    """
    bundle = bundle or shipped_bundle()
    model = bundle.resources[resource]
    margins = model.margins[kind] if calibrated else (0.0, 0.0, 0.0)
    if kind == "last_value":
        return LastValuePredictor(margins=margins, capacity=model.capacity)
    if kind == "ewma":
        return EwmaPredictor(alpha=model.ewma_alpha, margins=margins, capacity=model.capacity)
    if kind == "holt":
        return HoltPredictor(
            alpha=model.holt_alpha, beta=model.holt_beta, margins=margins, capacity=model.capacity, step_s=bundle.step_s
        )
    if kind == "lstm":
        return LstmPredictor(model=model, window=bundle.window, margins=margins, upper=calibrated)
    raise ValueError(f"unknown predictor kind {kind!r}; expected one of {KINDS}")


def default_predictor(resource: Resource, *, bundle: ModelBundle | None = None) -> PeakPredictor:
    """The predictor the allocator uses by default: ``DEFAULT_KIND[resource]``, calibrated."""
    return make_predictor(DEFAULT_KIND[resource], resource, bundle=bundle, calibrated=True)


def save_bundle(bundle: ModelBundle, path: Path | str) -> None:
    arrays: dict[str, FloatArray] = {}
    header: dict[str, object] = {
        "format": _FORMAT,
        "step_s": bundle.step_s,
        "window": bundle.window,
        "meta": json.loads(bundle.meta_json),
        "resources": {},
    }
    resources = cast(dict[str, object], header["resources"])
    for name, model in bundle.resources.items():
        resources[name] = {
            "capacity": model.capacity,
            "mean": model.mean,
            "std": model.std,
            "ewma_alpha": model.ewma_alpha,
            "holt_alpha": model.holt_alpha,
            "holt_beta": model.holt_beta,
            "margins": {k: list(v) for k, v in model.margins.items()},
        }
        for key, array in model.lstm.arrays().items():
            arrays[f"{name}__{key}"] = array
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        np.savez_compressed(handle, allow_pickle=False, header=np.array(json.dumps(header, sort_keys=True)), **arrays)


def load_bundle(path: Path | str = SHIPPED_MODEL_PATH) -> ModelBundle:
    with np.load(Path(path), allow_pickle=False) as data:
        header = json.loads(str(data["header"]))
        if header.get("format") != _FORMAT:
            raise ValueError(f"{path}: not a {_FORMAT} file")
        resources: dict[Resource, ResourceModel] = {}
        for name, fitted in header["resources"].items():
            if name not in RESOURCES:
                raise ValueError(f"{path}: unknown resource {name!r}")
            resource = cast(Resource, name)
            params = LstmParams(**{k: np.array(data[f"{name}__{k}"], dtype=np.float64) for k in ("w", "b", "v", "c")})
            margins = {cast(PredictorKind, k): _three(v) for k, v in fitted["margins"].items()}
            resources[resource] = ResourceModel(
                resource=resource,
                capacity=float(fitted["capacity"]),
                mean=float(fitted["mean"]),
                std=float(fitted["std"]),
                lstm=params,
                ewma_alpha=float(fitted["ewma_alpha"]),
                holt_alpha=float(fitted["holt_alpha"]),
                holt_beta=float(fitted["holt_beta"]),
                margins=MappingProxyType(margins),
            )
    step_s = float(header["step_s"])
    if not math.isclose(step_s, STEP_S):
        raise ValueError(f"{path}: step_s {step_s} differs from the predictors' {STEP_S}")
    return ModelBundle(
        step_s=step_s,
        window=int(header["window"]),
        resources=MappingProxyType(resources),
        meta_json=json.dumps(header["meta"], sort_keys=True),
    )


def _three(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) != 3:
        raise ValueError(f"expected 3 margins, got {values!r}")
    return float(values[0]), float(values[1]), float(values[2])


@functools.cache
def shipped_bundle() -> ModelBundle:
    """The bundle trained on the Azure LLM conversation trace, loaded once per process."""
    return load_bundle(SHIPPED_MODEL_PATH)
