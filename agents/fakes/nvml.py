"""The subset of ``pynvml`` that ``agents.backends.nvml.NvmlBackend`` calls, over in-memory
devices, and the NVML fixtures (``python -m agents.gpu_check --save-fixtures``) it loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

__all__ = ["NVML_FIXTURE_SCHEMA", "FakeNvml", "FakeNvmlDevice"]

# JSON written by ``python -m agents.gpu_check --save-fixtures`` from a real driver's answers.
NVML_FIXTURE_SCHEMA = "vgpu-ledger/nvml-fixture/v1"


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
    # Device PCIe throughput as nvmlDeviceGetPcieThroughput reports it, KB/s; None: not supported.
    pcie_tx_kb_s: int | None = None
    pcie_rx_kb_s: int | None = None
    # Energy since the driver loaded, mJ (nvmlDeviceGetTotalEnergyConsumption; Volta and newer); None: not
    # supported, and then the power draw (nvmlDeviceGetPowerUsage, mW; None: not supported either).
    total_energy_mj: int | None = None
    power_mw: int | None = None
    # MIG: when ``mig_instances`` is non-empty the device is in MIG mode and these are its
    # instances (each a device of its own, with ``mig_sm_count`` set).
    mig_instances: list[FakeNvmlDevice] = field(default_factory=list)


class FakeNvml:
    """The subset of ``pynvml`` that ``NvmlBackend`` calls, over in-memory devices.

    Errors are real ``pynvml.NVMLError`` instances with NVML's codes.
    """

    @classmethod
    def from_fixture(cls, fixture: dict[str, Any]) -> FakeNvml:
        """The devices of an NVML fixture (``NVML_FIXTURE_SCHEMA``; ``nvml_fixture`` writes one)."""
        if fixture.get("schema") != NVML_FIXTURE_SCHEMA:
            raise ValueError(f"not an NVML fixture: schema {fixture.get('schema')!r}, expected {NVML_FIXTURE_SCHEMA!r}")
        return cls(devices=[_device_from_json(d) for d in fixture["devices"]])

    def to_fixture(self, **source: Any) -> dict[str, Any]:
        """These devices as an NVML fixture; ``source`` says where the answers came from."""
        return {
            "schema": NVML_FIXTURE_SCHEMA,
            "source": source,
            "devices": [_device_to_json(d) for d in self.devices],
        }

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
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

    def nvmlDeviceGetMigMode(self, handle: FakeNvmlDevice) -> tuple[int, int]:
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if handle.mig_instances else pynvml.NVML_DEVICE_MIG_DISABLE
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeNvmlDevice) -> int:
        return 7 if handle.mig_instances else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeNvmlDevice, index: int) -> FakeNvmlDevice:
        if index >= len(handle.mig_instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handle.mig_instances[index]

    def nvmlDeviceGetPcieThroughput(self, handle: FakeNvmlDevice, counter: int) -> int:
        value = handle.pcie_tx_kb_s if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else handle.pcie_rx_kb_s
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeNvmlDevice) -> int:
        if handle.total_energy_mj is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.total_energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: FakeNvmlDevice) -> int:
        if handle.power_mw is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeNvmlDevice) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes.items()]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeNvmlDevice, last_seen_us: int) -> list[SimpleNamespace]:
        fresh = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm) for pid, ts, sm in handle.samples if ts > last_seen_us
        ]
        if not fresh:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return fresh


def _device_to_json(device: FakeNvmlDevice) -> dict[str, Any]:
    return {
        "uuid": device.uuid,
        "name": device.name,
        "memory_total_bytes": device.memory_total_bytes,
        "compute_capability": list(device.compute_capability),
        "cuda_cores": device.cuda_cores,
        "mig_sm_count": device.mig_sm_count,
        # JSON keys are strings: [pid, bytes or null] pairs keep the pid an integer.
        "processes": [[pid, used] for pid, used in sorted(device.processes.items())],
        "samples": [list(s) for s in device.samples],
        "pcie_tx_kb_s": device.pcie_tx_kb_s,
        "pcie_rx_kb_s": device.pcie_rx_kb_s,
        "total_energy_mj": device.total_energy_mj,
        "power_mw": device.power_mw,
        "mig_instances": [_device_to_json(m) for m in device.mig_instances],
    }


def _device_from_json(raw: dict[str, Any]) -> FakeNvmlDevice:
    major, minor = raw["compute_capability"]
    return FakeNvmlDevice(
        uuid=raw["uuid"],
        name=raw["name"],
        memory_total_bytes=int(raw["memory_total_bytes"]),
        compute_capability=(int(major), int(minor)),
        cuda_cores=int(raw["cuda_cores"]),
        mig_sm_count=raw["mig_sm_count"],
        processes={int(pid): used for pid, used in raw["processes"]},
        samples=[(int(pid), int(ts), int(sm)) for pid, ts, sm in raw["samples"]],
        pcie_tx_kb_s=raw["pcie_tx_kb_s"],
        pcie_rx_kb_s=raw["pcie_rx_kb_s"],
        # Fixtures saved before energy was read have neither: the device then meters no energy.
        total_energy_mj=raw.get("total_energy_mj"),
        power_mw=raw.get("power_mw"),
        mig_instances=[_device_from_json(m) for m in raw["mig_instances"]],
    )
