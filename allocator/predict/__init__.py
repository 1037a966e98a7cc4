"""Short-term peak-demand prediction for the allocation loop (docs/prediction.md).

A :class:`PeakPredictor` is fed one sample of a workload's use every 100 ms
(``observe``) and forecasts the peak over the next 0.5, 1 and 2 s (``predict``).
Four kinds share that contract: last value, EWMA, Holt and a one-layer numpy
LSTM; the fitted parameters, margins and LSTM weights ship in
``models/azure_llm_conv_v1.npz``. :func:`default_predictor` returns the kind
the evaluation in docs/prediction.md chose.
"""

from allocator.predict._baselines import EwmaPredictor, HoltPredictor, LastValuePredictor
from allocator.predict._forecast import HORIZONS_S, STEP_S, PeakForecast, PeakPredictor, PredictorKind, Resource
from allocator.predict._model import (
    DEFAULT_KIND,
    SHIPPED_MODEL_PATH,
    LstmPredictor,
    ModelBundle,
    ResourceModel,
    default_predictor,
    load_bundle,
    make_predictor,
    predict_peaks,
    save_bundle,
    shipped_bundle,
)
from allocator.predict._signal import LoadModel, LoadSignal, RequestTrace, build_load_signal, read_azure_llm_trace

__all__ = [
    "DEFAULT_KIND",
    "HORIZONS_S",
    "SHIPPED_MODEL_PATH",
    "STEP_S",
    "EwmaPredictor",
    "HoltPredictor",
    "LastValuePredictor",
    "LoadModel",
    "LoadSignal",
    "LstmPredictor",
    "ModelBundle",
    "PeakForecast",
    "PeakPredictor",
    "PredictorKind",
    "RequestTrace",
    "Resource",
    "ResourceModel",
    "build_load_signal",
    "default_predictor",
    "load_bundle",
    "make_predictor",
    "predict_peaks",
    "read_azure_llm_trace",
    "save_bundle",
    "shipped_bundle",
]
