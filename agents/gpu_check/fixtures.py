"""What NVML answered, kept: a ``pynvml`` stand-in that passes every call through and records it.

``NvmlBackend`` runs over ``RecordingNvml(pynvml)`` exactly as over ``pynvml``; each answer is
written into a ``FakeNvmlDevice`` per device handle, so ``fixture()`` is an NVML fixture
(``agents.fakes.nvml.NVML_FIXTURE_SCHEMA``) that ``FakeNvml.from_fixture`` serves back: the
real driver's strings, sizes, process memory and utilisation samples, errors included
(a ``NOT_SUPPORTED`` answer becomes the fake's "not served").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from agents.fakes.nvml import FakeNvml, FakeNvmlDevice

__all__ = ["RecordingNvml"]

T = TypeVar("T")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RecordingNvml:
    """``pynvml`` (or anything with its API) with each device's answers recorded."""

    def __init__(self, nvml: Any) -> None:  # nvml: the pynvml module, untyped
        self._nvml = nvml
        # (handle, its record): handles are opaque and compared by identity, which holds
        # because NvmlBackend asks for each handle once and keeps it.
        self._records: list[tuple[Any, FakeNvmlDevice]] = []
        self._top: list[FakeNvmlDevice] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nvml, name)  # constants, NVMLError, calls nothing records

    def fixture(self, **source: Any) -> dict[str, Any]:
        return FakeNvml(devices=self._top).to_fixture(**source)

    def _record(self, handle: Any) -> FakeNvmlDevice:
        for known, record in self._records:
            if known is handle:
                return record
        raise KeyError("a device handle RecordingNvml did not hand out")

    def _new(self, handle: Any) -> FakeNvmlDevice:
        record = FakeNvmlDevice(uuid="", name="", memory_total_bytes=0, compute_capability=(0, 0), cuda_cores=0)
        self._records.append((handle, record))
        return record

    def _answer(self, call: Callable[[], T], *, unsupported: Callable[[], None] | None = None) -> T:
        """``call()``; an NVML "not supported" runs ``unsupported`` (recording it) and is re-raised."""
        try:
            return call()
        except self._nvml.NVMLError as error:
            if unsupported is not None and error.value == self._nvml.NVML_ERROR_NOT_SUPPORTED:
                unsupported()
            raise

    # -- the calls NvmlBackend makes ---------------------------------------------------------

    def nvmlShutdown(self) -> None:
        self._nvml.nvmlShutdown()

    def nvmlDeviceGetCount(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        self._top.append(self._new(handle))
        return handle

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        instance = self._nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        self._record(handle).mig_instances.append(self._new(instance))
        return instance

    def nvmlDeviceGetMigMode(self, handle: Any) -> Any:
        return self._nvml.nvmlDeviceGetMigMode(handle)  # implied by the instances recorded

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return int(self._nvml.nvmlDeviceGetMaxMigDeviceCount(handle))

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        value = self._nvml.nvmlDeviceGetUUID(handle)
        self._record(handle).uuid = _text(value)
        return value

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        value = self._nvml.nvmlDeviceGetName(handle)
        self._record(handle).name = _text(value)
        return value

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        value = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        self._record(handle).memory_total_bytes = int(value.total)
        return value

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        record = self._record(handle)

        def not_served() -> None:
            record.mig_sm_count = None

        value = self._answer(lambda: self._nvml.nvmlDeviceGetAttributes(handle), unsupported=not_served)
        record.mig_sm_count = int(value.multiprocessorCount)
        return value

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> Any:
        major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(handle)
        self._record(handle).compute_capability = (int(major), int(minor))
        return major, minor

    def nvmlDeviceGetNumGpuCores(self, handle: Any) -> int:
        value = int(self._nvml.nvmlDeviceGetNumGpuCores(handle))
        self._record(handle).cuda_cores = value
        return value

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        record = self._record(handle)
        tx = counter == self._nvml.NVML_PCIE_UTIL_TX_BYTES

        def not_served() -> None:
            if tx:
                record.pcie_tx_kb_s = None
            else:
                record.pcie_rx_kb_s = None

        value = int(self._answer(lambda: self._nvml.nvmlDeviceGetPcieThroughput(handle, counter), unsupported=not_served))
        if tx:
            record.pcie_tx_kb_s = value
        else:
            record.pcie_rx_kb_s = value
        return value

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Any:
        processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        # The latest list: the fixture is the GPU as last seen (the load still running).
        self._record(handle).processes = {int(p.pid): p.usedGpuMemory for p in processes}
        return processes

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> Any:
        samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us)
        record = self._record(handle)
        seen = {(pid, ts) for pid, ts, _ in record.samples}
        # Every sample seen, once: replayed from 0, the fake hands them all to the first read.
        record.samples.extend(
            (int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples if (s.pid, s.timeStamp) not in seen
        )
        return samples
