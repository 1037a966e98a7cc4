"""Peak predictors (allocator/predict, docs/prediction.md): LSTM maths, baselines, load model, shipped model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from allocator.predict import (
    DEFAULT_KIND,
    EwmaPredictor,
    HoltPredictor,
    LastValuePredictor,
    LoadModel,
    ModelBundle,
    PeakForecast,
    PredictorKind,
    RequestTrace,
    Resource,
    ResourceModel,
    build_load_signal,
    default_predictor,
    load_bundle,
    make_predictor,
    predict_peaks,
    read_azure_llm_trace,
    save_bundle,
    shipped_bundle,
)
from allocator.predict._baselines import ewma_peak_forecasts, holt_peak_forecasts, last_value_peak_forecasts
from allocator.predict._evaluation import Origins, peak_targets, point_forecasts, score
from allocator.predict._lstm import LstmInference, LstmParams, lstm_backward, lstm_forward, lstm_init, pinball_loss
from allocator.predict._training import TrainingConfig, train_lstm

# ---------------------------------------------------------------- LSTM maths


def _numeric_gradient(fn: Callable[[], float], array: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        saved = array[index]
        array[index] = saved + eps
        up = fn()
        array[index] = saved - eps
        down = fn()
        array[index] = saved
        grad[index] = (up - down) / (2 * eps)
    return grad


def test_bptt_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(3)
    params = lstm_init(features=3, hidden=4, outputs=2, rng=rng)
    params = params.map(lambda a: a + rng.normal(scale=0.3, size=a.shape))  # off the symmetric init
    x = rng.normal(size=(5, 6, 3))
    weights = rng.normal(size=(5, 2))  # loss = Σ y ⊙ weights, so ∂loss/∂y = weights

    def loss() -> float:
        y, _ = lstm_forward(params, x)
        return float(np.sum(y * weights))

    _, cache = lstm_forward(params, x)
    analytic = lstm_backward(params, cache, weights)
    for name, array in params.arrays().items():
        numeric = _numeric_gradient(loss, array)
        got = analytic.arrays()[name]
        assert np.max(np.abs(got - numeric)) <= 1e-7 * max(1.0, float(np.max(np.abs(numeric)))), name


def test_pinball_gradient_matches_finite_differences_away_from_kinks() -> None:
    rng = np.random.default_rng(4)
    prediction = rng.normal(size=(7, 6))
    target = prediction + rng.choice([-1.0, 1.0], size=(7, 6)) * rng.uniform(0.1, 1.0, size=(7, 6))
    taus = np.repeat([0.5, 0.95], 3)
    _, grad = pinball_loss(prediction, target, taus)
    numeric = _numeric_gradient(lambda: pinball_loss(prediction, target, taus)[0], prediction)
    np.testing.assert_allclose(grad, numeric, atol=1e-8)


def test_pinball_loss_at_median_is_half_the_mae() -> None:
    loss, _ = pinball_loss(np.array([[1.0, 2.0]]), np.array([[3.0, 1.0]]), 0.5)
    assert loss == pytest.approx(0.5 * (2.0 + 1.0) / 2)


def _tiny_training_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.normal(size=(1, 400)), axis=1) + 50.0
    origins = Origins.between(series=1, start=0, stop=400, first=8)
    padded = np.pad(x, ((0, 0), (8, 0)), mode="edge")
    windows = padded[origins.series[:, None], origins.step[:, None] + np.arange(9)[None, :]]
    return windows, peak_targets(x)[origins.series, origins.step]


def _train_tiny(seed: int) -> LstmParams:
    windows, targets = _tiny_training_data(0)
    config = TrainingConfig(window=8, hidden=4, epochs=2, batch=32, windows_per_epoch=96, seed=seed)
    params, _ = train_lstm(
        fit_windows=windows,
        fit_targets=targets,
        val_windows=windows[:50],
        val_targets=targets[:50],
        mean=50.0,
        std=5.0,
        config=config,
        rng=np.random.default_rng(seed),
    )
    return params


def test_training_is_deterministic_for_a_seed() -> None:
    first, again, other = _train_tiny(11), _train_tiny(11), _train_tiny(12)
    for name, array in first.arrays().items():
        np.testing.assert_array_equal(array, again.arrays()[name])
    assert not np.array_equal(first.w, other.w)


# ---------------------------------------------------------------- baselines


def _feed(predictor: LastValuePredictor | EwmaPredictor | HoltPredictor, values: list[float]) -> PeakForecast:
    for v in values:
        predictor.observe(v)
    return predictor.predict()


@pytest.mark.parametrize(
    "predictor",
    [LastValuePredictor(), EwmaPredictor(alpha=0.3), HoltPredictor(alpha=0.4, beta=0.2)],
    ids=["last_value", "ewma", "holt"],
)
def test_baselines_on_a_constant_forecast_the_constant(
    predictor: LastValuePredictor | EwmaPredictor | HoltPredictor,
) -> None:
    assert _feed(predictor, [7.5] * 40) == PeakForecast(7.5, 7.5, 7.5)


def test_last_value_on_a_ramp_forecasts_the_last_sample() -> None:
    assert _feed(LastValuePredictor(), [10.0 + 2.0 * t for t in range(30)]) == PeakForecast(68.0, 68.0, 68.0)


def test_holt_on_a_rising_ramp_extrapolates_to_the_end_of_each_horizon() -> None:
    # α = 0.5, β = 0.25 and integer steps keep every operation exact in binary floating point.
    forecast = _feed(HoltPredictor(alpha=0.5, beta=0.25), [10.0 + 2.0 * t for t in range(30)])
    assert forecast == PeakForecast(68.0 + 2.0 * 5, 68.0 + 2.0 * 10, 68.0 + 2.0 * 20)


def test_holt_on_a_falling_ramp_forecasts_the_next_step() -> None:
    forecast = _feed(HoltPredictor(alpha=0.5, beta=0.25), [100.0 - 2.0 * t for t in range(30)])
    assert forecast == PeakForecast(40.0, 40.0, 40.0)  # last sample 42, next step 40


def test_ewma_on_a_ramp_lags_by_the_known_amount() -> None:
    alpha, slope, n = 0.5, 2.0, 30
    forecast = _feed(EwmaPredictor(alpha=alpha), [10.0 + slope * t for t in range(n)])
    lag = slope * (1 - alpha) / alpha * (1 - (1 - alpha) ** (n - 1))
    assert forecast.as_tuple() == pytest.approx((10.0 + slope * (n - 1) - lag,) * 3, abs=1e-12)


def test_margins_are_added_and_forecasts_clipped_to_capacity() -> None:
    predictor = LastValuePredictor(margins=(1.0, 5.0, -20.0), capacity=12.0)
    assert _feed(predictor, [10.0]) == PeakForecast(11.0, 12.0, 0.0)


def test_vectorised_baselines_match_the_streaming_predictors() -> None:
    x = np.abs(np.random.default_rng(5).normal(50, 10, size=(2, 60)))
    cases = [
        (LastValuePredictor, {}, last_value_peak_forecasts(x)),
        (EwmaPredictor, {"alpha": 0.3}, ewma_peak_forecasts(x, 0.3)),
        (HoltPredictor, {"alpha": 0.4, "beta": 0.1}, holt_peak_forecasts(x, 0.4, 0.1)),
    ]
    for cls, kwargs, batch in cases:
        for s in range(2):
            predictor = cls(**kwargs)
            for t in range(60):
                predictor.observe(float(x[s, t]))
                np.testing.assert_allclose(predictor.predict().as_tuple(), batch[s, t], rtol=1e-12)


def test_observations_must_be_finite_and_non_negative() -> None:
    with pytest.raises(ValueError, match="observed value must be finite and >= 0"):
        LastValuePredictor().observe(-1.0)
    with pytest.raises(ValueError, match="observed value must be finite and >= 0"):
        EwmaPredictor(alpha=0.5).observe(math.nan)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        EwmaPredictor(alpha=1.5)


# ---------------------------------------------------------------- targets and metrics


def test_peak_targets_are_the_maximum_over_the_next_steps() -> None:
    x = np.arange(30, dtype=np.float64)[None, :]
    targets = peak_targets(x)
    assert targets[0, 0].tolist() == [5.0, 10.0, 20.0]
    assert targets[0, 9].tolist() == [14.0, 19.0, 29.0]
    assert np.isnan(targets[0, 10, 2])
    assert targets[0, 10, 1] == 20.0


def test_metrics_on_a_hand_computed_example() -> None:
    forecast = np.array([[10.0] * 3, [8.0] * 3, [15.0] * 3, [9.0] * 3])
    target = np.array([[10.0] * 3, [10.0] * 3, [12.0] * 3, [10.0] * 3])
    m = score(forecast, target)[0]
    assert m.mae == pytest.approx((0 + 2 + 3 + 1) / 4)
    assert m.under_rate == 0.5
    assert m.mean_over_reservation == pytest.approx(3 / 4)
    assert m.p95_abs_error == pytest.approx(np.percentile([0, 2, 3, 1], 95))


# ---------------------------------------------------------------- load model

_TINY = LoadModel(
    step_s=0.1,
    replicas=1,
    prefill_tokens_per_s=1_000.0,
    decode_tokens_per_s=10.0,
    card_prefill_tokens_per_s=2_000.0,
    card_decode_tokens_per_s=100.0,
    kv_mb_per_token=1.0,
    fixed_mb=100.0,
    sm_count=100,
)


def _trace(rows: list[tuple[float, float, float]]) -> RequestTrace:
    a, c, g = (np.array(col, dtype=np.float64) for col in zip(*rows, strict=True))
    return RequestTrace(arrival_s=a, context_tokens=c, generated_tokens=g)


def test_load_signal_on_a_hand_made_trace() -> None:
    # A: prefill 50 tokens over [0, 0.05), decode 2 tokens over [0.05, 0.25).
    # B: prefill 20 tokens over [0.33, 0.35), decode 1 token over [0.35, 0.45). C only extends the trace.
    signal = build_load_signal(_trace([(0.0, 50, 2), (0.33, 20, 1), (0.6, 0, 0)]), _TINY)
    # Memory at each step's end: 100 MB fixed + 1 MB per token in flight.
    np.testing.assert_allclose(signal.memory_mb[0], [150.5, 151.5, 100.0, 120.5, 100.0, 100.0], atol=1e-9)
    # SM: 100 × (prefill tokens/s ÷ 2000 + decode tokens/s ÷ 100), averaged over each step.
    # Step 1: 50 prefill + 0.5 decode tokens in 0.1 s → 100 × (0.25 + 0.05); step 4: 20 prefill + 0.5 decode.
    np.testing.assert_allclose(signal.sm[0], [30.0, 10.0, 5.0, 15.0, 5.0, 0.0], atol=1e-9)


def test_sm_demand_saturates_at_the_card() -> None:
    saturating = dataclasses.replace(_TINY, card_prefill_tokens_per_s=100.0)
    signal = build_load_signal(_trace([(0.0, 500, 0), (1.0, 0, 0)]), saturating)
    assert signal.sm[0, :4].tolist() == [100.0] * 4


def test_requests_are_dispatched_round_robin_over_replicas() -> None:
    model = dataclasses.replace(_TINY, replicas=2)
    signal = build_load_signal(_trace([(0.0, 50, 2), (0.01, 30, 0), (0.6, 0, 0)]), model)
    assert signal.memory_mb[0, 0] == pytest.approx(150.5)
    assert signal.memory_mb[1, 0] == pytest.approx(100.0)  # B finished at 0.04: nothing in flight
    assert signal.sm[1, 0] == pytest.approx(100 * 30 / 0.1 / 2000)


def test_default_load_model_derives_kv_and_weights_from_llama_2_7b() -> None:
    model = LoadModel()
    assert model.kv_mb_per_token == 0.5  # 32 layers × 4096 × 2 (K, V) × 2 bytes = 512 KiB
    assert model.fixed_mb == pytest.approx(6.74e9 * 0.5 / 2**20 + 512.0)


def test_reading_the_azure_trace_format(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.9000000,374,44\n"
        "2023-11-17 00:00:00.1500000,396,109",
        encoding="utf-8",
    )
    trace = read_azure_llm_trace(path)
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 0.25])
    assert trace.context_tokens.tolist() == [374.0, 396.0]
    assert trace.generated_tokens.tolist() == [44.0, 109.0]


# ---------------------------------------------------------------- bundle and predictors


def _small_bundle(seed: int = 9) -> ModelBundle:
    rng = np.random.default_rng(seed)
    kinds: tuple[PredictorKind, ...] = ("last_value", "ewma", "holt", "lstm")
    margins = MappingProxyType(dict.fromkeys(kinds, (1.0, 2.0, 3.0)))
    sizes: tuple[tuple[Resource, float], ...] = (("memory_mb", 81_920.0), ("sm", 108.0))
    resources: dict[Resource, ResourceModel] = {
        name: ResourceModel(
            resource=name,
            capacity=capacity,
            mean=capacity / 4,
            std=capacity / 10,
            lstm=lstm_init(features=3, hidden=5, outputs=6, rng=rng),
            ewma_alpha=0.3,
            holt_alpha=0.5,
            holt_beta=0.1,
            margins=margins,
        )
        for name, capacity in sizes
    }
    return ModelBundle(step_s=0.1, window=6, resources=MappingProxyType(resources), meta_json='{"note": "test"}')


def test_bundle_round_trips_through_npz(tmp_path: Path) -> None:
    bundle = _small_bundle()
    save_bundle(bundle, tmp_path / "m.npz")
    loaded = load_bundle(tmp_path / "m.npz")
    assert (loaded.step_s, loaded.window, loaded.meta_json) == (bundle.step_s, bundle.window, bundle.meta_json)
    for name, model in bundle.resources.items():
        got = loaded.resources[name]
        for field in ("capacity", "mean", "std", "ewma_alpha", "holt_alpha", "holt_beta"):
            assert getattr(got, field) == getattr(model, field)
        assert dict(got.margins) == dict(model.margins)
        for key, array in model.lstm.arrays().items():
            np.testing.assert_array_equal(got.lstm.arrays()[key], array)
    values = [20_000.0 + 100 * i for i in range(10)]
    for kind in ("last_value", "ewma", "holt", "lstm"):
        a, b = make_predictor(kind, "memory_mb", bundle=bundle), make_predictor(kind, "memory_mb", bundle=loaded)
        for v in values:
            a.observe(v)
            b.observe(v)
        assert a.predict() == b.predict()


def test_streaming_lstm_matches_the_batch_forecasts() -> None:
    bundle = _small_bundle()
    model = bundle.resources["sm"]
    x = np.abs(np.random.default_rng(6).normal(30, 15, size=(1, 25)))
    origins = Origins(series=np.zeros(25, dtype=np.int64), step=np.arange(25, dtype=np.int64))
    for upper in (False, True):
        batch = point_forecasts("lstm", model, x, origins, bundle.window, upper=upper)
        predictor = make_predictor("lstm", "sm", bundle=bundle, calibrated=upper)
        margins = np.asarray(model.margins["lstm"]) if upper else 0.0
        for t in range(25):
            predictor.observe(float(x[0, t]))
            expected = np.clip(batch[t] + margins, 0.0, model.capacity)
            np.testing.assert_allclose(predictor.predict().as_tuple(), expected, rtol=1e-12)


@pytest.mark.parametrize("resource", ["memory_mb", "sm"])
def test_shipped_model_predicts_finite_non_negative_peaks(resource: Resource) -> None:
    bundle = shipped_bundle()
    model = bundle.resources[resource]
    rng = np.random.default_rng(1)
    samples = np.clip(model.mean + model.std * rng.normal(size=60), 0.0, model.capacity)
    kinds: tuple[PredictorKind, ...] = ("last_value", "ewma", "holt", "lstm")
    for kind in kinds:
        for calibrated in (False, True):
            predictor = make_predictor(kind, resource, calibrated=calibrated)
            assert all(0.0 <= v <= model.capacity for v in predictor.predict().as_tuple())  # before any sample
            for v in samples:
                predictor.observe(float(v))
                forecast = predictor.predict().as_tuple()
                assert all(math.isfinite(v) and 0.0 <= v <= model.capacity for v in forecast), (kind, forecast)
    default = default_predictor(resource)
    default.observe(float(samples[0]))
    assert isinstance(default.predict(), PeakForecast)
    assert DEFAULT_KIND[resource] in kinds
    assert bundle.resources[resource].lstm.outputs == 6


@pytest.mark.parametrize("hidden", [1, 5, 24])
def test_inference_forward_equals_lstm_forward(hidden: int) -> None:
    rng = np.random.default_rng(hidden)
    params = lstm_init(features=3, hidden=hidden, outputs=6, rng=rng)
    params = params.map(lambda a: a + rng.normal(0, 0.3, size=a.shape))  # not only the initial biases
    x = rng.normal(size=(11, 9, 3))  # (batch, steps, features)
    expected, _ = lstm_forward(params, x)
    got = LstmInference(params).forward(np.ascontiguousarray(x.transpose(1, 2, 0)))
    np.testing.assert_allclose(got.T, expected, rtol=1e-12, atol=1e-14)
    single = LstmInference(params).forward(np.ascontiguousarray(x[:1].transpose(1, 2, 0)))
    np.testing.assert_allclose(single.T, expected[:1], rtol=1e-12, atol=1e-14)


def test_batched_predictions_equal_one_at_a_time() -> None:
    """``predict_peaks``: LSTMs of two models, both heads, empty/short/full histories, and a baseline."""
    rng = np.random.default_rng(3)
    bundles = (_small_bundle(), shipped_bundle())
    predictors = []
    for bundle in bundles:
        for resource in ("memory_mb", "sm"):
            capacity = bundle.resources[resource].capacity
            for calibrated in (True, False):
                for samples in (0, 1, 3, bundle.window + 1, 40):
                    p = make_predictor("lstm", resource, bundle=bundle, calibrated=calibrated)
                    for v in rng.uniform(0, capacity, size=samples):
                        p.observe(float(v))
                    predictors.append(p)
    baseline = make_predictor("holt", "sm", bundle=bundles[0])
    for v in (10.0, 30.0, 20.0):
        baseline.observe(v)
    predictors.insert(7, baseline)
    expected = [p.predict().as_tuple() for p in predictors]
    got = [f.as_tuple() for f in predict_peaks(predictors)]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-9)
    assert predict_peaks([baseline]) == [baseline.predict()]
    assert predict_peaks([]) == []
