"""Fakes for the agent's seams, shipped with the code (STYLE §7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pynvml
import requests

from agents.clock import from_us, to_us

__all__ = ["FakeClock", "FakeNvml", "FakeNvmlDevice", "RecordedRequest", "ScriptedSession"]


class FakeClock:
    """A ``Clock`` that stands still until slept on; ``sleep`` advances it exactly.

    Time is kept in integer microseconds so that ticks never drift.
    """

    def __init__(self, *, start: datetime) -> None:
        self._start_us = to_us(start)
        self._elapsed_us = 0

    def now(self) -> datetime:
        return from_us(self._start_us + self._elapsed_us)

    def monotonic(self) -> float:
        return self._elapsed_us / 1_000_000

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time ({seconds} s)")
        self._elapsed_us += round(seconds * 1_000_000)

    def advance(self, delta: timedelta) -> None:
        """Move time forward without a sleep (e.g. a stalled tick)."""
        self.sleep(delta.total_seconds())


@dataclass
class FakeNvmlDevice:
    """One GPU as ``FakeNvml`` reports it; tests mutate ``processes`` and ``samples``."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_bytes: int = 81920 * 1024 * 1024
    compute_capability: tuple[int, int] = (8, 0)
    cuda_cores: int = 6912
    mig_sm_count: int | None = None  # served by nvmlDeviceGetAttributes only when set
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes (None: withheld)
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timestamp µs, SM %)


class FakeNvml:
    """The subset of ``pynvml`` that ``NvmlBackend`` calls, over in-memory devices.

    Errors are real ``pynvml.NVMLError`` instances with NVML's codes.
    """

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVMLError = pynvml.NVMLError

    def __init__(self, *, devices: list[FakeNvmlDevice]) -> None:
        self.devices = devices
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeNvmlDevice:
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: FakeNvmlDevice) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeNvmlDevice) -> str:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeNvmlDevice) -> SimpleNamespace:
        return SimpleNamespace(total=handle.memory_total_bytes)

    def nvmlDeviceGetAttributes(self, handle: FakeNvmlDevice) -> SimpleNamespace:
        if handle.mig_sm_count is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=handle.mig_sm_count)

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        return handle.compute_capability

    def nvmlDeviceGetNumGpuCores(self, handle: FakeNvmlDevice) -> int:
        return handle.cuda_cores

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeNvmlDevice) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes.items()]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeNvmlDevice, last_seen_us: int) -> list[SimpleNamespace]:
        fresh = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm) for pid, ts, sm in handle.samples if ts > last_seen_us
        ]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh


@dataclass(frozen=True)
class RecordedRequest:
    url: str
    body: bytes
    headers: dict[str, str]
    timeout: float


class ScriptedSession(requests.Session):
    """A ``requests.Session`` that answers ``post`` from a script instead of the network.

    Each script entry is ``(status, headers, body)`` or an exception to raise
    (e.g. ``requests.ConnectionError``). Every request is recorded in ``sent``.
    """

    def __init__(self, script: list[tuple[int, dict[str, str], bytes] | Exception]) -> None:
        super().__init__()
        self._script = list(script)
        self.sent: list[RecordedRequest] = []

    def post(
        self, url: str | bytes, data: Any = None, json: Any = None, **kwargs: Any
    ) -> requests.Response:  # signature of requests.Session.post
        self.sent.append(
            RecordedRequest(url=str(url), body=bytes(data), headers=dict(kwargs["headers"]), timeout=kwargs["timeout"])
        )
        entry = self._script.pop(0)
        if isinstance(entry, Exception):
            raise entry
        status, headers, body = entry
        response = requests.Response()
        response.status_code = status
        response.headers.update(headers)
        response._content = body
        response.url = str(url)
        return response
