"""Peak-demand predictors on the Azure LLM inference trace: LSTM vs last value, EWMA and Holt.

    python -m allocator.experiments.predictor --trace data/traces/AzureLLMInferenceTrace_conv.csv \\
        [--train] [--model PATH] [--json] [--out docs/prediction.md]

Without ``--train`` the shipped bundle (``allocator/predict/models/``) is evaluated;
with it every predictor is fitted again (deterministic for ``--seed``) and the
bundle is written to ``--model``. ``--out`` writes the markdown table into that
file between the ``predictor-table`` markers (or the whole file when it has none).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from allocator.predict import (
    SHIPPED_MODEL_PATH,
    LoadModel,
    build_load_signal,
    load_bundle,
    read_azure_llm_trace,
    save_bundle,
)
from allocator.predict._evaluation import Split
from allocator.predict._training import EvaluationRow, TrainingConfig, evaluate_bundle, fit_bundle

__all__ = ["main", "render_markdown"]

_START = "<!-- predictor-table:start -->"
_END = "<!-- predictor-table:end -->"
_NAMES = {"last_value": "last value", "ewma": "EWMA", "holt": "Holt", "lstm": "LSTM"}
_UNITS = {"memory_mb": "MB", "sm": "SMs"}


def render_markdown(rows: Sequence[EvaluationRow], *, target_under_rate: float) -> str:
    """One table per resource and mode, one row per horizon and predictor."""
    titles = {
        "raw": "raw point forecasts (median)",
        "calibrated": (
            f"calibrated: forecast + margin fitted for {100 * target_under_rate:g} % under-prediction "
            "on the calibration part (what ships)"
        ),
        "equal_risk": (
            f"diagnostic: margin set on the test part itself for exactly {100 * target_under_rate:g} % "
            "under-prediction (sharpness at equal risk; not deployable)"
        ),
    }
    parts: list[str] = []
    for resource in ("memory_mb", "sm"):
        for mode, title in titles.items():
            chosen = [r for r in rows if r.resource == resource and r.mode == mode]
            if not chosen:
                continue
            unit = _UNITS[resource]
            parts.append(f"**{resource}, {title}** (n = {chosen[0].metrics.count} test origins per horizon)\n")
            parts.append(
                f"| horizon | predictor | MAE ({unit}) | P95 abs. error ({unit}) | under-prediction "
                f"| mean over-reservation ({unit}) |"
            )
            parts.append("|---|---|---:|---:|---:|---:|")
            for r in sorted(chosen, key=lambda r: (r.horizon_s, list(_NAMES).index(r.kind))):
                m = r.metrics
                parts.append(
                    f"| {r.horizon_s:g} s | {_NAMES[r.kind]} | {m.mae:.1f} | {m.p95_abs_error:.1f} | "
                    f"{100 * m.under_rate:.1f} % | {m.mean_over_reservation:.1f} |"
                )
            parts.append("")
    return "\n".join(parts)


def _write_table(path: Path, table: str) -> None:
    if path.exists():
        text = path.read_text(encoding="utf-8")
        if _START in text and _END in text:
            head, rest = text.split(_START, 1)
            _, tail = rest.split(_END, 1)
            path.write_text(f"{head}{_START}\n{table}\n{_END}{tail}", encoding="utf-8")
            return
    path.write_text(table + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trace", type=Path, required=True, help="AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--train", action="store_true", help="fit every predictor again and write --model")
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL_PATH, help="bundle to evaluate or to write")
    parser.add_argument("--seed", type=int, default=TrainingConfig().seed)
    parser.add_argument("--epochs", type=int, default=TrainingConfig().epochs)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of markdown")
    parser.add_argument("--out", type=Path, help="write the markdown table into this file")
    args = parser.parse_args(argv)

    digest = hashlib.sha256(args.trace.read_bytes()).hexdigest()
    load_model = LoadModel()
    signal = build_load_signal(read_azure_llm_trace(args.trace), load_model)
    if args.train:
        config = TrainingConfig(seed=args.seed, epochs=args.epochs)
        bundle = fit_bundle(signal, config=config, load_model=load_model, trace_digest=digest)
        save_bundle(bundle, args.model)
    else:
        bundle = load_bundle(args.model)
    meta = json.loads(bundle.meta_json)
    if meta["load_model"] != dataclasses.asdict(load_model) or meta["trace_sha256"] != digest:
        print(f"{args.model} was fitted on another trace or load model; run with --train", file=sys.stderr)
        return 2
    config_used = meta["config"]
    split = Split.of(
        signal.memory_mb.shape[1],
        fit_fraction=config_used["fit_fraction"],
        train_fraction=config_used["train_fraction"],
    )
    target = float(config_used["target_under_rate"])
    rows = evaluate_bundle(bundle, signal, split=split, target_under_rate=target)
    table = render_markdown(rows, target_under_rate=target)
    if args.json:
        payload = {
            "split_steps": dataclasses.asdict(split),
            "step_s": signal.step_s,
            "series": int(signal.memory_mb.shape[0]),
            "rows": [
                {
                    "resource": r.resource,
                    "predictor": r.kind,
                    "mode": r.mode,
                    "horizon_s": r.horizon_s,
                    **dataclasses.asdict(r.metrics),
                }
                for r in rows
            ],
        }
        print(json.dumps(payload, indent=2))
    else:
        print(table)
    if args.out:
        _write_table(args.out, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
