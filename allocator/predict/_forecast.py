"""The predictor contract shared by the baselines and the LSTM."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "HORIZONS_S",
    "STEP_S",
    "PeakForecast",
    "PeakPredictor",
    "PredictorKind",
    "Resource",
    "horizon_steps",
]

FloatArray = npt.NDArray[np.float64]

STEP_S = 0.1  # one observation per 100 ms
HORIZONS_S = (0.5, 1.0, 2.0)
Resource = Literal["memory_mb", "sm"]
PredictorKind = Literal["last_value", "ewma", "holt", "lstm"]


@dataclass(frozen=True, slots=True)
class PeakForecast:
    """Predicted peak of a workload's demand over the next 0.5, 1 and 2 s (resource units)."""

    h0_5: float
    h1: float
    h2: float

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.h0_5, self.h1, self.h2)


class PeakPredictor(Protocol):
    """Fed one sample every ``STEP_S`` seconds; forecasts the peak over (t, t + h]."""

    def observe(self, value: float) -> None: ...

    def predict(self) -> PeakForecast: ...


def horizon_steps(step_s: float = STEP_S) -> tuple[int, int, int]:
    """Steps of ``step_s`` in each horizon: (5, 10, 20) at 100 ms."""
    steps = tuple(round(h / step_s) for h in HORIZONS_S)
    if any(s < 1 or not math.isclose(s * step_s, h) for s, h in zip(steps, HORIZONS_S, strict=True)):
        raise ValueError(f"step_s {step_s!r} must divide every horizon {HORIZONS_S}")
    return steps[0], steps[1], steps[2]


def finish_forecast(points: Sequence[float], margins: Sequence[float], capacity: float) -> PeakForecast:
    """Point forecast + calibrated margin, clipped to ``[0, capacity]``."""
    if len(points) != 3 or len(margins) != 3:
        raise ValueError(f"expected 3 points and 3 margins, got {len(points)} and {len(margins)}")
    # min(capacity, max(0.0, point + margin)) per horizon, unrolled: this runs per workload and resource every tick.
    a, b, c = float(points[0]) + float(margins[0]), float(points[1]) + float(margins[1]), float(points[2]) + float(margins[2])
    a = 0.0 if not a > 0.0 else (a if a < capacity else capacity)
    b = 0.0 if not b > 0.0 else (b if b < capacity else capacity)
    c = 0.0 if not c > 0.0 else (c if c < capacity else capacity)
    return PeakForecast(h0_5=a, h1=b, h2=c)


def validate_observation(value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"observed value must be finite and >= 0, got {value!r}")
    return value


def validate_margins(margins: Sequence[float], capacity: float) -> tuple[float, float, float]:
    if len(margins) != len(HORIZONS_S) or not all(math.isfinite(m) for m in margins):
        raise ValueError(f"margins must be {len(HORIZONS_S)} finite numbers, got {margins!r}")
    if math.isnan(capacity) or capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity!r}")
    return float(margins[0]), float(margins[1]), float(margins[2])
