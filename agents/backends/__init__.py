"""GPU backends: ``sim`` (trace-driven simulated GPUs) and ``nvml`` (real GPUs)."""

__all__: list[str] = []
