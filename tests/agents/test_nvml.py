"""The NVML backend over ``agents.fakes.nvml.FakeNvml`` (pynvml's API, NVML's error codes)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents.backends.nvml import NvmlBackend, cuda_cores_per_sm
from agents.fakes.nvml import FakeNvml, FakeNvmlDevice
from agents.interfaces import GpuInfo

NOW = datetime(2026, 11, 30, 3, 0, 0, tzinfo=UTC)
MIB = 1024 * 1024


def test_inventory_reports_uuid_model_memory_and_sm_count() -> None:
    nvml = FakeNvml(
        devices=[
            FakeNvmlDevice(uuid="GPU-a100"),
            FakeNvmlDevice(
                uuid="GPU-h200",
                name="NVIDIA H200",
                memory_total_bytes=143771 * MIB,
                compute_capability=(9, 0),
                cuda_cores=16896,
            ),
            FakeNvmlDevice(uuid="MIG-3g", mig_sm_count=42),
        ]
    )
    assert list(NvmlBackend(nvml=nvml).inventory()) == [
        GpuInfo(uuid="GPU-a100", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=108),
        GpuInfo(uuid="GPU-h200", model="NVIDIA H200", memory_mb=143771, sm_count=132),
        GpuInfo(uuid="MIG-3g", model="NVIDIA A100-SXM4-80GB", memory_mb=81920, sm_count=42),
    ]


def test_processes_are_read_with_memory_and_mean_sm_since_the_last_read() -> None:
    gpu = FakeNvmlDevice(uuid="GPU-a", processes={4242: 512 * MIB, 77: None})
    gpu.samples = [(4242, 1_000, 10), (4242, 2_000, 30), (77, 2_000, 50)]
    backend = NvmlBackend(nvml=FakeNvml(devices=[gpu]))
    first = {r.workload.pod: r for r in backend.read(now=NOW)}
    assert first["pid-4242"].mem_used_mb == 512.0
    assert first["pid-4242"].sm_used == pytest.approx(0.20 * 108)
    assert first["pid-77"].mem_used_mb == 0.0  # the driver withheld it
    assert first["pid-77"].sm_used == pytest.approx(0.50 * 108)
    assert {r.workload.tenant for r in first.values()} == {"unattributed"}

    second = {r.workload.pod: r for r in backend.read(now=NOW)}  # no new samples: NOT_FOUND
    assert second["pid-4242"].sm_used == 0.0
    assert second["pid-4242"].mem_used_mb == 512.0


def test_a_process_that_left_only_samples_behind_still_gets_its_sm_time() -> None:
    gpu = FakeNvmlDevice(uuid="GPU-a", samples=[(9, 5_000, 40)])
    (reading,) = NvmlBackend(nvml=FakeNvml(devices=[gpu])).read(now=NOW)
    assert (reading.workload.pod, reading.mem_used_mb) == ("pid-9", 0.0)
    assert reading.sm_used == pytest.approx(0.40 * 108)


@pytest.mark.parametrize(
    ("capability", "cores"),
    [((7, 0), 64), ((8, 0), 64), ((8, 6), 128), ((8, 9), 128), ((9, 0), 128)],
)
def test_cores_per_sm_follow_the_cuda_architecture_table(capability: tuple[int, int], cores: int) -> None:
    assert cuda_cores_per_sm(*capability) == cores


def test_an_unknown_architecture_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"compute capability 3\.5"):
        cuda_cores_per_sm(3, 5)


def test_a_gpu_in_mig_mode_is_metered_as_its_instances_not_the_parent() -> None:
    instances = [
        FakeNvmlDevice(uuid="MIG-aaaa", name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", memory_total_bytes=40192 * MIB,
                       mig_sm_count=42, processes={11: 1024 * MIB}),
        FakeNvmlDevice(uuid="MIG-bbbb", name="NVIDIA A100-SXM4-80GB MIG 1g.10gb", memory_total_bytes=9856 * MIB,
                       mig_sm_count=14),
    ]
    nvml = FakeNvml(devices=[FakeNvmlDevice(uuid="GPU-parent", mig_instances=instances), FakeNvmlDevice(uuid="GPU-b")])
    backend = NvmlBackend(nvml=nvml)
    assert [(g.uuid, g.memory_mb, g.sm_count) for g in backend.inventory()] == [
        ("MIG-aaaa", 40192, 42), ("MIG-bbbb", 9856, 14), ("GPU-b", 81920, 108),
    ]
    (reading,) = backend.read(now=NOW)
    assert (reading.gpu, reading.mem_used_mb) == ("MIG-aaaa", 1024.0)


def test_device_pcie_throughput_is_split_over_processes_by_sm_use() -> None:
    gpu = FakeNvmlDevice(uuid="GPU-a", processes={1: 100 * MIB, 2: 300 * MIB}, pcie_tx_kb_s=2048, pcie_rx_kb_s=1024)
    gpu.samples = [(1, 1_000, 30), (2, 1_000, 10)]
    readings = {r.workload.pod: r.pcie_mb_per_s for r in NvmlBackend(nvml=FakeNvml(devices=[gpu])).read(now=NOW)}
    # 3 MB/s in all; SM use 30 : 10.
    assert readings == {"pid-1": pytest.approx(2.25), "pid-2": pytest.approx(0.75)}


def test_pcie_falls_back_to_memory_shares_and_to_zero_when_the_counter_is_not_served() -> None:
    gpu = FakeNvmlDevice(uuid="GPU-a", processes={1: 100 * MIB, 2: 300 * MIB}, pcie_tx_kb_s=1024, pcie_rx_kb_s=0)
    readings = {r.workload.pod: r.pcie_mb_per_s for r in NvmlBackend(nvml=FakeNvml(devices=[gpu])).read(now=NOW)}
    assert readings == {"pid-1": pytest.approx(0.25), "pid-2": pytest.approx(0.75)}
    quiet = FakeNvmlDevice(uuid="GPU-b", processes={3: 100 * MIB})
    (reading,) = NvmlBackend(nvml=FakeNvml(devices=[quiet])).read(now=NOW)
    assert reading.pcie_mb_per_s == 0.0
