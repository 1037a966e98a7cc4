"""Step forecasts from the agent's predictors, vectorised over the replay's rows (docs/replay.md).

The agent keeps one predictor per (workload, resource) from :mod:`allocator.predict`
(:func:`allocator.predict.default_predictor`: the calibrated LSTM for memory, last value +
margin for SM) and reserves the largest of its 0.5, 1 and 2 s peaks. The replay feeds the
same predictors one sample per step (the step's peak use) and reads the same largest peak as
the forecast for the step the grant applies to. Running the streaming objects on 3 million
rows would take far too long, so this module evaluates them on whole arrays; a test checks
that the answers equal the streaming predictors' fed the same samples.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from allocator.predict import DEFAULT_KIND, ModelBundle, Resource, shipped_bundle
from allocator.predict._model import lstm_point_forecasts  # the vectorised form of LstmPredictor

__all__ = ["PREDICTOR_CHOICES", "PredictorChoice", "history_window", "step_forecasts"]

FloatArray = npt.NDArray[np.float64]
PredictorChoice = Literal["default", "raw"]
PREDICTOR_CHOICES: tuple[PredictorChoice, ...] = get_args(PredictorChoice)


def history_window(resource: Resource, bundle: ModelBundle | None = None) -> int:
    """Samples the default predictor of ``resource`` reads (window + 1 for the LSTM, 1 for last value)."""
    bundle = bundle or shipped_bundle()
    return bundle.window + 1 if DEFAULT_KIND[resource] == "lstm" else 1


def step_forecasts(
    histories: FloatArray,
    resource: Resource,
    choice: PredictorChoice,
    *,
    bundle: ModelBundle | None = None,
) -> FloatArray:
    """Largest forecast peak over the three horizons, one per history row, clipped to [0, capacity].

    ``histories`` is (n, history_window(resource)), oldest sample first, already padded with the
    first sample where fewer were seen (as :class:`allocator.predict.LstmPredictor` pads).
    ``default`` is :func:`allocator.predict.default_predictor` (calibrated); ``raw`` is the same
    kind uncalibrated (median head for the LSTM, no margins).
    """
    if choice not in PREDICTOR_CHOICES:
        raise ValueError(f"predictor must be one of {', '.join(PREDICTOR_CHOICES)}, got {choice!r}")
    bundle = bundle or shipped_bundle()
    model = bundle.resources[resource]
    kind = DEFAULT_KIND[resource]
    calibrated = choice == "default"
    margins = np.asarray(model.margins[kind] if calibrated else (0.0, 0.0, 0.0), dtype=np.float64)
    x = np.asarray(histories, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != history_window(resource, bundle):
        raise ValueError(f"histories must be (n, {history_window(resource, bundle)}), got {x.shape}")
    if kind == "last_value":
        points = np.repeat(x[:, -1:], 3, axis=1)
    elif kind == "lstm":
        points = lstm_point_forecasts(model, x, upper=calibrated)
    else:  # pragma: no cover - DEFAULT_KIND names only the two kinds above today
        raise ValueError(f"the replay has no vectorised form of predictor kind {kind!r}")
    result: FloatArray = np.clip(points + margins[None, :], 0.0, model.capacity).max(axis=1)
    return result
