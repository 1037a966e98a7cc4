"""Real GPUs through NVML (``nvidia-ml-py``, module ``pynvml``).

Per-process memory comes from ``nvmlDeviceGetComputeRunningProcesses`` and
per-process SM utilisation from ``nvmlDeviceGetProcessUtilization`` (samples
since the previous read). NVML has no per-process PCIe counter: the device's
TX + RX throughput (``nvmlDeviceGetPcieThroughput``, KB/s over NVML's own short
sampling window) is split over the GPU's processes in proportion to their SM
use (by memory when no SM use was sampled) — an estimate, documented in
docs/agent.md. A GPU in MIG mode is metered as its MIG instances (each with
its own UUID, memory and SM count); the parent GPU is not listed.

Energy (``energy_j``) is per GPU: NVML's total energy consumption counter
(``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded) where the
GPU has one, else its power draw (``nvmlDeviceGetPowerUsage``, mW) held from one
read to the next and integrated over time. A MIG instance has neither: its parent's
energy is not split (docs/agent.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from types import ModuleType
from typing import Any

from agents.attribution import PidAttributor
from agents.interfaces import Attributor, GpuInfo, UsageReading, Workload

__all__ = ["NvmlBackend", "NvmlUnavailable", "cuda_cores_per_sm", "load_nvml"]

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine; the message names the way out."""


def cuda_cores_per_sm(major: int, minor: int) -> int:
    """FP32 cores per SM by compute capability (CUDA C Programming Guide, table 'Throughput')."""
    if (major, minor) in ((6, 0), (7, 0), (7, 2), (7, 5), (8, 0)):
        return 64
    if major in (6, 8, 9, 10, 12):
        return 128
    raise ValueError(f"unknown SM layout for compute capability {major}.{minor}")


def load_nvml() -> ModuleType:
    """``pynvml``, initialised; ``NvmlUnavailable`` (naming ``--backend sim``) when there is no NVML."""
    try:
        import pynvml  # noqa: PLC0415 - an optional dependency; its absence is reported as NvmlUnavailable
    except ImportError as error:
        raise NvmlUnavailable(
            f"NVML backend needs nvidia-ml-py ({error}); use --backend sim to run on simulated GPUs"
        ) from error
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise NvmlUnavailable(
            f"NVML is not available on this machine ({error}); use --backend sim to run on simulated GPUs"
        ) from error
    module: ModuleType = pynvml  # untyped third-party module
    return module


class NvmlBackend:
    """``GpuBackend`` over the node's NVIDIA GPUs."""

    def __init__(self, *, attributor: Attributor | None = None, nvml: Any = None) -> None:
        # ``nvml``: the pynvml module, or a stand-in such as ``agents.fakes.nvml.FakeNvml``.
        self._nvml = nvml if nvml is not None else load_nvml()
        self._attributor = attributor if attributor is not None else PidAttributor()
        self._handles: list[tuple[GpuInfo, Any]] = []
        # PCIe is a property of the physical GPU: MIG instances share their parent's link.
        self._pcie_handle: dict[str, Any] = {}
        for index in range(self._nvml.nvmlDeviceGetCount()):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
            for device in self._mig_instances(handle) or [handle]:
                gpu = self._describe(device)
                self._handles.append((gpu, device))
                self._pcie_handle[gpu.uuid] = handle
        # NVML timestamp (µs) of the newest utilisation sample seen, per GPU.
        self._last_sample_us: dict[str, int] = {gpu.uuid: 0 for gpu, _ in self._handles}
        # Host PIDs of each workload's GPU processes at the last read (the enforcers' process table).
        self._pids: dict[str, tuple[int, ...]] = {}
        # Power-integrated energy of the GPUs without an energy counter: (joules so far, last power W, at).
        self._power_energy: dict[str, tuple[float, float, datetime]] = {}

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def inventory(self) -> Sequence[GpuInfo]:
        return tuple(gpu for gpu, _ in self._handles)

    def processes(self, workload: Workload) -> Sequence[int]:
        """Host PIDs of ``workload``'s GPU processes as of the last ``read`` (any GPU)."""
        return self._pids.get(workload.key, ())

    def read(self, *, now: datetime) -> Sequence[UsageReading]:
        readings: list[UsageReading] = []
        pids: dict[str, set[int]] = {}
        for gpu, handle in self._handles:
            memory = {
                p.pid: (p.usedGpuMemory or 0) / _MIB  # None: driver withholds it (no permission)
                for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            }
            sm_percent = self._sm_percent(gpu, handle)
            present = sorted(memory.keys() | sm_percent.keys())
            pcie = _split_pcie(self._pcie_mb_per_s(gpu), present, sm_percent, memory)
            for pid in present:
                workload = self._attributor.attribute(pid=pid)
                pids.setdefault(workload.key, set()).add(pid)
                readings.append(
                    UsageReading(
                        workload=workload,
                        gpu=gpu.uuid,
                        mem_used_mb=min(memory.get(pid, 0.0), float(gpu.memory_mb)),
                        sm_used=min(sm_percent.get(pid, 0.0), 100.0) / 100.0 * gpu.sm_count,
                        pcie_mb_per_s=pcie.get(pid, 0.0),
                    )
                )
        self._pids = {key: tuple(sorted(found)) for key, found in pids.items()}
        return readings

    def energy_j(self, *, now: datetime) -> dict[str, float]:
        """Cumulative joules per GPU (``agents.interfaces.EnergyReader``): the counter where the GPU has one,
        else power x time, the power read now held until the next read. GPUs with neither are left out."""
        nvml = self._nvml
        energy: dict[str, float] = {}
        for gpu, handle in self._handles:
            try:
                energy[gpu.uuid] = nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0
                continue
            except nvml.NVMLError as error:
                if error.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                    raise
            try:
                watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except nvml.NVMLError as error:
                if error.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                    raise
                continue
            joules, held_w, since = self._power_energy.get(gpu.uuid, (0.0, watts, now))
            joules += held_w * max((now - since).total_seconds(), 0.0)
            self._power_energy[gpu.uuid] = (joules, watts, now)
            energy[gpu.uuid] = joules
        return energy

    def _mig_instances(self, handle: Any) -> list[Any]:  # handle: opaque NVML device handle
        """The MIG instances of a GPU in MIG mode; empty when MIG is off or not supported."""
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return []  # not a MIG-capable GPU
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        instances = []
        for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                instances.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
            except nvml.NVMLError as error:
                if error.value != nvml.NVML_ERROR_NOT_FOUND:
                    raise
        return instances

    def _pcie_mb_per_s(self, gpu: GpuInfo) -> float:
        """Device TX + RX, MB/s; 0 where the driver does not serve the counter."""
        nvml = self._nvml
        handle = self._pcie_handle[gpu.uuid]
        try:
            kb_s = nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES) + \
                nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_RX_BYTES)
        except nvml.NVMLError as error:
            if error.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return 0.0
            raise
        return float(kb_s) / 1024.0

    def _sm_percent(self, gpu: GpuInfo, handle: Any) -> dict[int, float]:  # handle: opaque NVML device handle
        """Mean SM utilisation (%) per pid over the samples since the previous read."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._last_sample_us[gpu.uuid])
        except nvml.NVMLError as error:
            if error.value in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_SUCCESS):
                return {}  # no samples since the previous read: nothing ran
            raise
        totals: dict[int, list[float]] = {}
        for s in samples:
            totals.setdefault(s.pid, []).append(float(s.smUtil))
            self._last_sample_us[gpu.uuid] = max(self._last_sample_us[gpu.uuid], s.timeStamp)
        return {pid: sum(values) / len(values) for pid, values in totals.items()}

    def _describe(self, handle: Any) -> GpuInfo:  # handle: opaque NVML device handle
        nvml = self._nvml
        uuid = nvml.nvmlDeviceGetUUID(handle)
        name = nvml.nvmlDeviceGetName(handle)
        memory_mb = nvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB
        return GpuInfo(
            uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
            model=name.decode() if isinstance(name, bytes) else name,
            memory_mb=int(memory_mb),
            sm_count=self._sm_count(handle),
        )

    def _sm_count(self, handle: Any) -> int:  # handle: opaque NVML device handle
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        except nvml.NVMLError as error:
            # Attributes are only served for MIG devices on many drivers; derive the
            # SM count from CUDA cores and the architecture's cores per SM instead.
            log.debug("event=nvml_attributes_unavailable error=%s", error)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return int(nvml.nvmlDeviceGetNumGpuCores(handle)) // cuda_cores_per_sm(major, minor)


def _split_pcie(
    total_mb_per_s: float, pids: Sequence[int], sm_percent: dict[int, float], memory_mb: dict[int, float]
) -> dict[int, float]:
    """Share a GPU's PCIe rate among its processes by SM use, else by memory, else evenly."""
    if total_mb_per_s <= 0 or not pids:
        return {}
    for weights in ({p: sm_percent.get(p, 0.0) for p in pids}, {p: memory_mb.get(p, 0.0) for p in pids}):
        total = sum(weights.values())
        if total > 0:
            return {p: total_mb_per_s * w / total for p, w in weights.items()}
    return {p: total_mb_per_s / len(pids) for p in pids}
