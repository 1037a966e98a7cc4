"""The NVML backend over ``agents.testing.FakeNvml`` (pynvml's API, NVML's error codes)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from agents.backends.nvml import NvmlBackend, cuda_cores_per_sm
from agents.interfaces import GpuInfo
from agents.testing import FakeNvml, FakeNvmlDevice

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
    with pytest.raises(ValueError, match="compute capability 3.5"):
        cuda_cores_per_sm(3, 5)
